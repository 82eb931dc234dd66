//! Crash tests of object-store disks with the store in memory
//! (`strata_s3::fault`): no S3 server, so every request of a
//! workload can be the one a crash cuts, before it takes effect or after
//! (its answer lost), in thousands of runs.
//!
//! A run writes, zeroes, unmaps and flushes at random against a model,
//! then crashes the process at its `n`-th store mutation; every request
//! after that fails. The host comes back (the same local directory, a new
//! client of the same objects) and must find, sector by sector, what its
//! last acknowledged flush held or a write made after it (never older,
//! never anything else); `check` must find no problem, the disk must take
//! new writes (its claim fencing the dead writer), and garbage collection
//! must keep everything a root reaches.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;
use std::time::Duration;

use strata_block::{BlockDevice, ZeroOptions};
use strata_objstore::disk::CompactOptions;
use strata_objstore::{ObjectDisk, ObjectStoreDatastore, OpenOptions};
use strata_s3::fault::{Crash, FaultStore};
use strata_s3::{Options, StoreUrl};

const SECTOR: usize = 512;

fn opts(f: &FaultStore) -> Options {
    Options {
        backend: Some(f.backend()),
        op_timeout: Duration::from_secs(10),
        ..Options::default()
    }
}

fn url() -> StoreUrl {
    StoreUrl::parse("s3://memory/ds").unwrap()
}

/// Sector `s` as a write tagged `tag` leaves it (tag 0: zeroes).
fn sector(s: usize, tag: u16) -> [u8; SECTOR] {
    let mut b = [0u8; SECTOR];
    if tag != 0 {
        for (i, x) in b.iter_mut().enumerate() {
            *x = (tag as u8) ^ ((tag >> 8) as u8).wrapping_mul(7) ^ (i as u8);
        }
        b[..8].copy_from_slice(&(s as u64).to_le_bytes());
        b[8..10].copy_from_slice(&tag.to_le_bytes());
    }
    b
}

/// What each sector may hold: the acknowledged tag, and the tags written
/// since the last acknowledged flush.
struct Model {
    acked: Vec<u16>,
    since: Vec<Vec<u16>>,
    now: Vec<u16>,
}

impl Model {
    fn new(sectors: usize) -> Self {
        Model {
            acked: vec![0; sectors],
            since: vec![Vec::new(); sectors],
            now: vec![0; sectors],
        }
    }

    fn set(&mut self, first: usize, n: usize, tag: u16) {
        for s in first..first + n {
            self.now[s] = tag;
            self.since[s].push(tag);
        }
    }

    fn flushed(&mut self) {
        self.acked.clone_from(&self.now);
        for v in &mut self.since {
            v.clear();
        }
    }

    /// Each sector's tag as `disk` holds it, or the first sector that
    /// holds what no history allows.
    fn observe(&self, disk: &ObjectDisk) -> Result<Vec<u16>, String> {
        let mut buf = vec![0u8; self.acked.len() * SECTOR];
        disk.read_at(&mut buf, 0)
            .map_err(|e| format!("read: {e}"))?;
        let mut tags = Vec::with_capacity(self.acked.len());
        for (s, got) in buf.chunks(SECTOR).enumerate() {
            let mut allowed = std::iter::once(self.acked[s]).chain(self.since[s].iter().copied());
            match allowed.clone().find(|&t| got == sector(s, t)) {
                Some(t) => tags.push(t),
                None => {
                    return Err(format!(
                        "sector {s} holds {:02x?}..., none of tags {:?}",
                        &got[..12],
                        allowed.by_ref().collect::<Vec<_>>()
                    ))
                }
            }
        }
        Ok(tags)
    }

    /// What the disk holds now is all there is.
    fn settle(&mut self, tags: Vec<u16>) {
        self.now = tags;
        self.flushed();
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A workload's shape.
#[derive(Clone, Copy)]
struct Shape {
    disk_bytes: u64,
    steps: u32,
    /// The longest write, in sectors.
    max_sectors: u64,
    /// FLUSHes per 100 steps.
    flushes: u64,
    /// Whether the workload compacts and collects garbage now and then.
    maintenance: bool,
    /// Whether a run without faults must leave a segment (a fold's nodes
    /// or grains streamed ahead of a commit).
    segments: bool,
}

/// Small random writes in a small disk: many commits of a few grains,
/// compaction and garbage collection between them.
const SMALL: Shape = Shape {
    disk_bytes: 2 << 20,
    steps: 60,
    max_sectors: 24,
    flushes: 25,
    maintenance: true,
    segments: false,
};

/// Large writes over 16 MiB: tails long enough to fold (2,048 entries).
const FOLDING: Shape = Shape {
    disk_bytes: 16 << 20,
    steps: 90,
    max_sectors: 2048,
    flushes: 25,
    maintenance: false,
    segments: true,
};

/// Writes of up to 4 MiB and few FLUSHes: grains stream to the store in
/// segments before the commit that names them.
const STREAMING: Shape = Shape {
    disk_bytes: 32 << 20,
    steps: 30,
    max_sectors: 8192,
    flushes: 6,
    maintenance: true,
    segments: true,
};

/// What goes wrong in a run.
#[derive(Debug, Clone, Copy)]
enum Faults {
    None,
    /// The process crashes at the `n`-th mutation after setup.
    Crash(u64, Crash),
    /// Requests fail now and then (per million), the process lives on.
    Transient(u32),
}

/// One step of a workload.
fn step(
    shape: Shape,
    rng: &mut Rng,
    tag: u16,
    ds: &ObjectStoreDatastore,
    disk: &ObjectDisk,
    model: &mut Model,
) -> Result<(), String> {
    let sectors = model.now.len();
    let first = rng.below(sectors as u64) as usize;
    let n = (1 + rng.below(shape.max_sectors) as usize).min(sectors - first);
    let (off, len) = ((first * SECTOR) as u64, (n * SECTOR) as u64);
    let dice = rng.below(100);
    let r = if dice < shape.flushes {
        let r = disk.flush();
        if r.is_ok() {
            model.flushed();
        }
        r
    } else if shape.maintenance && dice < shape.flushes + 3 {
        let opts = CompactOptions {
            below: 0.9,
            ..CompactOptions::default()
        };
        disk.compact(opts).map(|_| ())
    } else if shape.maintenance && dice < shape.flushes + 6 {
        ds.gc(false).map(|_| ())
    } else if dice < shape.flushes + 16 {
        model.set(first, n, 0);
        disk.write_zeroes(off, len, ZeroOptions::default())
    } else if dice < shape.flushes + 26 {
        // Whole grains only: a partial one keeps its data.
        let (lo, hi) = (first.div_ceil(8) * 8, (first + n) / 8 * 8);
        if lo < hi {
            model.set(lo, hi - lo, 0);
        }
        disk.unmap(off, len)
    } else {
        let mut buf = Vec::with_capacity(n * SECTOR);
        for s in first..first + n {
            buf.extend_from_slice(&sector(s, tag));
        }
        model.set(first, n, tag);
        disk.write_at(&buf, off, false)
    };
    r.map_err(|e| e.to_string())
}

/// Run `shape`'s workload from `seed` against a fresh datastore with
/// `faults`. Returns the mutations the workload made, or panics with
/// what the host found wrong after coming back.
fn run(shape: Shape, seed: u64, faults: Faults) -> u64 {
    let f = FaultStore::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let ds = Arc::new(
        ObjectStoreDatastore::init(dir.path(), &url(), &opts(&f))
            .unwrap()
            .0,
    );
    ds.create_disk("vm", shape.disk_bytes).unwrap();
    let mut model = Model::new((shape.disk_bytes as usize) / SECTOR);
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    let base = f.mutations();
    match faults {
        Faults::Crash(n, how) => f.crash_at_mutation(base + n, how),
        Faults::Transient(ppm) => f.fail_randomly(ppm),
        Faults::None => {}
    }
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let what = format!("seed {seed}, {faults:?}");
    let mut errors = Vec::new();
    for i in 1..=shape.steps {
        if let Err(e) = step(shape, &mut rng, i as u16, &ds, &disk, &mut model) {
            match faults {
                Faults::Crash(..) if f.crashed().is_some() => break,
                Faults::Transient(_) => errors.push(e),
                _ => panic!("{what}: step {i} failed with no fault: {e}"),
            }
        }
    }
    if f.crashed().is_none() && disk.flush().is_ok() {
        model.flushed();
    }
    let made = f.mutations() - base;
    drop(disk);
    drop(ds);
    let what = match f.crashed() {
        Some(at) => format!("{what} at {at}"),
        None => {
            if let Faults::Crash(n, _) = faults {
                assert!(n >= made, "{what}: no crash");
                return made;
            }
            format!("{what} ({} failed steps: {errors:?})", errors.len())
        }
    };
    if matches!(faults, Faults::None) && shape.segments {
        assert!(
            f.objects().iter().any(|(k, _)| k.contains("/s/")),
            "{what}: the workload uploaded no segment"
        );
    }
    comes_back(&f.restart(), dir.path(), &mut model, &what);
    made
}

/// The host comes back after `what` (the same local directory, a new
/// client of the store): the disk holds what `model` allows, `check`
/// finds nothing wrong, the disk takes writes (fencing its dead self) and
/// garbage collection keeps everything reached.
fn comes_back(f: &FaultStore, dir: &std::path::Path, model: &mut Model, what: &str) {
    let ds = Arc::new(ObjectStoreDatastore::open(dir, &opts(f), OpenOptions::default()).unwrap());
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    let found = model
        .observe(&disk)
        .unwrap_or_else(|wrong| panic!("{what}: {wrong}"));
    model.settle(found);
    let rep = ds.check().unwrap();
    assert!(rep.errors.is_empty(), "{what}: check: {:?}", rep.errors);
    let tag = u16::MAX;
    disk.write_at(&sector(0, tag), 0, false)
        .unwrap_or_else(|e| panic!("{what}: a write after coming back: {e}"));
    disk.flush()
        .unwrap_or_else(|e| panic!("{what}: a flush after coming back: {e}"));
    model.set(0, 1, tag);
    model.flushed();
    let gc = ds.gc(false).unwrap();
    drop(disk);
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    if let Err(wrong) = model.observe(&disk) {
        panic!("{what}: after GC ({gc:?}): {wrong}");
    }
    let rep = ds.check().unwrap();
    assert!(
        rep.errors.is_empty(),
        "{what}: check after GC: {:?}",
        rep.errors
    );
}

/// Every mutation of `shape`'s workload under `seeds`, cut before and
/// after it takes effect; the number of crashes.
fn every_cut(shape: Shape, seeds: std::ops::Range<u64>) -> usize {
    let mut runs = 0;
    for seed in seeds {
        let made = run(shape, seed, Faults::None);
        assert!(made > 0, "seed {seed}: the workload stored nothing");
        for n in 0..made {
            for how in [Crash::Before, Crash::After] {
                run(shape, seed, Faults::Crash(n, how));
                runs += 1;
            }
        }
    }
    runs
}

#[test]
fn small_writes_survive_a_crash_at_every_store_request() {
    let runs = every_cut(SMALL, 1..41);
    eprintln!("{runs} crashes");
    assert!(runs >= 1000, "{runs}");
}

#[test]
fn folding_writes_survive_a_crash_at_every_store_request() {
    let runs = every_cut(FOLDING, 1..3);
    eprintln!("{runs} crashes");
}

#[test]
fn streamed_writes_survive_a_crash_at_every_store_request() {
    let runs = every_cut(STREAMING, 1..6);
    eprintln!("{runs} crashes");
}

#[test]
fn failing_requests_lose_nothing_acknowledged() {
    for seed in 1..25 {
        for shape in [SMALL, FOLDING, STREAMING] {
            run(shape, seed, Faults::Transient(30_000));
        }
    }
}

const MIB: usize = 1 << 20;

/// A new datastore in `f` with disk "vm" of `bytes`, and its local
/// directory.
fn fresh(f: &FaultStore, bytes: u64) -> (tempfile::TempDir, Arc<ObjectStoreDatastore>) {
    let dir = tempfile::tempdir().unwrap();
    let ds = Arc::new(
        ObjectStoreDatastore::init(dir.path(), &url(), &opts(f))
            .unwrap()
            .0,
    );
    ds.create_disk("vm", bytes).unwrap();
    (dir, ds)
}

/// The host of `dir` again, on `f` after its crash.
fn again(f: &FaultStore, dir: &std::path::Path) -> (Arc<ObjectStoreDatastore>, Arc<ObjectDisk>) {
    let ds = Arc::new(
        ObjectStoreDatastore::open(dir, &opts(&f.restart()), OpenOptions::default()).unwrap(),
    );
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    (ds, disk)
}

/// The bytes pattern `p` has from disk offset `off` on, `len` of them:
/// noise that depends on `p` and the offset (zeros for 0), so no
/// grain compresses (§18.6) and the tests' byte counts are raw grains'.
fn pattern(p: u8, off: usize, len: usize) -> Vec<u8> {
    (off..off + len)
        .map(|o| {
            if p == 0 {
                return 0;
            }
            let mut x = (u64::from(p) << 56 | (o / 8) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x ^= x >> 31;
            x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x ^= x >> 29;
            (x >> (8 * (o % 8))) as u8
        })
        .collect()
}

/// Whether `len` bytes at `off` hold pattern `p`.
fn holds(disk: &ObjectDisk, off: usize, len: usize, p: u8) -> bool {
    let mut b = vec![0u8; len];
    disk.read_at(&mut b, off as u64).unwrap();
    b == pattern(p, off, len)
}

fn clean(ds: &ObjectStoreDatastore, what: &str) {
    let rep = ds.check().unwrap();
    assert!(rep.errors.is_empty(), "{what}: {:?}", rep.errors);
}

/// The cuts of one commit (FORMAT.md §11.4): before anything of it is
/// stored, after its segment (uploaded, named by no manifest) and after
/// its manifest (committed, the answer lost). The flush is never
/// acknowledged; after the crash the cut write is whole or absent, check
/// is clean, and the orphaned segment is kept until the writer's
/// generation moves on, then collected.
#[test]
fn a_crash_at_each_step_of_a_commit_loses_nothing_acknowledged() {
    let cuts = [
        ("/m/", Crash::Before, 64 << 10),
        ("/s/", Crash::After, 9 * MIB),
        ("/m/", Crash::After, 64 << 10),
    ];
    for (part, how, len) in cuts {
        let what = format!("{how:?} {part}");
        let f = FaultStore::new(1);
        let (dir, ds) = fresh(&f, 16 << 20);
        let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
        disk.write_at(&pattern(0x11, 0, MIB), 0, false).unwrap();
        disk.flush().unwrap();
        f.crash_at_key(part, 0, how);
        let w = disk.write_at(&pattern(0x22, 0, len), 0, false);
        assert!(w.is_err() || disk.flush().is_err(), "{what}: acknowledged");
        assert!(f.crashed().is_some(), "{what}");
        drop((disk, ds));

        let (ds, disk) = again(&f, dir.path());
        let want = if how == Crash::After && part == "/m/" {
            0x22
        } else {
            0x11
        };
        assert!(holds(&disk, 0, 64 << 10, want), "{what}");
        assert!(holds(&disk, 64 << 10, MIB - (64 << 10), 0x11), "{what}");
        clean(&ds, &what);
        let g = ds.gc(false).unwrap();
        assert_eq!(g.deleted_segments, 0, "{what}: {g:?}");
        let orphan = u64::from(part == "/s/");
        assert_eq!(
            g.in_flight_segments, orphan,
            "{what}: kept until fenced: {g:?}"
        );
        // The first write claims a new generation: the orphan may go.
        disk.write_at(&pattern(0x33, 8 << 20, 4096), 8 << 20, false)
            .unwrap();
        disk.flush().unwrap();
        let g = ds.gc(false).unwrap();
        assert_eq!(g.deleted_segments, orphan, "{what}: {g:?}");
        assert_eq!(g.in_flight_segments, 0, "{what}: {g:?}");
        assert!(holds(&disk, 8 << 20, 4096, 0x33), "{what}");
        clean(&ds, &what);
    }
}

/// A crash once a background fold's nodes are uploaded and before a
/// commit names them: every flushed write is there, and the nodes are an
/// orphan kept until the writer's generation moves on, then collected.
#[test]
fn a_crash_during_a_fold_loses_nothing_flushed() {
    let f = FaultStore::new(2);
    let (dir, ds) = fresh(&f, 16 << 20);
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    f.crash_at_key("/s/", 0, Crash::After);
    // 256 grains per flush: the 8th commit's tail (2,048 entries) starts
    // a fold.
    let mut flushed = 0;
    for i in 0..12 {
        let ok = disk.write_at(
            &pattern(0x40 + i as u8, i * MIB, MIB),
            (i * MIB) as u64,
            false,
        );
        if ok.and_then(|()| disk.flush()).is_err() {
            break;
        }
        flushed += 1;
    }
    assert!(
        f.crashed().is_some_and(|at| at.contains("/s/")),
        "{:?}",
        f.crashed()
    );
    assert!(flushed >= 8, "{flushed}");
    drop((disk, ds));

    let (ds, disk) = again(&f, dir.path());
    for i in 0..flushed {
        assert!(holds(&disk, i * MIB, MIB, 0x40 + i as u8), "MiB {i}");
    }
    clean(&ds, "after the crash");
    let g = ds.gc(false).unwrap();
    assert_eq!(g.in_flight_segments, 1, "the fold's nodes: {g:?}");
    assert_eq!(g.deleted_segments, 0, "{g:?}");
    disk.write_at(&pattern(0x33, 15 << 20, 4096), 15 << 20, false)
        .unwrap();
    disk.flush().unwrap();
    let g = ds.gc(false).unwrap();
    assert_eq!(g.deleted_segments, 1, "{g:?}");
    for i in 0..flushed {
        assert!(
            holds(&disk, i * MIB, MIB, 0x40 + i as u8),
            "MiB {i} after GC"
        );
    }
    clean(&ds, "after GC");
}

/// A crash once a compaction's segment is uploaded, before the manifest
/// that moves grains into it: nothing is lost, the segment is an orphan
/// until the writer's generation moves on; then a whole pass frees the
/// partly live payloads and every grain reads back.
#[test]
fn a_crash_during_compaction_loses_nothing_and_a_pass_then_frees_space() {
    let f = FaultStore::new(3);
    // 1,024 grains: a tail never long enough to fold.
    let grains = 1024u64;
    let (dir, ds) = fresh(&f, grains * 4096);
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    // Three rounds of 4 KiB writes in random order, a FLUSH every 64:
    // each payload ends partly live.
    let mut last = vec![0u8; grains as usize];
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for i in 0..3 * grains {
        let g = rng.below(grains);
        let p = 1 + (i % 250) as u8;
        last[g as usize] = p;
        disk.write_at(&pattern(p, g as usize * 4096, 4096), g * 4096, false)
            .unwrap();
        if i % 64 == 63 {
            disk.flush().unwrap();
        }
    }
    disk.flush().unwrap();
    let verify = |disk: &ObjectDisk, what: &str| {
        for (g, &p) in last.iter().enumerate() {
            assert!(holds(disk, g * 4096, 4096, p), "{what}: grain {g}");
        }
    };
    let dry = disk
        .compact(CompactOptions {
            dry_run: true,
            ..CompactOptions::default()
        })
        .unwrap();
    assert!(dry.rewritten_grains > 0 && dry.candidates > 10, "{dry:?}");
    f.crash_at_key("/s/", 0, Crash::After);
    disk.compact(CompactOptions::default()).unwrap_err();
    assert!(
        f.crashed().is_some_and(|at| at.contains("/s/")),
        "{:?}",
        f.crashed()
    );
    drop((disk, ds));

    let (ds, disk) = again(&f, dir.path());
    verify(&disk, "after the crash");
    clean(&ds, "after the crash");
    let g = ds.gc(false).unwrap();
    assert_eq!(g.in_flight_segments, 1, "the compaction's segment: {g:?}");
    disk.write_at(&pattern(last[0], 0, 4096), 0, false).unwrap();
    disk.flush().unwrap();
    let g = ds.gc(false).unwrap();
    assert_eq!(g.in_flight_segments, 0, "{g:?}");
    let before = ds.gc(true).unwrap();

    let c = disk.compact(CompactOptions::default()).unwrap();
    assert!(c.relocated_grains > 500, "{c:?}");
    assert_eq!(c.dropped_grains, 0, "nothing wrote meanwhile: {c:?}");
    let g = ds.gc(false).unwrap();
    assert!(g.deleted_manifests > 10, "{g:?}");
    let after = ds.gc(true).unwrap();
    assert!(
        after.stored_bytes * 10 <= after.live_bytes * 12
            && after.stored_bytes < before.stored_bytes,
        "stored within 1.2x live after compaction: before {before:?}, after {after:?}"
    );
    verify(&disk, "after compaction and GC");
    clean(&ds, "after compaction and GC");
}

/// A store whose listings take longer than the writer's claim-marker
/// period (100 ms: a distant region's LIST, or a store that hangs until
/// the timeout) still takes flushes: the writer lists the markers, then
/// commits. It listed again after every listing before, since each one
/// took longer than the period, and a flush never returned (found as a
/// hang of `a_store_outage_fails_flushes_cleanly_and_loses_nothing`).
#[test]
fn a_flush_completes_when_the_stores_listings_are_slow() {
    let f = FaultStore::new(7);
    let (_dir, ds) = fresh(&f, MIB as u64);
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    f.crash_when(|r| {
        if r.op == strata_s3::fault::Op::List {
            std::thread::sleep(Duration::from_millis(150));
        }
        None
    });
    disk.write_at(&pattern(7, 0, 4096), 0, false).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let d = disk.clone();
    std::thread::spawn(move || {
        let _ = tx.send(d.flush());
    });
    // A bound for a hang, not a measure: the flush takes well under 1 s.
    let flushed = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the flush never returned: the writer kept listing claim markers");
    flushed.unwrap();
    assert!(holds(&disk, 0, 4096, 7));
}
