//! Space reduction (issue 64): `dedup --estimate` reads every version's
//! grains once and says what re-sharing would free, exactly at the same
//! offset, by sample at any offset, and how a sample compresses; it
//! changes nothing and needs no key, offline and through the server.
//! `dedup` frees what the estimate said, every disk reading back its bytes
//! through qemu-img, under client writes and across a kill -9.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;

const MIB: u64 = 1 << 20;

/// An 8 MiB image: 2 MiB of noise, 2 MiB of zeros, 2 MiB of text, 2 MiB
/// of zeros; with `differ`, its first MiB is other noise.
fn image(dir: &std::path::Path, name: &str, differ: bool) -> String {
    let mut b = vec![0u8; 8 << 20];
    b[..2 << 20].copy_from_slice(&noise(7, 2 << 20));
    if differ {
        b[..1 << 20].copy_from_slice(&noise(99, 1 << 20));
    }
    let text = b"strata keeps one refcounted map per disk version. ".repeat(50_000);
    b[4 << 20..6 << 20].copy_from_slice(&text[..2 << 20]);
    let p = dir.join(name);
    std::fs::write(&p, b).unwrap();
    p.to_str().unwrap().to_string()
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

#[test]
fn the_estimate_finds_equal_grains_changes_nothing_and_needs_no_key() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let (same, other) = (
        image(dir.path(), "a.raw", false),
        image(dir.path(), "c.raw", true),
    );
    s.ok(&["import", &same, "a"]);
    s.ok(&["import", &same, "b"]);
    s.ok(&["import", &other, "c"]);
    s.ok(&["snapshot", "create", "a", "s1"]);
    s.ok(&["clone", "a@s1", "a2"]);
    let used = |s: &Store| u(&s.json(&["status"]), "used_bytes");
    let before = used(&s);

    // Every disk: a, a@s1 and a2 share one copy (4 MiB mapped each: the
    // zeros were not stored); b equals a grain for grain, c in 3 of its
    // 4 MiB.
    let e = s.json(&["dedup", "--estimate"]);
    assert_eq!(u(&e, "versions"), 5, "{e}");
    assert_eq!(u(&e, "logical_bytes"), 20 * MIB, "{e}");
    assert_eq!(u(&e, "stored_bytes"), 12 * MIB, "{e}");
    assert_eq!(u(&e, "shared_bytes"), 8 * MIB, "{e}");
    assert_eq!(u(&e, "same_offset_bytes"), 7 * MIB, "{e}");
    assert_eq!(u(&e, "read_bytes"), 12 * MIB, "{e}");
    // The text repeats every 51 bytes, so its grains repeat at other
    // offsets too: sharing at any offset frees more. Under a million
    // distinct grains the sample is all of them.
    assert_eq!(u(&e, "sample_every"), 1, "{e}");
    assert_eq!(u(&e, "sample_grains"), 3 * 1024, "{e}");
    assert!(u(&e, "any_offset_bytes") > 8 * MIB, "{e}");
    assert!(u(&e, "any_offset_bytes") < 12 * MIB, "{e}");
    assert_eq!(u(&e, "zero_bytes"), 0, "{e}");
    assert_eq!(u(&e, "encrypted_bytes"), 0, "{e}");
    // Every 64th distinct grain: a third noise (no gain), the rest text.
    let sampled = u(&e, "compress_sampled_grains");
    assert_eq!(sampled, 3 * 1024 / 64, "{e}");
    let packable = u(&e, "packable_grains");
    assert!(packable > 0 && packable < sampled, "{e}");
    assert!(
        u(&e, "compress_sampled_bytes_after") < sampled * 4096,
        "{e}"
    );
    assert_eq!(e["disks"], serde_json::json!(["a", "b", "c", "a2"]), "{e}");

    // Named disks only (their snapshots come with them).
    let ab = s.json(&["dedup", "--estimate", "a", "b"]);
    assert_eq!(u(&ab, "versions"), 3, "{ab}");
    assert_eq!(u(&ab, "same_offset_bytes"), 4 * MIB, "{ab}");
    let human = s.ok(&["dedup", "--estimate", "a", "c"]);
    assert!(
        human.contains("at the same offset would free 3 MiB"),
        "{human}"
    );
    assert_eq!(used(&s), before, "an estimate changes nothing");

    // Encrypted disks: compared as stored, never with another keyring's
    // grains, and their compressibility needs the key. They are locked
    // here (no server holds their keys) and the estimate still runs.
    let key = dir.path().join("k");
    std::fs::write(&key, noise(3, 32)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = key.to_str().unwrap();
    s.ok(&["import", &same, "e1", "--encrypt", "--key-file", key]);
    s.ok(&["import", &same, "e2", "--encrypt", "--key-file", key]);
    let before = used(&s);
    let enc = s.json(&["dedup", "--estimate", "a", "e1", "e2"]);
    assert_eq!(u(&enc, "stored_bytes"), 12 * MIB, "{enc}");
    assert_eq!(u(&enc, "same_offset_bytes"), 0, "{enc}");
    assert_eq!(u(&enc, "encrypted_bytes"), 8 * MIB, "{enc}");
    assert!(u(&enc, "compress_sampled_grains") <= 4 * 1024 / 64, "{enc}");
    let human = s.ok(&["dedup", "--estimate", "e1"]);
    assert!(human.contains("needs the key"), "{human}");
    assert_eq!(used(&s), before);

    // Thick disks' grains stay where their reservation put them: never
    // counted as shareable, not even two eager-zeroed disks' zeros.
    s.ok(&["create", "t1", "--size", "4M", "--type", "eagerzeroedthick"]);
    s.ok(&["create", "t2", "--size", "4M", "--type", "eagerzeroedthick"]);
    let before = used(&s);
    let thick = s.json(&["dedup", "--estimate", "t1", "t2"]);
    assert_eq!(u(&thick, "stored_bytes"), 8 * MIB, "{thick}");
    assert_eq!(u(&thick, "same_offset_bytes"), 0, "{thick}");
    assert_eq!(u(&thick, "any_offset_bytes"), 0, "{thick}");
    assert_eq!(u(&thick, "zero_bytes"), 0, "{thick}");

    // Nothing changed; the datastore checks clean.
    assert_eq!(used(&s), before);
    s.ok(&["check"]);

    // Wrong arguments: a snapshot, a disk that does not exist.
    let err = s.fails(&["dedup", "--estimate", "a@s1"]);
    assert!(err.contains("'a@s1' is a snapshot"), "{err}");
    let err = s.fails(&["dedup", "--estimate", "nope"]);
    assert!(err.contains("nope"), "{err}");

    // Through a running server: a job, the same figures.
    let _srv = s.serve();
    let served = s.json(&["dedup", "--estimate", "a", "b"]);
    assert_eq!(served, ab);
}

#[test]
fn an_object_store_says_dedup_is_not_built_there() {
    if strata_s3::testing::shared().is_none() {
        return;
    }
    let s = Store::of(Kind::ObjectStore);
    s.ok(&["create", "a", "--size", "4M"]);
    for args in [&["dedup", "--estimate", "a"][..], &["dedup", "a"]] {
        let err = s.fails(args);
        assert!(
            err.contains("dedup on this object-store datastore is not implemented"),
            "{err}"
        );
    }
}

/// A served estimate is a job: a snapshot deleted and a disk reverted
/// under it are followed (each region takes the versions again), and a
/// cancel stops it between regions.
#[test]
fn a_served_estimate_follows_changes_under_it_and_can_be_cancelled() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", false);
    s.ok(&["import", &img, "a"]);
    s.ok(&["import", &img, "b"]);
    s.ok(&["snapshot", "create", "a", "s1"]);
    s.ok(&["snapshot", "create", "b", "s2"]);
    let _srv = s.serve();
    // 8 MiB stored at 2 MB/s: about four seconds, with the command
    // attached (it prints the job's result when it ends).
    let r = std::thread::scope(|scope| {
        let run = scope.spawn(|| s.json(&["dedup", "--estimate", "--rate", "2M"]));
        let t = std::time::Instant::now();
        while s.json(&["jobs"]).as_array().is_none_or(|j| j.is_empty()) {
            assert!(t.elapsed().as_secs() < 30, "the estimate never started");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        s.ok(&["snapshot", "delete", "a", "s1"]);
        s.ok(&["snapshot", "revert", "b", "s2"]);
        run.join().unwrap()
    });
    assert_eq!(u(&r, "versions"), 4, "{r}");
    assert_eq!(u(&r, "stored_bytes"), 8 * MIB, "{r}");
    assert_eq!(u(&r, "same_offset_bytes"), 4 * MIB, "{r}");
    // The job keeps what it answered: `jobs show` prints it as the
    // command did, and `jobs --json` carries it, tagged with its kind.
    let j = s.job(1);
    assert_eq!(j["state"], "done");
    assert_eq!(j["result"]["dedup_estimate"], r, "{j}");
    assert_eq!(s.json(&["jobs", "show", "1"]), j);
    let shown = s.ok(&["jobs", "show", "1"]);
    assert!(
        shown.contains("dedup --estimate")
            && shown.contains("re-sharing equal grains at the same offset would free 4 MiB"),
        "{shown}"
    );
    let none = s.fails(&["jobs", "show", "99"]);
    assert!(none.contains("no job 99"), "{none}");

    let started = s.json(&["dedup", "--estimate", "--rate", "1M", "--detach"]);
    let id = started["id"].as_u64().unwrap();
    s.wait_job(id, "running", Duration::from_secs(60));
    s.ok(&["jobs", "cancel", &id.to_string()]);
    let j = s.wait_job(id, "cancelled", Duration::from_secs(60));
    assert!(j["error"].as_str().unwrap().contains("cancel"), "{j}");
    assert!(j.get("result").is_none(), "{j}");
    s.ok(&["check"]);
    // The answers outlive the server (jobs.json).
    drop(_srv);
    let _srv = s.serve();
    assert_eq!(s.job(1)["result"]["dedup_estimate"], r);
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

#[test]
fn copies_become_one_and_every_byte_reads_back() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let (same, other) = (
        image(dir.path(), "a.raw", false),
        image(dir.path(), "c.raw", true),
    );
    s.ok(&["import", &same, "a"]);
    s.ok(&["import", &same, "b"]);
    s.ok(&["import", &other, "c"]);
    s.ok(&["snapshot", "create", "a", "s1"]);
    s.ok(&["clone", "a@s1", "a2"]);
    let key = dir.path().join("k");
    std::fs::write(&key, noise(3, 32)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = key.to_str().unwrap();
    s.ok(&["import", &same, "e1", "--encrypt", "--key-file", key]);
    s.ok(&["import", &same, "e2", "--encrypt", "--key-file", key]);
    s.ok(&["import", &same, "t", "--type", "zeroedthick"]);
    let used = |s: &Store| u(&s.json(&["status"]), "used_bytes");
    let est = s.json(&["dedup", "--estimate"]);
    let before = used(&s);

    // The pass frees exactly what the estimate said: b's copy of a
    // (4 MiB) and c's 3 MiB equal to a's; the encrypted disks are of two
    // keyrings and "t" is thick, so they keep their grains.
    let r = s.json(&["dedup"]);
    assert_eq!(
        u(&r, "freed_bytes"),
        u(&est, "same_offset_bytes"),
        "{r} {est}"
    );
    assert_eq!(u(&r, "freed_bytes"), 7 * MIB, "{r}");
    assert_eq!(u(&r, "used_bytes_before"), before, "{r}");
    assert_eq!(before - used(&s), 7 * MIB, "{r}");
    assert_eq!(u(&r, "regions_skipped"), 0, "{r}");
    assert_eq!(u(&r, "grains_kept"), 0, "{r}");
    assert_eq!(u(&s.json(&["dedup", "--estimate"]), "same_offset_bytes"), 0);
    // `status` counts what the disks and snapshots map (the estimate's
    // logical bytes, O(1) per version), the same before and after.
    let st = s.json(&["status"]);
    assert_eq!(u(&st, "logical_bytes"), u(&est, "logical_bytes"), "{st}");
    let human = s.ok(&["status"]);
    assert!(human.contains("of disks and snapshots"), "{human}");
    let human = s.ok(&["dedup", "a", "b"]);
    assert!(human.contains("freed 0 B"), "{human}");
    s.ok(&["check"]);

    // Every disk reads back its bytes through a real client; a write to a
    // shared grain lands in that disk alone.
    let _srv = s.serve();
    for d in ["a", "b", "a2", "a@s1", "t"] {
        same_as(&s, d, &same);
    }
    same_as(&s, "c", &other);
    qemu_io_ok(&["-f", "raw"], &s.uri("b"), &["write -P 0x5b 1M 64k"]);
    same_as(&s, "a", &same);
    same_as(&s, "a2", &same);
    qemu_io_ok(&["-f", "raw"], &s.uri("b"), &["read -P 0x5b 1M 64k"]);
    s.ok(&["check"]);
}

/// Copies packed apart (FORMAT.md §17.2b): the pass points them at the
/// oldest copy's streams, frees a raw copy's grains equal to packed ones,
/// and every disk reads back its bytes through qemu-img.
#[test]
fn copies_packed_apart_become_one_and_read_back() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", false);
    for d in ["a", "b", "r"] {
        s.ok(&["import", &img, d]);
    }
    s.ok(&["compress", "a"]);
    s.ok(&["compress", "b", "--codec", "zstd"]);
    let est = s.json(&["dedup", "--estimate"]);
    // b's 2 MiB of text, packed, point at a's; r's text (raw) is freed
    // into a's packed grains, and b's and r's noise (raw) into a's.
    assert_eq!(u(&est, "same_offset_packed_bytes"), 2 * MIB, "{est}");
    assert_eq!(u(&est, "same_offset_bytes"), 6 * MIB, "{est}");
    let before = u(&s.json(&["status"]), "used_bytes");
    let r = s.json(&["dedup"]);
    assert_eq!(u(&r, "packed_merged_bytes"), 2 * MIB, "{r}");
    // The raw grains, and b's streams, which lost every fragment.
    let streams = u(&r, "freed_bytes") - 6 * MIB;
    assert!(streams > 0 && streams < MIB, "{r}");
    assert_eq!(
        before - u(&s.json(&["status"]), "used_bytes"),
        u(&r, "freed_bytes")
    );
    let again = s.json(&["dedup", "--estimate"]);
    assert_eq!(u(&again, "same_offset_packed_bytes"), 0, "{again}");
    assert_eq!(u(&again, "same_offset_bytes"), 0, "{again}");
    s.ok(&["check"]);
    let _srv = s.serve();
    for d in ["a", "b", "r"] {
        same_as(&s, d, &img);
    }
    // A write to the shared packed grains lands in that disk alone.
    qemu_io_ok(&["-f", "raw"], &s.uri("r"), &["write -P 0x5b 4M 64k"]);
    same_as(&s, "a", &img);
    same_as(&s, "b", &img);
    qemu_io_ok(&["-f", "raw"], &s.uri("r"), &["read -P 0x5b 4M 64k"]);
    s.ok(&["check"]);
}

/// A served pass is a job: clients write while it runs, a kill -9 stops it
/// in the middle, and running it again finishes; every disk reads back
/// what it should, and one copy of the image is left.
#[test]
fn a_served_pass_survives_client_writes_and_a_kill_9() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", false);
    for d in ["a", "b", "c", "d"] {
        s.ok(&["import", &img, d]);
    }
    let used = |s: &Store| u(&s.json(&["status"]), "used_bytes");
    let four = used(&s);
    let srv = s.serve();
    // 12 MiB to compare at 2 MB/s: about six seconds.
    let started = s.json(&["dedup", "--rate", "2M", "--detach"]);
    let id = started["id"].as_u64().unwrap();
    s.wait_job(id, "running", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(1500));
    // Writes while it runs: one flushed range of "a", and the same bytes
    // written again over "b" (new grains, equal to the others).
    qemu_io_ok(
        &["-f", "raw"],
        &s.uri("a"),
        &["write -P 0xa5 2M 128k", "flush"],
    );
    raw_copy(&img, &s.uri("b"));
    assert_eq!(s.job(id)["state"], "running", "the pass ended too soon");
    srv.kill9();

    let srv = s.serve();
    let r = s.json(&["dedup"]);
    assert_eq!(u(&r, "regions_skipped"), 0, "{r}");
    // One copy of the image and a's own 128 KiB are left.
    let one = four / 4;
    let now = used(&s);
    assert!(now <= one + MIB, "{now} used of one copy's {one}: {r}");
    for d in ["b", "c", "d"] {
        same_as(&s, d, &img);
    }
    let mut want = std::fs::read(&img).unwrap();
    want[2 << 20..(2 << 20) + (128 << 10)].fill(0xa5);
    let a_img = dir.path().join("a-now.raw");
    std::fs::write(&a_img, want).unwrap();
    same_as(&s, "a", a_img.to_str().unwrap());
    drop(srv);
    s.ok(&["check"]);
}

/// `import --base`: an identical image writes nothing and takes no room;
/// one with its first MiB changed writes that MiB; zeros where the base
/// has data are unmapped; every byte reads back; the base is untouched
/// by writes to the new disk; wrong combinations are refused by name.
#[test]
fn import_onto_a_base_writes_only_what_differs() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let (same, other) = (
        image(dir.path(), "a.raw", false),
        image(dir.path(), "c.raw", true),
    );
    s.ok(&["import", &same, "a"]);
    let used = |s: &Store| u(&s.json(&["status"]), "used_bytes");
    let before = used(&s);
    let r = s.json(&["import", &same, "b", "--base", "a"]);
    let b = &r["base"];
    assert_eq!(u(b, "written_bytes"), 0, "{r}");
    assert_eq!(u(b, "unmapped_bytes"), 0, "{r}");
    assert_eq!(u(b, "same_bytes"), 4 * MIB, "{r}");
    assert!(r["disk"]["parent"].is_null(), "{r}");
    // Only map nodes (a root and a leaf at most) are new.
    assert!(
        used(&s) - before <= 8 << 10,
        "{} more used",
        used(&s) - before
    );
    let r = s.json(&["import", &other, "c", "--base", "a"]);
    assert_eq!(u(&r["base"], "written_bytes"), MIB, "{r}");
    assert_eq!(u(&r["base"], "same_bytes"), 3 * MIB, "{r}");

    // A sparse image of zeros, larger than the base: everything the base
    // holds is unmapped there, and the disk is the image's size.
    let zeros = dir.path().join("z.raw");
    std::fs::File::create(&zeros)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let err = s.fails(&["import", zeros.to_str().unwrap(), "z", "--base", "a@s"]);
    assert!(err.contains("no snapshot named 's'"), "{err}");
    s.ok(&["snapshot", "create", "a", "s"]);
    let r = s.json(&["import", zeros.to_str().unwrap(), "z", "--base", "a@s"]);
    assert_eq!(u(&r["base"], "unmapped_bytes"), 4 * MIB, "{r}");
    assert_eq!(u(&r["base"], "written_bytes"), 0, "{r}");
    assert_eq!(u(&r["disk"], "size_bytes"), 16 * MIB, "{r}");
    assert_eq!(u(&r["disk"], "allocated_bytes"), 0, "{r}");

    // Refused: a base larger than the image, thick, an encrypted import,
    // a VMDK image; none leaves a disk behind.
    let small = dir.path().join("small.raw");
    std::fs::write(&small, noise(5, 1 << 20)).unwrap();
    let err = s.fails(&["import", small.to_str().unwrap(), "x", "--base", "a"]);
    assert!(err.contains("does not shrink"), "{err}");
    let err = s.fails(&["import", &same, "x", "--base", "a", "--type", "zeroedthick"]);
    assert!(err.contains("--type zeroedthick"), "{err}");
    let err = s.fails(&["import", &same, "x", "--base", "nope"]);
    assert!(err.contains("nope"), "{err}");
    assert!(!s.disk_names().contains(&"x".to_string()));
    s.ok(&["check"]);

    // Every byte, through a real client; writes to b stay in b.
    let _srv = s.serve();
    same_as(&s, "a", &same);
    same_as(&s, "b", &same);
    same_as(&s, "c", &other);
    same_as(&s, "z", zeros.to_str().unwrap());
    qemu_io_ok(&["-f", "raw"], &s.uri("b"), &["write -P 0x3c 0 1M"]);
    same_as(&s, "a", &same);
    same_as(&s, "a@s", &same);
    s.ok(&["check"]);
}

/// `import-diff` leaves a grain alone when the stream carries the bytes
/// the disk holds already: applying a stream twice, with a snapshot
/// between, unshares nothing (an rbd diff of whole objects carries much
/// that did not change).
#[test]
fn import_diff_leaves_equal_grains_shared() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", false);
    s.ok(&["import", &img, "a"]);
    let stream = dir.path().join("a.diff");
    s.ok(&["export-diff", "a", stream.to_str().unwrap()]);
    s.ok(&["create", "b", "--size", "8M"]);
    let r = s.json(&["import-diff", stream.to_str().unwrap(), "b"]);
    assert_eq!(u(&r, "same_bytes"), 0, "{r}");
    s.ok(&["snapshot", "create", "b", "s"]);
    let used = |s: &Store| u(&s.json(&["status"]), "used_bytes");
    let before = used(&s);
    let r = s.json(&["import-diff", stream.to_str().unwrap(), "b"]);
    assert_eq!(u(&r, "same_bytes"), u(&r, "data_bytes"), "{r}");
    assert!(u(&r, "data_bytes") >= 4 * MIB, "{r}");
    assert_eq!(used(&s), before, "the second apply unshared grains");
    let human = s.ok(&["import-diff", stream.to_str().unwrap(), "b"]);
    assert!(human.contains("held already, left shared"), "{human}");
    let _srv = s.serve();
    same_as(&s, "b", &img);
    same_as(&s, "b@s", &img);
}

/// `serve --dedup-interval N` runs the pass over every disk in the
/// background: two copies imported become one without a command.
#[test]
fn serve_runs_dedup_in_the_background_when_asked() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", false);
    s.ok(&["import", &img, "a"]);
    s.ok(&["import", &img, "b"]);
    let used = |s: &Store| u(&s.json(&["status"]), "used_bytes");
    let before = used(&s);
    let _srv = s.serve_with(&["--dedup-interval", "1"]);
    eventually("the background dedup", Duration::from_secs(60), || {
        before - used(&s) >= 4 * MIB
    });
    same_as(&s, "a", &img);
    same_as(&s, "b", &img);
    // Each pass is a job of the server, started by it; the one that freed
    // the copy stays listed with its answer, the later ones (nothing
    // left to free) leave the list once done. Their ends are in the
    // event log.
    let passes = |s: &Store| -> Vec<serde_json::Value> {
        let jobs = s.json(&["jobs"]);
        jobs.as_array()
            .unwrap()
            .iter()
            .filter(|j| j["what"] == "dedup (every disk)" && j["state"] == "done")
            .cloned()
            .collect()
    };
    let finished = |s: &Store| s.jobs_finished_by("server (--dedup-interval)");
    eventually("three passes", Duration::from_secs(60), || {
        finished(&s) >= 3
    });
    let done = passes(&s);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0]["result"]["dedup"]["freed_bytes"], 4 * MIB);
}
