//! `strata compress` (docs/FORMAT.md §18): cold grains packed into
//! compressed streams through the command's public interface, offline and
//! through a server (a job, `--detach`, `jobs show`, the HTTP API). Every
//! disk, snapshot and clone reads back its bytes through qemu-img, a
//! client write to a packed grain lands, and `check` stays clean; wrong
//! arguments and an object store are refused by name.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::http::{free_addr, http, metrics, sample, wait_http};
use common::*;

const MIB: u64 = 1 << 20;

/// An 8 MiB image: 2 MiB of noise (no compressor shrinks it), 2 MiB of
/// zeros, 2 MiB of text (it packs), 2 MiB of zeros.
fn image(dir: &std::path::Path, name: &str) -> String {
    let mut b = vec![0u8; 8 << 20];
    b[..2 << 20].copy_from_slice(&noise(7, 2 << 20));
    let text = b"strata keeps one refcounted map per disk version. ".repeat(50_000);
    b[4 << 20..6 << 20].copy_from_slice(&text[..2 << 20]);
    let p = dir.join(name);
    std::fs::write(&p, b).unwrap();
    p.to_str().unwrap().to_string()
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

/// The datastore's used bytes, as `status` says.
fn used(s: &Store) -> u64 {
    u(&s.json(&["status"]), "used_bytes")
}

/// A `--json` answer of `compress`: every field of the report, each of
/// its type, and nothing else.
fn report(v: &serde_json::Value) -> strata_api::CompressReport {
    let fields = [
        "disks",
        "versions",
        "codec",
        "read_bytes",
        "packed_bytes",
        "pair_bytes",
        "quad_bytes",
        "repacked_bytes",
        "stream_bytes",
        "raw_bytes",
        "regions",
        "regions_skipped",
        "unchanged_bytes",
        "used_bytes_before",
        "used_bytes_after",
    ];
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = fields.to_vec();
    want.sort_unstable();
    assert_eq!(keys, want, "{v}");
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

/// Compare a served disk with the image it should hold, every byte.
fn same_as(s: &Store, disk: &str, image: &str) {
    let o = raw_compare(&s.uri(disk), image);
    assert!(
        o.status.success(),
        "{disk} differs from {image}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A key file for `--encrypt`, mode 0600.
fn key(dir: &std::path::Path) -> String {
    let key = dir.join("k");
    std::fs::write(&key, noise(3, 32)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    key.to_str().unwrap().to_string()
}

#[test]
fn cold_grains_pack_and_every_byte_reads_back() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw");
    s.ok(&["import", &img, "a"]);
    s.ok(&["snapshot", "create", "a", "s1"]);
    s.ok(&["clone", "a@s1", "a2"]);
    let key = key(dir.path());
    s.ok(&["import", &img, "e", "--encrypt", "--key-file", &key]);
    s.ok(&["import", &img, "t", "--type", "zeroedthick"]);
    let before = used(&s);

    // "a" with its snapshot (its clone "a2" shares the grains and
    // follows): the text packs, the noise stays raw, the zeros were never
    // stored.
    let r = report(&s.json(&["compress", "--codec", "zstd", "a"]));
    assert_eq!(r.disks, ["a"], "{r:?}");
    assert_eq!(r.versions, 2, "{r:?}");
    assert_eq!(r.codec, "zstd", "{r:?}");
    assert_eq!(r.read_bytes, 4 * MIB, "{r:?}");
    assert_eq!(r.packed_bytes, 2 * MIB, "{r:?}");
    assert_eq!(r.raw_bytes, 2 * MIB, "{r:?}");
    assert!(r.pair_bytes <= r.packed_bytes, "{r:?}");
    assert!(
        r.stream_bytes > 0 && r.stream_bytes < r.packed_bytes / 2,
        "{r:?}"
    );
    assert_eq!(r.regions_skipped, 0, "{r:?}");
    assert!(r.regions > 0, "{r:?}");
    assert_eq!(r.used_bytes_before, before, "{r:?}");
    assert!(r.used_bytes_after < r.used_bytes_before, "{r:?}");
    assert!(r.used_bytes_before - r.used_bytes_after >= MIB, "{r:?}");
    assert_eq!(used(&s), r.used_bytes_after, "{r:?}");
    s.ok(&["check"]);
    // `info` says how much of each head is packed: all of "a"'s text,
    // and of its clone's, which shares it.
    for d in ["a", "a2"] {
        assert_eq!(u(&s.json(&["info", d]), "packed_bytes"), 2 * MIB, "{d}");
    }
    assert!(s.ok(&["info", "a"]).contains("packed:          2 MiB"));
    // The estimate counts them: stored as before, packed in the streams.
    let e = s.json(&["dedup", "--estimate", "a"]);
    assert_eq!(u(&e, "packed_bytes"), r.packed_bytes, "{e}");
    assert_eq!(u(&e, "packed_stored_bytes"), r.stream_bytes, "{e}");
    assert_eq!(u(&e, "stored_bytes"), 4 * MIB, "{e}");
    let human = s.ok(&["dedup", "--estimate", "a"]);
    assert!(
        human.contains("2 MiB of stored grains are packed, in "),
        "{human}"
    );

    // Again: nothing left that shrinks; nothing changes.
    let again = report(&s.json(&["compress", "a"]));
    assert_eq!(again.packed_bytes, 0, "{again:?}");
    assert_eq!(again.used_bytes_after, again.used_bytes_before, "{again:?}");

    // Encrypted and thick disks' grains stay raw (no key needed to say
    // so: "e" is locked here).
    let et = report(&s.json(&["compress", "e", "t"]));
    assert_eq!(et.packed_bytes, 0, "{et:?}");
    assert_eq!(et.used_bytes_after, et.used_bytes_before, "{et:?}");

    // For people: what it packed, into what, and the space.
    let human = s.ok(&["compress", "a2"]);
    assert!(human.starts_with("a2 ("), "{human}");
    assert!(human.contains("stayed raw; used "), "{human}");
    assert!(human.contains("lz4 in "), "{human}");
    s.ok(&["check"]);

    // Every disk and snapshot reads back its bytes through a real
    // client; a write to a packed grain lands in that disk alone.
    let _srv = s.serve();
    for d in ["a", "a@s1", "a2", "t"] {
        same_as(&s, d, &img);
    }
    qemu_io_ok(RAW, &s.uri("a"), &["write -P 0x5b 4M 64k", "flush"]);
    qemu_io_ok(RAW, &s.uri("a"), &["read -P 0x5b 4M 64k"]);
    same_as(&s, "a@s1", &img);
    same_as(&s, "a2", &img);
    let mut want = std::fs::read(&img).unwrap();
    want[4 << 20..(4 << 20) + (64 << 10)].fill(0x5b);
    let a_now = dir.path().join("a-now.raw");
    std::fs::write(&a_now, want).unwrap();
    same_as(&s, "a", a_now.to_str().unwrap());
    s.ok(&["check"]);
}

#[test]
fn wrong_arguments_are_refused_by_name() {
    let s = Store::new();
    s.ok(&["create", "a", "--size", "4M"]);
    s.ok(&["snapshot", "create", "a", "s1"]);
    let before = used(&s);
    // Not found: exit 3 (docs/ERRORS.md).
    let err = s.fails_with(3, &["compress", "nope"]);
    assert!(err.contains("nope"), "{err}");
    let err = s.fails_with(3, &["compress", "a", "nope"]);
    assert!(err.contains("nope"), "{err}");
    // A snapshot comes with its disk, never alone.
    let err = s.fails(&["compress", "a@s1"]);
    assert!(err.contains("'a@s1' is a snapshot"), "{err}");
    // Usage errors: exit 2.
    let err = s.fails_with(2, &["compress", "--rate", "fast"]);
    assert!(err.contains("--rate"), "{err}");
    let err = s.fails_with(2, &["compress", "--codec", "gzip"]);
    assert!(
        err.contains("unknown codec 'gzip' (use lz4 or zstd)"),
        "{err}"
    );
    let err = s.fails_with(2, &["compress", "--lz4"]);
    assert!(err.contains("--lz4"), "{err}");
    // Under --json an error is JSON too.
    let o = s.cmd(&["compress", "nope", "--json"]);
    assert_eq!(o.status.code(), Some(3));
    let e: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
    assert!(e.to_string().contains("nope"), "{e}");
    assert_eq!(used(&s), before, "a refused run changes nothing");
    // The refusals are in the event log, as compress.
    let events = s.ok(&["events"]);
    assert!(
        events
            .lines()
            .any(|l| l.contains("compress") && l.contains("nope")),
        "{events}"
    );
}

/// Through a server: a job like dedup's. `--detach` prints the job,
/// `jobs show ID` its kept answer (tagged `compress`), and the event log
/// has the run; attached, the command prints the job's answer.
#[test]
fn a_served_compress_is_a_job_that_keeps_its_answer() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw");
    for d in ["a", "b"] {
        s.ok(&["import", &img, d]);
    }
    let _srv = s.serve();
    let started = s.json(&["compress", "a", "--detach"]);
    let id = started["id"].as_u64().unwrap();
    assert_eq!(started["what"], "compress a", "{started}");
    let j = s.wait_job(id, "done", Duration::from_secs(120));
    let r = report(&j["result"]["compress"]);
    assert_eq!(r.disks, ["a"], "{j}");
    assert_eq!(r.packed_bytes, 2 * MIB, "{j}");
    assert!(r.used_bytes_after < r.used_bytes_before, "{j}");
    assert_eq!(s.json(&["jobs", "show", &id.to_string()]), j);
    let shown = s.ok(&["jobs", "show", &id.to_string()]);
    assert!(
        shown.contains("compress a") && shown.contains("packed 2 MiB of 4 MiB read"),
        "{shown}"
    );

    // Attached, with zstd: the job's answer is the command's.
    let zstd = report(&s.json(&["compress", "--codec", "zstd", "b"]));
    assert_eq!(zstd.codec, "zstd", "{zstd:?}");
    assert_eq!(zstd.packed_bytes, 2 * MIB, "{zstd:?}");
    let jobs = s.json(&["jobs"]);
    let last = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["what"] == "compress --codec zstd b")
        .unwrap_or_else(|| panic!("no zstd job: {jobs}"));
    assert_eq!(last["state"], "done", "{last}");
    assert_eq!(
        report(&last["result"]["compress"]).packed_bytes,
        zstd.packed_bytes
    );

    let events = s.ok(&["events"]);
    assert!(
        events
            .lines()
            .any(|l| l.contains("compress") && l.contains("--codec zstd")),
        "{events}"
    );
    same_as(&s, "a", &img);
    same_as(&s, "b", &img);
    s.ok(&["check"]);
}

/// `POST /api/v1/compress`: the body of `/dedup` (disks, rate) and
/// `codec`; a job (202); a bad body is a 400 naming the field.
#[test]
fn the_http_api_starts_compress_as_a_job() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw");
    s.ok(&["import", &img, "a"]);
    let tok = s.dir.path().join("http.token");
    let addr = free_addr();
    let _srv = s.serve_with(&["--http", &addr, "--http-token", tok.to_str().unwrap()]);
    wait_http(&addr);
    let token = std::fs::read_to_string(&tok).unwrap().trim().to_string();
    let auth = format!("Bearer {token}");
    let post = |body: &str| {
        http(
            &addr,
            "POST",
            "/api/v1/compress",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    for (body, says) in [
        (r#"{"disks": "a"}"#, "list of disk names"),
        (r#"{"rate": "fast"}"#, "fast"),
        (r#"{"codec": true}"#, "codec"),
        (r#"{"codec": "gzip"}"#, "gzip"),
    ] {
        let (st, answer) = post(body);
        assert_eq!(st, 400, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer}");
    }
    let (st, answer) = post(r#"{"disks": ["a"], "codec": "zstd", "rate": "100M"}"#);
    assert_eq!(st, 202, "{answer}");
    let job: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let id = job["id"].as_u64().unwrap();
    let j = s.wait_job(id, "done", Duration::from_secs(120));
    let r = report(&j["result"]["compress"]);
    assert_eq!(r.codec, "zstd", "{j}");
    assert_eq!(r.disks, ["a"], "{j}");
    // The disk's packed bytes in /metrics, as `info` says them.
    let packed = sample(&metrics(&addr), "strata_disk_packed_bytes{disk=\"a\"}");
    assert_eq!(packed as u64, r.packed_bytes, "{j}");
    let (st, answer) = post(r#"{"disks": ["nope"]}"#);
    // Started as a job; the job fails naming the disk.
    assert_eq!(st, 202, "{answer}");
    let job: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let failed = s.wait_job(
        job["id"].as_u64().unwrap(),
        "failed",
        Duration::from_secs(60),
    );
    assert!(
        failed["error"].as_str().unwrap().contains("nope"),
        "{failed}"
    );
    same_as(&s, "a", &img);
}

#[test]
fn an_object_store_says_packing_is_for_local_datastores() {
    if strata_s3::testing::shared().is_none() {
        return;
    }
    let s = Store::of(Kind::ObjectStore);
    s.ok(&["create", "a", "--size", "4M"]);
    for args in [
        &["compress", "a"][..],
        &["compress"],
        &["compress", "--codec", "zstd", "a"],
    ] {
        // Unsupported: exit 10 (docs/ERRORS.md).
        let err = s.fails_with(10, args);
        assert!(
            err.contains("compress on this object-store datastore")
                && err.contains("for local datastores in this version"),
            "{err}"
        );
    }
    let st = s.json(&["status"]);
    let cannot = st["cannot"].as_array().unwrap();
    assert!(cannot.iter().any(|c| c["command"] == "compress"), "{st}");
}

/// `serve --compress-interval N` packs the disks no client has changed
/// for `--compress-cold`, and leaves a disk being written raw until it
/// too has gone unchanged that long.
#[test]
fn serve_packs_cold_disks_in_the_background() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw");
    s.ok(&["import", &img, "cold"]);
    s.ok(&["import", &img, "busy"]);
    let _srv = s.serve_with(&["--compress-interval", "1", "--compress-cold", "5"]);
    let passes = |s: &Store| -> Vec<serde_json::Value> {
        let jobs = s.json(&["jobs"]);
        jobs.as_array()
            .unwrap()
            .iter()
            .filter(|j| j["what"].as_str().unwrap_or("").starts_with("compress"))
            .cloned()
            .collect()
    };
    // A client writes "busy" (zeros where the image has zeros) about
    // twice a second until the cold disk has been packed: no pass takes
    // "busy" meanwhile.
    let t = std::time::Instant::now();
    let packed = loop {
        qemu_io_ok(RAW, &s.uri("busy"), &["write -P 0 7M 4k"]);
        let jobs = passes(&s);
        for j in &jobs {
            assert!(
                !j["what"].as_str().unwrap().contains("busy"),
                "a disk being written was packed: {jobs:?}"
            );
        }
        if let Some(j) = jobs
            .iter()
            .find(|j| j["what"] == "compress cold" && j["state"] == "done")
        {
            break report(&j["result"]["compress"]);
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no background compress of 'cold' in 60 s: {jobs:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(packed.packed_bytes, 2 * MIB, "{packed:?}");
    assert_eq!(packed.codec, "lz4", "{packed:?}");
    // Left alone, "busy" goes cold and is packed too.
    eventually("'busy' packed", Duration::from_secs(60), || {
        passes(&s).iter().any(|j| {
            j["state"] == "done"
                && j["what"].as_str().unwrap().contains("busy")
                && j["result"]["compress"]["packed_bytes"] == 2 * MIB
        })
    });
    // Both taken and unchanged since: no pass reads them again.
    let finished = |s: &Store| s.jobs_finished_by("server (--compress-interval)");
    // (The last pass's end may reach the event log just after its job
    // shows done.)
    std::thread::sleep(Duration::from_millis(1500));
    let passes_run = finished(&s);
    assert!(passes_run >= 2, "{passes_run}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(finished(&s), passes_run, "a pass over disks already packed");
    same_as(&s, "cold", &img);
    same_as(&s, "busy", &img);
}

/// A served pass is a job: clients write into the grains it packs while
/// it runs, a kill -9 stops it in the middle, and running it again
/// finishes; every disk reads back what it should and `check` finds the
/// counts exact.
#[test]
fn a_served_pass_survives_client_writes_and_a_kill_9() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw");
    for d in ["a", "b", "c", "d"] {
        s.ok(&["import", &img, d]);
    }
    let srv = s.serve();
    // 32 MiB to read at 2 MB/s, a region (1 MiB of each disk) in two
    // seconds.
    let started = s.json(&["compress", "--codec", "zstd", "--rate", "2M", "--detach"]);
    let id = started["id"].as_u64().unwrap();
    s.wait_job(id, "running", Duration::from_secs(60));
    // Past the first MiB of text (its region packed on every disk), in
    // the second.
    eventually("the pass in the text", Duration::from_secs(60), || {
        s.job(id)["done"].as_u64().unwrap_or(0) >= 5 * MIB
    });
    // Flushed writes while it runs: into "a"'s text (the region being
    // packed) and "b"'s noise.
    qemu_io_ok(RAW, &s.uri("a"), &["write -P 0xa5 5184k 128k", "flush"]);
    qemu_io_ok(RAW, &s.uri("b"), &["write -P 0x5a 1M 8k", "flush"]);
    assert_eq!(s.job(id)["state"], "running", "the pass ended too soon");
    srv.kill9();

    let srv = s.serve();
    let r = report(&s.json(&["compress", "--codec", "zstd"]));
    assert_eq!(r.regions_skipped, 0, "{r:?}");
    // The killed pass's first text region stayed packed: left are at
    // most the second (4 MiB, "a"'s new 128 KiB among it) and "b"'s new
    // 8 KiB.
    assert!(r.packed_bytes <= 4 * MIB + (8 << 10), "{r:?}");
    for d in ["c", "d"] {
        same_as(&s, d, &img);
    }
    let want = std::fs::read(&img).unwrap();
    for (d, at, len, byte) in [
        ("a", 5184 << 10, 128 << 10, 0xa5u8),
        ("b", 1 << 20, 8 << 10, 0x5a),
    ] {
        let mut w = want.clone();
        w[at..at + len].fill(byte);
        let p = dir.path().join(format!("{d}-now.raw"));
        std::fs::write(&p, w).unwrap();
        same_as(&s, d, p.to_str().unwrap());
    }
    // Everything that packs is packed: a third pass finds nothing.
    let again = report(&s.json(&["compress", "--codec", "zstd"]));
    assert_eq!(again.packed_bytes, 0, "{again:?}");
    drop(srv);
    s.ok(&["check"]);
}

/// Repacking (FORMAT.md §18.10) through a real client and a server: the
/// text packed, then three quarters of it written over through NBD (so
/// each stream grain keeps a quarter of its fragments); the next pass, a
/// job of the server, moves the live quarter into new streams and frees
/// the old grains, and qemu-img finds every byte as written.
/// Through one server, a pass leaves unread the raw grains of regions an
/// earlier pass found nothing to pack in, unless a client wrote there
/// since (FORMAT.md §18.5): the noise is read by the first pass and not
/// by the next; text written in place over noise has that region read
/// again and packed; a run without the server reads everything.
#[test]
fn a_served_pass_reads_again_only_regions_written_since() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw");
    s.ok(&["import", &img, "n"]);
    let _srv = s.serve();
    let pass = || report(&s.json(&["compress", "n"]));
    let first = pass();
    assert_eq!(first.read_bytes, 4 * MIB, "{first:?}");
    assert_eq!(first.packed_bytes, 2 * MIB, "{first:?}");
    assert_eq!(first.unchanged_bytes, 0, "{first:?}");
    // The noise's two regions found nothing to pack and are not read; the
    // text's streams are, to see that none is half dead, then not again.
    let second = pass();
    assert_eq!(second.read_bytes, first.stream_bytes, "{second:?}");
    assert_eq!(second.unchanged_bytes, 2 * MIB, "{second:?}");
    assert_eq!(second.packed_bytes, 0, "{second:?}");
    let human = s.ok(&["compress", "n"]);
    assert!(
        human.contains("2 MiB raw not read again: unchanged since"),
        "{human}"
    );

    // 64 KiB of a repeated byte over the noise of the second region.
    let mut want = std::fs::read(&img).unwrap();
    qemu_io_ok(RAW, &s.uri("n"), &["write -P 0x5b 1114112 64k", "flush"]);
    want[1114112..1114112 + (64 << 10)].fill(0x5b);
    let want_path = dir.path().join("want.raw");
    std::fs::write(&want_path, &want).unwrap();
    let want_path = want_path.to_str().unwrap();
    let third = pass();
    assert_eq!(third.read_bytes, MIB, "{third:?}");
    assert_eq!(third.packed_bytes, 64 << 10, "{third:?}");
    assert_eq!(third.unchanged_bytes, MIB, "{third:?}");
    // The region just packed is read once more (its leftovers and its
    // stream), then not.
    let fourth = pass();
    assert_eq!(
        fourth.read_bytes,
        MIB - (64 << 10) + third.stream_bytes,
        "{fourth:?}"
    );
    assert_eq!(fourth.packed_bytes, 0, "{fourth:?}");
    let fifth = pass();
    assert_eq!(fifth.read_bytes, 0, "{fifth:?}");
    assert_eq!(fifth.unchanged_bytes, 2 * MIB - (64 << 10), "{fifth:?}");
    same_as(&s, "n", want_path);
    drop(_srv);

    // What a pass notes lives in its process: a run without the server
    // reads the noise and every stream again.
    let offline = pass();
    assert_eq!(offline.unchanged_bytes, 0, "{offline:?}");
    assert_eq!(
        offline.read_bytes,
        2 * MIB - (64 << 10) + first.stream_bytes + third.stream_bytes,
        "{offline:?}"
    );
    s.ok(&["check"]);
}

#[test]
fn half_dead_streams_are_repacked_through_a_server() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw");
    s.ok(&["import", &img, "r"]);
    let first = report(&s.json(&["compress", "r"]));
    assert_eq!(first.packed_bytes, 2 * MIB, "{first:?}");
    assert_eq!(first.repacked_bytes, 0, "{first:?}");
    let _srv = s.serve();
    let mut want = std::fs::read(&img).unwrap();
    let mut cmds = Vec::new();
    for chunk in 0..32u64 {
        let at = (4 << 20) + chunk * (64 << 10);
        cmds.push(format!("write -P 0x5b {at} 48k"));
        want[at as usize..at as usize + (48 << 10)].fill(0x5b);
    }
    cmds.push("flush".into());
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io_ok(RAW, &s.uri("r"), &cmds);
    let want_path = dir.path().join("want.raw");
    std::fs::write(&want_path, &want).unwrap();
    let want_path = want_path.to_str().unwrap();
    same_as(&s, "r", want_path);
    let before = used(&s);
    let e0 = s.json(&["dedup", "--estimate", "r"]);

    // Through the server, a job: the new raw grains (0x5b) pack, and the
    // streams a quarter alive are repacked.
    let r = report(&s.json(&["compress", "r"]));
    assert!(r.repacked_bytes > 0, "{r:?}");
    assert_eq!(r.regions_skipped, 0, "{r:?}");
    let e1 = s.json(&["dedup", "--estimate", "r"]);
    assert_eq!(
        u(&e1, "packed_bytes"),
        u(&e0, "packed_bytes") + r.packed_bytes,
        "{e0} {e1}"
    );
    // Every old stream grain went: what is stored packed now is the new
    // streams of both kinds, under what the old ones took.
    assert!(
        u(&e1, "packed_stored_bytes") < u(&e0, "packed_stored_bytes") + r.stream_bytes,
        "{e0} {e1} {r:?}"
    );
    assert!(used(&s) < before, "{r:?}");
    same_as(&s, "r", want_path);
    // A pass after it moves nothing.
    let again = report(&s.json(&["compress", "r"]));
    assert_eq!(again.repacked_bytes, 0, "{again:?}");
    same_as(&s, "r", want_path);
    drop(_srv);
    s.ok(&["check"]);
}

/// Free-space consolidation on a packed disk (FORMAT.md §10.4): its
/// streams above the new end move down by repacking, so the pool ends
/// where the used grains do, and the disk reads back through qemu-img.
#[test]
fn free_space_consolidation_brings_streams_down() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "p.raw");
    let low = dir.path().join("low.raw");
    std::fs::write(&low, noise(11, 24 << 20)).unwrap();
    s.ok(&["import", low.to_str().unwrap(), "low"]);
    s.ok(&["import", &img, "p"]);
    s.ok(&["compress", "p"]);
    s.ok(&["rm", "low"]);
    let r = s.json(&["defrag", "--free-space"]);
    assert!(r.get("note").is_none(), "{r}");
    assert!(u(&r, "repacked_bytes") > 0, "{r}");
    assert!(u(&r, "pool_bytes_after") < 16 * MIB, "{r}");
    assert!(u(&r, "pool_bytes_before") > 24 * MIB, "{r}");
    s.ok(&["check"]);
    let human = s.ok(&["defrag", "--free-space"]);
    assert!(!human.contains("note:"), "{human}");
    let _srv = s.serve();
    let o = raw_compare(&s.uri("p"), &img);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}
