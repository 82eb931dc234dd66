//! `serve --vhost-user-blk` from the command line: argument errors, the
//! socket's owner and mode, and the socket going away at shutdown. The
//! protocol itself is tested in crates/vhost/tests (a test frontend) and
//! with a QEMU guest in guest.rs.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::process::Command;

fn serve_fails(s: &Store, extra: &[&str]) -> String {
    let o = Command::new(strata())
        .arg("--datastore")
        .arg(s.path())
        .arg("serve")
        .args(extra)
        .output()
        .unwrap();
    assert!(!o.status.success(), "serve {extra:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_vhost_arguments_are_refused_with_a_clear_error() {
    let s = Store::new();
    s.ok(&["create", "d", "--size", "64M"]);
    let sock = s.dir.path().join("v.sock");
    let e = serve_fails(&s, &["--vhost-user-blk", "d"]);
    assert!(e.contains("expected DISK=SOCKET"), "{e}");
    let spec = format!("nope={}", sock.display());
    let e = serve_fails(&s, &["--vhost-user-blk", &spec]);
    assert!(e.contains("nope"), "{e}");
    let spec = format!("d={}", sock.display());
    let e = serve_fails(&s, &["--vhost-user-blk", &spec, "--vhost-user-blk", &spec]);
    assert!(e.contains("given twice"), "{e}");
    let e = serve_fails(&s, &["--vhost-user-blk", &spec, "--vhost-queues", "0"]);
    assert!(e.contains("vhost-queues"), "{e}");
    let e = serve_fails(&s, &["--vhost-user-blk", &spec, "--socket-mode", "999"]);
    assert!(e.contains("octal"), "{e}");
    let e = serve_fails(
        &s,
        &[
            "--vhost-user-blk",
            &spec,
            "--socket-owner",
            "no-such-user-x",
        ],
    );
    assert!(e.contains("no user named"), "{e}");
    // A regular file in the socket's place is not replaced.
    std::fs::write(&sock, b"precious").unwrap();
    let e = serve_fails(&s, &["--vhost-user-blk", &spec]);
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&sock).unwrap(), b"precious");
}

#[test]
fn sockets_get_the_mode_and_group_asked_for_and_go_at_shutdown() {
    let s = Store::new();
    s.ok(&["create", "d", "--size", "64M"]);
    s.ok(&["snapshot", "create", "d", "s1"]);
    let v = s.dir.path().join("v.sock");
    let vs = s.dir.path().join("vs.sock");
    let spec = format!("d={}", v.display());
    let spec_snap = format!("d@s1={}", vs.display());
    let srv = s.serve_with(&[
        "--vhost-user-blk",
        &spec,
        "--vhost-user-blk",
        &spec_snap,
        "--socket-mode",
        "0660",
        "--socket-owner",
        ":nogroup",
    ]);
    // No wait of its own: the server binds its NBD socket, which the
    // harness waited for, after every other listener.
    let gid = run_ok("getent", &["group", "nogroup"])
        .split(':')
        .nth(2)
        .unwrap()
        .parse::<u32>()
        .unwrap();
    for p in [&v, &vs, &s.sock()] {
        let m = std::fs::metadata(p).unwrap();
        assert!(m.file_type().is_socket(), "{}", p.display());
        assert_eq!(m.permissions().mode() & 0o7777, 0o660, "{}", p.display());
        assert_eq!(m.gid(), gid, "{}", p.display());
    }
    srv.stop();
    assert!(
        !v.exists() && !vs.exists(),
        "vhost sockets removed at shutdown"
    );
}
