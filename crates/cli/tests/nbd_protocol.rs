//! The NBD wire protocol of `strata serve`, byte by byte: a small raw client
//! written here from the protocol description drives the handshake, simple
//! and structured replies, block status, hostile input and multi-conn, and
//! the server must still shut down cleanly afterwards.

mod common;
use common::*;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use strata_block::sched::{kernel_has_thread_slices, slice_of};

const TIMEOUT: Duration = Duration::from_secs(5);

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u32 = 1;
const FLAG_NO_ZEROES: u32 = 2;

const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_STARTTLS: u32 = 5;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_SET_META_CONTEXT: u32 = 10;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_META_CONTEXT: u32 = 4;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;
const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

const TF_HAS_FLAGS: u16 = 1;
const TF_READ_ONLY: u16 = 2;
const TF_SEND_FLUSH: u16 = 4;
const TF_SEND_FUA: u16 = 8;
const TF_SEND_TRIM: u16 = 32;
const TF_SEND_WRITE_ZEROES: u16 = 64;
const TF_CAN_MULTI_CONN: u16 = 256;
const TF_EXPECTED: u16 = TF_HAS_FLAGS
    | TF_SEND_FLUSH
    | TF_SEND_FUA
    | TF_SEND_TRIM
    | TF_SEND_WRITE_ZEROES
    | TF_CAN_MULTI_CONN;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;

const CMD_FLAG_FUA: u16 = 1;
const CMD_FLAG_NO_HOLE: u16 = 2;
const CMD_FLAG_REQ_ONE: u16 = 8;

const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

const STATE_HOLE: u32 = 1;
const STATE_ZERO: u32 = 2;

const EPERM: u32 = 1;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;
const EOVERFLOW: u32 = 75;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Deterministic bytes that differ per seed and per position.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
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

fn be_name(name: &str) -> Vec<u8> {
    let mut p = (name.len() as u32).to_be_bytes().to_vec();
    p.extend_from_slice(name.as_bytes());
    p
}

/// INFO/GO payload: name, then the info types asked for.
fn info_payload(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut p = be_name(name);
    p.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        p.extend_from_slice(&i.to_be_bytes());
    }
    p
}

/// LIST/SET_META_CONTEXT payload: export name, then the queries.
fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut p = be_name(name);
    p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        p.extend_from_slice(&be_name(q));
    }
    p
}

struct OptReply {
    opt: u32,
    ty: u32,
    data: Vec<u8>,
}

/// What INFO/GO told us about an export.
#[derive(Debug)]
struct Export {
    size: u64,
    flags: u16,
    /// (minimum, preferred, maximum) from INFO_BLOCK_SIZE.
    block: Option<(u32, u32, u32)>,
}

#[derive(Debug)]
enum Reply {
    Simple {
        errno: u32,
        cookie: u64,
    },
    Chunk {
        flags: u16,
        ty: u16,
        cookie: u64,
        payload: Vec<u8>,
    },
}

/// A raw NBD client over a Unix socket. Every read has a timeout, so a
/// server that stops answering fails the test instead of hanging it.
struct Nbd {
    s: UnixStream,
    next_cookie: u64,
    /// The base:allocation context id, once negotiated.
    ctx: Option<u32>,
}

impl Nbd {
    fn raw(sock: &Path) -> Nbd {
        let s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        Nbd {
            s,
            next_cookie: 1,
            ctx: None,
        }
    }

    /// Connect, check the greeting, send `client_flags`.
    fn hello(sock: &Path, client_flags: u32) -> Nbd {
        let mut c = Nbd::raw(sock);
        assert_eq!(c.u64(), NBDMAGIC, "greeting magic");
        assert_eq!(c.u64(), IHAVEOPT, "greeting IHAVEOPT");
        assert_eq!(
            c.u16() as u32,
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES,
            "handshake flags"
        );
        c.send(&client_flags.to_be_bytes());
        c
    }

    /// A connection in the option phase.
    fn negotiating(sock: &Path) -> Nbd {
        Nbd::hello(sock, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES)
    }

    /// A connection in the transmission phase on `name`, with simple replies.
    fn open(sock: &Path, name: &str) -> (Nbd, Export) {
        Nbd::open_with(sock, name, false, false)
    }

    /// A connection in the transmission phase on `name`; `structured`
    /// negotiates structured replies first, `meta` then base:allocation
    /// (its context id goes to `self.ctx`).
    fn open_with(sock: &Path, name: &str, structured: bool, meta: bool) -> (Nbd, Export) {
        let mut c = Nbd::negotiating(sock);
        if structured {
            c.option(OPT_STRUCTURED_REPLY, &[]);
            let r = c.opt_reply();
            assert_eq!((r.opt, r.ty), (OPT_STRUCTURED_REPLY, REP_ACK));
        }
        if meta {
            let ids = c.set_base_allocation(name);
            assert_eq!(ids.len(), 1, "base:allocation granted once");
            c.ctx = Some(ids[0]);
        }
        let e = c.info(OPT_GO, name).expect("GO");
        (c, e)
    }

    /// SET_META_CONTEXT base:allocation; returns the context ids granted
    /// (each must name base:allocation).
    fn set_base_allocation(&mut self, name: &str) -> Vec<u32> {
        self.option(
            OPT_SET_META_CONTEXT,
            &meta_payload(name, &["base:allocation"]),
        );
        let mut ids = Vec::new();
        loop {
            let r = self.opt_reply();
            assert_eq!(r.opt, OPT_SET_META_CONTEXT);
            match r.ty {
                REP_ACK => return ids,
                REP_META_CONTEXT => {
                    assert!(r.data.len() >= 4);
                    assert_eq!(&r.data[4..], b"base:allocation");
                    ids.push(u32::from_be_bytes(r.data[..4].try_into().unwrap()));
                }
                t => panic!("unexpected SET_META_CONTEXT reply {t:#x}"),
            }
        }
    }

    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("send to server");
    }

    fn recv(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s
            .read_exact(&mut b)
            .unwrap_or_else(|e| panic!("reading {n} bytes from the server: {e}"));
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.recv(2).try_into().unwrap())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.recv(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.recv(8).try_into().unwrap())
    }

    /// Whether the server hung up: end of file (or a reset) within the
    /// timeout, after draining whatever it still sent.
    fn closed(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        let mut drained = 0usize;
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => return true,
                Ok(n) => {
                    drained += n;
                    if drained > 1 << 20 {
                        return false;
                    }
                }
                Err(e)
                    if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) =>
                {
                    return true
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    fn option(&mut self, opt: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    fn opt_reply(&mut self) -> OptReply {
        assert_eq!(self.u64(), OPT_REPLY_MAGIC, "option reply magic");
        let opt = self.u32();
        let ty = self.u32();
        let len = self.u32() as usize;
        let data = self.recv(len);
        OptReply { opt, ty, data }
    }

    /// INFO or GO on `name` asking for the block size; the reply type on
    /// error. Checks the replies answer this option and end with ACK.
    fn info(&mut self, opt: u32, name: &str) -> Result<Export, u32> {
        self.option(opt, &info_payload(name, &[INFO_BLOCK_SIZE]));
        let mut export: Option<(u64, u16)> = None;
        let mut block = None;
        loop {
            let r = self.opt_reply();
            assert_eq!(r.opt, opt, "reply names the option asked");
            match r.ty {
                REP_INFO => {
                    assert!(r.data.len() >= 2);
                    let d = &r.data;
                    match u16::from_be_bytes([d[0], d[1]]) {
                        INFO_EXPORT => {
                            assert_eq!(d.len(), 12, "INFO_EXPORT length");
                            export = Some((
                                u64::from_be_bytes(d[2..10].try_into().unwrap()),
                                u16::from_be_bytes(d[10..12].try_into().unwrap()),
                            ));
                        }
                        INFO_BLOCK_SIZE => {
                            assert_eq!(d.len(), 14, "INFO_BLOCK_SIZE length");
                            let u = |i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap());
                            block = Some((u(2), u(6), u(10)));
                        }
                        _ => {}
                    }
                }
                REP_ACK => {
                    let (size, flags) = export.expect("ACK without INFO_EXPORT");
                    return Ok(Export { size, flags, block });
                }
                t => {
                    assert!(t & (1 << 31) != 0, "unexpected reply type {t:#x}");
                    assert!(export.is_none(), "error after INFO_EXPORT");
                    return Err(t);
                }
            }
        }
    }

    /// Send one request; returns its cookie.
    fn request(&mut self, flags: u16, ty: u16, offset: u64, len: u32, data: &[u8]) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.send(&header(REQUEST_MAGIC, flags, ty, cookie, offset, len));
        if !data.is_empty() {
            self.send(data);
        }
        cookie
    }

    /// The next reply, simple or structured (data of a simple READ is left
    /// on the wire for the caller).
    fn reply(&mut self) -> Reply {
        match self.u32() {
            SIMPLE_REPLY_MAGIC => {
                let errno = self.u32();
                let cookie = self.u64();
                Reply::Simple { errno, cookie }
            }
            STRUCTURED_REPLY_MAGIC => {
                let flags = self.u16();
                let ty = self.u16();
                let cookie = self.u64();
                let len = self.u32() as usize;
                let payload = self.recv(len);
                Reply::Chunk {
                    flags,
                    ty,
                    cookie,
                    payload,
                }
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }

    /// A simple reply to `cookie`; its errno.
    fn simple(&mut self, cookie: u64) -> u32 {
        match self.reply() {
            Reply::Simple { errno, cookie: c } => {
                assert_eq!(c, cookie, "reply cookie");
                errno
            }
            r => panic!("expected a simple reply, got {r:?}"),
        }
    }

    /// A command without payload, simple replies; its errno.
    fn cmd(&mut self, ty: u16, flags: u16, offset: u64, len: u32) -> u32 {
        let c = self.request(flags, ty, offset, len, &[]);
        self.simple(c)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        let c = self.request(0, CMD_WRITE, offset, data.len() as u32, data);
        self.simple(c)
    }

    /// READ with simple replies: the data, or the errno.
    fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let c = self.request(0, CMD_READ, offset, len, &[]);
        match self.simple(c) {
            0 => Ok(self.recv(len as usize)),
            e => Err(e),
        }
    }

    /// A structured chunk answering `cookie`: (flags, type, payload).
    fn chunk(&mut self, cookie: u64) -> (u16, u16, Vec<u8>) {
        match self.reply() {
            Reply::Chunk {
                flags,
                ty,
                cookie: c,
                payload,
            } => {
                assert_eq!(c, cookie, "chunk cookie");
                (flags, ty, payload)
            }
            r => panic!("expected a structured chunk, got {r:?}"),
        }
    }

    /// Structured replies to `cookie` up to the one flagged DONE; each
    /// chunk as (type, payload).
    fn chunks_until_done(&mut self, cookie: u64) -> Vec<(u16, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let (flags, ty, payload) = self.chunk(cookie);
            out.push((ty, payload));
            if flags & REPLY_FLAG_DONE != 0 {
                return out;
            }
            assert!(out.len() < 10_000, "no DONE chunk");
        }
    }

    /// READ on a structured connection, reassembled from its chunks: the
    /// data, or the errno of the first ERROR chunk.
    fn sread(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let cookie = self.request(0, CMD_READ, offset, len, &[]);
        let mut buf = vec![0u8; len as usize];
        let mut covered = 0u64;
        let mut err = None;
        for (ty, p) in self.chunks_until_done(cookie) {
            match ty {
                REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => {
                    let at = u64::from_be_bytes(p[..8].try_into().unwrap());
                    let n = if ty == REPLY_TYPE_OFFSET_DATA {
                        p.len() as u64 - 8
                    } else {
                        u32::from_be_bytes(p[8..12].try_into().unwrap()) as u64
                    };
                    assert!(
                        at >= offset && at + n <= offset + len as u64,
                        "chunk out of range"
                    );
                    let i = (at - offset) as usize;
                    if ty == REPLY_TYPE_OFFSET_DATA {
                        buf[i..i + n as usize].copy_from_slice(&p[8..]);
                    }
                    covered += n;
                }
                t if t & (1 << 15) != 0 => {
                    err.get_or_insert(error_chunk(&p).0);
                }
                t => panic!("unexpected chunk type {t} in a READ reply"),
            }
        }
        match err {
            Some(e) => Err(e),
            None => {
                assert_eq!(covered, len as u64, "READ chunks must cover the request");
                Ok(buf)
            }
        }
    }

    /// BLOCK_STATUS on base:allocation: the raw (length, flags)
    /// descriptors, or the errno of an error reply.
    fn status(&mut self, flags: u16, offset: u64, len: u32) -> Result<Vec<(u32, u32)>, u32> {
        let cookie = self.request(flags, CMD_BLOCK_STATUS, offset, len, &[]);
        if self.ctx.is_none() {
            // Nothing to describe: whatever comes back must be an error.
            return Err(match self.reply() {
                Reply::Simple { errno, cookie: c } => {
                    assert_eq!(c, cookie);
                    errno
                }
                Reply::Chunk {
                    ty,
                    cookie: c,
                    payload,
                    ..
                } => {
                    assert_eq!(c, cookie);
                    assert_eq!(ty, REPLY_TYPE_ERROR, "expected an ERROR chunk");
                    error_chunk(&payload).0
                }
            });
        }
        let ctx = self.ctx.unwrap();
        let mut descs = None;
        let mut err = None;
        for (ty, p) in self.chunks_until_done(cookie) {
            match ty {
                REPLY_TYPE_BLOCK_STATUS => {
                    assert!(descs.is_none(), "two BLOCK_STATUS chunks for one context");
                    descs = Some(descriptors(&p, ctx));
                }
                REPLY_TYPE_NONE => assert!(p.is_empty()),
                t if t & (1 << 15) != 0 => {
                    err.get_or_insert(error_chunk(&p).0);
                }
                t => panic!("unexpected chunk type {t} in a BLOCK_STATUS reply"),
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(descs.expect("no BLOCK_STATUS chunk")),
        }
    }

    /// A non-READ command that must succeed, on a structured connection
    /// (the server may answer with a simple reply or a NONE chunk).
    fn expect_ok(&mut self, cookie: u64) {
        match self.reply() {
            Reply::Simple { errno, cookie: c } => assert_eq!((errno, c), (0, cookie)),
            Reply::Chunk {
                flags,
                ty,
                cookie: c,
                ..
            } => assert_eq!((flags, ty, c), (REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie)),
        }
    }
}

fn header(magic: u32, flags: u16, ty: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(28);
    b.extend_from_slice(&magic.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&ty.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// (errno, message) of a structured ERROR chunk payload.
fn error_chunk(payload: &[u8]) -> (u32, String) {
    assert!(payload.len() >= 6, "error chunk too short");
    let errno = u32::from_be_bytes(payload[..4].try_into().unwrap());
    let n = u16::from_be_bytes(payload[4..6].try_into().unwrap()) as usize;
    assert_eq!(payload.len(), 6 + n, "error message length");
    (errno, String::from_utf8_lossy(&payload[6..]).into_owned())
}

/// Block status descriptors (length, flags) of a BLOCK_STATUS chunk,
/// which must be for context `ctx`.
fn descriptors(payload: &[u8], ctx: u32) -> Vec<(u32, u32)> {
    assert!(payload.len() >= 12 && (payload.len() - 4).is_multiple_of(8));
    assert_eq!(u32::from_be_bytes(payload[..4].try_into().unwrap()), ctx);
    payload[4..]
        .chunks(8)
        .map(|d| {
            let len = u32::from_be_bytes(d[..4].try_into().unwrap());
            assert!(len > 0, "zero-length descriptor");
            (len, u32::from_be_bytes(d[4..].try_into().unwrap()))
        })
        .collect()
}

/// Descriptors with neighbours of equal flags merged.
fn merged(descs: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &(len, flags) in descs {
        match out.last_mut() {
            Some(last) if last.1 == flags => last.0 += len,
            _ => out.push((len, flags)),
        }
    }
    out
}

/// A datastore with `disk` (1 MiB), `other` (2 MiB) and `disk@s1`, a
/// snapshot of `disk` taken while it was still all zeros.
fn store_with_snapshot() -> Store {
    let s = Store::new();
    s.ok(&["create", "disk", "--size", "1M"]);
    s.ok(&["create", "other", "--size", "2M"]);
    s.ok(&["snapshot", "create", "disk", "s1"]);
    s
}

#[test]
fn option_haggling_gets_spec_replies_and_still_negotiates() {
    let s = store_with_snapshot();
    let srv = s.serve();
    let mut c = Nbd::negotiating(&s.sock());

    // An option payload over 64 KiB is read and refused, not fatal.
    c.option(OPT_INFO, &vec![0x55u8; 100 * KIB as usize]);
    let r = c.opt_reply();
    assert_eq!((r.opt, r.ty), (OPT_INFO, REP_ERR_TOO_BIG));

    for opt in [99, OPT_STARTTLS] {
        c.option(opt, &[]);
        let r = c.opt_reply();
        assert_eq!((r.opt, r.ty), (opt, REP_ERR_UNSUP), "option {opt}");
    }

    // LIST names every disk and snapshot, then ACKs.
    c.option(OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let r = c.opt_reply();
        assert_eq!(r.opt, OPT_LIST);
        match r.ty {
            REP_SERVER => {
                let n = u32::from_be_bytes(r.data[..4].try_into().unwrap()) as usize;
                assert!(4 + n <= r.data.len(), "name longer than the reply");
                names.push(String::from_utf8(r.data[4..4 + n].to_vec()).unwrap());
            }
            REP_ACK => break,
            t => panic!("unexpected LIST reply {t:#x}"),
        }
    }
    names.sort();
    assert_eq!(names, ["disk", "disk@s1", "other"]);

    for opt in [OPT_INFO, OPT_GO] {
        assert_eq!(c.info(opt, "nope").unwrap_err(), REP_ERR_UNKNOWN);
        assert_eq!(c.info(opt, "disk@nope").unwrap_err(), REP_ERR_UNKNOWN);
    }

    for (name, size, ro) in [
        ("disk", MIB, false),
        ("other", 2 * MIB, false),
        ("disk@s1", MIB, true),
    ] {
        let e = c.info(OPT_INFO, name).unwrap();
        assert_eq!(e.size, size, "{name} size");
        assert_eq!(
            e.flags & TF_EXPECTED,
            TF_EXPECTED,
            "{name} flags {:#x}",
            e.flags
        );
        assert_eq!(e.flags & TF_READ_ONLY != 0, ro, "{name} read-only flag");
        assert_eq!(e.block, Some((512, 4096, 32 << 20)), "{name} block sizes");
    }

    // GO whose name length runs past the payload.
    let mut bad = 1000u32.to_be_bytes().to_vec();
    bad.extend_from_slice(b"disk\0\0");
    c.option(OPT_GO, &bad);
    let r = c.opt_reply();
    assert_eq!((r.opt, r.ty), (OPT_GO, REP_ERR_INVALID));
    // GO whose info count promises more than it holds.
    let mut bad = be_name("disk");
    bad.extend_from_slice(&5u16.to_be_bytes());
    c.option(OPT_GO, &bad);
    assert_eq!(c.opt_reply().ty, REP_ERR_INVALID);

    // Meta contexts need structured replies first.
    c.option(
        OPT_SET_META_CONTEXT,
        &meta_payload("disk", &["base:allocation"]),
    );
    let r = c.opt_reply();
    assert_eq!((r.opt, r.ty), (OPT_SET_META_CONTEXT, REP_ERR_INVALID));

    // After all that the same connection still gets to transmission.
    let e = c.info(OPT_GO, "disk").unwrap();
    assert_eq!(e.size, MIB);
    assert_eq!(c.write(4096, &pattern(1, 4096)), 0);
    assert_eq!(c.read(4096, 4096).unwrap(), pattern(1, 4096));
    c.request(0, CMD_DISC, 0, 0, &[]);
    assert!(c.closed(), "DISC must end the connection");

    // A client that does not ask for NO_ZEROES gets through too.
    let mut c = Nbd::hello(&s.sock(), FLAG_FIXED_NEWSTYLE);
    assert_eq!(c.info(OPT_GO, "disk@s1").unwrap().size, MIB);
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
    drop(c);
    srv.stop();
}

#[test]
fn refused_handshakes_and_abort_close_the_connection() {
    let s = store_with_snapshot();
    let srv = s.serve();
    let sock = s.sock();
    // Each hang-up is checked before the next connection is opened, so the
    // close must come from the refusal itself.
    for flags in [
        0,
        FLAG_NO_ZEROES,
        FLAG_FIXED_NEWSTYLE | 4,
        FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES | 0x8000_0000,
    ] {
        let mut c = Nbd::hello(&sock, flags);
        assert!(c.closed(), "client flags {flags:#x} must be refused");
    }

    let mut c = Nbd::negotiating(&sock);
    let mut b = 0x0123_4567_89ab_cdefu64.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_LIST.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    let _ = c.s.write_all(&b); // the server may hang up mid-write
    assert!(c.closed(), "bad option magic must end the connection");

    let mut c = Nbd::negotiating(&sock);
    c.option(OPT_ABORT, &[]);
    let r = c.opt_reply();
    assert_eq!((r.opt, r.ty), (OPT_ABORT, REP_ACK));
    assert!(c.closed(), "ABORT must end the connection after its ACK");

    // The server still serves others afterwards.
    let (mut c, _) = Nbd::open(&sock, "disk");
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
    drop(c);
    srv.stop();
}

/// After an error reply, a READ of a known region must still line up.
fn in_sync(c: &mut Nbd, offset: u64, expect: &[u8]) {
    assert_eq!(
        c.read(offset, expect.len() as u32).expect("follow-up read"),
        expect,
        "stream out of sync"
    );
}

#[test]
fn simple_replies_carry_errnos_and_keep_the_stream_in_sync() {
    let s = store_with_snapshot();
    let srv = s.serve();
    let (mut c, e) = Nbd::open(&s.sock(), "disk");
    assert_eq!(e.size, MIB);

    let known = pattern(7, 64 * KIB as usize);
    assert_eq!(c.write(128 * KIB, &known), 0);
    in_sync(&mut c, 128 * KIB, &known);
    let head = pattern(8, 4096);
    let ck = c.request(CMD_FLAG_FUA, CMD_WRITE, 0, 4096, &head);
    assert_eq!(c.simple(ck), 0, "FUA write");
    in_sync(&mut c, 0, &head);

    for (what, offset, len) in [
        ("read past the end", MIB - 512, 1024),
        ("read at the end", MIB, 512),
        ("read whose end overflows", u64::MAX - 511, 1024),
        ("misaligned offset", 100, 512),
        ("misaligned length", 0, 100),
    ] {
        assert_eq!(c.read(offset, len), Err(EINVAL), "{what}");
        in_sync(&mut c, 128 * KIB, &known);
    }
    // Refused writes still have their payload consumed.
    let e = c.write(MIB - 512, &[1u8; 1024]);
    assert!(e == EINVAL || e == ENOSPC, "write past the end: errno {e}");
    in_sync(&mut c, 128 * KIB, &known);
    assert_eq!(c.write(100, &[1u8; 512]), EINVAL, "misaligned write");
    in_sync(&mut c, 0, &head);

    // Over the advertised 32 MiB maximum.
    let e = c.read(0, 64 << 20).unwrap_err();
    assert!(e == EOVERFLOW || e == EINVAL, "64 MiB read: errno {e}");
    in_sync(&mut c, 128 * KIB, &known);
    let big = vec![0xaau8; 33 << 20];
    let e = c.write(0, &big);
    assert!(e == EOVERFLOW || e == EINVAL, "33 MiB write: errno {e}");
    in_sync(&mut c, 0, &head);

    assert_eq!(c.cmd(42, 0, 0, 512), EINVAL, "unknown command");
    in_sync(&mut c, 128 * KIB, &known);

    // TRIM and WRITE_ZEROES (with and without NO_HOLE) read back as zeros.
    assert_eq!(c.cmd(CMD_TRIM, 0, 128 * KIB, 64 * KIB as u32), 0);
    assert_eq!(
        c.read(128 * KIB, 64 * KIB as u32).unwrap(),
        vec![0u8; 65536]
    );
    let more = pattern(9, 64 * KIB as usize);
    assert_eq!(c.write(256 * KIB, &more), 0);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 256 * KIB, 16 * KIB as u32), 0);
    assert_eq!(
        c.cmd(
            CMD_WRITE_ZEROES,
            CMD_FLAG_NO_HOLE,
            288 * KIB,
            16 * KIB as u32
        ),
        0
    );
    let got = c.read(256 * KIB, 64 * KIB as u32).unwrap();
    assert_eq!(got[..16 * 1024], [0u8; 16 * 1024]);
    assert_eq!(got[16 * 1024..32 * 1024], more[16 * 1024..32 * 1024]);
    assert_eq!(got[32 * 1024..48 * 1024], [0u8; 16 * 1024]);
    assert_eq!(got[48 * 1024..], more[48 * 1024..]);
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0), 0, "FLUSH");

    // The snapshot export refuses every kind of write and keeps its data.
    let (mut ro, e) = Nbd::open(&s.sock(), "disk@s1");
    assert_ne!(e.flags & TF_READ_ONLY, 0);
    assert_eq!(ro.write(0, &pattern(10, 4096)), EPERM, "WRITE");
    assert_eq!(ro.cmd(CMD_TRIM, 0, 0, 4096), EPERM, "TRIM");
    assert_eq!(ro.cmd(CMD_WRITE_ZEROES, 0, 0, 4096), EPERM, "WRITE_ZEROES");
    assert_eq!(ro.read(0, 8192).unwrap(), vec![0u8; 8192]);
    assert_eq!(ro.cmd(CMD_FLUSH, 0, 0, 0), 0, "FLUSH on a read-only export");
    drop(ro);
    drop(c);
    srv.stop();
}

#[test]
fn bad_request_magic_drops_only_that_connection_and_disc_drains_pipelined_writes() {
    let s = Store::new();
    s.ok(&["create", "disk", "--size", "1M"]);
    let srv = s.serve();
    let sock = s.sock();

    let (mut bad, _) = Nbd::open(&sock, "disk");
    let (mut good, _) = Nbd::open(&sock, "disk");
    assert_eq!(good.write(0, &pattern(1, 4096)), 0);
    bad.send(&header(0xdead_beef, 0, CMD_READ, 1, 0, 512));
    assert!(bad.closed(), "bad request magic must end that connection");
    in_sync(&mut good, 0, &pattern(1, 4096));
    assert_eq!(good.write(4096, &pattern(2, 4096)), 0);
    in_sync(&mut good, 4096, &pattern(2, 4096));

    // Pipeline writes, then DISC without reading anything: every write is
    // answered before the server hangs up.
    let (mut p, _) = Nbd::open(&sock, "disk");
    let n = 32u64;
    let chunk = 16 * KIB;
    let mut cookies = std::collections::BTreeSet::new();
    for i in 0..n {
        let flags = if i % 4 == 0 { CMD_FLAG_FUA } else { 0 };
        let data = pattern(100 + i, chunk as usize);
        cookies.insert(p.request(flags, CMD_WRITE, 64 * KIB + i * chunk, chunk as u32, &data));
    }
    p.request(0, CMD_DISC, 0, 0, &[]);
    for _ in 0..n {
        match p.reply() {
            Reply::Simple { errno, cookie } => {
                assert_eq!(errno, 0, "write {cookie}");
                assert!(cookies.remove(&cookie), "unexpected cookie {cookie}");
            }
            r => panic!("expected a simple reply, got {r:?}"),
        }
    }
    assert!(cookies.is_empty());
    assert!(p.closed(), "DISC must end the connection");

    let (mut f, _) = Nbd::open(&sock, "disk");
    for i in 0..n {
        in_sync(
            &mut f,
            64 * KIB + i * chunk,
            &pattern(100 + i, chunk as usize),
        );
    }
    in_sync(&mut f, 0, &pattern(1, 4096));
    drop((bad, good, f));
    srv.stop();
}

#[test]
fn structured_replies_carry_data_errors_and_block_status() {
    let s = Store::new();
    s.ok(&["create", "disk", "--size", "1M"]);
    let srv = s.serve();
    let sock = s.sock();
    let (mut c, e) = Nbd::open_with(&sock, "disk", true, true);
    assert_eq!(e.size, MIB);
    const HOLE_ZERO: u32 = STATE_HOLE | STATE_ZERO;

    // A fresh thin disk is one hole that reads as zeros.
    assert_eq!(
        c.status(0, 0, MIB as u32),
        Ok(vec![(MIB as u32, HOLE_ZERO)])
    );

    let data = pattern(3, 4096);
    let ck = c.request(0, CMD_WRITE, 64 * KIB, 4096, &data);
    c.expect_ok(ck);

    // A READ is one OFFSET_DATA chunk flagged DONE: offset, then the data.
    let ck = c.request(0, CMD_READ, 64 * KIB, 4096, &[]);
    let (flags, ty, payload) = c.chunk(ck);
    assert_eq!((flags, ty), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
    assert_eq!(payload.len(), 8 + 4096);
    assert_eq!(payload[..8], (64 * KIB).to_be_bytes());
    assert_eq!(payload[8..], data[..]);
    let wide = c.sread(60 * KIB, 12 * KIB as u32).unwrap();
    assert_eq!(wide[..4096], [0u8; 4096]);
    assert_eq!(wide[4096..8192], data[..]);
    assert_eq!(wide[8192..], [0u8; 4096]);

    // Errors on READ are ERROR chunks flagged DONE.
    for (what, offset, len) in [
        ("past the end", MIB - 512, 1024u32),
        ("misaligned", 100, 512),
    ] {
        let ck = c.request(0, CMD_READ, offset, len, &[]);
        let (flags, ty, payload) = c.chunk(ck);
        assert_eq!((flags, ty), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR), "{what}");
        assert_eq!(error_chunk(&payload).0, EINVAL, "{what}");
    }
    let e = c.sread(0, 64 << 20).map(|_| ()).unwrap_err();
    assert!(e == EOVERFLOW || e == EINVAL, "64 MiB read: errno {e}");
    assert_eq!(c.sread(64 * KIB, 4096).unwrap(), data);

    // base:allocation: hole+zero, 4 KiB of data, hole+zero.
    let all = c.status(0, 0, MIB as u32).unwrap();
    assert_eq!(
        merged(&all),
        [
            (64 * 1024, HOLE_ZERO),
            (4096, 0),
            (MIB as u32 - 68 * 1024, HOLE_ZERO)
        ]
    );
    assert_eq!(
        merged(&c.status(0, 60 * KIB, 8192).unwrap()),
        [(4096, HOLE_ZERO), (4096, 0)]
    );
    // REQ_ONE: exactly one descriptor, no longer than asked.
    for (offset, flags, max) in [
        (0, HOLE_ZERO, 64 * 1024),
        (64 * KIB, 0, 4096),
        (68 * KIB, HOLE_ZERO, MIB as u32 - 68 * 1024),
    ] {
        let one = c
            .status(CMD_FLAG_REQ_ONE, offset, (MIB - offset) as u32)
            .unwrap();
        assert_eq!(one.len(), 1, "REQ_ONE at {offset}: {one:?}");
        assert_eq!(one[0].1, flags, "REQ_ONE at {offset}");
        assert!(one[0].0 <= max, "REQ_ONE at {offset}: {one:?}");
    }
    assert_eq!(c.status(0, MIB, 4096), Err(EINVAL), "status past the end");
    assert_ne!(
        c.status(0, 0, 0).map(|_| ()).unwrap_err(),
        0,
        "zero-length status"
    );

    // After a TRIM the data extent is a hole again.
    let ck = c.request(0, CMD_TRIM, 64 * KIB, 4096, &[]);
    c.expect_ok(ck);
    assert_eq!(
        merged(&c.status(0, 0, MIB as u32).unwrap()),
        [(MIB as u32, HOLE_ZERO)]
    );
    assert_eq!(c.sread(64 * KIB, 4096).unwrap(), vec![0u8; 4096]);

    // Without a negotiated meta context, BLOCK_STATUS is an error (with
    // and without structured replies), and the connection carries on.
    for structured in [true, false] {
        let (mut n, _) = Nbd::open_with(&sock, "disk", structured, false);
        let e = n.status(0, 0, 4096).unwrap_err();
        assert_ne!(e, 0, "structured={structured}");
        let again = if structured {
            n.sread(0, 4096)
        } else {
            n.read(0, 4096)
        };
        assert_eq!(again.unwrap(), vec![0u8; 4096]);
    }
    drop(c);
    srv.stop();
}

/// One client READ is one read command to the disk, whatever it finds:
/// the server answers holes from the read itself (OFFSET_HOLE chunks), not
/// from a block-status walk of its own, so `strata stats` counts exactly
/// what the client sent.
#[test]
fn structured_1mib_reads_over_data_and_holes_count_as_reads_and_no_block_status() {
    let s = Store::new();
    s.ok(&["create", "disk", "--size", "16M"]);
    let srv = s.serve();
    let (mut c, _) = Nbd::open_with(&s.sock(), "disk", true, true);
    // The first half is data; the second half was never written.
    let data = pattern(9, MIB as usize);
    for i in 0..8 {
        let ck = c.request(0, CMD_WRITE, i * MIB, MIB as u32, &data);
        c.expect_ok(ck);
    }
    s.json(&["stats", "disk", "--reset"]);

    for i in 0..16u64 {
        let ck = c.request(0, CMD_READ, i * MIB, MIB as u32, &[]);
        let chunks = c.chunks_until_done(ck);
        assert_eq!(chunks.len(), 1, "read {i}: one chunk");
        let (ty, payload) = &chunks[0];
        assert_eq!(payload[..8], (i * MIB).to_be_bytes(), "read {i}: offset");
        if i < 8 {
            assert_eq!(*ty, REPLY_TYPE_OFFSET_DATA, "read {i}");
            assert!(payload[8..] == data[..], "read {i}: data");
        } else {
            assert_eq!(*ty, REPLY_TYPE_OFFSET_HOLE, "read {i}");
            assert_eq!(payload[8..], (MIB as u32).to_be_bytes(), "read {i}: length");
        }
    }
    let d = s.json(&["stats", "disk"])["disk"].clone();
    assert_eq!(d["read"]["commands"], 16, "{d}");
    assert_eq!(d["read"]["bytes"], 16 * MIB);
    assert_eq!(d["block_status"]["commands"], 0, "{d}");
    assert_eq!(d["io_length"]["read"]["count"], 16);

    // A read that straddles data and hole: data chunk, then hole chunk,
    // and still one read.
    let ck = c.request(0, CMD_READ, 7 * MIB + 512 * KIB, MIB as u32, &[]);
    let types: Vec<u16> = c.chunks_until_done(ck).iter().map(|x| x.0).collect();
    assert_eq!(types, [REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE]);
    let d = s.json(&["stats", "disk"])["disk"].clone();
    assert_eq!(d["read"]["commands"], 17, "{d}");
    assert_eq!(d["block_status"]["commands"], 0, "{d}");
    drop(c);
    srv.stop();
}

#[test]
fn concurrent_connections_each_read_back_their_own_writes() {
    const THREADS: u64 = 8;
    const REGION: u64 = 512 * KIB;
    const CHUNK: u64 = 64 * KIB;
    let s = Store::new();
    s.ok(&["create", "disk", "--size", "4M"]);
    let srv = s.serve();
    let seed = |t: u64, i: u64| 1000 * t + i;
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let sock = s.sock();
            std::thread::spawn(move || {
                let (mut c, e) = Nbd::open_with(&sock, "disk", t % 2 == 1, false);
                assert_ne!(e.flags & TF_CAN_MULTI_CONN, 0);
                let base = t * REGION;
                // Pipelined: all writes first, then all replies.
                let mut cookies = std::collections::BTreeSet::new();
                for i in 0..REGION / CHUNK {
                    let data = pattern(seed(t, i), CHUNK as usize);
                    cookies.insert(c.request(0, CMD_WRITE, base + i * CHUNK, CHUNK as u32, &data));
                }
                while let Some(&ck) = cookies.first() {
                    let got = match c.reply() {
                        Reply::Simple { errno, cookie } => {
                            assert_eq!(errno, 0);
                            cookie
                        }
                        Reply::Chunk {
                            flags, ty, cookie, ..
                        } => {
                            assert_eq!((flags, ty), (REPLY_FLAG_DONE, REPLY_TYPE_NONE));
                            cookie
                        }
                    };
                    assert!(cookies.remove(&got), "cookie {got} (next {ck})");
                }
                let ck = c.request(0, CMD_FLUSH, 0, 0, &[]);
                c.expect_ok(ck);
                for i in 0..REGION / CHUNK {
                    let got = if t % 2 == 1 {
                        c.sread(base + i * CHUNK, CHUNK as u32)
                    } else {
                        c.read(base + i * CHUNK, CHUNK as u32)
                    };
                    assert!(
                        got.unwrap() == pattern(seed(t, i), CHUNK as usize),
                        "thread {t} chunk {i} reads back wrong"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    // Flushed on one connection, visible on any other.
    let (mut c, _) = Nbd::open(&s.sock(), "disk");
    for t in 0..THREADS {
        for i in 0..REGION / CHUNK {
            in_sync(
                &mut c,
                t * REGION + i * CHUNK,
                &pattern(seed(t, i), CHUNK as usize),
            );
        }
    }
    drop(c);
    srv.stop();
    let check = s.json(&["check"]);
    assert_eq!(check["errors"].as_array().unwrap().len(), 0, "{check}");
}

/// The `se.slice` of every `nbd-conn` thread of process `pid`.
fn connection_slices(pid: i32) -> Vec<Duration> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != "nbd-conn" {
            continue;
        }
        let sched = std::fs::read_to_string(t.path().join("sched")).unwrap_or_default();
        out.extend(slice_of(&sched));
    }
    out
}

/// `--nbd-sched-slice-us`: a connection's thread runs with the slice asked
/// for (where the kernel has per-thread slices: Linux 6.12+), 0 leaves the
/// kernel's default, and a slice the kernel would clamp is refused.
#[test]
fn connection_threads_ask_for_the_scheduler_slice_given() {
    if !kernel_has_thread_slices() {
        eprintln!("skipped: this kernel has no per-thread slices");
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let err = s.fails(&["serve", "--nbd-sched-slice-us", "50"]);
    assert!(err.contains("100 to 100000"), "{err}");

    // The kernel's default, as the main thread of any process has it.
    let default = slice_of(&std::fs::read_to_string("/proc/self/sched").unwrap())
        .expect("se.slice in /proc/self/sched");
    for (arg, want) in [("250", Duration::from_micros(250)), ("0", default)] {
        let srv = s.serve_with(&["--nbd-sched-slice-us", arg]);
        let mut c = common::nbd::Pipelined::open(&s.sock(), "d").unwrap();
        // A request answered: the connection's thread is up and settled.
        c.send(common::nbd::CMD_READ, 1, 0, 4096, &[]).unwrap();
        c.reply(&mut [0u8; 4096]).unwrap();
        let slices = connection_slices(srv.pid());
        assert!(!slices.is_empty(), "no nbd-conn thread found");
        assert!(
            slices.iter().all(|&s| s == want),
            "--nbd-sched-slice-us {arg}: {slices:?}"
        );
        drop(c);
        srv.stop();
    }
}
