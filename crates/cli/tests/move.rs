//! `strata move` (docs/MOVE.md) through the CLI and real clients: a served
//! disk under fio's verifying writes moves to an object store (SeaweedFS)
//! and back; a server killed at a random moment of a move keeps the
//! source and a repeated move completes (at each step of a move:
//! crates/server/tests/move_crash.rs); refusals.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{qemu_io, qemu_io_ok, raw_compare, run_ok, save, Kind, Store, RAW_WRITEBACK};
use strata_s3::testing;

fn url(name: &str) -> Option<String> {
    testing::shared()?;
    Some(format!(
        "s3://strata-cli-test/{name}-{:08x}",
        rand::random::<u32>()
    ))
}

fn same(uri: &str, img: &Path) {
    let o = raw_compare(uri, img.to_str().unwrap());
    assert!(
        o.status.success(),
        "{uri} differs from {}: {}{}",
        img.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The home server's placement file (docs/MOVE.md), empty if none yet.
fn placement(home: &Store) -> serde_json::Value {
    match std::fs::read(home.path().join("placement.json")) {
        Ok(b) => serde_json::from_slice(&b).unwrap(),
        Err(_) => serde_json::json!({ "disks": {}, "moves": {} }),
    }
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

/// The snapshot tree as (name, parent) pairs.
fn tree(s: &Store, disk: &str) -> Vec<(String, Option<String>)> {
    let j = s.json(&["snapshot", "list", disk]);
    let mut t: Vec<(String, Option<String>)> = j
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().to_string(),
                x["parent"].as_str().map(str::to_string),
            )
        })
        .collect();
    t.sort();
    t
}

/// fio over NBD with crc32c verification: writes (verifying as it goes
/// and at the end) or, with `verify_only`, reads back and verifies what
/// the same job wrote.
fn fio(uri: &str, verify_only: bool) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--name=mv",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        // 32 MiB of random writes over 64 MiB at 1,200 writes a second:
        // about 7 s of writing, which a move started 1.5 s in falls within
        // however loaded the machine (fio can only be slower). Each move
        // gets a writer of its own, so nothing depends on how long the
        // moves and the checks between them take.
        "--offset=64M",
        "--size=64M",
        "--io_size=32M",
        "--verify=crc32c",
        "--verify_backlog=512",
        "--verify_fatal=1",
        "--rate_iops=1200",
        "--randrepeat=1",
        // No verify state file left in the working directory.
        "--verify_state_save=0",
    ]);
    if verify_only {
        c.arg("--verify_only");
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn finish(child: Child) -> String {
    let o = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "fio failed: {text}");
    assert!(!text.contains("verify: bad"), "{text}");
    text
}

/// Build a disk with a snapshot tree: s1 -> {s2, s3}, the head on s3.
fn tree_disk(home: &Store) {
    let u = home.uri("d");
    qemu_io_ok(
        RAW_WRITEBACK,
        &u,
        &["write -P 0x11 0 4M", "write -P 0x12 40M 1M"],
    );
    home.ok(&["snapshot", "create", "d", "s1", "--description", "base"]);
    qemu_io_ok(
        RAW_WRITEBACK,
        &u,
        &["write -P 0x22 1M 1M", "write -z 40M 512k"],
    );
    home.ok(&["snapshot", "create", "d", "s2"]);
    home.ok(&["snapshot", "revert", "d", "s1"]);
    qemu_io_ok(RAW_WRITEBACK, &u, &["write -P 0x33 2M 64k"]);
    home.ok(&["snapshot", "create", "d", "s3"]);
    qemu_io_ok(RAW_WRITEBACK, &u, &["write -P 0x44 8M 64k", "flush"]);
}

/// The images of `d`'s snapshots s1..s3 and of its head's first 64 MiB
/// (fio writes above): the directory and the head's path.
fn save_images(home: &Store) -> (tempfile::TempDir, std::path::PathBuf) {
    let imgs = tempfile::tempdir().unwrap();
    for s in ["s1", "s2", "s3"] {
        save(&home.uri(&format!("d@{s}")), &imgs.path().join(s));
    }
    let head = imgs.path().join("head");
    save(&home.uri("d"), &head);
    run_ok("truncate", &["-s", "64M", head.to_str().unwrap()]);
    (imgs, head)
}

/// `d` and its snapshots read what [`save_images`] saved.
fn same_images(home: &Store, imgs: &tempfile::TempDir, head: &Path) {
    for s in ["s1", "s2", "s3"] {
        same(&home.uri(&format!("d@{s}")), &imgs.path().join(s));
    }
    let now = imgs.path().join("now");
    save(&home.uri("d"), &now);
    run_ok("truncate", &["-s", "64M", now.to_str().unwrap()]);
    same(now.to_str().unwrap(), head);
}

/// A served disk moves to a datastore of the other kind and back under
/// fio's verifying writes, whichever kind is its home (issue 13's first
/// case, local -> object store -> local; issue 25's, object store ->
/// local -> object store); its snapshot tree goes along and reads the same.
#[test]
fn a_served_disk_moves_to_the_other_kind_and_back_under_fio_verify() {
    if !common::have("fio") || !common::have("qemu-img") {
        return;
    }
    common::each_kind(|kind| {
        let home = Store::of(kind);
        let other_kind = match kind {
            Kind::Local => Kind::ObjectStore,
            Kind::ObjectStore => Kind::Local,
        };
        if other_kind == Kind::ObjectStore && url("move").is_none() {
            return;
        }
        let other = Store::of(other_kind);
        home.ok(&["create", "d", "--size", "128M"]);
        let _server = home.serve();
        tree_disk(&home);
        let (imgs, head) = save_images(&home);
        let before = tree(&home, "d");

        let writer = fio(&home.uri("d"), false).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let out = home.json(&["move", "d", "--to", other.path().to_str().unwrap()]);
        assert_eq!(out["snapshots"], serde_json::json!(["s1", "s2", "s3"]));
        assert!(out["passes"].as_u64().unwrap() >= 1, "{out}");
        // The source is gone; the other datastore has it; this server
        // serves it from there, and `info` is the other kind's. (A local
        // target is held by this server while it serves from it: only an
        // object store can be listed by another process meanwhile.)
        assert!(!names(&home.json(&["list"])).contains(&"d".to_string()));
        if other_kind == Kind::ObjectStore {
            assert!(names(&other.json(&["list"])).contains(&"d".to_string()));
        }
        let kind_name = if other_kind == Kind::Local {
            "local"
        } else {
            "object-store"
        };
        assert_eq!(placement(&home)["disks"]["d"]["kind"], kind_name);
        let info = home.json(&["info", "d"]);
        assert_eq!(info["name"], "d", "{info}");
        assert_eq!(
            (info["nb"].is_u64(), info["object_store"].is_object()),
            (other_kind == Kind::Local, other_kind == Kind::ObjectStore),
            "{info}"
        );
        // The first move ran under fio's writes: they all verified.
        let text = finish(writer);
        assert!(text.contains("mv: (groupid"), "{text}");
        // The move back starts under the same writes again.
        let writer = fio(&home.uri("d"), false).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let back = home.json(&["move", "d", "--to", home.path().to_str().unwrap()]);
        assert_eq!(back["snapshots"], serde_json::json!(["s1", "s2", "s3"]));
        let text = finish(writer);
        assert!(text.contains("mv: (groupid"), "{text}");
        // And once more, reading everything back.
        finish(fio(&home.uri("d"), true).spawn().unwrap());

        assert!(names(&home.json(&["list"])).contains(&"d".to_string()));
        if other_kind == Kind::ObjectStore {
            assert!(!names(&other.json(&["list"])).contains(&"d".to_string()));
            assert!(other.cmd(&["check"]).status.success());
        }
        same_images(&home, &imgs, &head);
        assert_eq!(tree(&home, "d"), before);
        let snaps = home.json(&["snapshot", "list", "d"]);
        let snaps = snaps.as_array().unwrap();
        let s1 = snaps.iter().find(|s| s["name"] == "s1").unwrap();
        assert_eq!(s1["description"], "base");
        assert!(
            snaps
                .iter()
                .any(|s| s["name"] == "s3" && s["current"] == true),
            "{snaps:?}"
        );
        let placement: serde_json::Value = placement(&home);
        assert_eq!(placement["disks"], serde_json::json!({}));
        assert_eq!(placement["moves"], serde_json::json!({}));
        assert!(home.cmd(&["check"]).status.success());
    });
}

/// A disk with data worth checking, flushed; its image and its snapshot's
/// saved (`img`, `img.snap`).
fn disk_with_data(home: &Store, img: &Path) {
    home.ok(&["create", "d", "--size", "64M"]);
    let server = home.serve();
    qemu_io_ok(
        RAW_WRITEBACK,
        &home.uri("d"),
        &["write -P 0x5a 0 8M", "write -P 0x6b 20M 3M", "flush"],
    );
    home.ok(&["snapshot", "create", "d", "snap"]);
    qemu_io_ok(
        RAW_WRITEBACK,
        &home.uri("d"),
        &["write -P 0x7c 1M 1M", "flush"],
    );
    save(&home.uri("d"), img);
    save(&home.uri("d@snap"), &img.with_extension("snap"));
    server.stop();
}

/// Issue 13's second acceptance case: kill -9 at a random moment of a
/// slow (rate-limited) move. (A move cut at each of its steps:
/// crates/server/tests/move_crash.rs.)
#[test]
fn a_server_killed_during_a_move_keeps_the_disk_and_a_repeated_move_completes() {
    if !common::have("qemu-img") || !common::have("qemu-io") {
        return;
    }
    let imgs = tempfile::tempdir().unwrap();
    let home = Store::new();
    let dest = Store::new();
    let img = imgs.path().join("random");
    disk_with_data(&home, &img);
    let server = home.serve();
    let mover = Command::new(common::strata())
        .args(["--datastore", home.path().to_str().unwrap()])
        .args(["move", "d", "--to", dest.path().to_str().unwrap()])
        .args(["--rate", "6M"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200 + rand::random::<u64>() % 2000));
    server.kill9();
    let _ = mover.wait_with_output();
    let _server = home.serve();
    same(&home.uri("d"), &img);
    // Cut before its commit point the disk is home, after it in dest
    // (the kill may come after the move ended): moving on completes.
    let p: serde_json::Value = placement(&home);
    assert_eq!(p["moves"], serde_json::json!({}), "{p}");
    let next = if p["disks"]["d"].is_null() {
        dest.path()
    } else {
        home.path()
    };
    home.ok(&["move", "d", "--to", next.to_str().unwrap()]);
    same(&home.uri("d"), &img);
}

#[test]
fn moves_refuse_what_they_cannot_do_and_route_commands_to_the_new_place() {
    if !common::have("qemu-io") || !common::have("qemu-img") {
        return;
    }
    let home = Store::new();
    let dest = Store::new();
    let d = dest.path();
    let dest_s = d.to_str().unwrap();
    home.ok(&["create", "d", "--size", "32M", "--type", "zeroedthick"]);
    // Without a server.
    let e = home.fails(&["move", "d", "--to", dest_s]);
    assert!(e.contains("runs in the server"), "{e}");
    let _server = home.serve();
    let e = home.fails(&["move", "d", "--to", home.path().to_str().unwrap()]);
    assert!(e.contains("already"), "{e}");
    let e = home.fails(&["move", "d", "--to", "/nonexistent-strata-dir"]);
    assert!(e.contains("/nonexistent-strata-dir"), "{e}");
    let plain = tempfile::tempdir().unwrap();
    let e = home.fails(&["move", "d", "--to", plain.path().to_str().unwrap()]);
    assert!(e.contains("neither a datastore"), "{e}");
    let e = home.fails(&["move", "nope", "--to", dest_s]);
    assert!(e.contains("nope"), "{e}");
    let e = home.fails(&["move", "d@x", "--to", dest_s]);
    assert!(e.contains("snapshot"), "{e}");

    qemu_io_ok(
        RAW_WRITEBACK,
        &home.uri("d"),
        &["write -P 0x21 0 2M", "flush"],
    );
    let img = plain.path().join("d.img");
    save(&home.uri("d"), &img);
    // Thick to thin on the way (the paper's Storage vMotion conversion).
    let r = home.json(&["move", "d", "--to", dest_s, "--type", "thin"]);
    assert_eq!(r["provisioning"], "thin");
    same(&home.uri("d"), &img);
    // Commands on the disk reach its new place through this server.
    let i = home.json(&["info", "d"]);
    assert_eq!(i["provisioning"], "thin");
    assert!(i["allocated_bytes"].as_u64().unwrap() <= 3 << 20, "{i}");
    home.ok(&["snapshot", "create", "d", "after"]);
    assert_eq!(tree(&home, "d").len(), 1);
    let e = home.fails(&["create", "d", "--size", "1M"]);
    assert!(e.contains("serves a disk named 'd'"), "{e}");
    // A name taken in the target is refused.
    home.ok(&["create", "e", "--size", "1M"]);
    let other = Store::new();
    other.ok(&["create", "e", "--size", "1M"]);
    let e = home.fails(&["move", "e", "--to", other.path().to_str().unwrap()]);
    assert!(e.contains("has a disk named 'e'"), "{e}");
    // A datastore another server holds is refused, saying so.
    let other_server = other.serve();
    home.ok(&["rm", "e"]);
    home.ok(&["create", "f", "--size", "1M"]);
    let e = home.fails(&["move", "f", "--to", other.path().to_str().unwrap()]);
    assert!(e.contains("served by another strata server"), "{e}");
    drop(other_server);
    // rm of a placed disk removes it there and stops serving it.
    home.ok(&["rm", "d"]);
    let p: serde_json::Value = placement(&home);
    assert_eq!(p["disks"], serde_json::json!({}));
    let list = run_ok(
        "nbdinfo",
        &[
            "--list",
            &format!("nbd+unix:///?socket={}", home.sock().display()),
        ],
    );
    assert!(!list.contains("export=\"d\""), "{list}");
}

/// A qemu-io "guest" that takes commands as they come; its output is
/// read as it comes (line-buffered through `stdbuf`), so a test can wait
/// for a command to have run.
struct Guest {
    child: Child,
    cmds: std::process::ChildStdin,
    out: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Guest {
    fn start(uri: &str) -> Guest {
        Guest::start_with(uri, &[])
    }
    fn start_with(uri: &str, opts: &[&str]) -> Guest {
        let mut child = Command::new("stdbuf")
            .args(["-oL", "qemu-io", "-f", "raw", "-t", "writeback"])
            .args(opts)
            .arg(uri)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let cmds = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = out.clone();
        let reader = std::thread::spawn(move || {
            use std::io::Read as _;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Guest {
            child,
            cmds,
            out,
            reader: Some(reader),
        }
    }
    fn send(&mut self, c: &str) {
        use std::io::Write as _;
        // A guest that has exited shows why in its output (finish).
        let _ = writeln!(self.cmds, "{c}");
    }
    /// Wait until the guest has printed `needle` (a command it was sent
    /// has run).
    fn wait_for(&self, needle: &str) {
        self.wait_until(&format!("printed {needle:?}"), |out| out.contains(needle));
    }
    /// Wait until every command sent so far has run: qemu-io prints its
    /// prompt before it reads each command and once more after the last.
    /// (qemu-io 7.2 runs one command per wake-up of its stdin: of lines
    /// that arrive together it runs the first, and the rest wait for the
    /// next input, seen on a plain raw file with no server at all. A
    /// command sent during the one before may thus not run until another
    /// is sent, so each waits for the one before.)
    fn wait_idle(&self, sent: usize) {
        self.wait_until(&format!("ran its {sent} commands"), |out| {
            out.matches("qemu-io> ").count() > sent
        });
    }
    /// Wait (60 s at most) until the guest's output so far satisfies
    /// `done`; else fail, saying the guest never did `what`, with the
    /// output.
    fn wait_until(&self, what: &str, done: impl Fn(&str) -> bool) {
        let t = std::time::Instant::now();
        while !done(&self.out.lock().unwrap()) {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the guest never {what}: {}",
                self.out.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    fn finish(mut self) -> String {
        self.send("quit");
        drop(self.cmds);
        let o = self.child.wait_with_output().unwrap();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let out = self.out.lock().unwrap().clone();
        format!("{out}{}", String::from_utf8_lossy(&o.stderr))
    }
}

/// Issue 13's hand-over case: a writer on host A, host B serving the disk
/// incoming; A releases (committing what it acknowledged, flushed or
/// not); B's first write, which waited for the release, goes through; A
/// was never fenced and refuses writes after its release. Then back to A
/// with `claim --handover`.
#[test]
fn a_disk_is_handed_over_between_hosts_without_a_fence() {
    if !common::have("qemu-io") {
        return;
    }
    let Some(u) = url("handover") else { return };
    let (a, b) = (Store::empty(), Store::empty());
    a.ok(&["init", "--object-store", &u]);
    a.ok(&["create", "vm", "--size", "16M"]);
    b.ok(&["attach", "--object-store", &u]);
    let (ha, hb) = (common::http::free_addr(), common::http::free_addr());
    let sa = a.serve_with(&["--http", &ha]);
    let sb = b.serve_with(&["--incoming", "vm", "--incoming-wait", "30", "--http", &hb]);

    // The VM runs on A: a flushed write, then one acknowledged only.
    // Each command waits for the one before (a fixed wait was not enough
    // on a loaded machine: with the flush and the next write queued in
    // qemu-io together, the flush waited for more input, and B read zeros).
    let mut guest = Guest::start(&a.uri("vm"));
    guest.send("write -P 0x11 0 1M");
    guest.wait_idle(1);
    guest.send("flush");
    guest.wait_idle(2);
    guest.send("write -P 0x22 1M 64k");
    guest.wait_idle(3);
    // B reads what A committed, without claiming.
    let (ok, r) = qemu_io(RAW_WRITEBACK, &b.uri("vm"), &["read -P 0x11 0 1M"]);
    assert!(ok && !r.contains("fail"), "{r}");
    assert_eq!(
        a.json(&["info", "vm"])["object_store"]["owner"]["pid"].as_u64(),
        Some(sa.pid() as u64)
    );
    // The VM resumes on B before the source let go: its first write
    // waits for the release rather than fencing A.
    let b_uri = b.uri("vm");
    let early = std::thread::spawn(move || {
        qemu_io(RAW_WRITEBACK, &b_uri, &["write -P 0x33 2M 64k", "flush"])
    });
    std::thread::sleep(Duration::from_millis(1000));
    assert!(!early.is_finished(), "B's write waits for the release");
    let out = a.ok(&["release", "vm"]);
    assert!(out.contains("released disk vm"), "{out}");
    let (ok, w) = early.join().unwrap();
    assert!(ok && w.contains("wrote 65536/65536"), "{w}");
    assert_eq!(
        b.json(&["info", "vm"])["object_store"]["owner"]["pid"].as_u64(),
        Some(sb.pid() as u64)
    );
    // A takes no more writes (EPERM, not a fence); its FLUSH succeeds; its
    // reads follow B.
    std::thread::sleep(Duration::from_millis(1500));
    guest.send("write -P 0x44 3M 4k");
    guest.send("flush");
    guest.send("read -P 0x33 2M 64k");
    let text = guest.finish();
    assert!(
        text.contains("write failed: Operation not permitted"),
        "{text}"
    );
    assert!(!text.contains("flush failed"), "{text}");
    assert!(text.contains("read 65536/65536"), "{text}");
    assert!(!text.contains("Pattern verification failed"), "{text}");
    let m = common::http::metrics(&ha);
    assert!(m.contains("strata_shared_fenced{disk=\"vm\"} 0"), "{m}");
    // Nothing A acknowledged is missing on B.
    let (ok, r) = qemu_io(
        RAW_WRITEBACK,
        &b.uri("vm"),
        &[
            "read -P 0x11 0 1M",
            "read -P 0x22 1M 64k",
            "read -P 0x33 2M 64k",
            "read -P 0 3M 4k",
        ],
    );
    assert!(ok && !r.contains("verification failed"), "{r}");

    // And back: B releases, A claims with --handover (no fence either way).
    let e = a.fails(&["claim", "vm", "--handover", "--wait", "1"]);
    assert!(e.contains("still written by"), "{e}");
    b.ok(&["release", "vm"]);
    a.ok(&["claim", "vm", "--handover", "--wait", "10"]);
    let (ok, w) = qemu_io(
        RAW_WRITEBACK,
        &a.uri("vm"),
        &["write -P 0x55 4M 4k", "flush"],
    );
    assert!(ok, "{w}");
    let (ok, w) = qemu_io(RAW_WRITEBACK, &b.uri("vm"), &["write -P 0x66 5M 4k"]);
    assert!(!ok || w.contains("Operation not permitted"), "{w}");
    assert!(common::http::metrics(&hb).contains("strata_shared_fenced{disk=\"vm\"} 0"));
    assert!(common::http::metrics(&ha).contains("strata_shared_fenced{disk=\"vm\"} 0"));
    // Releasing again is a no-op; releasing a disk this host does not
    // write says so.
    b.ok(&["release", "vm"]);
    a.ok(&["create", "other", "--size", "1M"]);
    let e = b.fails(&["release", "other"]);
    assert!(e.contains("nothing to release"), "{e}");
}

/// A move is a job: paused it copies nothing, cancelled it leaves the
/// source serving and no copy behind.
#[test]
fn a_move_pauses_and_a_cancelled_one_leaves_the_source() {
    if !common::have("qemu-io") || !common::have("qemu-img") {
        return;
    }
    let home = Store::new();
    let dest = Store::new();
    let imgs = tempfile::tempdir().unwrap();
    let img = imgs.path().join("d");
    disk_with_data(&home, &img);
    let _server = home.serve();
    let started = home.json(&[
        "move",
        "d",
        "--to",
        dest.path().to_str().unwrap(),
        "--rate",
        "1M",
        "--detach",
    ]);
    let id = started["id"].as_u64().unwrap();
    assert!(
        started["what"].as_str().unwrap().starts_with("move d to "),
        "{started}"
    );
    home.wait_job(id, "running", Duration::from_secs(30));
    // Commands that change the disk wait for the move's end.
    let e = home.fails(&["snapshot", "create", "d", "during"]);
    assert!(e.contains("being moved"), "{e}");
    home.ok(&["info", "d"]);
    home.ok(&["jobs", "pause", &id.to_string()]);
    let a = home.wait_job(id, "paused", Duration::from_secs(30))["done"]
        .as_u64()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let b = home.job(id)["done"].as_u64().unwrap();
    assert!(b <= a + (1 << 20), "a paused move went on: {a} -> {b}");
    home.ok(&["jobs", "resume", &id.to_string()]);
    home.wait_job(id, "running", Duration::from_secs(30));
    home.ok(&["jobs", "cancel", &id.to_string()]);
    let j = home.wait_job(id, "cancelled", Duration::from_secs(30));
    assert!(
        j["error"].as_str().unwrap().contains("partial copy in"),
        "{j}"
    );
    same(&home.uri("d"), &img);
    let p: serde_json::Value = placement(&home);
    assert_eq!(p["moves"], serde_json::json!({}), "{p}");
    assert_eq!(p["disks"], serde_json::json!({}), "{p}");
    // The target was left closed and empty: another process may open it.
    assert!(dest.json(&["list"]).as_array().unwrap().is_empty());
    home.ok(&["snapshot", "create", "d", "after"]);
}

/// Active mirroring (forced after the first pass): client writes go to
/// both copies under range locks while the last pass copies; fio's
/// verification holds during and after.
#[test]
fn a_move_that_mirrors_client_writes_loses_none() {
    if !common::have("fio") || !common::have("qemu-img") {
        return;
    }
    let home = Store::new();
    let dest = Store::new();
    home.ok(&["create", "d", "--size", "128M"]);
    let _server = home.serve_with(&["--move-mirror", "always"]);
    qemu_io_ok(
        RAW_WRITEBACK,
        &home.uri("d"),
        &["write -P 0x17 0 32M", "flush"],
    );
    // Each move under a writer of its own (see `fio`).
    let writer = fio(&home.uri("d"), false).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let r = home.json(&["move", "d", "--to", dest.path().to_str().unwrap()]);
    assert_eq!(r["mirrored"], true, "{r}");
    finish(writer);
    let writer = fio(&home.uri("d"), false).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let back = home.json(&["move", "d", "--to", home.path().to_str().unwrap()]);
    assert_eq!(back["mirrored"], true, "{back}");
    finish(writer);
    finish(fio(&home.uri("d"), true).spawn().unwrap());
    let (ok, r) = qemu_io(RAW_WRITEBACK, &home.uri("d"), &["read -P 0x17 0 32M"]);
    assert!(ok && !r.contains("fail"), "{r}");
}

/// `--head-only`: the live state moves, the snapshots stay behind and go
/// with the source; a connection to a snapshot export is told why.
#[test]
fn a_head_only_move_leaves_the_snapshots() {
    if !common::have("qemu-io") || !common::have("qemu-img") {
        return;
    }
    let home = Store::new();
    let dest = Store::new();
    home.ok(&["create", "d", "--size", "64M"]);
    let _server = home.serve();
    tree_disk(&home);
    let imgs = tempfile::tempdir().unwrap();
    let head = imgs.path().join("head");
    save(&home.uri("d"), &head);
    let mut snap_reader = Guest::start_with(&home.uri("d@s1"), &["-r"]);
    snap_reader.send("read -P 0x11 0 64k");
    // Read before the move starts (not merely sent).
    snap_reader.wait_for("read 65536/65536");
    let r = home.json(&[
        "move",
        "d",
        "--to",
        dest.path().to_str().unwrap(),
        "--head-only",
    ]);
    assert_eq!(r["snapshots"], serde_json::json!([]), "{r}");
    same(&home.uri("d"), &head);
    assert!(tree(&home, "d").is_empty());
    std::thread::sleep(Duration::from_millis(300));
    snap_reader.send("read 0 64k");
    let text = snap_reader.finish();
    assert!(text.contains("read 65536/65536"), "{text}");
    assert!(text.contains("read failed"), "{text}");
    let (ok, _) = qemu_io(RAW_WRITEBACK, &home.uri("d@s1"), &["read 0 4k"]);
    assert!(!ok, "the snapshot export is gone");
}
