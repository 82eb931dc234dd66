//! The CLI through its public interface: every command, errors, locking,
//! provisioning accounting, and commands against a running server.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

#[test]
fn cli_mistakes_get_one_clear_line_and_nonzero_exit() {
    let s = Store::new();
    // Each kind of failure has its exit status (`strata --help`).
    for (code, args, needle) in [
        (2, vec!["create", "a", "--size", "10X"], "unknown size unit"),
        (
            2,
            vec!["create", "a", "--size", "1G", "--type", "fat"],
            "unknown provisioning type",
        ),
        (
            2,
            vec!["create", "bad/name", "--size", "1G"],
            "invalid disk name",
        ),
        (3, vec!["info", "nope"], "no disk named 'nope'"),
        (
            3,
            vec!["snapshot", "create", "nope", "s"],
            "no disk named 'nope'",
        ),
        (2, vec!["clone", "nope", "x"], "needs a snapshot"),
        (2, vec!["create", "a", "--size", "0"], "give at least 512"),
    ] {
        let err = s.fails_with(code, &args);
        assert!(err.contains(needle), "{args:?}: '{err}' lacks '{needle}'");
        assert!(err.lines().count() <= 3, "{args:?}: too chatty: {err}");
    }
    s.ok(&["create", "a", "--size", "1M"]);
    assert!(s
        .fails_with(4, &["create", "a", "--size", "1M"])
        .contains("already exists"));
    assert!(s
        .fails(&["extend", "a", "--size", "512K"])
        .contains("only grows"));
    // No datastore at all.
    let o = std::process::Command::new(strata())
        .args(["--datastore", "/nonexistent/strata", "list"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "no datastore is not found");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no datastore"));
    // init twice.
    assert!(s
        .fails_with(4, &["init"])
        .contains("already holds a datastore"));
    let help = s.ok(&["--help"]);
    assert!(
        help.contains("Exit status:") && help.contains("9   the object store"),
        "{help}"
    );
}

/// Disks, snapshots and clones without a server, on each kind of datastore.
#[test]
fn disks_snapshots_and_clones_offline() {
    common::each_kind(|kind| {
        let s = Store::of(kind);
        s.ok(&["create", "vm", "--size", "64M"]);
        let info = s.json(&["info", "vm"]);
        // An object store's disk has a writer record instead of the
        // allocation figures only a walk of its map would know.
        let keys: &[&str] = match kind {
            Kind::Local => &["allocated_bytes", "nb", "tbz", "created_unix"],
            Kind::ObjectStore => &["object_store"],
        };
        for k in [
            "size_bytes",
            "provisioning",
            "snapshots",
            "current_snapshot",
        ]
        .iter()
        .chain(keys)
        {
            assert!(info.get(k).is_some(), "info --json lacks {k}: {info}");
        }
        assert_eq!(info["size_bytes"], 64 << 20);
        assert_eq!(info["provisioning"], "thin");
        s.ok(&["snapshot", "create", "vm", "base", "--description", "first"]);
        s.ok(&["snapshot", "create", "vm", "two"]);
        let list = s.json(&["snapshot", "list", "vm"]);
        assert_eq!(list.as_array().unwrap().len(), 2);
        assert_eq!(list[0]["description"], "first");
        assert_eq!(list[1]["parent"], "base");
        assert_eq!(list[1]["current"], true);
        let tree = s.ok(&["snapshot", "list", "vm"]);
        assert!(tree.contains("base") && tree.contains("  two"), "{tree}");
        s.ok(&["snapshot", "revert", "vm", "base"]);
        assert_eq!(s.json(&["info", "vm"])["current_snapshot"], "base");
        s.ok(&["clone", "vm@base", "linked"]);
        let copy_type = match kind {
            Kind::Local => "eagerzeroedthick",
            Kind::ObjectStore => "thin",
        };
        s.ok(&["clone", "--full", "vm@two", "copy", "--type", copy_type]);
        assert_eq!(s.json(&["info", "linked"])["parent"], "vm@base");
        assert_eq!(s.json(&["info", "copy"])["provisioning"], copy_type);
        // The linked clone holds the snapshot it came from, unless forced;
        // then it outlives it, its parent shown as deleted.
        let e = s.fails_with(6, &["snapshot", "delete", "vm", "base"]);
        assert!(
            e.contains("linked clones of 'vm@base' exist: linked"),
            "{e}"
        );
        s.ok(&["snapshot", "delete", "vm", "base", "--force"]);
        assert_eq!(s.json(&["info", "linked"])["parent_deleted"], true);
        s.ok(&["rm", "vm"]);
        assert_eq!(s.disk_names(), ["copy", "linked"]);
        let c = s.json(&["check"]);
        assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
    });
}

#[test]
fn provisioning_accounting() {
    let s = Store::new();
    // 1 TiB thin: no data space.
    s.ok(&["create", "big", "--size", "1T"]);
    let i = s.json(&["info", "big"]);
    assert_eq!(i["allocated_bytes"], 0);
    assert_eq!(i["nb"], 0);
    let st = s.json(&["status"]);
    assert_eq!(st["used_bytes"], 0);
    assert_eq!(st["reserved_bytes"], 0);
    assert_eq!(st["provisioned_bytes"], 1u64 << 40);
    let pool = s.path().join("pool.data");
    let du = std::fs::metadata(&pool)
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
        .unwrap_or(0);
    assert!(du < 1 << 20, "pool uses {du} bytes for an empty thin disk");

    // zeroedthick: reserves its size, nb = all blocks, tbz = all blocks until written.
    s.ok(&["create", "zt", "--size", "32M", "--type", "zeroedthick"]);
    let st = s.json(&["status"]);
    assert_eq!(st["reserved_bytes"], 32u64 << 20);
    let i = s.json(&["info", "zt"]);
    assert_eq!(i["nb"], 32);
    assert_eq!(i["tbz"], 32);

    // eagerzeroedthick: allocated and zeroed at create.
    s.ok(&[
        "create",
        "ezt",
        "--size",
        "16M",
        "--type",
        "eagerzeroedthick",
    ]);
    let i = s.json(&["info", "ezt"]);
    assert_eq!(i["allocated_bytes"], 16u64 << 20);
    assert_eq!(i["nb"], 16);
    assert_eq!(i["tbz"], 0);
    let du = std::fs::metadata(&pool)
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
        .unwrap();
    assert!(
        du >= 16 << 20,
        "eager-zeroed disk must occupy its space, pool holds {du}"
    );

    // A reservation the datastore cannot honour is refused.
    let small = tempfile::tempdir().unwrap();
    let d = small.path().join("ds");
    let run = |args: &[&str]| {
        std::process::Command::new(strata())
            .arg("--datastore")
            .arg(&d)
            .args(args)
            .output()
            .unwrap()
    };
    assert!(run(&["init", "--capacity", "64M"]).status.success());
    assert!(
        run(&["create", "a", "--size", "48M", "--type", "zeroedthick"])
            .status
            .success()
    );
    let o = run(&["create", "b", "--size", "48M", "--type", "zeroedthick"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot reserve"));
    // Thin over-commit is allowed.
    assert!(run(&["create", "c", "--size", "1G"]).status.success());
    let st: serde_json::Value = serde_json::from_slice(&run(&["status", "--json"]).stdout).unwrap();
    assert!(st["overcommit_percent"].as_u64().unwrap() > 100);
}

/// With a server running, commands go through its control socket (on
/// each kind of datastore), and a second server is refused.
#[test]
fn commands_work_against_a_running_server_and_lock_is_exclusive() {
    common::each_kind(|kind| {
        let s = Store::of(kind);
        s.ok(&["create", "vm", "--size", "8M"]);
        let srv = s.serve();
        // Another server on the same datastore is refused: it is locked.
        let e = s.fails_with(
            5,
            &[
                "serve",
                "--nbd-unix",
                s.dir.path().join("x.sock").to_str().unwrap(),
            ],
        );
        assert!(
            e.contains("already served") || e.contains("one server per directory"),
            "{kind:?}: {e}"
        );
        // Commands go through the control socket.
        s.ok(&["snapshot", "create", "vm", "s1"]);
        s.ok(&["clone", "vm@s1", "c1"]);
        s.ok(&["create", "new", "--size", "1M"]);
        s.ok(&["extend", "vm", "--size", "16M"]);
        assert_eq!(s.json(&["info", "vm"])["size_bytes"], 16 << 20);
        assert!(s
            .fails_with(3, &["info", "ghost"])
            .contains("no disk named 'ghost'"));
        // An error the server answers keeps its place: the file, where in
        // it and what was being done (the message alone names none).
        let bad = s.dir.path().join("bad.vmdk");
        let mut header = b"KDMV\x01\0\0\0".to_vec();
        header.resize(4096, 0);
        std::fs::write(&bad, header).unwrap();
        let e = s.fails_with(11, &["import", bad.to_str().unwrap(), "bad"]);
        assert!(
            e.contains(&format!("{} at 0: open: KDMV grain size", bad.display())),
            "{kind:?}: {e}"
        );
        let c = s.json(&["check"]);
        assert_eq!(c["errors"].as_array().unwrap().len(), 0);
        srv.stop();
        // After a clean stop the datastore opens directly again.
        assert_eq!(s.disk_names(), ["c1", "new", "vm"]);
    });
}

/// A server that fails part-way through starting stops what it had
/// started, in reverse: here its NBD TCP address is taken, after its
/// control socket, placement, background work and NBD Unix socket were
/// up. Nothing is left behind (no socket file, no lock), so the same
/// command works once the address is free, on both kinds.
#[test]
fn a_server_that_fails_to_start_leaves_nothing_behind_and_announces_nothing() {
    common::each_kind(|kind| {
        let s = Store::of(kind);
        s.ok(&["create", "vm", "--size", "8M"]);
        let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = busy.local_addr().unwrap().to_string();
        let sock = s.dir.path().join("nbd.sock");
        let args = [
            "serve",
            "--nbd-unix",
            sock.to_str().unwrap(),
            "--nbd-tcp",
            &tcp,
        ];
        let o = s.cmd(&args);
        assert!(
            !o.status.success(),
            "{kind:?}: serve with a taken port started"
        );
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(&tcp), "{kind:?}: {e}");
        // Nothing was announced: a server that fails to start never said
        // it was serving (nor listed the NBD socket it bound and removed).
        let said = String::from_utf8_lossy(&o.stdout);
        assert!(
            said.is_empty(),
            "{kind:?}: announced before failing: {said}"
        );
        assert!(!sock.exists(), "{kind:?}: the NBD socket was left behind");
        let ctl = s.path().join("control.sock");
        assert!(
            !ctl.exists(),
            "{kind:?}: the control socket was left behind"
        );
        // The datastore was closed: opened directly, then served.
        assert_eq!(s.disk_names(), ["vm"], "{kind:?}");
        drop(busy);
        let srv = s.serve();
        s.ok(&["snapshot", "create", "vm", "s1"]);
        srv.stop();
    });
}

/// A server whose datastore directory is deleted under it still stops on
/// SIGTERM, saying what it could not save. Its control thread once waited
/// in accept(2) for ever: it was woken by a connection to the socket's
/// path, and the path was gone.
#[test]
fn a_server_whose_directory_was_deleted_stops_on_sigterm() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    let srv = s.serve();
    std::fs::remove_dir_all(s.path()).unwrap();
    // SAFETY: plain kill(2) of the test's own child.
    unsafe { libc::kill(srv.pid(), libc::SIGTERM) };
    let st = srv.wait_exit(std::time::Duration::from_secs(60));
    let st = st.expect("the server did not stop within 60 s of SIGTERM");
    // 12: an I/O error (docs/ERRORS.md), what it could not save.
    assert_eq!(st.code(), Some(12), "{st}");
}

#[test]
fn check_reports_damage_and_corrupt_metadata_gets_a_clear_error() {
    use std::os::unix::fs::FileExt;
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "4M"]);
    // Allocate data through a full clone of a disk with data: zero-filled
    // eager disk gives mapped grains without needing a client.
    s.ok(&[
        "create",
        "ezt",
        "--size",
        "1M",
        "--type",
        "eagerzeroedthick",
    ]);
    assert_eq!(s.json(&["check"])["errors"].as_array().unwrap().len(), 0);
    // A flipped bit in a count page: check fails and names the page.
    let refs = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(s.path().join("refcount.data"))
        .unwrap();
    let mut b = [0u8; 4096];
    refs.read_at(&mut b, 0).unwrap();
    let good = b;
    b[4 * 9] ^= 0x10;
    refs.write_at(&b, 0).unwrap();
    let o = s.cmd(&["check"]);
    assert!(!o.status.success(), "check must fail on a damaged page");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("count page 0 (refcount.data byte 0)") && err.contains("checksum"),
        "{err}"
    );
    // Raise one grain's reference count behind strata's back, with a valid
    // checksum: a leak that only recounting finds.
    let mut counts = strata_format::decode_ref_page(&good, 0, false).unwrap();
    let g = (1..strata_format::REFS_PER_PAGE)
        .find(|&g| counts[g] == 1)
        .unwrap();
    counts[g] = 7;
    strata_format::encode_ref_page(0, &counts, &mut b);
    refs.write_at(&b, 0).unwrap();
    drop(refs);
    let o = s.cmd(&["check"]);
    assert!(
        !o.status.success(),
        "check must fail on a damaged datastore"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("grain {g}: count 7 but 1 references (leaked)")),
        "{out}"
    );
    // Both superblock slots damaged: a clear error, nothing panics.
    let sb = std::fs::OpenOptions::new()
        .write(true)
        .open(s.path().join("strata.super"))
        .unwrap();
    sb.write_at(&[0xffu8; 64], 32).unwrap();
    sb.write_at(&[0xffu8; 64], 4096 + 32).unwrap();
    drop(sb);
    let e = s.fails(&["list"]);
    assert!(e.contains("superblock") && e.contains("checksum"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn deleting_a_snapshot_returns_at_once_and_space_comes_back_while_served() {
    if !have("qemu-io") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let srv = s.serve();
    let uri = s.uri("vm");
    run_ok("qemu-io", &["-f", "raw", "-c", "write -P 1 0 32M", &uri]);
    s.ok(&["snapshot", "create", "vm", "old"]);
    // Overwrite everything: the snapshot now holds 32 MiB nobody else has.
    run_ok("qemu-io", &["-f", "raw", "-c", "write -P 2 0 32M", &uri]);
    let used_before = s.json(&["status"])["used_bytes"].as_u64().unwrap();
    assert!(used_before >= 64 << 20, "{used_before}");
    s.ok(&["snapshot", "delete", "vm", "old"]);
    // The background reclaimer gives the 32 MiB back while the disk is served.
    let t = std::time::Instant::now();
    loop {
        let st = s.json(&["status"]);
        let used = st["used_bytes"].as_u64().unwrap();
        if st["reclaiming"] == 0 && used < used_before - (31 << 20) {
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "space never came back: {st}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let r = run_ok(
        "qemu-io",
        &["-f", "raw", "-r", "-c", "read -P 2 0 32M", &uri],
    );
    assert!(!r.contains("verification failed"), "{r}");
    assert_eq!(s.json(&["check"])["errors"].as_array().unwrap().len(), 0);
    srv.stop();
}

/// What a snapshot holds, as `snapshot list --json` and `info --json` show
/// it, is what deleting it gives back once the server's reclaim ends.
#[test]
fn exclusive_bytes_of_a_snapshot_is_what_its_deletion_frees() {
    if !have("qemu-io") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let srv = s.serve();
    let uri = s.uri("vm");
    run_ok("qemu-io", &["-f", "raw", "-c", "write -P 1 0 24M", &uri]);
    s.ok(&["snapshot", "create", "vm", "old"]);
    // The head overwrites 8 MiB: `old` alone holds its first 8 MiB.
    run_ok("qemu-io", &["-f", "raw", "-c", "write -P 2 0 8M", &uri]);
    s.ok(&["snapshot", "create", "vm", "new"]);
    let list = s.json(&["snapshot", "list", "vm"]);
    let figure = |name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .and_then(|x| x["exclusive_bytes"].as_u64())
            .unwrap_or_else(|| panic!("{name} lacks exclusive_bytes: {list}"))
    };
    let old = figure("old");
    assert!(
        (8 << 20..9 << 20).contains(&old),
        "old holds 8 MiB of data and a few map nodes: {old}"
    );
    assert_eq!(figure("new"), 0, "new is the head's map");
    let info = s.json(&["info", "vm"]);
    let rm = info["exclusive_bytes"]
        .as_u64()
        .expect("info has exclusive_bytes");
    let snaps = info["snapshot_space_bytes"]
        .as_u64()
        .expect("info has snapshot_space_bytes");
    assert_eq!(snaps, old, "only old holds what the head does not");
    assert!(rm >= 32 << 20, "rm frees all 32 MiB of data: {rm}");
    let human = s.ok(&["info", "vm"]);
    assert!(
        human.contains("exclusive:") && human.contains("snapshot space:"),
        "{human}"
    );
    let human = s.ok(&["snapshot", "list", "vm"]);
    assert!(human.contains("exclusive"), "{human}");

    let used = |s: &Store| {
        let t = std::time::Instant::now();
        loop {
            let st = s.json(&["status"]);
            if st["reclaiming"] == 0 {
                return st["used_bytes"].as_u64().unwrap();
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(60), "{st}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let before = used(&s);
    s.ok(&["snapshot", "delete", "vm", "old"]);
    let freed = before - used(&s);
    assert!(
        freed.abs_diff(old) <= 1 << 20,
        "deleting old freed {freed}, exclusive_bytes said {old}"
    );
    // rm of the whole disk, the same way.
    let rm = s.json(&["info", "vm"])["exclusive_bytes"].as_u64().unwrap();
    let before = used(&s);
    s.ok(&["rm", "vm"]);
    let freed = before - used(&s);
    assert!(
        freed.abs_diff(rm) <= 1 << 20,
        "rm freed {freed}, figure {rm}"
    );
    srv.stop();
}

/// `strata list | head -1`: a reader that went away ends the command
/// quietly and successfully. It once panicked on the broken pipe (exit
/// 101, "failed printing to stdout"). The pipe's read end is closed
/// before the command starts, so its first write fails every time.
#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["status"],
        &["info", "vm"],
    ] {
        let mut fds = [0; 2];
        // SAFETY: pipe2(2) fills two new descriptors, owned below.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: each descriptor was just made and is owned once.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        let o = std::process::Command::new(common::strata())
            .arg("--datastore")
            .arg(s.path())
            .args(args)
            .stdout(std::process::Stdio::from(write))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "strata {args:?}: {err}");
        assert!(!err.contains("panicked"), "strata {args:?}: {err}");
    }
}

/// Under `--json` (before or after the command) an error is JSON too, on
/// stderr, shaped as the API's error body, with the same exit code.
#[test]
fn under_json_errors_are_json_shaped_like_the_api() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    for args in [&["info", "nope", "--json"][..], &["--json", "rm", "nope"]] {
        let e = s.fails_with(3, args);
        let v: serde_json::Value = serde_json::from_str(&e).unwrap_or_else(|x| panic!("{x}: {e}"));
        assert_eq!(v["error"]["kind"], "not_found", "{e}");
        assert_eq!(v["error"]["message"], "no disk named 'nope'", "{e}");
    }
    // A command line clap refuses is JSON too under --json, exit 2.
    for args in [
        &["create", "--json"][..],
        &["--json", "bogus"],
        &["create", "x", "--size", "10GB", "--json"],
    ] {
        let e = s.fails_with(2, args);
        let v: serde_json::Value = serde_json::from_str(&e).unwrap_or_else(|x| panic!("{x}: {e}"));
        assert_eq!(v["error"]["kind"], "invalid_argument", "{e}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(!m.contains("Usage:") && !m.contains("--help"), "{m}");
    }
    assert!(
        s.fails_with(2, &["create"]).contains("Usage:"),
        "plain without --json"
    );
    // A command with an answer of no JSON form refuses the flag, in JSON.
    let e = s.fails_with(2, &["serve", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&e).unwrap_or_else(|x| panic!("{x}: {e}"));
    assert_eq!(v["error"]["kind"], "invalid_argument", "{e}");
    // rm has a JSON answer now.
    assert_eq!(s.json(&["rm", "vm"])["removed"], "vm");
}

/// Snapshot commands name a snapshot as `DISK@SNAP` (as clone, diff and
/// export do) or as `DISK SNAP`; both at once is a usage error that says
/// which two were given. Group snapshot commands likewise (`GROUP@SNAP`).
#[test]
fn snapshot_commands_take_disk_at_snap_or_two_names() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    assert!(s.ok(&["snapshot", "create", "vm@s1"]).contains("vm@s1"));
    s.ok(&["snapshot", "create", "vm", "s2"]);
    let names = |s: &Store| -> Vec<String> {
        let list = s.json(&["snapshot", "list", "vm"]);
        let names = list.as_array().unwrap().iter();
        names
            .map(|x| x["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&s), ["s1", "s2"]);
    assert_eq!(
        s.json(&["snapshot", "revert", "vm@s1"])["current_snapshot"],
        "s1"
    );
    assert_eq!(
        s.json(&["snapshot", "revert", "vm", "s2"])["current_snapshot"],
        "s2"
    );
    s.ok(&["snapshot", "delete", "vm@s1"]);
    assert_eq!(names(&s), ["s2"]);
    for args in [
        &["snapshot", "delete", "vm@s2", "s1"][..],
        &["snapshot", "create", "vm@s3", "s4"],
        &["snapshot", "revert", "vm@s2", "s2"],
    ] {
        let e = s.fails_with(2, args);
        assert!(
            e.contains("names two snapshots") && e.contains("not both"),
            "{args:?}: {e}"
        );
    }
    assert!(s
        .fails_with(2, &["snapshot", "delete", "vm"])
        .contains("which snapshot"));
    assert_eq!(names(&s), ["s2"], "a refused command changed nothing");
    // Groups: GROUP@SNAP for snapshot, revert and delete.
    s.ok(&["group", "create", "app", "vm"]);
    s.ok(&["group", "snapshot", "app@n1"]);
    s.ok(&["group", "snapshot", "app", "n2"]);
    let e = s.fails_with(2, &["group", "snapshot", "app@n3", "n4"]);
    assert!(e.contains("give app@n3 or app n4, not both"), "{e}");
    assert!(s.ok(&["group", "revert", "app@n1"]).contains("to n1"));
    s.ok(&["group", "snapshot", "delete", "app@n1"]);
    s.ok(&["group", "snapshot", "delete", "app", "n2"]);
    assert_eq!(names(&s), ["s2"]);
    let help = s.ok(&["snapshot", "delete", "--help"]);
    assert!(help.contains("<DISK[@SNAP]> [SNAP]"), "{help}");
}

/// `rm` and `delete` name one command, and so do `list` and `ls`: for
/// disks, snapshots, groups and alarms; `--help` shows the other name.
#[test]
fn rm_and_delete_list_and_ls_are_one_command() {
    let s = Store::new();
    for d in ["a", "b"] {
        s.ok(&["create", d, "--size", "1M"]);
    }
    assert_eq!(s.json(&["ls"]), s.json(&["list"]));
    s.ok(&["snapshot", "create", "a@s1"]);
    s.ok(&["snapshot", "create", "a@s2"]);
    assert_eq!(
        s.json(&["snapshot", "ls", "a"]).as_array().unwrap().len(),
        2
    );
    assert_eq!(s.json(&["snapshot", "rm", "a@s1"])["deleted"], "a@s1");
    assert_eq!(
        s.json(&["snapshot", "delete", "a", "s2"])["deleted"],
        "a@s2"
    );
    s.ok(&["group", "create", "g", "a"]);
    assert_eq!(s.json(&["group", "ls"]), s.json(&["group", "list"]));
    assert_eq!(s.json(&["group", "delete", "g"])["deleted"], "g");
    assert_eq!(s.json(&["alarm", "ls"]), s.json(&["alarm", "list"]));
    assert_eq!(s.json(&["delete", "b"])["removed"], "b");
    assert_eq!(s.disk_names(), ["a"]);
    let help = s.ok(&["--help"]);
    assert!(
        help.contains("[alias: ls]") && help.contains("[alias: delete]"),
        "{help}"
    );
    assert!(s.ok(&["snapshot", "--help"]).contains("[alias: rm]"));
}

/// Every command with an answer prints it as JSON under `--json` (the
/// answer's API shape), the ones that change something too; only those
/// with nothing to answer (`serve`, `completions`, `manpages`, a local
/// `init`) refuse the flag.
#[test]
fn every_command_with_an_answer_prints_it_under_json() {
    let s = Store::new();
    let out = s.path().with_file_name("out.vmdk");
    let out = out.to_str().unwrap();
    for (args, key, want) in [
        (&["create", "vm", "--size", "8M"][..], "name", "vm"),
        (&["create", "vm2", "--size", "8M"], "name", "vm2"),
        (&["snapshot", "create", "vm@s1"], "name", "s1"),
        (&["snapshot", "revert", "vm@s1"], "current_snapshot", "s1"),
        (&["extend", "vm", "--size", "16M"], "name", "vm"),
        (&["limit", "vm", "--iops", "100"], "name", "vm"),
        (&["punchzero", "vm"], "disk", "vm"),
        (
            &["convert", "vm", "--type", "zeroedthick"],
            "provisioning",
            "zeroedthick",
        ),
        (&["defrag", "vm"], "disk", "vm"),
        (&["clone", "vm@s1", "c"], "name", "c"),
        (&["export", "vm@s1", out], "open", out),
        (&["group", "create", "app", "vm"], "name", "app"),
        (&["group", "snapshot", "app@n"], "name", "n"),
        (
            &["group", "snapshot", "delete", "app@n"],
            "deleted",
            "app@n",
        ),
        (&["group", "rm", "app"], "deleted", "app"),
        (&["snapshot", "create", "vm", "s2"], "name", "s2"),
        (&["snapshot", "delete", "vm@s2"], "deleted", "vm@s2"),
        (&["rm", "vm2"], "removed", "vm2"),
    ] {
        let v = s.json(args);
        let got = v
            .get(key)
            .or_else(|| v.get("snapshot").and_then(|x| x.get(key)));
        assert_eq!(got.and_then(|g| g.as_str()), Some(want), "{args:?}: {v:#}");
    }
    s.ok(&["group", "create", "app", "vm"]);
    s.ok(&["group", "snapshot", "app", "n"]);
    let reverted = s.json(&["group", "revert", "app@n"]);
    assert_eq!(reverted[0]["current_snapshot"], "n", "{reverted:#}");
    for args in [
        &["status"][..],
        &["check"],
        &["grow"],
        &["alarm", "list"],
        &["jobs"],
    ] {
        let o = s.cmd(&[args, &["--json"]].concat());
        let text = String::from_utf8_lossy(if o.status.success() {
            &o.stdout
        } else {
            &o.stderr
        });
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "{args:?}: {text}"
        );
    }
    for args in [&["serve"][..], &["completions", "bash"], &["init"]] {
        let e = s.fails_with(2, &[args, &["--json"]].concat());
        assert!(e.contains("no answer to print as JSON"), "{args:?}: {e}");
    }
}

/// `info DISK@SNAP` shows the snapshot (its entry of `snapshot list`,
/// also under `--json`); a snapshot the disk lacks is not found.
#[test]
fn info_of_disk_at_snap_shows_the_snapshot() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    s.ok(&["snapshot", "create", "vm@s1", "--description", "pre 2.0"]);
    s.ok(&["snapshot", "create", "vm@s2"]);
    let text = s.ok(&["info", "vm@s1"]);
    assert!(
        text.contains("vm@s1 (id ") && text.contains("pre 2.0"),
        "{text}"
    );
    assert!(s.ok(&["info", "vm@s2"]).contains("current:"));
    let list = s.json(&["snapshot", "list", "vm"]);
    assert_eq!(s.json(&["info", "vm@s1"]), list[0]);
    let e = s.fails_with(3, &["info", "vm@nope"]);
    assert!(e.contains("disk 'vm' has no snapshot named 'nope'"), "{e}");
    assert!(s
        .fails_with(3, &["info", "nope@s1"])
        .contains("no disk named 'nope'"));
}

/// Sizes read as qemu-img reads them: powers of 1024, `GB` refused, a
/// size that is not whole sectors rounded up with a note, `+SIZE` to grow.
#[test]
fn sizes_read_as_qemu_img_reads_them() {
    let s = Store::new();
    let e = s.fails(&["create", "vm", "--size", "10GB"]);
    assert!(e.contains("write 10G (10 GiB)"), "{e}");
    let o = s.cmd(&["create", "vm", "--size", "1.3M"]);
    assert!(o.status.success());
    let note = String::from_utf8_lossy(&o.stderr);
    assert!(note.contains("rounded up to 1363456"), "{note}");
    assert_eq!(s.json(&["info", "vm"])["size_bytes"], 1_363_456);
    s.ok(&["extend", "vm", "--size", "+1m"]);
    assert_eq!(s.json(&["info", "vm"])["size_bytes"], 1_363_456 + (1 << 20));
    s.ok(&["extend", "vm", "--size", "4M"]);
    assert_eq!(s.json(&["info", "vm"])["size_bytes"], 4 << 20);
    let e = s.fails(&["extend", "vm", "--size", "+1KB"]);
    assert!(e.contains("powers of 1024"), "{e}");
}

/// `strata serve -h` fits a terminal: one short line per option, under
/// headings; `--help` still has each option's whole text, and examples.
/// No other command's `-h` has a line wider than 100 columns either.
#[test]
fn short_help_fits_a_terminal() {
    let help = |args: &[&str]| {
        let o = std::process::Command::new(strata())
            .args(args)
            // Its value would be shown after --datastore's help.
            .env_remove("STRATA_DATASTORE")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "strata {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    let short = help(&["serve", "-h"]);
    let lines = short.lines().count();
    assert!(lines <= 70, "{lines} lines:\n{short}");
    for line in short.lines() {
        assert!(line.chars().count() <= 100, "too wide: '{line}'\n{short}");
    }
    for heading in [
        "NBD",
        "vhost-user-blk and FUSE",
        "TLS and access",
        "HTTP dashboard, API and metrics",
        "I/O, caching and space",
        "Datastore and VMDK files",
        "Object-store datastores",
    ] {
        let heading = format!("{heading}:");
        assert!(short.lines().any(|l| l == heading), "no {heading}\n{short}");
    }
    assert!(short.contains("strata serve --help"), "{short}");
    assert!(!short.contains("FORCEDTLS"), "{short}");
    let long = help(&["serve", "--help"]);
    for phrase in [
        "FORCEDTLS",
        "handshake_evicted",
        "allow_other",
        "S3-FIFO",
        "[default: 16 with --cache none",
        "Examples:",
        "vhost-user-blk-pci",
    ] {
        assert!(long.contains(phrase), "no '{phrase}' in:\n{long}");
    }

    let top = help(&["-h"]);
    let commands: Vec<&str> = top
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.contains(&"serve") && commands.len() > 20, "{top}");
    // Wide lines this test lets be: a subcommand's summary defined outside
    // args.rs, and clap's own list of possible values.
    let allowed = [("group", "  revert "), ("export", "[possible values: ")];
    for command in commands {
        let text = help(&[command, "-h"]);
        for line in text.lines() {
            let excused = line.starts_with("Usage:")
                || allowed
                    .iter()
                    .any(|(c, part)| *c == command && line.contains(part));
            assert!(
                line.chars().count() <= 100 || excused,
                "strata {command} -h: too wide: '{line}'\n{text}"
            );
        }
    }
}
