//! Block sizes as the NBD spec has them: a client that did not ask for
//! them (GO without NBD_INFO_BLOCK_SIZE, or EXPORT_NAME) gets the
//! default minimum of 1 byte and is served at any offset and length
//! (read-modify-write where a write cuts a sector); a client that asked
//! is told 512 and its misaligned requests fail with EINVAL. The clients
//! are libnbd (scripts/nbd_unaligned.py: two connections, 64 commands in
//! flight each, every byte checked) and a raw EXPORT_NAME client.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::nbd::Pipelined;
use common::*;

const SIZE: u64 = 1 << 20;

fn libnbd(s: &Store, args: &[&str]) -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/scripts/nbd_unaligned.py"
    );
    let (uri, size) = (s.uri("d"), SIZE.to_string());
    let mut all = vec![script, &uri, &size];
    all.extend_from_slice(args);
    // Debian's python3 has libnbd's binding (see nbd_stress.rs).
    let o = run("/usr/bin/python3", &all);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.starts_with("ok"),
        "nbd_unaligned.py {args:?}: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Any alignment from clients that did not ask, in each mode: the ring
/// takes none of their writes (they hold the export's lock), and a
/// read-modify-write is never undone by another write to its sector.
#[test]
fn clients_that_did_not_ask_for_block_sizes_are_served_at_any_alignment() {
    if !have("nbdsh") {
        return;
    }
    for mode in [&[][..], &["--cache", "none"], &["--aio", "threads"]] {
        let s = Store::new();
        s.ok(&["create", "d", "--size", "1M"]);
        let srv = s.serve_with(mode);
        let out = libnbd(&s, &["free", "1"]);
        eprintln!("{mode:?}: {out}");
        srv.stop();
    }
}

#[test]
fn a_client_that_asked_for_block_sizes_is_held_to_512_bytes() {
    if !have("nbdsh") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "1M"]);
    let srv = s.serve();
    libnbd(&s, &["strict"]);
    srv.stop();
}

/// EXPORT_NAME cannot ask for block sizes: its client is byte-granular.
#[test]
fn an_export_name_client_writes_and_reads_single_bytes() {
    let s = Store::new();
    s.ok(&["create", "d", "--size", "1M"]);
    let srv = s.serve();
    let mut c = Pipelined::open(&s.sock(), "d").unwrap();
    c.write_at(&[0xaa; 1024], 0).unwrap();
    c.write_at(b"xyz", 1).unwrap();
    c.write_at(b"!", 511).unwrap();
    c.write_at(b"across", 510).unwrap();
    let mut got = [0u8; 3];
    c.read_at(&mut got, 1).unwrap();
    assert_eq!(&got, b"xyz");
    let mut whole = vec![0u8; 1024];
    c.read_at(&mut whole, 0).unwrap();
    let mut want = vec![0xaa; 1024];
    want[1..4].copy_from_slice(b"xyz");
    want[510..516].copy_from_slice(b"across");
    assert_eq!(whole, want);
    drop(c);
    srv.stop();
}
