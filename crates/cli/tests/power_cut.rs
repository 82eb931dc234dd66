//! Power cuts under a real `strata serve --cache none`, with writes still
//! in its io_uring rings (or native AIO contexts, `--aio native`).
//!
//! The datastore lives on crashfs (power_cut/crashfs.rs): a FUSE file
//! system in this process that keeps what each file's last fsync made
//! durable apart from what was written since. A pipelined NBD client
//! keeps 16 random 4 KiB writes in flight over a disk whose first half is
//! written (so those writes are overwrites in place) and whose second half
//! is a hole (so those allocate, and the server installs the new grains
//! once they are written); under `--cache none` both kinds go through the
//! server's rings. A FLUSH follows every few writes. At a
//! random moment the power goes: crashfs refuses everything from then on
//! and keeps, loses or tears each change made since its file's last fsync.
//! The server is killed, and a new server opens what survived.
//!
//! Every 512-byte sector must then hold what a write to its block put
//! there that the last completed FLUSH covered, or what a later write
//! (answered or not) put there; nothing else. And `check` is clean.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
#[path = "power_cut/crashfs.rs"]
mod crashfs;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::nbd::{Pipelined, CMD_FLAG_FUA, CMD_FLUSH, CMD_WRITE};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DISK: u64 = 8 << 20;
const BLOCK: usize = 4096;
const BLOCKS: usize = (DISK as usize) / BLOCK;
/// Blocks below this are written before the cut's run (overwrites in
/// place); the others are holes (allocating writes).
const WRITTEN: usize = BLOCKS / 2;
const QD: usize = 16;
const FLUSH_EVERY: usize = 24;
const ROUNDS: u64 = 6;

/// Sector `s` of block `block` as write `gen` left it (gen 0: the state
/// before the run: a pattern in the written half, zeros in the hole).
fn sector(block: usize, gen: u32, s: usize) -> [u8; 512] {
    let mut out = [0u8; 512];
    if gen == 0 && block >= WRITTEN {
        return out;
    }
    out[..8].copy_from_slice(&(block as u64).to_le_bytes());
    out[8..12].copy_from_slice(&gen.to_le_bytes());
    out[12..16].copy_from_slice(&(s as u32).to_le_bytes());
    for (i, b) in out.iter_mut().enumerate().skip(16) {
        *b = (block as u32 * 31 + gen * 17 + s as u32 * 7 + i as u32) as u8;
    }
    out
}

fn block(block: usize, gen: u32) -> Vec<u8> {
    (0..BLOCK / 512)
        .flat_map(|s| sector(block, gen, s))
        .collect()
}

/// What the client mixes into its stream of writes.
#[derive(Clone, Copy, Default)]
struct Load {
    /// Every this many writes one carries FUA: once answered, it is
    /// durable by itself.
    fua_every: Option<usize>,
    /// FLUSHes go over a second connection to the same export, which the
    /// server's CAN_MULTI_CONN says covers writes answered on the first.
    flush_elsewhere: bool,
}

/// What the client did: per block, the generations it wrote in order
/// (index 0: the state before the run), and how many of them were durable
/// by the last completed FLUSH or a FUA write.
struct History {
    gens: Vec<Vec<u32>>,
    durable: Vec<usize>,
    writes: u64,
    fua_writes: u64,
    flushes: u64,
    /// FLUSHes answered so far, for the thread that cuts the power.
    answered: Arc<AtomicU64>,
}

impl History {
    /// A FLUSH completed that covered, per block, `covered` generations.
    fn flushed(&mut self, covered: &[usize]) {
        for (d, &c) in self.durable.iter_mut().zip(covered) {
            *d = (*d).max(c);
        }
        self.flushes += 1;
        self.answered.fetch_add(1, Ordering::Relaxed);
    }
}

enum Op {
    /// A write of one block, with FUA or not.
    Write(usize, bool),
    /// A FLUSH, with how many writes of each block were answered when it
    /// was sent.
    Flush(Vec<usize>),
}

/// Random writes at depth QD with a FLUSH every FLUSH_EVERY writes (and
/// FUA and a second connection as `load` says), never two in flight on
/// one block, until `stop` or a connection fails.
fn run(
    mut c: Pipelined,
    mut flusher: Option<Pipelined>,
    load: Load,
    stop: &AtomicBool,
    seed: u64,
    answered: Arc<AtomicU64>,
) -> History {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut h = History {
        gens: vec![vec![0]; BLOCKS],
        durable: vec![1; BLOCKS],
        writes: 0,
        fua_writes: 0,
        flushes: 0,
        answered,
    };
    let mut answered = vec![1usize; BLOCKS];
    let mut busy = vec![false; BLOCKS];
    let mut flight: std::collections::HashMap<u64, Op> = Default::default();
    let mut next = 0u64;
    let mut since_flush = 0usize;
    let mut gen = 0u32;
    loop {
        while flight.len() < QD && !stop.load(Ordering::Relaxed) {
            next += 1;
            if since_flush >= FLUSH_EVERY {
                since_flush = 0;
                if let Some(f) = &mut flusher {
                    // On the other connection, waited for here: it covers
                    // what this one had answered when it was sent.
                    let covered = answered.clone();
                    match f
                        .send(CMD_FLUSH, next, 0, 0, &[])
                        .and_then(|()| f.reply(&mut []))
                    {
                        Ok(r) if r.error == 0 => h.flushed(&covered),
                        _ => return h,
                    }
                    continue;
                }
                if c.send(CMD_FLUSH, next, 0, 0, &[]).is_err() {
                    return h;
                }
                flight.insert(next, Op::Flush(answered.clone()));
                continue;
            }
            let b = loop {
                let b = rng.gen_range(0..BLOCKS);
                if !busy[b] {
                    break b;
                }
            };
            gen += 1;
            h.gens[b].push(gen);
            busy[b] = true;
            since_flush += 1;
            let data = block(b, gen);
            let fua = load
                .fua_every
                .is_some_and(|n| (gen as usize).is_multiple_of(n));
            let flags = if fua { CMD_FLAG_FUA } else { 0 };
            let at = (b * BLOCK) as u64;
            if c.send_flagged(CMD_WRITE, flags, next, at, BLOCK as u32, &data)
                .is_err()
            {
                return h;
            }
            flight.insert(next, Op::Write(b, fua));
        }
        if flight.is_empty() {
            return h;
        }
        let Ok(r) = c.reply(&mut []) else {
            return h;
        };
        let Some(op) = flight.remove(&r.handle) else {
            panic!("a reply to handle {} that is not in flight", r.handle);
        };
        if r.error != 0 {
            // The server stops at the first failed write or sync (the power
            // is gone); what it answered before stands.
            return h;
        }
        match op {
            Op::Write(b, fua) => {
                answered[b] = h.gens[b].len();
                if fua {
                    h.durable[b] = h.durable[b].max(answered[b]);
                    h.fua_writes += 1;
                }
                busy[b] = false;
                h.writes += 1;
            }
            Op::Flush(covered) => h.flushed(&covered),
        }
    }
}

fn describe(s: &[u8]) -> String {
    if s.iter().all(|&b| b == 0) {
        return "zeros".into();
    }
    format!(
        "block {} gen {} sector {}",
        u64::from_le_bytes(s[..8].try_into().unwrap()),
        u32::from_le_bytes(s[8..12].try_into().unwrap()),
        u32::from_le_bytes(s[12..16].try_into().unwrap())
    )
}

fn one_cut(round: u64, serve: &[&str], load: Load) -> crashfs::CutReport {
    let s = Store::empty();
    std::fs::create_dir(s.path()).unwrap();
    let fs = crashfs::CrashFs::mount(&s.path());
    s.ok(&["init"]);
    s.ok(&["create", "d", "--size", "8M"]);
    let srv = s.serve_with(serve);
    let mut c = Pipelined::open(&s.sock(), "d").unwrap();
    assert_eq!(c.size, DISK);
    // The written half, then a flush: the floor every block starts from.
    let fill: Vec<u8> = (0..WRITTEN).flat_map(|b| block(b, 0)).collect();
    for (i, chunk) in fill.chunks(1 << 20).enumerate() {
        c.write_flush(chunk, (i << 20) as u64).unwrap();
    }

    let flusher = load
        .flush_elsewhere
        .then(|| Pipelined::open(&s.sock(), "d").unwrap());

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let client = {
        let (stop, answered) = (stop.clone(), answered.clone());
        std::thread::spawn(move || run(c, flusher, load, &stop, round, answered))
    };
    // The cut falls at a random moment once a FLUSH has been answered:
    // on a loaded host the first one can take longer than any fixed
    // sleep, and a cut before it checks nothing.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while answered.load(Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < deadline && !client.is_finished(),
            "round {round}: no FLUSH answered in 300 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut rng = StdRng::seed_from_u64(round ^ 0x5eed);
    std::thread::sleep(Duration::from_millis(rng.gen_range(300..1500)));
    let report = fs.cut(round);
    srv.kill9();
    stop.store(true, Ordering::Relaxed);
    let h = client.join().unwrap();
    eprintln!(
        "round {round}: {} writes ({} with FUA) and {} flushes answered; at the cut {report:?}",
        h.writes, h.fua_writes, h.flushes
    );
    assert!(
        h.flushes > 0,
        "round {round}: no FLUSH completed before the cut"
    );
    assert!(
        load.fua_every.is_none() || h.fua_writes > 0,
        "round {round}: no FUA write answered before the cut"
    );

    // A new server on what survived.
    let after = Store::empty();
    fs.write_image(&after.path());
    drop(fs);
    let srv = after.serve();
    let mut c = Pipelined::open(&after.sock(), "d").unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for piece in 0..(DISK as usize >> 20) {
        c.read_at(&mut buf, (piece << 20) as u64).unwrap();
        for (i, got) in buf.chunks(BLOCK).enumerate() {
            let b = (piece << 20) / BLOCK + i;
            let may = &h.gens[b][h.durable[b] - 1..];
            for (n, sec) in got.chunks(512).enumerate() {
                assert!(
                    may.iter().any(|&g| sector(b, g, n)[..] == *sec),
                    "round {round}: block {b} sector {n} holds {} where only \
                     generations {may:?} may be (the last FLUSH or FUA write \
                     covered gen {})",
                    describe(sec),
                    h.gens[b][h.durable[b] - 1]
                );
            }
        }
    }
    drop(c);
    srv.stop();
    let check = after.json(&["check"]);
    assert_eq!(
        check["errors"].as_array().unwrap().len(),
        0,
        "round {round}: {check}"
    );
    report
}

fn cuts(serve: &[&str], load: Load, rounds: u64) -> Vec<crashfs::CutReport> {
    (1..=rounds)
        .map(|round| one_cut(round, serve, load))
        .collect()
}

#[test]
fn power_cuts_with_writes_in_the_ring_keep_every_flushed_write() {
    if !have_fuse() {
        return;
    }
    ring_cuts(&["--cache", "none"]);
}

/// Cuts under `serve` with `args`, whose writes go through rings: they
/// were in use, and held writes when the power went.
fn ring_cuts(args: &[&str]) {
    let reports = cuts(args, Load::default(), ROUNDS);
    let through_ring: u64 = reports.iter().map(|r| r.ring_writes).sum();
    let in_ring: usize = reports.iter().map(|r| r.from_rings).sum();
    assert!(through_ring > 0, "no write went through a ring");
    assert!(
        in_ring > 0,
        "no cut came while ring writes were unsynced ({through_ring} went through rings)"
    );
}

/// The same through the host page cache (the default), where the NBD
/// readers carry out small writes themselves.
#[test]
fn power_cuts_under_writeback_keep_every_flushed_write() {
    if !have_fuse() {
        return;
    }
    let reports = cuts(&[], Load::default(), ROUNDS);
    let pending: usize = reports
        .iter()
        .map(|r| r.changes.kept + r.changes.dropped + r.changes.torn)
        .sum();
    assert!(pending > 0, "no cut came with unsynced writes");
}

/// The same with the writes in native AIO contexts (`--aio native`).
#[test]
fn power_cuts_with_writes_in_native_aio_keep_every_flushed_write() {
    if !have_fuse() {
        return;
    }
    ring_cuts(&["--cache", "none", "--aio", "native"]);
}

/// A write with FUA is durable once answered (the NBD protocol's MUST),
/// and a FLUSH on a second connection covers the writes answered on the
/// first (the server advertises CAN_MULTI_CONN), under the host page
/// cache and under `--cache none` (where FUA writes skip the rings).
#[test]
fn power_cuts_keep_every_answered_fua_write_and_what_another_connection_flushed() {
    if !have_fuse() {
        return;
    }
    let load = Load {
        fua_every: Some(4),
        flush_elsewhere: true,
    };
    for serve in [&[][..], &["--cache", "none"]] {
        cuts(serve, load, ROUNDS / 2);
    }
}
