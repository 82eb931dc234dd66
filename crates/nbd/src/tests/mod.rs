//! Protocol tests: a raw client against a server exporting in-memory disks.

mod client;
mod conformance;
mod memdisk;
mod tools;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_block::{BlockDevice, ZeroOptions};

use crate::proto::*;
use crate::{ExportInfo, ExportProvider, NbdServer, ServerOptions, OPTION_BYTES_MAX};
use client::*;
use memdisk::*;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;

/// Deterministic bytes that differ by seed and position.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub struct Exports(pub Vec<(ExportInfo, Arc<MemDisk>)>);

impl ExportProvider for Exports {
    fn list(&self) -> Vec<ExportInfo> {
        self.0.iter().map(|(i, _)| i.clone()).collect()
    }

    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error> {
        self.0
            .iter()
            .find(|(i, _)| i.name == name)
            .map(|(_, d)| d.clone() as Arc<dyn BlockDevice>)
            .ok_or_else(|| {
                strata_block::Error::new(
                    strata_block::Kind::NotFound,
                    format!("no export named '{name}'"),
                )
            })
    }
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub server: NbdServer,
    pub disks: Vec<Arc<MemDisk>>,
}

impl Harness {
    /// `disk` (1 MiB), `other` (2 MiB) and `ro` (1 MiB, read-only, filled
    /// with pattern 99), served on a Unix socket.
    pub fn new() -> Harness {
        Harness::with(ServerOptions::default(), default_disks())
    }

    pub fn with(opts: ServerOptions, disks: Vec<(&str, &str, MemDisk)>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let mut exports = Vec::new();
        let mut arcs = Vec::new();
        for (name, desc, d) in disks {
            let d = d.arc();
            arcs.push(d.clone());
            exports.push((
                ExportInfo {
                    name: name.into(),
                    description: desc.into(),
                },
                d,
            ));
        }
        let server = NbdServer::new(Arc::new(Exports(exports)), opts);
        server
            .serve_unix(UnixListener::bind(&sock).unwrap())
            .unwrap();
        Harness {
            dir,
            sock,
            server,
            disks: arcs,
        }
    }

    pub fn open(&self, name: &str, structured: bool, meta: bool) -> (Client, Export) {
        Client::open(&self.sock, name, structured, meta)
    }

    pub fn disk(&self, i: usize) -> &MemDisk {
        &self.disks[i]
    }

    /// Wait (by polling, bounded) until the server has no connection left.
    pub fn wait_idle(&self) {
        let deadline = Instant::now() + TIMEOUT;
        while self.server.connections() > 0 {
            assert!(Instant::now() < deadline, "connections never ended");
            std::thread::yield_now();
        }
    }
}

fn default_disks() -> Vec<(&'static str, &'static str, MemDisk)> {
    let ro = MemDisk::new(MIB).read_only();
    ro.fill(0, &pattern(99, MIB as usize));
    vec![
        ("disk", "the test disk", MemDisk::new(MIB)),
        ("other", "", MemDisk::new(2 * MIB)),
        ("ro", "read-only", ro),
    ]
}

const TF_ALWAYS: u16 = TF_HAS_FLAGS
    | TF_SEND_FLUSH
    | TF_SEND_FUA
    | TF_SEND_TRIM
    | TF_SEND_WRITE_ZEROES
    | TF_CAN_MULTI_CONN
    | TF_SEND_CACHE
    | TF_SEND_FAST_ZERO;

// ---------------------------------------------------------------------
// Handshake

#[test]
fn go_then_write_and_read_back_with_simple_replies() {
    let h = Harness::new();
    let (mut c, e) = h.open("disk", false, false);
    assert_eq!(e.size, MIB);
    assert_eq!(e.flags, TF_ALWAYS, "no DF without structured replies");
    assert_eq!(e.block, Some((512, 4096, 32 << 20)));

    let data = pattern(1, 64 * KIB as usize);
    assert_eq!(c.write(128 * KIB, &data), 0);
    assert_eq!(c.read(128 * KIB, 64 * KIB as u32).unwrap(), data);
    assert_eq!(h.disk(0).contents(128 * KIB, data.len()), data);
    assert_eq!(c.read(0, 4096).unwrap(), vec![0u8; 4096]);
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0), 0);
    assert_eq!(c.cmd(CMD_CACHE, 0, 0, 4096), 0);
    c.disc();
    assert!(c.closed(), "DISC ends the connection");
    h.wait_idle();
}

#[test]
fn list_names_every_export_with_its_description() {
    let h = Harness::new();
    let mut c = Client::negotiating(&h.sock);
    let l = c.list().unwrap();
    assert_eq!(
        l,
        [
            ("disk".to_string(), "the test disk".to_string()),
            ("other".to_string(), String::new()),
            ("ro".to_string(), "read-only".to_string()),
        ]
    );
    // LIST with data is invalid, and the session goes on.
    c.option(OPT_LIST, b"x");
    assert_eq!(c.opt_reply().ty, REP_ERR_INVALID);
    assert_eq!(c.info(OPT_GO, "other", &[]).unwrap().size, 2 * MIB);
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
}

#[test]
fn info_reports_export_name_description_and_block_sizes() {
    let h = Harness::new();
    let mut c = Client::negotiating(&h.sock);
    let e = c
        .info(
            OPT_INFO,
            "disk",
            &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
        )
        .unwrap();
    assert_eq!(
        e,
        Export {
            size: MIB,
            flags: TF_ALWAYS,
            name: Some("disk".into()),
            description: Some("the test disk".into()),
            block: Some((512, 4096, 32 << 20)),
        }
    );
    // The empty name is the default export, the first listed.
    let e = c.info(OPT_INFO, "", &[INFO_NAME]).unwrap();
    assert_eq!(e.name.as_deref(), Some("disk"));
    // Read-only exports say so.
    let e = c.info(OPT_INFO, "ro", &[]).unwrap();
    assert_eq!(e.flags, TF_ALWAYS | TF_READ_ONLY);
    // Unknown exports, for INFO and GO alike.
    assert_eq!(c.info(OPT_INFO, "nope", &[]), Err(REP_ERR_UNKNOWN));
    assert_eq!(c.info(OPT_GO, "nope", &[]), Err(REP_ERR_UNKNOWN));
    // Malformed payloads: name longer than the data, item count too big,
    // trailing bytes.
    let mut bad = 1000u32.to_be_bytes().to_vec();
    bad.extend_from_slice(b"disk\0\0");
    c.option(OPT_GO, &bad);
    assert_eq!(c.opt_reply().ty, REP_ERR_INVALID);
    let mut bad = be_string("disk");
    bad.extend_from_slice(&5u16.to_be_bytes());
    c.option(OPT_INFO, &bad);
    assert_eq!(c.opt_reply().ty, REP_ERR_INVALID);
    let mut bad = info_payload("disk", &[]);
    bad.push(0);
    c.option(OPT_GO, &bad);
    assert_eq!(c.opt_reply().ty, REP_ERR_INVALID);
    // Structured replies switch DF on; GO still works after all that.
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.opt_reply().ty, REP_ACK);
    c.structured = true;
    let e = c.info(OPT_GO, "", &[]).unwrap();
    assert_eq!(e.flags, TF_ALWAYS | TF_SEND_DF);
    assert_eq!(c.read(0, 4096).unwrap(), vec![0u8; 4096]);
}

#[test]
fn export_name_enters_transmission_old_style() {
    let h = Harness::new();
    h.disk(1).fill(4096, &pattern(5, 4096));
    for (flags, padding) in [
        (CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES, 0),
        (CLIENT_FIXED_NEWSTYLE, 124),
    ] {
        let mut c = Client::unix(&h.sock).hello(flags);
        c.option(OPT_EXPORT_NAME, b"other");
        assert_eq!(c.u64(), 2 * MIB);
        assert_eq!(c.u16(), TF_ALWAYS);
        assert_eq!(c.recv(padding), vec![0u8; padding]);
        assert_eq!(c.read(4096, 4096).unwrap(), pattern(5, 4096));
    }
    // An unknown export cannot be refused politely: the server hangs up.
    let mut c = Client::negotiating(&h.sock);
    c.option(OPT_EXPORT_NAME, b"nope");
    assert!(c.closed());
    // Structured replies negotiated before EXPORT_NAME stay on.
    let mut c = Client::negotiating(&h.sock);
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.opt_reply().ty, REP_ACK);
    c.option(OPT_EXPORT_NAME, b"");
    assert_eq!(c.u64(), MIB);
    assert_eq!(c.u16(), TF_ALWAYS | TF_SEND_DF);
    c.structured = true;
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
}

#[test]
fn refused_client_flags_and_bad_option_magic_close_the_connection() {
    let h = Harness::new();
    for flags in [0, CLIENT_NO_ZEROES, CLIENT_FIXED_NEWSTYLE | 4, 0x8000_0001] {
        let mut c = Client::unix(&h.sock).hello(flags);
        assert!(c.closed(), "client flags {flags:#x} must be refused");
    }
    let mut c = Client::negotiating(&h.sock);
    let mut b = 0x0123_4567_89ab_cdefu64.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_LIST.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    c.send(&b);
    assert!(c.closed(), "bad option magic");
    // A client that gives up in the middle of the greeting.
    drop(UnixStream::connect(&h.sock).unwrap());
    // ABORT is acknowledged, then the connection ends.
    let mut c = Client::negotiating(&h.sock);
    c.option(OPT_ABORT, &[]);
    let r = c.opt_reply();
    assert_eq!((r.opt, r.ty), (OPT_ABORT, REP_ACK));
    assert!(c.closed());
    // None of that disturbed the server.
    let (mut c, _) = h.open("disk", false, false);
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
    drop(c);
    h.wait_idle();
}

#[test]
fn oversized_options_are_refused_and_huge_ones_close() {
    let h = Harness::new();
    let mut c = Client::negotiating(&h.sock);
    c.option(OPT_INFO, &vec![0x55u8; 100 * KIB as usize]);
    let r = c.opt_reply();
    assert_eq!((r.opt, r.ty), (OPT_INFO, REP_ERR_TOO_BIG));
    assert_eq!(c.info(OPT_INFO, "disk", &[]).unwrap().size, MIB);

    // A length far beyond anything reasonable: the server hangs up without
    // waiting for the data.
    let mut c = Client::negotiating(&h.sock);
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&0x8000_0000u32.to_be_bytes());
    c.send(&b);
    assert!(c.closed());

    // EXPORT_NAME cannot be refused, so an oversized one closes too.
    let mut c = Client::negotiating(&h.sock);
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    b.extend_from_slice(&(OPTION_BYTES_MAX + 1).to_be_bytes());
    c.send(&b);
    assert!(c.closed());
}

#[test]
fn unknown_options_starttls_and_extended_headers_are_unsupported() {
    let h = Harness::new();
    let mut c = Client::negotiating(&h.sock);
    for opt in [0, 4, OPT_STARTTLS, 11, 99, u32::MAX] {
        c.option(opt, &[1, 2, 3]);
        let r = c.opt_reply();
        assert_eq!((r.opt, r.ty), (opt, REP_ERR_UNSUP), "option {opt}");
    }
    c.option(OPT_STRUCTURED_REPLY, &[0]);
    assert_eq!(
        c.opt_reply().ty,
        REP_ERR_INVALID,
        "STRUCTURED_REPLY with data"
    );
    let e = c.info(OPT_GO, "disk", &[]).unwrap();
    assert_eq!(
        e.flags & TF_SEND_DF,
        0,
        "the refused option enabled nothing"
    );
}

#[test]
fn meta_contexts_list_and_set_base_allocation_only() {
    let h = Harness::new();
    let mut c = Client::negotiating(&h.sock);
    // SET needs structured replies first.
    assert_eq!(
        c.meta(OPT_SET_META_CONTEXT, "disk", &[BASE_ALLOCATION]),
        Err(REP_ERR_INVALID)
    );
    // LIST: everything, the namespace, the exact name, something else.
    let base = vec![(0, BASE_ALLOCATION.to_string())];
    assert_eq!(c.meta(OPT_LIST_META_CONTEXT, "disk", &[]).unwrap(), base);
    assert_eq!(
        c.meta(OPT_LIST_META_CONTEXT, "disk", &["base:"]).unwrap(),
        base
    );
    assert_eq!(
        c.meta(
            OPT_LIST_META_CONTEXT,
            "disk",
            &["qemu:dirty-bitmap:x", BASE_ALLOCATION]
        )
        .unwrap(),
        base
    );
    assert_eq!(
        c.meta(OPT_LIST_META_CONTEXT, "disk", &["qemu:dirty-bitmap:x"])
            .unwrap(),
        []
    );
    assert_eq!(
        c.meta(OPT_LIST_META_CONTEXT, "nope", &[]),
        Err(REP_ERR_UNKNOWN)
    );
    // A query count that promises more than the payload holds.
    let mut bad = be_string("disk");
    bad.extend_from_slice(&3u32.to_be_bytes());
    bad.extend_from_slice(&be_string(BASE_ALLOCATION));
    c.option(OPT_LIST_META_CONTEXT, &bad);
    assert_eq!(c.opt_reply().ty, REP_ERR_INVALID);

    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.opt_reply().ty, REP_ACK);
    c.structured = true;
    assert_eq!(
        c.meta(OPT_SET_META_CONTEXT, "disk", &["base:"]).unwrap(),
        []
    );
    assert_eq!(
        c.set_meta("disk", &["x-other:thing", BASE_ALLOCATION]),
        [(BASE_ALLOCATION_ID, BASE_ALLOCATION.to_string())]
    );
    // Selected for "disk" but GO picks "other": no context there.
    c.info(OPT_GO, "other", &[]).unwrap();
    assert_eq!(c.block_status(0, 0, 4096), Err(EINVAL));
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
}

#[test]
fn handshake_times_out_on_silent_clients() {
    let opts = ServerOptions {
        handshake_timeout: Some(Duration::from_millis(200)),
        ..Default::default()
    };
    let h = Harness::with(opts, default_disks());
    let mut c = Client::negotiating(&h.sock);
    let t = Instant::now();
    assert!(c.closed(), "a silent client is dropped");
    assert!(t.elapsed() < TIMEOUT);
    // A client that goes quiet after GO is fine: no timeout in transmission.
    let (mut c, _) = h.open("disk", false, false);
    // Deliberately idle for longer than the handshake timeout.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
}

// ---------------------------------------------------------------------
// Transmission

#[test]
fn invalid_requests_get_errnos_and_the_connection_goes_on() {
    for structured in [false, true] {
        let h = Harness::new();
        let (mut c, _) = h.open("disk", structured, false);
        let known = pattern(7, 8192);
        assert_eq!(c.write(64 * KIB, &known), 0);
        let in_sync = |c: &mut Client| assert_eq!(c.read(64 * KIB, 8192).unwrap(), known);

        for (what, offset, len) in [
            ("past the end", MIB - 512, 1024),
            ("at the end", MIB, 512),
            ("end overflows", u64::MAX - 511, 1024),
            ("misaligned offset", 100, 512),
            ("misaligned length", 0, 100),
            ("zero length", 0, 0),
        ] {
            assert_eq!(c.read(offset, len), Err(EINVAL), "READ {what}");
            in_sync(&mut c);
            // A write past the end is out of space (the protocol's
            // ENOSPC); anything misaligned or empty is invalid.
            let write_errno = if what.contains("end") { ENOSPC } else { EINVAL };
            let data = vec![1u8; len as usize];
            assert_eq!(c.write(offset, &data), write_errno, "WRITE {what}");
            in_sync(&mut c);
            for (ty, errno) in [
                (CMD_TRIM, EINVAL),
                (CMD_WRITE_ZEROES, write_errno),
                (CMD_CACHE, EINVAL),
            ] {
                assert_eq!(c.cmd(ty, 0, offset, len), errno, "{ty} {what}");
            }
            in_sync(&mut c);
        }
        // Over the 32 MiB maximum: the read is refused, the write's
        // payload is consumed and refused.
        assert_eq!(c.read(0, 64 << 20), Err(EOVERFLOW));
        in_sync(&mut c);
        assert_eq!(c.write(0, &vec![0xaa; 33 << 20]), EINVAL);
        in_sync(&mut c);
        // TRIM and WRITE_ZEROES have no payload and no such limit.
        assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 0, 0), EINVAL);
        // Unknown commands and flags.
        for ty in [8, 42, u16::MAX] {
            assert_eq!(c.cmd(ty, 0, 0, 512), EINVAL, "command {ty}");
        }
        assert_eq!(c.cmd(CMD_FLUSH, 1 << 9, 0, 0), EINVAL, "unknown flag");
        assert_eq!(
            c.write_flags(1 << 15, 0, &[3u8; 512]),
            EINVAL,
            "WRITE with an unknown flag"
        );
        in_sync(&mut c);
        // BLOCK_STATUS without a negotiated context.
        let ck = c.request(0, CMD_BLOCK_STATUS, 0, 4096, &[]);
        assert_eq!(c.status_of(ck), EINVAL);
        in_sync(&mut c);
        assert_eq!(
            h.disk(0).contents(0, 512),
            vec![0u8; 512],
            "refused writes wrote nothing"
        );
    }
}

#[test]
fn structured_errors_are_error_chunks_with_messages() {
    let h = Harness::new();
    let (mut c, _) = h.open("disk", true, false);
    let ck = c.request(0, CMD_READ, MIB, 512, &[]);
    match c.reply() {
        Reply::Chunk {
            flags,
            ty,
            cookie,
            payload,
        } => {
            assert_eq!((flags, ty, cookie), (CHUNK_DONE, CHUNK_ERROR, ck));
            let (errno, msg) = error_chunk(&payload);
            assert_eq!(errno, EINVAL);
            assert!(msg.contains("past the device size"), "message: {msg}");
        }
        r => panic!("expected an ERROR chunk, got {r:?}"),
    }
    let ck = c.request(0, CMD_READ, 0, 64 << 20, &[]);
    assert!(matches!(c.reply(), Reply::Chunk { ty: CHUNK_ERROR, cookie, .. } if cookie == ck));
}

#[test]
fn huge_write_payloads_close_the_connection() {
    let h = Harness::new();
    let (mut c, _) = h.open("disk", false, false);
    // 1 GiB announced: too big to skip; the server hangs up instead of
    // reading (and the client never sends the payload).
    c.send(&header(REQUEST_MAGIC, 0, CMD_WRITE, 1, 0, 1 << 30));
    assert!(c.closed());
    let (mut c, _) = h.open("disk", false, false);
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
}

#[test]
fn structured_read_is_one_offset_data_chunk() {
    let h = Harness::new();
    let (mut c, e) = h.open("disk", true, false);
    assert_ne!(e.flags & TF_SEND_DF, 0);
    let data = pattern(3, 12 * KIB as usize);
    assert_eq!(c.write(60 * KIB, &data), 0);
    for flags in [0, FLAG_DF] {
        let ck = c.request(flags, CMD_READ, 60 * KIB, data.len() as u32, &[]);
        match c.reply() {
            Reply::Chunk {
                flags,
                ty,
                cookie,
                payload,
            } => {
                assert_eq!((flags, ty, cookie), (CHUNK_DONE, CHUNK_OFFSET_DATA, ck));
                assert_eq!(payload[..8], (60 * KIB).to_be_bytes());
                assert_eq!(payload[8..], data[..]);
            }
            r => panic!("expected OFFSET_DATA, got {r:?}"),
        }
    }
    // Writes and flushes are acknowledged (simple replies are allowed).
    let ck = c.request(FLAG_FUA, CMD_WRITE, 0, 512, &[9u8; 512]);
    assert_eq!(c.status_of(ck), 0);
    assert_eq!(c.read(0, 512).unwrap(), vec![9u8; 512]);
}

/// Every chunk of the structured reply to `cookie`, until DONE:
/// `(type, offset, length)` with the data of OFFSET_DATA chunks checked
/// against `expect` (the bytes at `base`).
fn read_chunks(c: &mut Client, cookie: u64, base: u64, expect: &[u8]) -> Vec<(u16, u64, u64)> {
    let mut out = Vec::new();
    loop {
        let Reply::Chunk {
            flags,
            ty,
            cookie: ck,
            payload,
        } = c.reply()
        else {
            panic!("simple reply to a structured READ");
        };
        assert_eq!(ck, cookie);
        let at = u64::from_be_bytes(payload[..8].try_into().unwrap());
        let len = match ty {
            CHUNK_OFFSET_DATA => {
                let i = (at - base) as usize;
                assert_eq!(
                    payload[8..],
                    expect[i..i + payload.len() - 8],
                    "data at {at}"
                );
                payload.len() as u64 - 8
            }
            CHUNK_OFFSET_HOLE => u32::from_be_bytes(payload[8..12].try_into().unwrap()) as u64,
            t => panic!("unexpected chunk type {t}"),
        };
        out.push((ty, at, len));
        if flags & CHUNK_DONE != 0 {
            return out;
        }
    }
}

#[test]
fn long_structured_reads_send_the_holes_the_read_reported_as_hole_chunks() {
    let h = Harness::new();
    let (mut c, _) = h.open("disk", true, false);
    let len = 128 * KIB as u32;
    let zeros = vec![0u8; len as usize];
    let (d, hl) = (CHUNK_OFFSET_DATA, CHUNK_OFFSET_HOLE);
    // All holes: one OFFSET_HOLE chunk.
    let ck = c.request(0, CMD_READ, 256 * KIB, len, &[]);
    assert_eq!(
        read_chunks(&mut c, ck, 256 * KIB, &zeros),
        vec![(hl, 256 * KIB, len as u64)]
    );
    // DF asks for the data itself.
    let ck = c.request(FLAG_DF, CMD_READ, 256 * KIB, len, &[]);
    assert_eq!(
        read_chunks(&mut c, ck, 256 * KIB, &zeros),
        vec![(d, 256 * KIB, len as u64)]
    );
    // One allocated block in the range: hole, data, hole, in order.
    assert_eq!(c.write(300 * KIB, &[5u8; 512]), 0);
    let mut expect = zeros.clone();
    expect[44 * 1024..44 * 1024 + 512].fill(5);
    let ck = c.request(0, CMD_READ, 256 * KIB, len, &[]);
    assert_eq!(
        read_chunks(&mut c, ck, 256 * KIB, &expect),
        vec![
            (hl, 256 * KIB, 44 * KIB),
            (d, 300 * KIB, 4 * KIB),
            (hl, 304 * KIB, 80 * KIB)
        ]
    );
    // Short reads are one data chunk, holes or not.
    let ck = c.request(0, CMD_READ, 0, 4096, &[]);
    assert_eq!(read_chunks(&mut c, ck, 0, &zeros), vec![(d, 0, 4096)]);
    assert_eq!(c.read(512 * KIB, len).unwrap(), zeros);
    assert_eq!(c.read(256 * KIB, len).unwrap(), expect);
}

#[test]
fn reads_make_one_pass_over_the_device_and_never_ask_block_status() {
    let h = Harness::new();
    let disk = h.disks[0].clone();
    disk.fill(0, &[3u8; 256 * 1024]);
    for (structured, df) in [(true, 0), (true, FLAG_DF), (false, 0)] {
        let (mut c, _) = h.open("disk", structured, structured);
        let reads = *disk.reads.lock();
        // 1 MiB: the first quarter data, the rest a hole.
        for mib_part in 0..4u64 {
            let off = mib_part * 256 * KIB;
            let ck = c.request(df, CMD_READ, off, 256 * KIB as u32, &[]);
            let want = vec![if mib_part == 0 { 3u8 } else { 0 }; 256 * 1024];
            assert_eq!(c.read_reply(ck, off, 256 * KIB as u32).unwrap(), want);
        }
        assert_eq!(*disk.reads.lock() - reads, 4, "one device read per READ");
        assert_eq!(*disk.statuses.lock(), 0, "no block status on the read path");
        c.disc();
    }
    // A BLOCK_STATUS command is the one thing that asks.
    let (mut c, _) = h.open("disk", true, true);
    assert!(c.block_status(0, 0, 4096).is_ok());
    assert_eq!(*disk.statuses.lock(), 1);
}

#[test]
fn block_status_reports_holes_and_data() {
    let h = Harness::new();
    let (mut c, _) = h.open("disk", true, true);
    const HZ: u32 = STATE_HOLE | STATE_ZERO;
    let m = MIB as u32;
    assert_eq!(c.block_status(0, 0, m), Ok(vec![(m, HZ)]));
    assert_eq!(c.write(64 * KIB, &pattern(1, 8192)), 0);
    assert_eq!(
        c.block_status(0, 0, m),
        Ok(vec![(64 * 1024, HZ), (8192, 0), (m - 72 * 1024, HZ)])
    );
    // A window in the middle, not aligned to the 4 KiB map.
    assert_eq!(
        c.block_status(0, 62 * KIB, 4096),
        Ok(vec![(2048, HZ), (2048, 0)])
    );
    // REQ_ONE: one descriptor, never past the request.
    assert_eq!(
        c.block_status(FLAG_REQ_ONE, 0, m),
        Ok(vec![(64 * 1024, HZ)])
    );
    assert_eq!(
        c.block_status(FLAG_REQ_ONE, 64 * KIB, 4096),
        Ok(vec![(4096, 0)])
    );
    assert_eq!(
        c.block_status(FLAG_REQ_ONE, 64 * KIB, m - 64 * 1024),
        Ok(vec![(8192, 0)])
    );
    // Errors.
    assert_eq!(c.block_status(0, MIB, 4096), Err(EINVAL), "past the end");
    assert_eq!(c.block_status(0, 0, 0), Err(EINVAL), "zero length");
    assert_eq!(c.block_status(0, 100, 512), Err(EINVAL), "misaligned");
    // TRIM turns the data back into a hole; WRITE_ZEROES with NO_HOLE
    // allocates.
    assert_eq!(c.cmd(CMD_TRIM, 0, 64 * KIB, 8192), 0);
    assert_eq!(c.block_status(0, 0, m), Ok(vec![(m, HZ)]));
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, FLAG_NO_HOLE, 0, 4096), 0);
    assert_eq!(c.block_status(0, 0, 8192), Ok(vec![(4096, 0), (4096, HZ)]));
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 0, 4096), 0);
    assert_eq!(c.block_status(0, 0, 8192), Ok(vec![(8192, HZ)]));
}

#[test]
fn block_status_never_reaches_past_the_request() {
    let disks = vec![("sloppy", "", MemDisk::new(MIB).sloppy_status())];
    let h = Harness::with(ServerOptions::default(), disks);
    let (mut c, _) = h.open("sloppy", true, true);
    assert_eq!(c.block_status(0, 4096, 8192), Ok(vec![(8192, 0)]));
    assert_eq!(
        c.block_status(FLAG_REQ_ONE, 0, MIB as u32),
        Ok(vec![(MIB as u32, 0)])
    );
}

#[test]
fn command_flags_reach_the_device() {
    let disks = vec![
        ("fast", "", MemDisk::new(MIB)),
        ("slow", "", MemDisk::new(MIB).without_fast_zero()),
    ];
    let h = Harness::with(ServerOptions::default(), disks);
    let (mut c, _) = h.open("fast", false, false);
    assert_eq!(c.write_flags(FLAG_FUA, 0, &[1u8; 4096]), 0);
    assert_eq!(c.write(4096, &[1u8; 4096]), 0);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, FLAG_NO_HOLE | FLAG_FUA, 0, 4096), 0);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, FLAG_FAST_ZERO, 8192, 4096), 0);
    assert_eq!(c.cmd(CMD_TRIM, 0, 4096, 4096), 0);
    assert_eq!(c.cmd(CMD_TRIM, FLAG_FUA, 4096, 4096), 0);
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0), 0);
    let z = |may_unmap, fast_only, fua| ZeroOptions {
        may_unmap,
        fast_only,
        fua,
    };
    assert_eq!(
        h.disk(0).take_calls(),
        [
            Call::Write {
                offset: 0,
                len: 4096,
                fua: true
            },
            Call::Write {
                offset: 4096,
                len: 4096,
                fua: false
            },
            Call::Zero {
                offset: 0,
                len: 4096,
                opts: z(false, false, true)
            },
            Call::Zero {
                offset: 8192,
                len: 4096,
                opts: z(true, true, false)
            },
            Call::Unmap {
                offset: 4096,
                len: 4096
            },
            // TRIM with FUA: unmap, then flush.
            Call::Unmap {
                offset: 4096,
                len: 4096
            },
            Call::Flush,
            Call::Flush,
        ]
    );
    // A device without fast zeroing: FAST_ZERO fails with ENOTSUP at once,
    // a plain WRITE_ZEROES works.
    let (mut c, _) = h.open("slow", true, false);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, FLAG_FAST_ZERO, 0, 4096), ENOTSUP);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 0, 4096), 0);
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let h = Harness::new();
    for structured in [false, true] {
        let (mut c, e) = h.open("ro", structured, false);
        assert_ne!(e.flags & TF_READ_ONLY, 0);
        assert_eq!(c.write(0, &pattern(1, 4096)), EPERM, "WRITE");
        assert_eq!(c.write(MIB, &pattern(1, 4096)), EPERM, "WRITE past the end");
        assert_eq!(c.cmd(CMD_TRIM, 0, 0, 4096), EPERM, "TRIM");
        assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 0, 4096), EPERM, "WRITE_ZEROES");
        assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0), 0, "FLUSH is harmless");
        assert_eq!(c.read(0, 8192).unwrap(), pattern(99, MIB as usize)[..8192]);
    }
    assert_eq!(h.disk(2).contents(0, 4096), pattern(99, 4096));
}

#[test]
fn bad_request_magic_drops_only_that_connection() {
    let h = Harness::new();
    let (mut bad, _) = h.open("disk", false, false);
    let (mut good, _) = h.open("disk", false, false);
    assert_eq!(good.write(0, &pattern(1, 4096)), 0);
    bad.send(&header(0xdead_beef, 0, CMD_READ, 1, 0, 512));
    assert!(bad.closed(), "bad request magic ends the connection");
    assert_eq!(good.read(0, 4096).unwrap(), pattern(1, 4096));
    // And new clients are still welcome.
    let (mut again, _) = h.open("disk", true, false);
    assert_eq!(again.read(0, 4096).unwrap(), pattern(1, 4096));
}

#[test]
fn a_panicking_device_fails_the_request_not_the_server() {
    let disks = vec![("p", "", MemDisk::new(MIB).panicking_at(8192))];
    let h = Harness::with(ServerOptions::default(), disks);
    let (mut c, _) = h.open("p", false, false);
    assert_eq!(c.read(8192, 512), Err(EIO));
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
}

#[test]
fn disc_answers_requests_in_flight_before_closing() {
    // One worker, held by a gated read: the writes sent next queue up
    // behind it, and DISC arrives while all of them are in flight.
    let opts = ServerOptions {
        workers_per_connection: 1,
        ..Default::default()
    };
    let h = Harness::with(opts, default_disks());
    let (mut c, _) = h.open("disk", false, false);
    let gate_at = 512 * KIB;
    h.disk(0).gate.close_at(gate_at);
    let gated = c.request(0, CMD_READ, gate_at, 4096, &[]);
    h.disk(0).gate.wait_for_held(1);
    let mut cookies = BTreeSet::new();
    for i in 0..16u64 {
        let data = pattern(100 + i, 16 * KIB as usize);
        cookies.insert(c.request(0, CMD_WRITE, i * 16 * KIB, data.len() as u32, &data));
    }
    c.disc();
    assert!(
        h.disk(0).take_calls().is_empty(),
        "the writes are still queued"
    );
    h.disk(0).gate.open();
    match c.reply() {
        Reply::Simple { errno: 0, cookie } if cookie == gated => {
            assert_eq!(c.recv(4096), vec![0u8; 4096]);
        }
        r => panic!("expected the held read first, got {r:?}"),
    }
    for _ in 0..16 {
        match c.reply() {
            Reply::Simple { errno: 0, cookie } => assert!(cookies.remove(&cookie)),
            r => panic!("unexpected reply {r:?}"),
        }
    }
    assert!(cookies.is_empty());
    assert!(c.closed(), "DISC ends the connection after the replies");
    for i in 0..16u64 {
        assert_eq!(
            h.disk(0).contents(i * 16 * KIB, 16 * KIB as usize),
            pattern(100 + i, 16 * KIB as usize)
        );
    }
}

#[test]
fn small_writes_run_on_the_reader_while_the_workers_are_busy() {
    // One worker, held by a gated read. With inline writes up to 16 KiB,
    // small WRITEs are answered meanwhile; a larger one and a FUA one go
    // to the worker and wait behind the read.
    let opts = ServerOptions {
        workers_per_connection: 1,
        inline_write_bytes: 16 * KIB as u32,
        ..Default::default()
    };
    let h = Harness::with(opts, default_disks());
    let (mut c, _) = h.open("disk", false, false);
    let gate_at = 512 * KIB;
    h.disk(0).gate.close_at(gate_at);
    // A failed assertion must not leave the worker held (the server's
    // shutdown would wait for it).
    struct OpenOnDrop<'a>(&'a memdisk::Gate);
    impl Drop for OpenOnDrop<'_> {
        fn drop(&mut self) {
            self.0.open();
        }
    }
    let _open = OpenOnDrop(&h.disk(0).gate);
    let gated = c.request(0, CMD_READ, gate_at, 4096, &[]);
    h.disk(0).gate.wait_for_held(1);
    for i in 0..8u64 {
        let len = if i % 2 == 0 { 4 * KIB } else { 16 * KIB };
        let data = pattern(200 + i, len as usize);
        let cookie = c.request(0, CMD_WRITE, i * 16 * KIB, len as u32, &data);
        match c.reply() {
            Reply::Simple {
                errno: 0,
                cookie: got,
            } => assert_eq!(got, cookie),
            r => panic!("expected the small write's reply, got {r:?}"),
        }
        assert_eq!(h.disk(0).contents(i * 16 * KIB, len as usize), data);
    }
    let big = pattern(300, 32 * KIB as usize);
    let queued_big = c.request(0, CMD_WRITE, 256 * KIB, big.len() as u32, &big);
    let small = pattern(301, 4 * KIB as usize);
    let queued_fua = c.request(FLAG_FUA, CMD_WRITE, 384 * KIB, small.len() as u32, &small);
    // A small write sent after them still overtakes them.
    let last = pattern(302, 4 * KIB as usize);
    let inline = c.request(0, CMD_WRITE, 448 * KIB, last.len() as u32, &last);
    match c.reply() {
        Reply::Simple { errno: 0, cookie } => assert_eq!(cookie, inline),
        r => panic!("expected the last small write first, got {r:?}"),
    }
    assert_eq!(
        h.disk(0).contents(256 * KIB, big.len()),
        vec![0u8; big.len()]
    );
    h.disk(0).gate.open();
    let mut rest = BTreeSet::from([gated, queued_big, queued_fua]);
    for _ in 0..3 {
        match c.reply() {
            Reply::Simple { errno: 0, cookie } => {
                if cookie == gated {
                    assert_eq!(c.recv(4096), vec![0u8; 4096]);
                }
                assert!(rest.remove(&cookie), "unexpected reply {cookie}");
            }
            r => panic!("unexpected reply {r:?}"),
        }
    }
    assert_eq!(h.disk(0).contents(256 * KIB, big.len()), big);
    assert_eq!(h.disk(0).contents(384 * KIB, small.len()), small);
}

#[test]
fn pipelining_past_the_inflight_limit_keeps_every_request() {
    let opts = ServerOptions {
        max_inflight_requests: 3,
        max_inflight_bytes: 64 * KIB,
        workers_per_connection: 2,
        ..Default::default()
    };
    let h = Harness::with(opts, default_disks());
    let (c, _) = h.open("disk", false, false);
    let mut sender = Client::over(c.s.dup());
    let mut c = c;
    const N: u64 = 400;
    let chunk = 8 * KIB;
    let send = std::thread::spawn(move || {
        for i in 0..N {
            let off = (i % 64) * chunk;
            // The cookie is the request index (the client counts from 1).
            if i % 2 == 0 {
                sender.request(0, CMD_WRITE, off, chunk as u32, &pattern(i, chunk as usize));
            } else {
                sender.request(0, CMD_READ, off, chunk as u32, &[]);
            }
        }
    });
    let mut seen = BTreeSet::new();
    for _ in 0..N {
        match c.reply() {
            Reply::Simple { errno: 0, cookie } => {
                let i = cookie - 1;
                if i % 2 == 1 {
                    c.recv(chunk as usize);
                }
                assert!(seen.insert(i), "duplicate reply {i}");
            }
            r => panic!("unexpected reply {r:?}"),
        }
    }
    send.join().unwrap();
    assert_eq!(seen.len() as u64, N);
}

#[test]
fn many_clients_over_unix_and_tcp_at_once() {
    let h = Harness::new();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    h.server.serve_tcp(tcp).unwrap();
    const CLIENTS: u64 = 8;
    const REGION: u64 = 128 * KIB;
    const CHUNK: u64 = 16 * KIB;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let sock = h.sock.clone();
            std::thread::spawn(move || {
                let c = if t % 2 == 0 {
                    Client::unix(&sock)
                } else {
                    Client::tcp(addr)
                };
                let c = c.hello(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
                let (mut c, e) = c.setup("disk", t % 3 == 0, false);
                assert_ne!(e.flags & TF_CAN_MULTI_CONN, 0);
                let base = t * REGION;
                let mut cookies = BTreeSet::new();
                for i in 0..REGION / CHUNK {
                    let data = pattern(t * 100 + i, CHUNK as usize);
                    cookies.insert(c.request(0, CMD_WRITE, base + i * CHUNK, CHUNK as u32, &data));
                }
                while !cookies.is_empty() {
                    let r = c.reply();
                    assert!(cookies.remove(&r.cookie()), "unexpected {r:?}");
                }
                assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0), 0);
                for i in 0..REGION / CHUNK {
                    let got = c.read(base + i * CHUNK, CHUNK as u32).unwrap();
                    assert!(
                        got == pattern(t * 100 + i, CHUNK as usize),
                        "client {t} chunk {i}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    // Every client's data is visible through a fresh connection.
    let (mut c, _) = h.open("disk", false, false);
    for t in 0..CLIENTS {
        for i in 0..REGION / CHUNK {
            assert_eq!(
                c.read(t * REGION + i * CHUNK, CHUNK as u32).unwrap(),
                pattern(t * 100 + i, CHUNK as usize)
            );
        }
    }
}

#[test]
fn connections_over_the_limit_are_closed_at_once() {
    let opts = ServerOptions {
        max_connections: 1,
        ..Default::default()
    };
    let h = Harness::with(opts, default_disks());
    let (mut first, _) = h.open("disk", false, false);
    let mut extra = Client::unix(&h.sock);
    assert!(extra.closed(), "second connection refused");
    assert_eq!(first.read(0, 512).unwrap(), vec![0u8; 512]);
    first.disc();
    assert!(first.closed());
    h.wait_idle();
    let (mut next, _) = h.open("disk", false, false);
    assert_eq!(next.read(0, 512).unwrap(), vec![0u8; 512]);
}

/// A full server closes the connection negotiating longest to admit a
/// new one; connections past their handshake keep their places, and when
/// all places are theirs a new connection is refused.
#[test]
fn a_new_client_takes_the_place_of_the_longest_stalled_handshake() {
    let opts = ServerOptions {
        max_connections: 2,
        ..Default::default()
    };
    let h = Harness::with(opts, default_disks());
    let refusals = h.server.refusals();
    // Two clients stall after the greeting: every place is taken.
    let mut first = Client::negotiating(&h.sock);
    let mut second = Client::negotiating(&h.sock);
    // A third gets in and is served; the first stalled one is closed.
    let (mut third, _) = h.open("disk", false, false);
    assert_eq!(third.read(0, 512).unwrap(), vec![0u8; 512]);
    assert!(first.closed(), "the oldest stalled handshake was closed");
    assert_eq!(refusals.count(crate::Refusal::HandshakeEvicted), 1);
    // A fourth evicts the second (the third is past its handshake).
    let (mut fourth, _) = h.open("disk", false, false);
    assert!(second.closed(), "the other stalled handshake was closed");
    assert_eq!(refusals.count(crate::Refusal::HandshakeEvicted), 2);
    // Both places are past their handshakes now: a fifth is refused and
    // neither open connection is touched.
    let mut fifth = Client::unix(&h.sock);
    assert!(fifth.closed(), "a connection past the limit is refused");
    assert_eq!(refusals.count(crate::Refusal::TooManyConnections), 1);
    assert_eq!(refusals.count(crate::Refusal::HandshakeEvicted), 2);
    assert_eq!(third.read(0, 512).unwrap(), vec![0u8; 512]);
    assert_eq!(fourth.read(0, 512).unwrap(), vec![0u8; 512]);
}

#[test]
fn serve_connection_runs_on_the_callers_thread() {
    let h = Harness::new();
    let (a, b) = UnixStream::pair().unwrap();
    a.set_read_timeout(Some(TIMEOUT)).unwrap();
    let server = &h.server;
    std::thread::scope(|s| {
        let t = s.spawn(move || server.serve_connection(b));
        let mut c = Client::over(Box::new(a)).hello(CLIENT_FIXED_NEWSTYLE);
        let e = c.info(OPT_GO, "other", &[]).unwrap();
        assert_eq!(e.size, 2 * MIB);
        assert_eq!(server.connections(), 1);
        assert_eq!(c.write(0, &[7u8; 512]), 0);
        c.disc();
        assert!(c.closed());
        t.join().unwrap().unwrap();
    });
    assert_eq!(h.disk(1).contents(0, 512), vec![7u8; 512]);
}

#[test]
fn shutdown_answers_requests_in_flight_then_closes_everything() {
    let h = Harness::new();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    h.server.serve_tcp(tcp).unwrap();
    let gate_at = 256 * KIB;
    h.disk(0).fill(gate_at, &pattern(4, 4096));
    h.disk(0).gate.close_at(gate_at);

    let (mut busy, _) = h.open("disk", true, false);
    let (mut idle, _) = Client::tcp(addr)
        .hello(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES)
        .setup("other", false, false);
    let mut negotiating = Client::negotiating(&h.sock);
    let ck = busy.request(0, CMD_READ, gate_at, 4096, &[]);
    h.disk(0).gate.wait_for_held(1);
    assert_eq!(h.server.connections(), 3);

    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let stopper = s.spawn(|| {
            h.server.shutdown();
            done.store(true, Ordering::SeqCst);
        });
        // Once the listener is gone, shutdown is waiting for connections:
        // it cannot finish while the read is held.
        let deadline = Instant::now() + TIMEOUT;
        while UnixStream::connect(&h.sock).is_ok() {
            assert!(Instant::now() < deadline, "listener never closed");
            std::thread::yield_now();
        }
        assert!(idle.closed(), "an idle connection is closed");
        assert!(negotiating.closed(), "a negotiating connection is closed");
        assert!(
            !done.load(Ordering::SeqCst),
            "shutdown waits for the held read"
        );
        h.disk(0).gate.open();
        assert_eq!(busy.read_reply(ck, gate_at, 4096), Ok(pattern(4, 4096)));
        assert!(busy.closed());
        stopper.join().unwrap();
    });
    assert_eq!(h.server.connections(), 0);
    // Every device handle has been released.
    for d in &h.disks {
        assert_eq!(Arc::strong_count(d), 2, "harness + provider only");
    }
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "TCP listener closed"
    );
    assert!(h
        .server
        .serve_unix(UnixListener::bind(h.dir.path().join("x")).unwrap())
        .is_err());
    h.server.shutdown(); // idempotent
}

/// A client that did not ask for the block sizes is told the spec's
/// default minimum of 1 and served at any alignment (the device only
/// ever sees whole sectors); one that asked is told 512.
#[test]
fn a_go_without_block_size_request_is_served_byte_granular() {
    let h = Harness::new();
    let mut c = Client::negotiating(&h.sock);
    let e = c.info(OPT_GO, "disk", &[]).expect("GO");
    assert_eq!(e.block.map(|b| b.0), Some(1));
    assert_eq!(c.write(0, &pattern(3, 1024)), 0);
    assert_eq!(c.write(1, b"abc"), 0);
    assert_eq!(c.write(510, b"across"), 0);
    let mut want = pattern(3, 1024);
    want[1..4].copy_from_slice(b"abc");
    want[510..516].copy_from_slice(b"across");
    assert_eq!(c.read(0, 1024).unwrap(), want);
    assert_eq!(c.read(511, 3).unwrap(), &want[511..514]);
    assert_eq!(c.read(MIB - 1, 2), Err(EINVAL), "past the end");
    let (_, asked) = h.open("disk", false, false);
    assert_eq!(asked.block.map(|b| b.0), Some(512));
}

/// Connections past their handshake are sessions: their export, whether
/// it is read-only, and who the client is; they go when it disconnects.
#[test]
fn sessions_name_each_clients_export_and_go_with_it() {
    let h = Harness::with(ServerOptions::default(), default_disks());
    assert!(h.server.sessions().is_empty());
    let (mut rw, _) = h.open("disk", false, false);
    let (ro, _) = h.open("ro", false, false);
    // Negotiating, with no export yet: not a session.
    let mut idle = Client::unix(&h.sock).hello(CLIENT_FIXED_NEWSTYLE);
    let s = h.server.sessions();
    assert_eq!(
        s.iter()
            .map(|s| (s.export.as_str(), s.read_only))
            .collect::<Vec<_>>(),
        [("disk", false), ("ro", true)],
        "{s:?}"
    );
    let me = format!("local pid {}", std::process::id());
    assert!(s.iter().all(|s| s.peer == me), "{s:?}");
    assert!(s[0].id < s[1].id && s[0].since_unix > 0, "{s:?}");
    rw.disc();
    assert!(rw.closed());
    let deadline = Instant::now() + TIMEOUT;
    while h.server.sessions().len() != 1 {
        assert!(Instant::now() < deadline, "the session never went");
        std::thread::yield_now();
    }
    assert_eq!(h.server.sessions()[0].export, "ro");
    // A client whose end is closed is no session at once, before its
    // connection's thread has read that (`rm` right after `qemu-io -c`
    // exits is not refused).
    drop(ro);
    assert!(h.server.sessions().is_empty());
    idle.disc();
}
