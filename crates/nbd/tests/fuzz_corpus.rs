//! Replays the committed corpus of the `nbd_session` fuzz target
//! (fuzz/corpus/nbd_session: sessions captured from qemu-io, qemu-img and
//! nbdinfo, sessions written by hand, pipelined sessions written by
//! [`pipelined_seeds`], and what fuzzing kept) through the real server, as
//! the fuzz target does: none may panic or hang. A session that has not
//! ended after [`SESSION_SECONDS_MAX`] fails the test with its name.
//!
//! `cargo test -p strata-nbd --test fuzz_corpus -- --ignored write_seeds`
//! writes the pipelined seeds again.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use strata_nbd::fuzzing::{self, Served};

/// How long one session may take before it counts as hung: each takes
/// milliseconds, a pipelined one of 4,096 requests well under a second.
const SESSION_SECONDS_MAX: u64 = 60;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/nbd_session")
}

/// Serve `input` on a thread of its own and wait at most
/// [`SESSION_SECONDS_MAX`] for it: a server that hangs fails the test
/// instead of hanging the suite (the hung thread is left behind).
fn serve_within(name: &str, input: Vec<u8>) -> Served {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("session {name}"))
        .spawn(move || {
            let _ = tx.send(fuzzing::session(&input));
        })
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(SESSION_SECONDS_MAX)) {
        Ok(served) => served,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "{name}: the session has not ended after {SESSION_SECONDS_MAX} s: the server hangs"
        ),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{name}: the session panicked"),
    }
}

/// Whether this kernel gives us an io_uring (else the server serves
/// export `c` with its workers, and no request is planned).
fn have_io_uring() -> bool {
    strata_block::ring_io::RingIo::<()>::new(8).is_ok()
}

#[test]
fn every_corpus_session_is_served_to_its_end() {
    let dir = corpus_dir();
    let seeds = pipelined_seeds();
    let ring = have_io_uring();
    if !ring {
        eprintln!("no io_uring here: the pipelined sessions are served by the workers alone");
    }
    let mut n = 0;
    let mut generated = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let input = std::fs::read(&path).unwrap();
        let served = serve_within(&name, input.clone());
        let answered = served.answered_bytes;
        // The greeting at least; a captured qemu-io session read 64 KiB,
        // half of it data (every other grain of the fuzz export is a hole).
        assert!(answered >= 18, "{name}: {answered} bytes answered");
        if name == "real_qemu_io" {
            assert!(
                answered > 32 << 10,
                "real_qemu_io: {answered} bytes answered"
            );
        }
        if let Some(seed) = seeds.iter().find(|s| s.name == name) {
            assert!(
                input == seed.input,
                "{name}: not what pipelined_seeds writes (write_seeds again)"
            );
            eprintln!(
                "{name}: {answered} bytes answered (at least {}), {} requests planned",
                seed.answered_min, served.planned_requests
            );
            // Every request before the end was answered.
            assert!(
                answered >= seed.answered_min,
                "{name}: {answered} bytes answered, at least {} expected",
                seed.answered_min
            );
            assert!(
                !ring || served.planned_requests > 0,
                "{name}: no request went through the ring"
            );
            generated += 1;
        }
        n += 1;
    }
    assert_eq!(generated, seeds.len(), "pipelined seeds missing in {dir:?}");
    assert!(n >= 15, "only {n} sessions in {}", dir.display());
}

/// Writes the pipelined seeds into fuzz/corpus/nbd_session.
#[test]
#[ignore]
fn write_seeds() {
    for s in pipelined_seeds() {
        std::fs::write(corpus_dir().join(s.name), &s.input).unwrap();
    }
}

// What a client sends (the NBD protocol, doc/proto.md of nbd).
const IHAVEOPT: &[u8] = b"IHAVEOPT";
const CLIENT_FIXED_NEWSTYLE_NO_ZEROES: u32 = 3;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_SET_META_CONTEXT: u32 = 10;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;
const FLAG_FUA: u16 = 1;
const FLAG_NO_HOLE: u16 = 1 << 1;
const FLAG_REQ_ONE: u16 = 1 << 3;
/// A command flag no version of the protocol defines.
const FLAG_UNKNOWN: u16 = 1 << 15;
/// A command type no version of the protocol defines.
const CMD_UNKNOWN: u16 = 42;
/// The smallest reply: a simple reply's header (a structured one's is 20).
const REPLY_BYTES_MIN: usize = 16;

/// The export the pipelined seeds use: it plans its reads and aligned
/// writes, so they go through the connection's ring (fuzzing.rs).
const EXPORT: &str = "c";
const EXPORT_BYTES: u64 = 1 << 20;
/// Every other grain of a fuzz export is a hole (fuzzing.rs).
const GRAIN: u64 = 4096;

/// One committed seed and what its replay must see.
struct Seed {
    name: &'static str,
    input: Vec<u8>,
    /// Bytes the server must answer at least: a reply to every request
    /// sent before the end, with the data of every valid READ's data
    /// grains.
    answered_min: usize,
}

/// A client's bytes, and the least the server must answer to them.
struct Client {
    out: Vec<u8>,
    handle: u64,
    answered_min: usize,
}

impl Client {
    /// Fixed newstyle without zeroes, structured replies with
    /// `base:allocation` if `structured`, then GO to [`EXPORT`].
    fn new(structured: bool) -> Client {
        let mut c = Client {
            out: CLIENT_FIXED_NEWSTYLE_NO_ZEROES.to_be_bytes().to_vec(),
            handle: 0,
            answered_min: 0,
        };
        if structured {
            c.option(OPT_STRUCTURED_REPLY, &[]);
            let query = b"base:allocation";
            let mut d = Vec::new();
            d.extend_from_slice(&(EXPORT.len() as u32).to_be_bytes());
            d.extend_from_slice(EXPORT.as_bytes());
            d.extend_from_slice(&1u32.to_be_bytes());
            d.extend_from_slice(&(query.len() as u32).to_be_bytes());
            d.extend_from_slice(query);
            c.option(OPT_SET_META_CONTEXT, &d);
        }
        let mut d = Vec::new();
        d.extend_from_slice(&(EXPORT.len() as u32).to_be_bytes());
        d.extend_from_slice(EXPORT.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        c.option(OPT_GO, &d);
        c
    }

    fn option(&mut self, opt: u32, data: &[u8]) {
        self.out.extend_from_slice(IHAVEOPT);
        self.out.extend_from_slice(&opt.to_be_bytes());
        self.out
            .extend_from_slice(&(data.len() as u32).to_be_bytes());
        self.out.extend_from_slice(data);
    }

    /// A request header only; not counted as one to answer.
    fn header(&mut self, flags: u16, ty: u16, offset: u64, len: u32) {
        self.handle += 1;
        self.out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        self.out.extend_from_slice(&flags.to_be_bytes());
        self.out.extend_from_slice(&ty.to_be_bytes());
        self.out.extend_from_slice(&self.handle.to_be_bytes());
        self.out.extend_from_slice(&offset.to_be_bytes());
        self.out.extend_from_slice(&len.to_be_bytes());
    }

    /// A request that is answered (with an error, maybe) and carries no
    /// data the count relies on.
    fn request(&mut self, flags: u16, ty: u16, offset: u64, len: u32) {
        self.header(flags, ty, offset, len);
        self.answered_min += REPLY_BYTES_MIN;
    }

    /// A valid READ: answered with at least the bytes of its data grains.
    fn read(&mut self, offset: u64, len: u32) {
        self.request(0, CMD_READ, offset, len);
        self.answered_min += data_bytes(offset, len as u64) as usize;
    }

    /// A WRITE with a payload of `len` bytes (its pattern from the handle).
    fn write(&mut self, flags: u16, offset: u64, len: u32) {
        self.request(flags, CMD_WRITE, offset, len);
        let h = self.handle as u8;
        self.out
            .extend((0..len).map(|i| h.wrapping_add(i as u8).wrapping_mul(7)));
    }

    fn seed(self, name: &'static str) -> Seed {
        Seed {
            name,
            input: self.out,
            answered_min: self.answered_min,
        }
    }
}

/// Bytes of `[offset, offset + len)` in the data grains (the even ones).
fn data_bytes(offset: u64, len: u64) -> u64 {
    let mut n = 0;
    let mut at = offset;
    while at < offset + len {
        let end = ((at / GRAIN + 1) * GRAIN).min(offset + len);
        if (at / GRAIN).is_multiple_of(2) {
            n += end - at;
        }
        at = end;
    }
    n
}

/// xorshift64: the same requests each time the seeds are written.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A grain-aligned offset where `grains` grains fit in the export.
    fn grain_offset(&mut self, grains: u64) -> u64 {
        self.below(EXPORT_BYTES / GRAIN - grains + 1) * GRAIN
    }
}

/// Valid requests of any kind the harness's export takes, mostly on the
/// ring's path (READs, aligned WRITEs), some not (FUA and 512-byte
/// WRITEs, FLUSH, TRIM, WRITE_ZEROES, BLOCK_STATUS: the workers'). READs
/// come in runs of up to 16, half of them longer than the harness's in-flight budget
/// (8): a reader that left a run queued on the ring unsubmitted while it
/// waited for room hung on it (39f0273); any other request between two
/// READs submits them.
fn valid_requests(c: &mut Client, rng: &mut Rng) {
    match rng.below(8) {
        0..=1 => {
            for _ in 0..1 + rng.below(16) {
                let grains = [1, 2, 16][rng.below(3) as usize];
                let offset = rng.grain_offset(grains);
                c.read(offset, (grains * GRAIN) as u32);
            }
        }
        2 => {
            let flags = if rng.below(4) == 0 { FLAG_FUA } else { 0 };
            c.write(flags, rng.grain_offset(1), GRAIN as u32);
        }
        3 => c.write(0, rng.below(EXPORT_BYTES / 512) * 512, 512),
        4 => c.request(0, CMD_FLUSH, 0, 0),
        5..=6 => {
            let offset = rng.grain_offset(4);
            let (ty, flags) = match rng.below(3) {
                0 => (CMD_TRIM, 0),
                1 => (CMD_WRITE_ZEROES, 0),
                _ => (CMD_WRITE_ZEROES, FLAG_NO_HOLE),
            };
            c.request(flags, ty, offset, (4 * GRAIN) as u32);
        }
        _ => {
            // Valid over structured replies with base:allocation; an
            // error reply over simple ones (no context negotiated).
            let flags = if rng.below(2) == 0 { FLAG_REQ_ONE } else { 0 };
            c.request(
                flags,
                CMD_BLOCK_STATUS,
                rng.grain_offset(16),
                16 * GRAIN as u32,
            );
        }
    }
}

/// Requests the server refuses one by one, answering each with an error
/// and reading (and dropping) a refused WRITE's payload.
fn invalid_requests(c: &mut Client) {
    // Unknown flags.
    c.request(FLAG_UNKNOWN, CMD_READ, 0, 4096);
    c.write(FLAG_UNKNOWN, 0, 4096);
    // Past the end.
    c.request(0, CMD_READ, EXPORT_BYTES, 4096);
    c.request(0, CMD_READ, EXPORT_BYTES - 4096, 8192);
    c.request(0, CMD_READ, u64::MAX - 511, 4096);
    c.write(0, EXPORT_BYTES - 512, 1024);
    c.request(0, CMD_TRIM, EXPORT_BYTES, 4096);
    c.request(0, CMD_BLOCK_STATUS, EXPORT_BYTES + 4096, 4096);
    // Not on sectors.
    c.request(0, CMD_READ, 100, 1000);
    c.write(0, 513, 1000);
    c.request(0, CMD_WRITE_ZEROES, 4096, 100);
    // Empty, and of no known type.
    c.request(0, CMD_READ, 0, 0);
    c.request(0, CMD_UNKNOWN, 0, 4096);
}

/// About `n` requests, [`valid_requests`] with [`invalid_requests`] in
/// the middle.
fn mix(c: &mut Client, rng: &mut Rng, n: u64) {
    let start = c.handle;
    let mut invalid = false;
    while c.handle - start < n {
        if !invalid && c.handle - start >= n / 2 {
            invalid_requests(c);
            invalid = true;
        }
        valid_requests(c, rng);
    }
}

/// The pipelined sessions (issue 58): every request is written before
/// any reply is read, deeper than the harness's in-flight budget (8) and
/// the server's default one (64), which the ring's reads must not wait
/// for while queued unsubmitted (39f0273).
fn pipelined_seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();

    // (a) As libnbd's and fio's clients: structured replies, 300 reads
    // of 4 KiB, every one of a data grain (so every one on the ring).
    let mut c = Client::new(true);
    for i in 0..300u64 {
        c.read(i * 2 * GRAIN % EXPORT_BYTES, GRAIN as u32);
    }
    seeds.push(c.seed("pipelined_reads_4k_x300"));

    // (b) 4,096 reads of one sector each, over simple replies, all data.
    let mut c = Client::new(false);
    for i in 0..4096u64 {
        let grain = (i / 8) % (EXPORT_BYTES / GRAIN / 2) * 2;
        c.read(grain * GRAIN + i % 8 * 512, 512);
    }
    seeds.push(c.seed("pipelined_reads_512_x4096"));

    // (c) and (d): 200 requests of every kind, invalid ones amid them.
    let mut c = Client::new(false);
    mix(&mut c, &mut Rng(58), 200);
    seeds.push(c.seed("pipelined_mix_200_simple"));
    let mut c = Client::new(true);
    mix(&mut c, &mut Rng(58), 200);
    seeds.push(c.seed("pipelined_mix_200_structured"));

    // (e) DISC with 150 requests in flight: those are answered, what
    // follows it is not read.
    let mut c = Client::new(true);
    mix(&mut c, &mut Rng(59), 150);
    c.header(0, CMD_DISC, 0, 0);
    for i in 0..16u64 {
        c.header(0, CMD_READ, i * 2 * GRAIN, GRAIN as u32);
    }
    seeds.push(c.seed("pipelined_disc_in_flight"));

    // (f) 150 requests in flight, then a WRITE of 64 KiB whose payload
    // stops after 10,000 bytes: the client hangs up.
    let mut c = Client::new(true);
    mix(&mut c, &mut Rng(60), 150);
    c.header(0, CMD_WRITE, 0, 64 << 10);
    c.out.extend(std::iter::repeat_n(0xa5, 10_000));
    seeds.push(c.seed("pipelined_hangup_mid_payload"));

    seeds
}
