//! Crash safety of seSparse images on the simulated backend.
//!
//! A run creates a seSparse image, does random writes, write-zeroes, unmaps
//! and flushes while keeping a per-sector model, pulls the plug
//! ([`SimBackend::crash`] keeps, drops or tears each unsynced write), and
//! reopens. What must hold after every crash:
//!
//! - the image opens;
//! - a sector not written since the last flush reads exactly what it held
//!   at that flush;
//! - a sector written since then reads its flushed content or one of the
//!   versions written to it since (zeros count as the version of a
//!   write-zeroes or unmap);
//! - `check` finds nothing wrong. Grain-table updates reach the file only
//!   after the data they name is synced, so no entry can name a grain past
//!   the end of the file. (With entries written right after the data,
//!   unsynced, one could: it read as zeros, and after reopening the next
//!   allocation appended right there, so two grains shared data and a
//!   flushed sector changed. The multi-crash runs below caught that.)
//! - after a crash the image keeps working: several crash cycles are run
//!   on the same image, each starting from what the previous one left.
//!
//! Shrink is crashed too: with writes failing after a random count and at
//! random points after it returns; the content never changes.
//!
//! Runs: `STRATA_CRASH_RUNS` (default 50).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_block::{BlockDevice, ZeroOptions};
use strata_storage::SimBackend;
use strata_vmdk::{create_image, ImageSpec, OpenOptions, Subformat, VmdkImage};

const SECTOR: u64 = 512;
const GRAIN_SECTORS: u64 = 8;
/// 24 MiB: two grain tables (one covers 16 MiB).
const CAP: u64 = 49152;
const NAME: &str = "d.vmdk";
const EXTENT: &str = "d-sesparse.vmdk";

fn runs() -> u64 {
    std::env::var("STRATA_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50)
}

/// The content of sector `s` as written by version `v` (0 = zeros): the
/// version and sector are in the first 16 bytes, so a read tells which
/// version it got.
fn sector_data(v: u64, s: u64) -> [u8; 512] {
    let mut b = [0u8; 512];
    if v == 0 {
        return b;
    }
    b[0..8].copy_from_slice(&v.to_le_bytes());
    b[8..16].copy_from_slice(&s.to_le_bytes());
    let mut x = v.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ s;
    for c in b[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    b
}

/// Which version a sector read holds, or None if it is none of them.
fn version_of(b: &[u8], s: u64) -> Option<u64> {
    if b.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let v = u64::from_le_bytes(b[0..8].try_into().unwrap());
    (sector_data(v, s)[..] == *b).then_some(v)
}

/// Per-sector model: what the last flush made durable, and every version
/// written since.
struct Model {
    durable: Vec<u64>,
    since: Vec<Vec<u64>>,
    dirty: Vec<u64>,
    live: Vec<u64>,
}

impl Model {
    fn new() -> Self {
        Model {
            durable: vec![0; CAP as usize],
            since: vec![Vec::new(); CAP as usize],
            dirty: Vec::new(),
            live: vec![0; CAP as usize],
        }
    }

    fn set(&mut self, s: u64, v: u64) {
        let i = s as usize;
        if self.since[i].is_empty() {
            self.dirty.push(s);
        }
        self.since[i].push(v);
        self.live[i] = v;
    }

    fn flushed(&mut self) {
        for s in std::mem::take(&mut self.dirty) {
            self.since[s as usize].clear();
        }
        self.durable.clone_from(&self.live);
    }

    fn allowed(&self, s: u64, v: u64) -> bool {
        self.durable[s as usize] == v || self.since[s as usize].contains(&v)
    }

    /// After a crash, what was read is the new truth.
    fn settle(&mut self, seen: Vec<u64>) {
        for s in std::mem::take(&mut self.dirty) {
            self.since[s as usize].clear();
        }
        self.durable = seen.clone();
        self.live = seen;
    }
}

fn open(b: &SimBackend, writable: bool) -> VmdkImage {
    VmdkImage::open_in(
        Arc::new(b.clone()),
        NAME,
        &OpenOptions {
            writable,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("reopen after a crash: {e}"))
}

/// A random range in sectors, biased to a few hot spots (the start, the
/// boundary between the two grain tables, the end) so operations overlap.
fn range(rng: &mut StdRng) -> (u64, u64) {
    let spot = [0u64, 32768 - 64, CAP - 128, rng.gen_range(0..CAP)][rng.gen_range(0..4)];
    let start = (spot + rng.gen_range(0..160)).min(CAP - 1);
    let len = if rng.gen_bool(0.4) {
        // Whole grains.
        let s = start / GRAIN_SECTORS * GRAIN_SECTORS;
        let n = rng.gen_range(1..=4) * GRAIN_SECTORS;
        return (s, n.min(CAP - s));
    } else {
        rng.gen_range(1..=20)
    };
    (start, len.min(CAP - start))
}

/// Read the whole disk and check every sector against the model; returns
/// the version each sector holds.
fn verify(img: &VmdkImage, m: &Model, ctx: &str) -> Vec<u64> {
    let mut buf = vec![0u8; (CAP * SECTOR) as usize];
    img.read_at(&mut buf, 0)
        .unwrap_or_else(|e| panic!("{ctx}: read: {e}"));
    let mut seen = Vec::with_capacity(CAP as usize);
    for s in 0..CAP {
        let b = &buf[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
        let v = version_of(b, s);
        match v {
            None => {
                let v = u64::from_le_bytes(b[0..8].try_into().unwrap());
                let from = u64::from_le_bytes(b[8..16].try_into().unwrap());
                panic!(
                    "{ctx}: sector {s} holds bytes no write put there (they start like version {v} of sector {from}); flushed {}, written since {:?}",
                    m.durable[s as usize], m.since[s as usize]
                )
            }
            Some(v) if !m.allowed(s, v) => panic!(
                "{ctx}: sector {s} reads version {v}; flushed {}, written since {:?}",
                m.durable[s as usize], m.since[s as usize]
            ),
            Some(v) => seen.push(v),
        }
    }
    seen
}

/// `check` finds nothing wrong: table updates reach the file only after
/// the data they point to, so a crash cannot leave an entry naming a grain
/// past the end of the file, or one whose space gets allocated again.
fn check_after_crash(img: &VmdkImage, ctx: &str) {
    let report = img
        .check(false)
        .unwrap_or_else(|e| panic!("{ctx}: check: {e}"));
    for (name, c) in &report {
        assert!(
            c.errors.is_empty(),
            "{ctx}: check of {name}: {:?}",
            c.errors
        );
    }
}

/// Random operations; returns after the last one (no flush).
fn random_ops(img: &VmdkImage, m: &mut Model, rng: &mut StdRng, next_version: &mut u64, n: usize) {
    for _ in 0..n {
        let (s, len) = range(rng);
        match rng.gen_range(0..20) {
            0..=8 => {
                let v = *next_version;
                *next_version += 1;
                let mut buf = Vec::with_capacity((len * SECTOR) as usize);
                for k in s..s + len {
                    buf.extend_from_slice(&sector_data(v, k));
                    m.set(k, v);
                }
                let fua = rng.gen_bool(0.05);
                img.write_at(&buf, s * SECTOR, fua).unwrap();
                if fua {
                    // FUA flushes the whole top link, not just this write.
                    m.flushed();
                }
            }
            9..=11 => {
                let opts = ZeroOptions {
                    may_unmap: rng.gen_bool(0.5),
                    ..Default::default()
                };
                img.write_zeroes(s * SECTOR, len * SECTOR, opts).unwrap();
                for k in s..s + len {
                    m.set(k, 0);
                }
            }
            12..=14 => {
                img.unmap(s * SECTOR, len * SECTOR).unwrap();
                for k in s..s + len {
                    m.set(k, 0);
                }
            }
            _ => {
                img.flush().unwrap();
                m.flushed();
            }
        }
    }
}

fn crash_run(seed: u64, sub: Subformat) {
    let mut rng = StdRng::seed_from_u64(seed);
    let b = SimBackend::new();
    let img = create_image(Arc::new(b.clone()), NAME, &ImageSpec::new(sub, CAP)).unwrap();
    let mut m = Model::new();
    let mut next_version = 1u64;
    let mut img = Some(img);
    let cycles = rng.gen_range(1..=3);
    for cycle in 0..cycles {
        let live = img.take().unwrap_or_else(|| open(&b, true));
        let n = rng.gen_range(1..60);
        random_ops(&live, &mut m, &mut rng, &mut next_version, n);
        let report = b.crash(rng.gen());
        drop(live);
        let ctx = format!("{}, seed {seed}, crash {cycle} ({report:?})", sub.name());
        let ro = open(&b, false);
        let seen = verify(&ro, &m, &ctx);
        check_after_crash(&ro, &ctx);
        drop(ro);
        m.settle(seen);
    }
    // A last clean round: everything flushed must read back exactly.
    let live = open(&b, true);
    random_ops(&live, &mut m, &mut rng, &mut next_version, 30);
    live.flush().unwrap();
    m.flushed();
    drop(live);
    let ro = open(&b, false);
    let ctx = format!("{}, seed {seed}, after the last flush", sub.name());
    verify(&ro, &m, &ctx);
    check_after_crash(&ro, &ctx);
}

#[test]
fn flushed_writes_survive_crashes_and_check_stays_clean() {
    for run in 0..runs() {
        crash_run(0x5e5e_0000 + run, Subformat::SeSparse);
    }
}

/// The same write protocol serves the other sparse kinds: hosted sparse
/// (grain and redundant tables) and COWD (one-sector grains, `freeSector`).
#[test]
fn other_sparse_kinds_survive_crashes_too() {
    for run in 0..runs().div_ceil(4) {
        crash_run(0x6e6e_0000 + run, Subformat::MonolithicSparse);
        crash_run(0x7e7e_0000 + run, Subformat::VmfsSparse);
    }
}

// ---------------------------------------------------------------- shrink

/// An image with data, zero grains and holes, all flushed; returns the
/// model of its content and the next unused version.
fn shrink_fixture(b: &SimBackend, rng: &mut StdRng) -> (Model, u64) {
    let img = create_image(
        Arc::new(b.clone()),
        NAME,
        &ImageSpec::new(Subformat::SeSparse, CAP),
    )
    .unwrap();
    let mut m = Model::new();
    let mut v = 1;
    random_ops(&img, &mut m, rng, &mut v, 80);
    // Grains written with zeros (shrink finds them), and grains written and
    // then unmapped (holes to fill).
    let grain = |rng: &mut StdRng| rng.gen_range(0..CAP / GRAIN_SECTORS) * GRAIN_SECTORS;
    for _ in 0..6 {
        let s = grain(rng);
        img.write_at(&[0u8; 4096], s * SECTOR, false).unwrap();
        (s..s + 8).for_each(|k| m.set(k, 0));
        let s = grain(rng);
        let data: Vec<u8> = (s..s + 8).flat_map(|k| sector_data(v, k)).collect();
        img.write_at(&data, s * SECTOR, false).unwrap();
        (s..s + 8).for_each(|k| m.set(k, v));
        v += 1;
        let s = grain(rng);
        img.unmap(s * SECTOR, 4096).unwrap();
        (s..s + 8).for_each(|k| m.set(k, 0));
    }
    img.flush().unwrap();
    m.flushed();
    (m, v)
}

fn assert_clean(img: &VmdkImage, ctx: &str) {
    for (name, c) in img.check(false).unwrap() {
        assert!(c.errors.is_empty(), "{ctx}: {name}: {:?}", c.errors);
    }
}

/// A shrink (`shrink`: offline or online) whose writes fail from the k-th
/// on, then a crash: the content is the same, check is clean, and the
/// image still takes writes and a full shrink afterwards.
fn shrink_interrupted_then_crashed(
    seed_base: u64,
    shrink: &dyn Fn(&VmdkImage) -> strata_vmdk::Result<Vec<strata_vmdk::sparse::ShrinkReport>>,
) {
    let mut saw_failure = false;
    let mut saw_success = false;
    let mut moved_some = false;
    for run in 0..runs() {
        let seed = seed_base + run;
        let mut rng = StdRng::seed_from_u64(seed);
        let b = SimBackend::new();
        let (mut m, mut v) = shrink_fixture(&b, &mut rng);
        let img = open(&b, true);
        // Sometimes unflushed writes first: shrink must make them durable
        // before it moves anything.
        if rng.gen_bool(0.5) {
            random_ops(&img, &mut m, &mut rng, &mut v, 12);
        }
        // Write number k fails, and every one after it.
        let k = rng.gen_range(0..120);
        b.fail_writes_after(k);
        let r = shrink(&img);
        let ctx = format!("seed {seed}, writes fail after {k}: {r:?}");
        match &r {
            Ok(reps) => {
                m.flushed();
                saw_success = true;
                moved_some |= reps.iter().any(|r| r.moved > 0);
            }
            Err(_) => saw_failure = true,
        }
        // The failed shrink left the open image reading the same content.
        verify(&img, &m, &format!("{ctx}, before the crash"));
        let report = b.crash(rng.gen());
        drop(img);
        let ro = open(&b, false);
        let ctx = format!("{ctx}, after crash {report:?}");
        let seen = verify(&ro, &m, &ctx);
        assert_clean(&ro, &ctx);
        drop(ro);
        m.settle(seen);
        // And the image still takes writes and a full shrink afterwards.
        let img = open(&b, true);
        random_ops(&img, &mut m, &mut rng, &mut v, 20);
        shrink(&img).unwrap();
        img.flush().unwrap();
        m.flushed();
        verify(&img, &m, &format!("{ctx}, shrunk again"));
        drop(img);
        let ro = open(&b, false);
        verify(&ro, &m, &format!("{ctx}, shrunk again, reopened"));
        assert_clean(&ro, &format!("{ctx}, shrunk again"));
    }
    assert!(
        saw_failure && saw_success && moved_some,
        "runs cover both outcomes"
    );
}

#[test]
fn shrink_interrupted_at_any_write_then_crashed_keeps_the_content() {
    shrink_interrupted_then_crashed(0x5a1e_0000, &|img| img.shrink(&mut |_, _| {}));
}

#[test]
fn crash_after_shrink_keeps_the_content_and_the_smaller_file() {
    for run in 0..runs() {
        let seed = 0x5a2e_0000 + run;
        let mut rng = StdRng::seed_from_u64(seed);
        let b = SimBackend::new();
        let (mut m, mut v) = shrink_fixture(&b, &mut rng);
        let img = open(&b, true);
        let reps = img.shrink(&mut |_, _| {}).unwrap();
        let after = reps[0].bytes_after;
        assert!(after <= reps[0].bytes_before);
        assert_eq!(
            b.durable_len(EXTENT),
            after,
            "seed {seed}: the truncation is durable"
        );
        // Sometimes more work after the shrink, flushed or not, before the crash.
        let more = rng.gen_bool(0.5);
        if more {
            random_ops(&img, &mut m, &mut rng, &mut v, 30);
        }
        let report = b.crash(rng.gen());
        drop(img);
        let ctx = format!("seed {seed}, crash {report:?}");
        let ro = open(&b, false);
        verify(&ro, &m, &ctx);
        assert_clean(&ro, &ctx);
    }
}

// --------------------------------------------------------- online shrink

#[test]
fn online_shrink_interrupted_at_any_write_then_crashed_keeps_the_content() {
    shrink_interrupted_then_crashed(0x5a3e_0000, &|img| img.shrink_online(None, &mut |_, _| {}));
}

/// Client writes, zeroes, unmaps and flushes race an online shrink on
/// another thread; then the plug is pulled. Content and check as always.
#[test]
fn online_shrink_racing_client_io_then_a_crash_keeps_the_content() {
    let mut moved_some = false;
    for run in 0..runs() {
        let seed = 0x5a4e_0000 + run;
        let mut rng = StdRng::seed_from_u64(seed);
        let b = SimBackend::new();
        let (mut m, mut v) = shrink_fixture(&b, &mut rng);
        let img = open(&b, true);
        let reps = std::thread::scope(|sc| {
            let shrink = sc.spawn(|| img.shrink_online(None, &mut |_, _| {}));
            while !shrink.is_finished() {
                random_ops(&img, &mut m, &mut rng, &mut v, 4);
            }
            shrink.join().unwrap()
        })
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        moved_some |= reps.iter().any(|r| r.moved > 0);
        let ctx = format!("seed {seed}");
        verify(&img, &m, &format!("{ctx}, before the crash"));
        if rng.gen_bool(0.5) {
            random_ops(&img, &mut m, &mut rng, &mut v, 10);
        }
        let report = b.crash(rng.gen());
        drop(img);
        let ctx = format!("{ctx}, crash {report:?}");
        let ro = open(&b, false);
        verify(&ro, &m, &ctx);
        assert_clean(&ro, &ctx);
    }
    assert!(moved_some, "some runs moved grains");
}
