//! Real clients nobody here wrote: qemu-img, qemu-io, nbdinfo and fio, over
//! NBD against `strata serve`, including a kill -9 in the middle of fio.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

use std::io::Write;

/// A 256 MiB sparse raw image with random data in some 1 MiB regions.
fn make_source(path: &std::path::Path) -> Vec<(u64, u64)> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let f = std::fs::File::create(path).unwrap();
    f.set_len(256 << 20).unwrap();
    let mut data_regions = Vec::new();
    let mut w = std::io::BufWriter::new(&f);
    for mib in 0..256u64 {
        if mib % 3 == 0 || mib % 7 == 0 {
            let mut buf = vec![0u8; 1 << 20];
            rng.fill(&mut buf[..]);
            std::io::Seek::seek(&mut w, std::io::SeekFrom::Start(mib << 20)).unwrap();
            w.write_all(&buf).unwrap();
            data_regions.push((mib << 20, 1 << 20));
        }
    }
    w.flush().unwrap();
    data_regions
}

/// (offset, length, is_data) from `nbdinfo --map --json`.
fn map(uri: &str) -> Vec<(u64, u64, bool)> {
    let out = run_ok("nbdinfo", &["--map", "--json", uri]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let ty = e["type"].as_u64().unwrap();
            (
                e["offset"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                ty & 1 == 0,
            )
        })
        .collect()
}

fn data_ranges(m: &[(u64, u64, bool)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(o, l, d) in m {
        if !d {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.0 + last.1 == o => last.1 += l,
            _ => out.push((o, l)),
        }
    }
    out
}

#[test]
fn qemu_img_round_trip_and_block_status_map() {
    if !have("qemu-img") || !have("nbdinfo") || !have("qemu-io") {
        return;
    }
    each_kind(qemu_img_round_trip_and_block_status_map_on);
}

fn qemu_img_round_trip_and_block_status_map_on(kind: Kind) {
    let s = Store::of(kind);
    s.ok(&["create", "disk", "--size", "256M"]);
    let src = s.dir.path().join("src.raw");
    let regions = make_source(&src);
    let srv = s.serve();
    let uri = s.uri("disk");
    raw_copy(src.to_str().unwrap(), &uri);
    let cmp = run_ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            src.to_str().unwrap(),
            &uri,
        ],
    );
    assert!(cmp.contains("identical"), "{cmp}");
    // The map shows data exactly where the image has data.
    let merged: Vec<(u64, u64)> = {
        let mut m: Vec<(u64, u64)> = Vec::new();
        for (o, l) in regions.iter().copied() {
            match m.last_mut() {
                Some(x) if x.0 + x.1 == o => x.1 += l,
                _ => m.push((o, l)),
            }
        }
        m
    };
    assert_eq!(data_ranges(&map(&uri)), merged);
    // Trim 1 MiB of data and zero another 1 MiB letting the server
    // unmap it (-u): both become holes and read as zeros. Zeroing without
    // -u (NBD's NO_HOLE) leaves the range allocated on a local datastore
    // (an object store keeps no grain of zeros: CLIENTS.md F3).
    run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "discard 0 1M",
            "-c",
            "write -z -u 3M 1M",
            "-c",
            "write -z 5M 1M",
            &uri,
        ],
    );
    let after = data_ranges(&map(&uri));
    assert!(
        !after.iter().any(|&(o, l)| o < 1 << 20 && o + l > 0),
        "trimmed range still mapped: {after:?}"
    );
    assert!(
        !after.iter().any(|&(o, l)| o < 4 << 20 && o + l > 3 << 20),
        "zeroed range still mapped: {after:?}"
    );
    if kind == Kind::Local {
        assert!(
            after.iter().any(|&(o, l)| o <= 5 << 20 && o + l >= 6 << 20),
            "a range zeroed with NO_HOLE is not allocated: {after:?}"
        );
    }
    let r = run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0 0 1M",
            "-c",
            "read -P 0 3M 1M",
            "-c",
            "read -P 0 5M 1M",
            &uri,
        ],
    );
    assert!(!r.contains("Pattern verification failed"), "{r}");
    // qemu-img info over NBD sees the size.
    let info = run_ok("qemu-img", &["info", "--output=json", &uri]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(v["virtual-size"], 256u64 << 20);
    // Snapshot exports are read-only and hold the data at snapshot time.
    s.ok(&["snapshot", "create", "disk", "s"]);
    run_ok("qemu-io", &["-f", "raw", "-c", "write -P 0x5a 0 64k", &uri]);
    let snap_uri = s.uri("disk@s");
    let r = run_ok(
        "qemu-io",
        &["-f", "raw", "-r", "-c", "read -P 0 0 64k", &snap_uri],
    );
    assert!(!r.contains("verification failed"), "{r}");
    let o = run("qemu-io", &["-f", "raw", "-c", "write 0 4k", &snap_uri]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !o.status.success()
            || text.contains("failed")
            || text.contains("read-only")
            || text.contains("Operation not permitted"),
        "write to snapshot export must fail: {text}"
    );
    let list = run_ok(
        "nbdinfo",
        &[
            "--list",
            &format!("nbd+unix://?socket={}", s.sock().display()),
        ],
    );
    assert!(list.contains("disk@s"), "{list}");
    srv.stop();
    let c = s.json(&["check"]);
    assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
}

/// fio on one export of the server at `sock`, 16 deep, with `extra`.
fn fio_ok(export: &str, sock: &std::path::Path, extra: &[&str]) {
    let uri = format!("nbd+unix:///{export}?socket={}", sock.display());
    let args = [&["--iodepth=16", "--output-format=normal"][..], extra].concat();
    common::fio_ok(export, &[("strata".to_string(), uri)], &args);
}

#[test]
fn fio_verify_survives_restart() {
    if !have("fio") {
        return;
    }
    each_kind(fio_verify_survives_restart_on);
}

fn fio_verify_survives_restart_on(kind: Kind) {
    let s = Store::of(kind);
    s.ok(&["create", "disk", "--size", "128M"]);
    let srv = s.serve();
    fio_ok(
        "disk",
        &s.sock(),
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=48M",
            "--offset=0",
            "--do_verify=1",
        ],
    );
    fio_ok(
        "disk",
        &s.sock(),
        &[
            "--rw=randwrite",
            "--bs=64k",
            "--size=64M",
            "--offset=64M",
            "--do_verify=1",
        ],
    );
    srv.stop();
    let srv = s.serve();
    fio_ok(
        "disk",
        &s.sock(),
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=48M",
            "--offset=0",
            "--verify_only",
        ],
    );
    fio_ok(
        "disk",
        &s.sock(),
        &[
            "--rw=randwrite",
            "--bs=64k",
            "--size=64M",
            "--offset=64M",
            "--verify_only",
        ],
    );
    srv.stop();
    let c = s.json(&["check"]);
    assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
}

#[test]
fn kill_9_during_fio_keeps_flushed_data() {
    if !have("fio") {
        return;
    }
    each_kind(|kind| kill_9_during_fio_keeps_flushed_data_on(kind, &[]));
}

/// Under `--cache none` overwrites of data the disk holds alone go
/// through each connection's io_uring: both phases below rewrite data
/// written first, so the flushed writes checked after the kill, and the
/// writes in flight when it comes, are in the ring.
#[test]
fn kill_9_with_overwrites_in_the_ring_keeps_flushed_data() {
    if !have("fio") {
        return;
    }
    kill_9_during_fio_keeps_flushed_data_on(Kind::Local, &["--cache", "none"]);
}

fn kill_9_during_fio_keeps_flushed_data_on(kind: Kind, serve: &[&str]) {
    let s = Store::of(kind);
    s.ok(&["create", "disk", "--size", "128M"]);
    s.ok(&["create", "other", "--size", "64M"]);
    let srv = s.serve_with(serve);
    if !serve.is_empty() {
        // Written once first: what follows overwrites in place.
        fio_ok(
            "disk",
            &s.sock(),
            &["--rw=write", "--bs=1M", "--size=128M", "--do_verify=0"],
        );
    }
    // Phase 1: written and flushed (fio flushes at the end with end_fsync).
    fio_ok(
        "disk",
        &s.sock(),
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--offset=0",
            "--end_fsync=1",
            "--do_verify=0",
        ],
    );
    // Phase 2: heavy I/O elsewhere on the disk and on another disk, then kill -9.
    let uri = format!("--uri=nbd+unix:///disk?socket={}", s.sock().display());
    let mut busy = std::process::Command::new("fio")
        .args([
            "--name=busy",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=16k",
            "--size=64M",
            "--offset=64M",
            "--iodepth=32",
            "--time_based",
            "--runtime=30",
            "--fsync=64",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    srv.kill9();
    let _ = busy.wait();
    // Restart: recovery replays the log; phase 1 verifies; check is clean.
    let srv = s.serve_with(serve);
    fio_ok(
        "disk",
        &s.sock(),
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--offset=0",
            "--verify_only",
        ],
    );
    srv.stop();
    let c = s.json(&["check"]);
    assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
}

#[test]
fn hostile_client_does_not_hurt_others() {
    if !have("nbdinfo") {
        return;
    }
    use std::io::Read;
    let s = Store::new();
    s.ok(&["create", "disk", "--size", "1M"]);
    let srv = s.serve();
    for garbage in [&b"hello"[..], &[0xffu8; 4096][..], b""] {
        let mut c = std::os::unix::net::UnixStream::connect(s.sock()).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let _ = c.write_all(garbage);
        let _ = c.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = c.read_to_end(&mut sink);
    }
    let out = run_ok("nbdinfo", &["--size", &s.uri("disk")]);
    assert_eq!(out.trim(), "1048576");
    srv.stop();
}

#[test]
fn nb_and_tbz_move_with_writes() {
    if !have("qemu-io") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "thin", "--size", "32M"]);
    s.ok(&["create", "zt", "--size", "32M", "--type", "zeroedthick"]);
    let srv = s.serve();
    // 3 MiB into blocks 0..3 of each disk, plus one 4 KiB write into block 10.
    for d in ["thin", "zt"] {
        run_ok(
            "qemu-io",
            &[
                "-f",
                "raw",
                "-c",
                "write -P 7 0 3M",
                "-c",
                "write -P 8 10M 4k",
                &s.uri(d),
            ],
        );
    }
    let thin = s.json(&["info", "thin"]);
    assert_eq!(thin["nb"], 4, "{thin}");
    assert_eq!(thin["tbz"], 0);
    assert_eq!(thin["allocated_bytes"], (3u64 << 20) + 4096);
    let zt = s.json(&["info", "zt"]);
    assert_eq!(zt["nb"], 32, "{zt}");
    assert_eq!(zt["tbz"], 28, "{zt}");
    // The reservation shrinks by what the thick disk has written.
    let st = s.json(&["status"]);
    assert_eq!(st["reserved_bytes"], (32u64 << 20) - (3 << 20) - 4096);
    // Trimming a whole block of the thin disk gives it back.
    run_ok(
        "qemu-io",
        &["-f", "raw", "-c", "discard 0 1M", &s.uri("thin")],
    );
    assert_eq!(s.json(&["info", "thin"])["nb"], 3);
    srv.stop();
}

/// `info` names who has the disk or one of its snapshots open (qemu-io
/// held open on its stdin), read-only or not, and forgets them once they
/// disconnect (docs/INTERLOCKS.md).
#[test]
fn info_names_the_clients_that_have_a_disk_open() {
    if !have("qemu-io") {
        return;
    }
    let (s, _srv, rw, ro) = two_clients();
    let clients = s.json(&["info", "vm"])["clients"].clone();
    let mut got: Vec<(String, bool, u64)> = clients
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["transport"], "nbd", "{c}");
            let peer = c["peer"].as_str().unwrap();
            let pid = peer
                .strip_prefix("local pid ")
                .unwrap_or_else(|| panic!("{c}"));
            let pid = pid.parse().unwrap();
            (
                c["export"].as_str().unwrap().to_string(),
                c["read_only"].as_bool().unwrap(),
                pid,
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("vm".to_string(), false, u64::from(rw.id())),
            ("vm@s1".to_string(), true, u64::from(ro.id()))
        ]
    );
    let text = s.ok(&["info", "vm"]);
    assert!(
        text.contains("open by:") && text.contains("vm@s1 over nbd from"),
        "{text}"
    );
    assert!(text.contains("(read-write, since "), "{text}");
    for c in [rw, ro] {
        c.wait_with_output().unwrap();
    }
    eventually(
        "the clients gone",
        std::time::Duration::from_secs(30),
        || s.json(&["info", "vm"]).get("clients").is_none(),
    );
}

/// qemu-io on `export` of `s`, held open on its stdin (its output piped).
fn held_open(s: &Store, export: &str, opts: &[&str]) -> std::process::Child {
    std::process::Command::new("qemu-io")
        .args(opts)
        .args(["-f", "raw", &s.uri(export)])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// `rm`, `snapshot revert` and `snapshot delete` refuse while clients
/// have open what they would take away, naming them (exit 6); with
/// `--force` those clients are disconnected first (docs/INTERLOCKS.md).
#[test]
fn what_clients_have_open_is_not_taken_from_them_unless_forced() {
    if !have("qemu-io") {
        return;
    }
    let (s, _srv, mut rw, ro) = two_clients();
    let rw_peer = format!("vm over nbd from local pid {}", rw.id());
    let ro_peer = format!("vm@s1 over nbd from local pid {}", ro.id());
    let e = s.fails_with(6, &["rm", "vm"]);
    assert!(e.contains("'vm' is open: ") && e.contains(&rw_peer), "{e}");
    assert!(e.contains(&ro_peer) && e.contains("pass --force"), "{e}");
    let e = s.fails_with(6, &["snapshot", "revert", "vm@s1"]);
    assert!(e.contains(&rw_peer) && !e.contains(&ro_peer), "{e}");
    let e = s.fails_with(6, &["snapshot", "delete", "vm@s1"]);
    assert!(e.contains(&ro_peer) && !e.contains(&rw_peer), "{e}");
    assert_eq!(
        s.json(&["snapshot", "list", "vm"])
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Forced: the writer is disconnected (its next read fails), the
    // revert is done, the reader of the snapshot stays.
    s.ok(&["snapshot", "revert", "vm@s1", "--force"]);
    let mut w = rw.stdin.take().unwrap();
    let _ = writeln!(w, "read 0 512");
    drop(w);
    let o = rw.wait_with_output().unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("read failed"), "{out}");
    let left = s.json(&["info", "vm"])["clients"].clone();
    assert_eq!(left.as_array().map(Vec::len), Some(1), "{left}");
    assert_eq!(left[0]["export"], "vm@s1");
    s.ok(&["rm", "vm", "--force"]);
    assert!(s.disk_names().is_empty());
    // Its reader went with it (closing stdin ends qemu-io).
    ro.wait_with_output().unwrap();
}

/// A datastore with disk `vm` and its snapshot `vm@s1`, served, no client
/// listed at first; then qemu-io held open read-write on `vm` and
/// read-only on `vm@s1`, both listed by `info`.
fn two_clients() -> (Store, Server, std::process::Child, std::process::Child) {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    s.ok(&["snapshot", "create", "vm@s1"]);
    let srv = s.serve();
    assert!(s.json(&["info", "vm"]).get("clients").is_none());
    let rw = held_open(&s, "vm", &[]);
    let ro = held_open(&s, "vm@s1", &["-r"]);
    eventually(
        "two clients listed",
        std::time::Duration::from_secs(30),
        || {
            let c = s.json(&["info", "vm"])["clients"].clone();
            c.as_array().is_some_and(|c| c.len() == 2)
        },
    );
    (s, srv, rw, ro)
}
