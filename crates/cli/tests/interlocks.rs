//! Who has a disk open over vhost-user-blk and FUSE, the interlocks on
//! them, vhost-user-blk sockets added to and removed from a running
//! server, and linked clones holding the snapshot they came from
//! (docs/INTERLOCKS.md). NBD's sessions are tested in clients.rs.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

use crate::vfront;

use std::os::unix::fs::FileExt;

use std::time::Duration;
use vhost::VhostBackend;

/// One request through the test frontend (`Guest::blk_io`).
fn vhost_io(g: &mut vfront::Guest, ty: u32, sector: u64, len: u32) -> u8 {
    g.blk_io(ty, sector, len)
}

fn sessions(s: &Store, disk: &str) -> Vec<serde_json::Value> {
    s.json(&["info", disk])["clients"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// A socket added to a running server serves its disk to a frontend at
/// once; `vhost ls` lists it with the frontend, `info` and `status` list
/// the frontend and a process holding the disk's FUSE file; `rm` and
/// `vhost remove` refuse while they are there, and `--force` cuts them
/// off: the FUSE handle answers EIO, the socket goes.
#[test]
fn vhost_and_fuse_clients_are_listed_and_forced_off() {
    if !have_fuse() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    s.ok(&["create", "other", "--size", "8M"]);
    let mnt = s.dir.path().join("mnt");
    let srv = s.serve_with(&["--fuse", mnt.to_str().unwrap()]);
    eventually("the FUSE file", Duration::from_secs(10), || {
        mnt.join("vm").exists()
    });
    let e = s.fails(&["vhost", "add", "nosuch", "x.sock"]);
    assert!(e.contains("nosuch"), "{e}");
    assert_eq!(s.json(&["vhost", "ls"]), serde_json::json!([]));

    // Added while serving, relative path and all: driven by the frontend.
    let sock = s.dir.path().join("vm.vhost");
    let added = s.json(&["vhost", "add", "vm", sock.to_str().unwrap()]);
    assert_eq!(added[0]["export"], "vm", "{added}");
    assert_eq!(added[0]["socket"], sock.to_str().unwrap());
    let e = s.fails(&["vhost", "add", "other", sock.to_str().unwrap()]);
    assert!(e.contains("served already"), "{e}");
    let mut g = vfront::Guest::connect(&sock, 1, 0);
    g.write(vfront::DATA_BASE + 0x1000, &[0x5a; 4096]);
    assert_eq!(vhost_io(&mut g, vfront::T_OUT, 8, 4096), 0);
    let fuse_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("vm"))
        .unwrap();
    let mut back = [0u8; 4096];
    fuse_file.read_exact_at(&mut back, 4096).unwrap();
    assert_eq!(
        back, [0x5a; 4096],
        "the FUSE file reads what the frontend wrote"
    );

    // Both listed, by transport, with who they are.
    eventually("two sessions", Duration::from_secs(10), || {
        sessions(&s, "vm").len() == 2
    });
    let c = sessions(&s, "vm");
    let vhost = c
        .iter()
        .find(|c| c["transport"] == "vhost-user-blk")
        .unwrap();
    let me = format!("pid {}", std::process::id());
    let peer = vhost["peer"].as_str().unwrap();
    assert!(
        peer.starts_with(sock.to_str().unwrap()) && peer.contains(&me),
        "{peer}"
    );
    let fuse = c.iter().find(|c| c["transport"] == "fuse").unwrap();
    assert!(fuse["peer"].as_str().unwrap().starts_with(&me), "{fuse}");
    assert_eq!(fuse["read_only"], false);
    let ls = s.json(&["vhost", "ls"]);
    assert_eq!(ls[0]["client"]["transport"], "vhost-user-blk", "{ls}");
    let st = s.json(&["status"]);
    assert_eq!(st["clients"].as_array().unwrap().len(), 2, "{st}");
    let text = s.ok(&["status"]);
    assert!(text.contains("clients: 2 sessions on 1 disk"), "{text}");

    // Refused, naming them; then forced.
    let e = s.fails_with(6, &["rm", "vm"]);
    assert!(
        e.contains("over vhost-user-blk from") && e.contains("over fuse from"),
        "{e}"
    );
    assert!(e.contains("removing it frees"), "{e}");
    let e = s.fails_with(6, &["vhost", "remove", sock.to_str().unwrap()]);
    assert!(e.contains("in use") && e.contains("--force"), "{e}");
    s.ok(&["rm", "vm", "--force"]);
    let err = fuse_file.read_exact_at(&mut back, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    eventually("the sessions gone", Duration::from_secs(10), || {
        s.json(&["status"]).get("clients").is_none()
    });
    drop(g);
    drop(fuse_file);

    // The socket stays until removed; removing it takes the file away.
    s.ok(&["vhost", "rm", sock.to_str().unwrap()]);
    assert!(!sock.exists());
    assert_eq!(s.json(&["vhost", "ls"]), serde_json::json!([]));
    let e = s.fails(&["vhost", "remove", sock.to_str().unwrap()]);
    assert!(e.contains("no vhost-user-blk socket"), "{e}");
    srv.stop();
    // Without a server there is nothing to add to.
    let e = s.fails_with(6, &["vhost", "add", "other", sock.to_str().unwrap()]);
    assert!(e.contains("strata serve"), "{e}");
}

/// A socket removed while its frontend is connected (forced) cuts the
/// frontend off; a new one on the same path serves again.
#[test]
fn a_vhost_socket_removed_with_force_cuts_its_frontend_off() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    let srv = s.serve();
    let sock = s.dir.path().join("vm.vhost");
    s.ok(&["vhost", "add", "vm", sock.to_str().unwrap()]);
    let mut g = vfront::Guest::connect(&sock, 1, 0);
    assert_eq!(vhost_io(&mut g, vfront::T_IN, 0, 4096), 0);
    let removed = s.json(&["vhost", "remove", sock.to_str().unwrap(), "--force"]);
    assert_eq!(removed["removed"]["export"], "vm", "{removed}");
    assert!(!sock.exists());
    assert!(
        g.fe.get_features().is_err(),
        "the frontend's connection is closed"
    );
    s.ok(&["vhost", "add", "vm", sock.to_str().unwrap()]);
    let mut g = vfront::Guest::connect(&sock, 1, 0);
    assert_eq!(vhost_io(&mut g, vfront::T_IN, 0, 4096), 0);
    drop(g);
    srv.stop();
}

/// `snapshot delete` of the snapshot linked clones came from, and `rm` of
/// its disk, are refused naming the clones, with a server and without;
/// forced, the clone keeps its data and shows its parent as deleted.
#[test]
fn linked_clones_hold_their_parent_unless_forced() {
    let s = Store::new();
    let img = s.dir.path().join("src.raw");
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&img, &data).unwrap();
    s.ok(&["import", img.to_str().unwrap(), "vm"]);
    s.ok(&["snapshot", "create", "vm@base"]);
    s.ok(&["clone", "vm@base", "c1"]);
    s.ok(&["clone", "vm@base", "c2"]);
    // Offline.
    let e = s.fails_with(6, &["snapshot", "delete", "vm@base"]);
    assert!(e.contains("c1, c2") && e.contains("--force"), "{e}");
    let e = s.fails_with(6, &["rm", "vm"]);
    assert!(e.contains("c1 (from vm@base)"), "{e}");
    // Through a server, JSON errors too.
    let srv = s.serve();
    let o = s.cmd(&["rm", "vm", "--json"]);
    assert_eq!(o.status.code(), Some(6));
    let v: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("c1"),
        "{v}"
    );
    s.ok(&["snapshot", "delete", "vm@base", "--force"]);
    let c1 = s.json(&["info", "c1"]);
    assert_eq!(c1["parent"], "vm@base", "{c1}");
    assert_eq!(c1["parent_deleted"], true, "{c1}");
    assert!(s.ok(&["info", "c1"]).contains("vm@base (deleted)"));
    assert!(s.ok(&["list"]).contains("vm@base (deleted)"));
    // Nothing holds `vm` now: removing it needs no force.
    s.ok(&["rm", "vm"]);
    srv.stop();
    let out = s.dir.path().join("c1.vmdk");
    let flat = ["--subformat", "monolithicFlat"];
    s.ok(&[&["export", "c1", out.to_str().unwrap()][..], &flat].concat());
    let flat = s.dir.path().join("c1-flat.vmdk");
    assert!(
        std::fs::read(&flat).unwrap() == data,
        "the clone kept its data"
    );
    let c = s.json(&["check"]);
    assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
}

/// `rename` of a served disk and of its snapshot: the frontend connected
/// goes on and is listed under the new name with its statistics, the
/// vhost-user-blk socket serves the new name, NBD opens it, linked
/// clones' parents follow; names taken or malformed are refused.
#[test]
fn a_rename_is_followed_by_clients_exports_and_clones() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    s.ok(&["create", "other", "--size", "8M"]);
    s.ok(&["snapshot", "create", "vm@s1"]);
    s.ok(&["clone", "vm@s1", "c1"]);
    let srv = s.serve();
    let sock = s.dir.path().join("vm.vhost");
    s.ok(&["vhost", "add", "vm", sock.to_str().unwrap()]);
    let mut g = vfront::Guest::connect(&sock, 1, 0);
    g.write(vfront::DATA_BASE + 0x1000, &[7; 4096]);
    assert_eq!(vhost_io(&mut g, vfront::T_OUT, 0, 4096), 0);
    eventually("the frontend listed", Duration::from_secs(10), || {
        sessions(&s, "vm").len() == 1
    });

    let r = s.json(&["rename", "vm", "vm2"]);
    assert_eq!(r, serde_json::json!({"renamed": "vm", "to": "vm2"}));
    assert!(s
        .fails_with(3, &["info", "vm"])
        .contains("no disk named 'vm'"));
    let c = sessions(&s, "vm2");
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0]["export"], "vm2");
    assert_eq!(s.json(&["vhost", "ls"])[0]["export"], "vm2");
    assert_eq!(
        vhost_io(&mut g, vfront::T_IN, 0, 4096),
        0,
        "the frontend goes on"
    );
    assert_eq!(g.read(vfront::DATA_BASE + 0x1000, 4096), vec![7; 4096]);
    let st = s.json(&["stats", "vm2"]);
    assert!(
        st["vm2"]["write"]["commands"].as_u64().unwrap() >= 1,
        "{st}"
    );
    assert_eq!(s.json(&["info", "c1"])["parent"], "vm2@s1");

    // The snapshot: DISK@SNAP NEW or DISK@NEW; not onto another disk.
    s.ok(&["snapshot", "rename", "vm2@s1", "s2"]);
    assert_eq!(s.json(&["info", "c1"])["parent"], "vm2@s2");
    s.ok(&["rename", "vm2@s2", "vm2@s3"]);
    let e = s.fails(&["rename", "vm2@s3", "other@s3"]);
    assert!(e.contains("stays with its disk"), "{e}");
    let c1 = s.json(&["info", "c1"]);
    assert_eq!(c1["parent"], "vm2@s3", "{c1}");
    assert!(c1.get("parent_deleted").is_none(), "{c1}");

    // Taken and malformed names.
    let e = s.fails(&["rename", "vm2", "other"]);
    assert!(e.contains("'other' already exists"), "{e}");
    let e = s.fails(&["rename", "vm2", "a/b"]);
    assert!(e.contains("a/b"), "{e}");
    let e = s.fails(&["rename", "nosuch", "x"]);
    assert!(e.contains("no disk named 'nosuch'"), "{e}");
    drop(g);
    srv.stop();

    // Offline too; the new names stay.
    s.ok(&["rename", "vm2", "vm3"]);
    assert_eq!(s.json(&["info", "c1"])["parent"], "vm3@s3");
    let c = s.json(&["check"]);
    assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
}

/// An object store's names are objects every host reads: renaming there
/// is refused, saying so, and changes nothing.
#[test]
fn a_rename_on_an_object_store_is_refused_until_built() {
    if strata_s3::testing::shared().is_none() {
        return;
    }
    let s = Store::of(Kind::ObjectStore);
    s.ok(&["create", "vm", "--size", "8M"]);
    let e = s.fails(&["rename", "vm", "vm2"]);
    assert!(e.contains("not built yet"), "{e}");
    assert_eq!(s.disk_names(), ["vm"]);
}
