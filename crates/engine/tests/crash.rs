//! Crash tests over the simulated storage layer. Several logical clients —
//! a writer on disk "d", a writer on disk "e", and an admin that takes,
//! deletes and reverts snapshots, reclaims, makes and drops clones,
//! converts, defragments, re-shares equal grains, packs what compresses,
//! consolidates free space and checkpoints — are interleaved by a
//! scheduler driven by the seed, so a
//! failing case replays exactly from the seed it prints. Rounds end in a
//! power cut (unflushed writes dropped, kept or torn at sector granularity),
//! sometimes in the middle of a flush or a checkpoint (page images, pages,
//! superblock), and sometimes after storage reads start failing (EIO on
//! metadata and data reads: operations fail, the datastore may fail-stop).
//! After recovery every flushed write is present, unflushed sectors hold
//! one of the values written to them, snapshots are intact and `check` is
//! clean.
//!
//! `STRATA_CRASH_RUNS` (default 250 runs × 4 rounds = 1,000 crash points)
//! or `STRATA_CRASH_SECONDS` (soak: run seeds until the time is up; bench/
//! soak.sh) set the amount; the count covered is printed.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_block::BlockDevice;
use strata_engine::{Datastore, FullClone, InitOptions, Provisioning, SpaceWork};
use strata_storage::SimBackend;

const DISK_BYTES: u64 = 3 << 20;
const SECTORS: u64 = DISK_BYTES / 512;
const DISKS: [&str; 2] = ["d", "e"];
const ROUNDS: u64 = 4;

type Sector = Vec<u8>;

/// `STRATA_CRASH_TRACE=1` prints every operation (to replay one seed).
fn trace(msg: impl FnOnce() -> String) {
    if std::env::var("STRATA_CRASH_TRACE").is_ok() {
        eprintln!("{}", msg());
    }
}

/// What one disk may hold after a crash.
struct DiskModel {
    durable: Vec<u8>,
    /// Sectors written since the last flush: every value they may hold now.
    candidates: HashMap<u64, Vec<Sector>>,
    /// Latest contents, as a reader sees them before the crash.
    live: Vec<u8>,
}

impl DiskModel {
    fn new() -> Self {
        DiskModel {
            durable: vec![0; DISK_BYTES as usize],
            candidates: HashMap::new(),
            live: vec![0; DISK_BYTES as usize],
        }
    }
    fn write(&mut self, sector: u64, data: &[u8]) {
        for (i, chunk) in data.chunks(512).enumerate() {
            let s = sector + i as u64;
            let c = self.candidates.entry(s).or_insert_with(|| {
                vec![self.durable[(s * 512) as usize..((s + 1) * 512) as usize].to_vec()]
            });
            c.push(chunk.to_vec());
            self.live[(s * 512) as usize..((s + 1) * 512) as usize].copy_from_slice(chunk);
        }
    }
    fn flush(&mut self) {
        self.durable = self.live.clone();
        self.candidates.clear();
    }
}

struct Snap {
    disk: usize,
    name: String,
    data: Vec<u8>,
    /// A command on it failed: it may or may not exist after the crash;
    /// if it does, it holds `data`.
    optional: bool,
}

struct World {
    disks: Vec<DiskModel>,
    snaps: Vec<Snap>,
}

impl World {
    /// A flush through any handle commits the whole datastore.
    fn flush(&mut self) {
        for d in &mut self.disks {
            d.flush();
        }
    }
}

fn open(b: &SimBackend) -> Datastore {
    let ds = common::open_sim(b);
    // Readied space (FORMAT.md §7.1), a block at a time: extensions of the
    // pool file in flight at every power cut.
    ds.set_ready_bytes(1 << 20);
    ds
}

fn try_read_all(ds: &Datastore, name: &str) -> strata_engine::Result<Vec<u8>> {
    let h = ds.open_disk(name)?;
    let mut buf = vec![0u8; DISK_BYTES as usize];
    h.read_at(&mut buf, 0)?;
    Ok(buf)
}

fn read_all(ds: &Datastore, name: &str) -> Vec<u8> {
    try_read_all(ds, name).unwrap()
}

fn verify(ds: &Datastore, w: &World, seed: u64) {
    for (i, name) in DISKS.iter().enumerate() {
        let m = &w.disks[i];
        let buf = read_all(ds, name);
        for s in 0..SECTORS {
            let got = &buf[(s * 512) as usize..((s + 1) * 512) as usize];
            match m.candidates.get(&s) {
                None => assert!(
                    got == &m.durable[(s * 512) as usize..((s + 1) * 512) as usize],
                    "seed {seed}: flushed sector {s} of {name} lost"
                ),
                Some(c) => assert!(
                    c.iter().any(|x| x == got),
                    "seed {seed}: unflushed sector {s} of {name} holds bytes never written there"
                ),
            }
        }
    }
    for s in &w.snaps {
        let target = format!("{}@{}", DISKS[s.disk], s.name);
        match ds.open_disk(&target) {
            Ok(_) => assert!(
                read_all(ds, &target) == s.data,
                "seed {seed}: snapshot {target} changed"
            ),
            Err(e) => assert!(s.optional, "seed {seed}: snapshot {target} is gone: {e}"),
        }
    }
    let r = ds.check().unwrap();
    assert!(
        r.is_clean(),
        "seed {seed}: check after recovery: {:#?}",
        r.errors
    );
}

/// Whether an operation failed because of injected faults (then the round
/// ends); a failure without faults is a bug.
fn failed<T>(r: strata_engine::Result<T>, faulty: bool, seed: u64, what: &str) -> bool {
    match r {
        Ok(_) => false,
        Err(e) => {
            assert!(faulty, "seed {seed}: {what} failed without a fault: {e}");
            true
        }
    }
}

fn block_failed(r: strata_block::BlockResult<()>, faulty: bool, seed: u64, what: &str) -> bool {
    failed(r, faulty, seed, what)
}

/// One round: interleaved operations until the round ends or a fault hits
/// (then returns true: what the failed operation did is uncertain, so no
/// flush may follow it before the power cut).
fn round(
    ds: &Datastore,
    b: &SimBackend,
    w: &mut World,
    rng: &mut StdRng,
    seed: u64,
    no: &mut u32,
) -> bool {
    let ops = rng.gen_range(5..80);
    // Reads start failing at a random step of some rounds.
    let fault_at = rng.gen_bool(0.25).then(|| rng.gen_range(0..ops));
    let mut faulty = false;
    for step in 0..ops {
        if fault_at == Some(step) {
            b.fail_reads_after(None, rng.gen_range(0..30));
            faulty = true;
        }
        // The scheduler: which logical client runs its next operation.
        let client = rng.gen_range(0..5);
        trace(|| format!("step {step} client {client} faulty {faulty}"));
        let stop = if client < 4 {
            let i = (client % 2) as usize;
            let h = ds.open_disk(DISKS[i]).unwrap();
            match rng.gen_range(0..100) {
                0..=69 => {
                    let sector = rng.gen_range(0..SECTORS);
                    let n = rng.gen_range(1..=64).min(SECTORS - sector);
                    let data: Vec<u8> = (0..n * 512).map(|_| rng.gen()).collect();
                    // Recorded first: a failed write may have landed in part.
                    w.disks[i].write(sector, &data);
                    trace(|| format!("  write {} sectors {sector}+{n}", DISKS[i]));
                    let f = block_failed(
                        h.write_at(&data, sector * 512, false),
                        faulty,
                        seed,
                        "write",
                    );
                    ds.ready_space();
                    f
                }
                70..=84 => {
                    let sector = rng.gen_range(0..SECTORS);
                    let n = rng.gen_range(1..=2048).min(SECTORS - sector);
                    w.disks[i].write(sector, &vec![0u8; (n * 512) as usize]);
                    trace(|| format!("  unmap {} sectors {sector}+{n}", DISKS[i]));
                    block_failed(h.unmap(sector * 512, n * 512), faulty, seed, "unmap")
                }
                _ => {
                    let f = block_failed(h.flush(), faulty, seed, "flush");
                    trace(|| format!("  flush failed={f}"));
                    if !f {
                        w.flush();
                    }
                    f
                }
            }
        } else {
            admin(ds, w, rng, seed, no, faulty)
        };
        if stop {
            b.heal_reads();
            return true;
        }
    }
    b.heal_reads();
    false
}

fn admin(
    ds: &Datastore,
    w: &mut World,
    rng: &mut StdRng,
    seed: u64,
    no: &mut u32,
    faulty: bool,
) -> bool {
    let i = rng.gen_range(0..DISKS.len());
    let disk = DISKS[i];
    let op = rng.gen_range(0..100);
    trace(|| format!("  admin op {op} on {disk}"));
    match op {
        0..=24 => {
            // Snapshot commands commit: the snapshot holds the live state.
            *no += 1;
            let name = format!("s{no}");
            let data = w.disks[i].live.clone();
            let f = failed(
                ds.snapshot_create(disk, &name, ""),
                faulty,
                seed,
                "snapshot",
            );
            if !f {
                w.flush();
            }
            w.snaps.push(Snap {
                disk: i,
                name,
                data,
                optional: f,
            });
            f
        }
        25..=39 => {
            let mine: Vec<usize> = (0..w.snaps.len())
                .filter(|&k| w.snaps[k].disk == i)
                .collect();
            if mine.is_empty() {
                return false;
            }
            let k = mine[rng.gen_range(0..mine.len())];
            let f = failed(
                ds.snapshot_delete(disk, &w.snaps[k].name),
                faulty,
                seed,
                "delete",
            );
            if f {
                w.snaps[k].optional = true;
            } else {
                w.snaps.remove(k);
                w.flush();
            }
            f
        }
        40..=44 if !faulty => {
            let mine: Vec<usize> = (0..w.snaps.len())
                .filter(|&k| w.snaps[k].disk == i && !w.snaps[k].optional)
                .collect();
            if mine.is_empty() {
                return false;
            }
            let k = mine[rng.gen_range(0..mine.len())];
            ds.snapshot_revert(disk, &w.snaps[k].name).unwrap();
            w.disks[i].live = w.snaps[k].data.clone();
            w.flush();
            false
        }
        45..=62 => {
            // Give back part of what deleted snapshots held: a crash may
            // land in the middle of reclaiming.
            failed(ds.reclaim(rng.gen_range(1..3000)), faulty, seed, "reclaim")
        }
        63..=64 => {
            // Pack what compresses (FORMAT.md §18.5): sectors written into
            // zero grains leave grains that shrink; streams, spills and
            // their counts meet every other operation and the crashes.
            let r = ds.compress(
                &[],
                if rng.gen_bool(0.5) {
                    strata_engine::PackCodec::Lz4
                } else {
                    strata_engine::PackCodec::Zstd
                },
                &SpaceWork::default(),
                &mut |_, _| {},
            );
            let f = failed(r, faulty, seed, "compress");
            if !f {
                w.flush();
            }
            f
        }
        65..=74 => {
            // A linked clone, written to and removed again: its writes must
            // never show up in the disk or its snapshots.
            let Some(s) = w.snaps.iter().find(|s| s.disk == i && !s.optional) else {
                return false;
            };
            let src = format!("{disk}@{}", s.name);
            let r = ds.clone_linked(&src, "tmpclone").and_then(|_| {
                let c = ds.open_disk("tmpclone")?;
                c.write_at(&[0xC1u8; 8192], 0, false)?;
                ds.remove_disk("tmpclone")
            });
            let f = failed(r, faulty, seed, "linked clone");
            if !f {
                w.flush();
            }
            f
        }
        75..=82 => {
            // A full clone of the live disk is the live state at that instant.
            let r = ds
                .clone_full(
                    &FullClone {
                        source: disk,
                        name: "tmpfull",
                        provisioning: Provisioning::Thin,
                        work: Default::default(),
                    },
                    &mut |_, _| {},
                )
                .and_then(|_| try_read_all(ds, "tmpfull"))
                .and_then(|copy| {
                    assert!(copy == w.disks[i].live, "seed {seed}: full clone differs");
                    ds.remove_disk("tmpfull")
                });
            let f = failed(r, faulty, seed, "full clone");
            if !f {
                w.flush();
            }
            f
        }
        83..=89 => {
            // Change the disk's provisioning: every step commits, and the
            // bytes stay what they were.
            let to = [
                Provisioning::Thin,
                Provisioning::Zeroedthick,
                Provisioning::Eagerzeroedthick,
            ][rng.gen_range(0..3)];
            let r = ds.convert_disk(disk, to, &SpaceWork::default(), &mut |_, _| {});
            let f = failed(r, faulty, seed, "convert");
            if !f {
                w.flush();
            }
            f
        }
        95..=96 => {
            // Consolidate free space: live grains (data and map nodes)
            // move down, the pool end comes down, free grains are punched.
            let r = ds.consolidate_free_space(&SpaceWork::default(), &mut |_, _| {});
            let f = failed(r, faulty, seed, "free-space consolidation");
            if !f {
                w.flush();
            }
            f
        }
        93..=94 => {
            // The same bytes at the same offset of both disks (a range of
            // this one's, written to the other and again here: new grains
            // equal to what snapshots hold), then re-sharing (FORMAT.md
            // §17.2) makes them one; every disk and snapshot keeps its bytes.
            let sector = rng.gen_range(0..SECTORS) & !7;
            let n = (rng.gen_range(1..=64u64) * 8).min(SECTORS - sector);
            let range = (sector * 512) as usize..((sector + n) * 512) as usize;
            let data = w.disks[i].live[range].to_vec();
            for k in [1 - i, i] {
                w.disks[k].write(sector, &data);
                trace(|| format!("  copy to {} sectors {sector}+{n}", DISKS[k]));
                let h = ds.open_disk(DISKS[k]).unwrap();
                if block_failed(h.write_at(&data, sector * 512, false), faulty, seed, "copy") {
                    return true;
                }
            }
            let r = ds.dedup(&[], &SpaceWork::default(), &mut |_, _| {});
            let f = failed(r, faulty, seed, "dedup");
            if !f {
                w.flush();
            }
            f
        }
        90..=92 => {
            // Lay the disk out again: grains it shares with its snapshots
            // move for all of them (FORMAT.md §10.2); the bytes stay.
            let r = ds.defrag_disk(disk, false, &SpaceWork::default(), &mut |_, _| {});
            let f = failed(r, faulty, seed, "defrag");
            if !f {
                w.flush();
            }
            f
        }
        _ => {
            // A checkpoint (close checkpoints and stays usable).
            let f = failed(ds.close(), faulty, seed, "checkpoint");
            if !f {
                w.flush();
            }
            f
        }
    }
}

fn one_run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let mut ds = open(&b);
    // "e" starts zeroedthick: its writes take blocks held on the host.
    for (d, p) in DISKS
        .iter()
        .zip([Provisioning::Thin, Provisioning::Zeroedthick])
    {
        ds.create_disk(d, DISK_BYTES, p, &mut |_, _| {}).unwrap();
    }
    let mut w = World {
        disks: DISKS.iter().map(|_| DiskModel::new()).collect(),
        snaps: vec![],
    };
    let mut no = 0;
    for r in 0..ROUNDS {
        let faulted = round(&ds, &b, &mut w, &mut rng, seed, &mut no);
        // Sometimes the power goes in the middle of a flush, or of a
        // checkpoint (page images, in-place pages, catalog, superblock).
        match if faulted { 9 } else { rng.gen_range(0..10) } {
            0..=2 => {
                b.fail_writes_after(rng.gen_range(0..6));
                if ds.flush().is_ok() {
                    w.flush();
                }
            }
            3..=4 => {
                b.fail_writes_after(rng.gen_range(0..40));
                if ds.close().is_ok() {
                    w.flush();
                }
            }
            _ => {}
        }
        trace(|| format!("crash round {r}"));
        b.crash(seed * 31 + r);
        drop(ds);
        ds = open(&b);
        verify(&ds, &w, seed);
        // Clones a fault interrupted may be left; they are not the model's.
        for t in ["tmpclone", "tmpfull"] {
            let _ = ds.remove_disk(t);
        }
        // What survived is now the durable state.
        for (i, d) in DISKS.iter().enumerate() {
            w.disks[i].live = read_all(&ds, d);
            w.disks[i].flush();
        }
        w.snaps.retain(|s| {
            ds.open_disk(&format!("{}@{}", DISKS[s.disk], s.name))
                .is_ok()
        });
        for s in &mut w.snaps {
            s.optional = false;
        }
    }
}

#[test]
fn flushed_writes_survive_simulated_power_cuts() {
    let env = |k: &str| std::env::var(k).ok().and_then(|s| s.parse::<u64>().ok());
    let (runs, deadline) = match env("STRATA_CRASH_SECONDS") {
        Some(secs) => (u64::MAX, Some(Instant::now() + Duration::from_secs(secs))),
        None => (env("STRATA_CRASH_RUNS").unwrap_or(250), None),
    };
    let first = env("STRATA_CRASH_SEED").unwrap_or(0);
    let mut seed = first;
    while seed - first < runs && deadline.is_none_or(|d| Instant::now() < d) {
        one_run(seed);
        seed += 1;
    }
    println!(
        "crash points covered: {} (seeds {first}..{seed}, {ROUNDS} per seed)",
        (seed - first) * ROUNDS
    );
}
