//! Served VMDK files are locked as QEMU locks images: `serve --vmdk` holds
//! an exclusive lock on the files of the top link it writes and shared
//! locks on the parents', so `vmdk check --repair` and a second writer are
//! refused with the server named (`vmdk shrink` is handed to the server), readers can share a
//! base, and everything works again once the server stops or is killed.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::vmdk::*;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A store with a 2-link seSparse chain exported from it: (store, base, top).
fn chain() -> (Store, PathBuf, PathBuf) {
    let s = Store::new();
    let dir = s.dir.path().to_path_buf();
    s.ok(&["create", "d", "--size", "8M"]);
    s.ok(&["snapshot", "create", "d", "s1"]);
    s.ok(&[
        "export",
        "d",
        p(&dir.join("vm.vmdk")),
        "--chain",
        "--subformat",
        "seSparse",
    ]);
    let (base, top) = (dir.join("vm.vmdk"), dir.join("vm-000001.vmdk"));
    assert!(base.exists() && top.exists());
    (s, base, top)
}

/// `strata serve --vmdk FILE` without a datastore, NBD on `tag`.sock.
fn serve_vmdk(s: &Store, file: &Path, tag: &str, read_only: bool) -> Server {
    let sock = s.dir.path().join(format!("{tag}.sock"));
    let mut c = Command::new(strata());
    c.env("STRATA_RUNTIME_DIR", runtime(s))
        .args(["--datastore", p(&s.dir.path().join("none")), "serve"])
        .args(["--nbd-unix", p(&sock), "--vmdk"])
        .arg(format!("{tag}={}", p(file)));
    if read_only {
        c.arg("--vmdk-read-only");
    }
    let child = c.stdout(Stdio::null()).spawn().unwrap();
    wait_for(&sock);
    Server { child: Some(child) }
}

/// A qemu-io session holding `file` open writable, and so its lock, once
/// it has the image open (it answers a command only then; racing a fixed
/// window failed once under load). Kill it to let go.
fn qemu_holding(file: &Path) -> std::process::Child {
    use std::io::{BufRead as _, Write as _};
    let mut q = Command::new("qemu-io")
        .args(["-f", "vmdk", p(file)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(q.stdin.as_ref().unwrap(), "info").unwrap();
    let mut first = String::new();
    std::io::BufReader::new(q.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    if first.is_empty() {
        let mut e = String::new();
        std::io::Read::read_to_string(q.stderr.as_mut().unwrap(), &mut e).unwrap();
        panic!("qemu-io could not open {}: {e}", p(file));
    }
    q
}

/// The refusal names the lock conflict and the server holding the file.
fn assert_in_use_by(err: &str, srv: &Server, socket: &Path) {
    assert!(err.contains("in use"), "{err}");
    assert!(err.contains("strata serve --vmdk"), "{err}");
    assert!(err.contains(&format!("pid {}", srv.pid())), "{err}");
    assert!(err.contains(p(socket)), "{err}");
}

#[test]
fn a_served_file_refuses_shrink_repair_and_a_second_writer_until_the_server_stops() {
    let (s, base, top) = chain();
    let srv = serve_vmdk(&s, &top, "a", false);
    let ctl = PathBuf::from(format!("{}.strata.sock", p(&top)));
    wait_for(&ctl);

    // Shrink is done by the server, online (vmdk_shrink_online.rs).
    ok(&s, &["vmdk", "shrink", p(&top)]);
    let e = fails(&s, &["vmdk", "check", "--repair", p(&top)]);
    assert_in_use_by(&e, &srv, &ctl);
    // The base is shared with the server: no writer either.
    let e = fails(&s, &["vmdk", "check", "--repair", p(&base)]);
    assert_in_use_by(&e, &srv, &ctl);
    let sock_b = s.dir.path().join("b.sock");
    let e = fails(
        &s,
        &[
            "--datastore",
            p(&s.dir.path().join("none")),
            "serve",
            "--nbd-unix",
            p(&sock_b),
            "--vmdk",
            p(&top),
        ],
    );
    assert_in_use_by(&e, &srv, &ctl);
    assert!(!sock_b.exists(), "the refused server must not listen");

    // Inspection takes no lock and still works.
    let info: serde_json::Value =
        serde_json::from_str(&ok(&s, &["vmdk", "info", p(&top), "--json"])).unwrap();
    assert_eq!(info["depth"], 2);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&s, &["vmdk", "check", p(&top), "--json"])).unwrap();
    assert_eq!(v["remaining_errors"], 0, "{v}");

    srv.stop();
    assert!(!ctl.exists(), "a clean stop removes the control socket");
    let left: Vec<_> = std::fs::read_dir(runtime(&s).join("holders"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "a clean stop removes its holder records");
    ok(&s, &["vmdk", "shrink", p(&top)]);
    ok(&s, &["vmdk", "check", "--repair", p(&top)]);
    ok(&s, &["vmdk", "check", "--repair", p(&base)]);
}

#[test]
fn readers_and_a_writable_child_share_a_base_but_not_with_a_writer() {
    let (s, base, top) = chain();
    let r1 = serve_vmdk(&s, &base, "r1", true);
    let ctl1 = PathBuf::from(format!("{}.strata.sock", p(&base)));
    wait_for(&ctl1);
    // A second reader of the same file gets a control socket of its own.
    let r2 = serve_vmdk(&s, &base, "r2", true);
    let ctl2 = PathBuf::from(format!("{}.strata-{}.sock", p(&base), r2.pid()));
    wait_for(&ctl2);
    // A writable child: exclusive on its own files, shared on the base.
    let w = serve_vmdk(&s, &top, "w", false);
    let ctl_w = PathBuf::from(format!("{}.strata.sock", p(&top)));
    wait_for(&ctl_w);
    if have("nbdinfo") {
        for tag in ["r1", "r2", "w"] {
            let uri = format!(
                "nbd+unix:///{tag}?socket={}",
                p(&s.dir.path().join(format!("{tag}.sock")))
            );
            run_ok("nbdinfo", &["--size", &uri]);
        }
    }
    // Nobody may write the shared base; the refusal names both readers.
    let e = fails(&s, &["vmdk", "check", "--repair", p(&base)]);
    assert_in_use_by(&e, &r1, &ctl1);
    assert_in_use_by(&e, &r2, &ctl2);
    // A reader of the top the writer holds is refused too (it would read
    // tables mid-update).
    let sock_x = s.dir.path().join("x.sock");
    let e = fails(
        &s,
        &[
            "--datastore",
            p(&s.dir.path().join("none")),
            "serve",
            "--nbd-unix",
            p(&sock_x),
            "--vmdk-read-only",
            "--vmdk",
            p(&top),
        ],
    );
    assert_in_use_by(&e, &w, &ctl_w);
    w.stop();
    r1.stop();
    r2.stop();
    ok(&s, &["vmdk", "check", "--repair", p(&base)]);
}

#[test]
fn a_killed_server_leaves_no_lock_behind() {
    let (s, _base, top) = chain();
    let srv = serve_vmdk(&s, &top, "a", false);
    let ctl = PathBuf::from(format!("{}.strata.sock", p(&top)));
    wait_for(&ctl);
    let e = fails(&s, &["vmdk", "check", "--repair", p(&top)]);
    assert_in_use_by(&e, &srv, &ctl);
    let killed = srv.pid();
    srv.kill9();
    // The kernel dropped the OFD locks; the stale record and socket are
    // skipped and replaced.
    ok(&s, &["vmdk", "shrink", p(&top)]);
    let again = serve_vmdk(&s, &top, "b", false);
    wait_for(&ctl);
    let e = fails(&s, &["vmdk", "check", "--repair", p(&top)]);
    assert_in_use_by(&e, &again, &ctl);
    assert!(
        !e.contains(&format!("pid {killed},")),
        "names the killed server: {e}"
    );
    again.stop();
    ok(&s, &["vmdk", "check", "--repair", p(&top)]);
}

#[test]
fn qemu_and_strata_see_each_others_locks() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let (s, base, top) = chain();
    let srv = serve_vmdk(&s, &top, "a", false);
    wait_for(&PathBuf::from(format!("{}.strata.sock", p(&top))));
    // qemu-img refuses the file strata writes, and reads the shared base.
    let o = run("qemu-img", &["info", p(&top)]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("lock"), "{e}");
    run_ok("qemu-img", &["info", p(&base)]);
    srv.stop();
    // A qemu-io session holding the base writable (QEMU cannot write
    // seSparse) keeps strata from writing it.
    let mut q = qemu_holding(&base);
    let mut refused = String::new();
    for _ in 0..100 {
        let o = strata_cmd(&s, &["vmdk", "check", "--repair", p(&base)]);
        if !o.status.success() {
            refused = String::from_utf8_lossy(&o.stderr).into_owned();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = q.kill();
    let _ = q.wait();
    assert!(refused.contains("in use by another process"), "{refused}");
    ok(&s, &["vmdk", "shrink", p(&top)]);
}

/// `strata ARGS` (VMDK commands, no datastore) is refused as Locked: exit
/// code 5 (docs/ERRORS.md); its stderr.
fn locked(s: &Store, args: &[&str]) -> String {
    let o = strata_cmd(s, args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(5), "strata {args:?}: {err}");
    err
}

/// A VMDK whose lock another process holds, a second strata or QEMU, is
/// refused with Locked's exit code (5) and sentence ("in use by another
/// process" when no strata process recorded holding it), by `serve --vmdk`
/// (writable or read-only) and `vmdk check --repair`; the refused server
/// never listens. No NBD client can meet the lock in a handshake: a
/// server opens and locks its `--vmdk` files when it starts, before it
/// listens, and holds them until it stops (docs/FORMAT.md §9.5), so an
/// export is never there without its lock.
#[test]
fn a_locked_vmdk_is_refused_with_the_kind_of_a_lock() {
    let (s, base, top) = chain();
    let none = s.dir.path().join("none");
    let sock = s.dir.path().join("b.sock");
    let serve = |file: &Path, read_only: bool| {
        let mut args = vec!["--datastore", p(&none), "serve", "--nbd-unix", p(&sock)];
        if read_only {
            args.push("--vmdk-read-only");
        }
        args.extend(["--vmdk", p(file)]);
        let err = locked(&s, &args);
        assert!(!sock.exists(), "the refused server must not listen");
        err
    };
    // Held by another strata server: it is named.
    let srv = serve_vmdk(&s, &top, "a", false);
    let ctl = PathBuf::from(format!("{}.strata.sock", p(&top)));
    wait_for(&ctl);
    for read_only in [false, true] {
        assert_in_use_by(&serve(&top, read_only), &srv, &ctl);
    }
    assert_in_use_by(
        &locked(&s, &["vmdk", "check", "--repair", p(&top)]),
        &srv,
        &ctl,
    );
    srv.stop();
    if !have("qemu-io") {
        return;
    }
    // Held by QEMU, which records nothing: "in use by another process".
    let mut q = qemu_holding(&base);
    let said = "in use by another process";
    for read_only in [false, true] {
        let e = serve(&base, read_only);
        assert!(e.contains(said) && e.contains(p(&base)), "{e}");
    }
    let e = locked(&s, &["vmdk", "check", "--repair", p(&base)]);
    assert!(e.contains(said), "{e}");
    // A child of the base needs the base unwritten, as QEMU writes it.
    let e = serve(&top, false);
    assert!(e.contains(said) && e.contains(p(&base)), "{e}");
    let _ = q.kill();
    let _ = q.wait();
    let srv = serve_vmdk(&s, &top, "a", false);
    if have("nbdinfo") {
        let uri = format!("nbd+unix:///a?socket={}", p(&s.dir.path().join("a.sock")));
        run_ok("nbdinfo", &["--size", &uri]);
    }
    srv.stop();
}
