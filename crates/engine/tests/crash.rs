//! Crash tests over the simulated storage layer: unflushed writes are
//! dropped, kept or torn at random; after recovery every flushed write is
//! present, unflushed sectors hold one of the values written to them,
//! snapshots are intact and `check` is clean. Seeds are printed on failure.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, OpenOptions, Provisioning};
use strata_storage::{Backend, SimBackend};

const DISK_BYTES: u64 = 3 << 20;
const SECTORS: u64 = DISK_BYTES / 512;

type Sector = Vec<u8>;

/// What the disk may hold after a crash.
struct Model {
    durable: Vec<u8>,
    /// Sectors written since the last flush: every value they may hold now.
    candidates: HashMap<u64, Vec<Sector>>,
    /// Snapshots (all durable: snapshot commands commit).
    snaps: Vec<(String, Vec<u8>)>,
    /// Latest contents, as a reader sees them before the crash.
    live: Vec<u8>,
}

impl Model {
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

fn open(b: &SimBackend) -> Datastore {
    Datastore::open(
        Arc::new(b.clone()) as Arc<dyn Backend>,
        &OpenOptions {
            cache_bytes: 64 * 4096,
        },
        None,
    )
    .expect("open after crash")
}

fn verify(ds: &Datastore, m: &Model, seed: u64) {
    let h = ds.open_disk("d").unwrap();
    let mut buf = vec![0u8; DISK_BYTES as usize];
    h.read_at(&mut buf, 0).unwrap();
    for s in 0..SECTORS {
        let got = &buf[(s * 512) as usize..((s + 1) * 512) as usize];
        match m.candidates.get(&s) {
            None => assert!(
                got == &m.durable[(s * 512) as usize..((s + 1) * 512) as usize],
                "seed {seed}: flushed sector {s} lost"
            ),
            Some(c) => assert!(
                c.iter().any(|x| x == got),
                "seed {seed}: unflushed sector {s} holds bytes never written there"
            ),
        }
    }
    for (name, data) in &m.snaps {
        let h = ds.open_disk(&format!("d@{name}")).unwrap();
        let mut buf = vec![0u8; DISK_BYTES as usize];
        h.read_at(&mut buf, 0).unwrap();
        assert!(buf == *data, "seed {seed}: snapshot {name} changed");
    }
    let r = ds.check().unwrap();
    assert!(
        r.is_clean(),
        "seed {seed}: check after recovery: {:#?}",
        r.errors
    );
}

fn one_run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let mut ds = open(&b);
    ds.create_disk("d", DISK_BYTES, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    // A second disk written at the same time: its data must never show up in "d".
    ds.create_disk("other", DISK_BYTES, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let mut m = Model {
        durable: vec![0; DISK_BYTES as usize],
        candidates: HashMap::new(),
        snaps: vec![],
        live: vec![0; DISK_BYTES as usize],
    };
    let mut snap_no = 0;
    for round in 0..4 {
        let ops = rng.gen_range(5..60);
        for _ in 0..ops {
            let h = ds.open_disk("d").unwrap();
            match rng.gen_range(0..100) {
                0..=59 => {
                    let sector = rng.gen_range(0..SECTORS);
                    let n = rng.gen_range(1..=64).min(SECTORS - sector);
                    let data: Vec<u8> = (0..n * 512).map(|_| rng.gen()).collect();
                    h.write_at(&data, sector * 512, false).unwrap();
                    m.write(sector, &data);
                }
                60..=69 => {
                    let sector = rng.gen_range(0..SECTORS);
                    let n = rng.gen_range(1..=2048).min(SECTORS - sector);
                    h.unmap(sector * 512, n * 512).unwrap();
                    m.write(sector, &vec![0u8; (n * 512) as usize]);
                }
                70..=79 => {
                    let o = ds.open_disk("other").unwrap();
                    let sector = rng.gen_range(0..SECTORS - 8) & !7;
                    o.write_at(&[0xEEu8; 4096], sector * 512, false).unwrap();
                    o.unmap(sector * 512, 4096).unwrap();
                }
                80..=86 => {
                    h.flush().unwrap();
                    m.flush();
                }
                87..=89 => {
                    // Give back part of what deleted snapshots held: a crash
                    // may land in the middle of reclaiming.
                    ds.reclaim(rng.gen_range(1..3000)).unwrap();
                }
                90..=94 => {
                    // Snapshot commands commit: the snapshot holds the live state.
                    snap_no += 1;
                    let name = format!("s{snap_no}");
                    ds.snapshot_create("d", &name, "").unwrap();
                    m.flush();
                    m.snaps.push((name, m.live.clone()));
                }
                95..=96 => {
                    if !m.snaps.is_empty() {
                        let i = rng.gen_range(0..m.snaps.len());
                        let (name, _) = m.snaps.remove(i);
                        ds.snapshot_delete("d", &name).unwrap();
                        m.flush();
                    }
                }
                97 => {
                    if !m.snaps.is_empty() {
                        let i = rng.gen_range(0..m.snaps.len());
                        let (name, data) = m.snaps[i].clone();
                        ds.snapshot_revert("d", &name).unwrap();
                        m.live = data;
                        m.flush();
                    }
                }
                _ => {
                    // A linked clone of a snapshot, written to and removed again:
                    // its writes must never show up in "d" or its snapshots.
                    if let Some((name, _)) = m.snaps.first().cloned() {
                        ds.clone_linked(&format!("d@{name}"), "tmpclone").unwrap();
                        let c = ds.open_disk("tmpclone").unwrap();
                        c.write_at(&[0xC1u8; 8192], 0, false).unwrap();
                        ds.remove_disk("tmpclone").unwrap();
                        m.flush();
                    }
                }
            }
        }
        // Sometimes the power goes in the middle of a flush, or of a
        // checkpoint (page images, in-place pages, catalog, superblock).
        match rng.gen_range(0..10) {
            0..=2 => {
                b.fail_writes_after(rng.gen_range(0..6));
                if ds.flush().is_ok() {
                    m.flush();
                }
            }
            3..=4 => {
                b.fail_writes_after(rng.gen_range(0..40));
                if ds.close().is_ok() {
                    m.flush();
                }
            }
            _ => {}
        }
        let report = b.crash(seed * 31 + round);
        let _ = report;
        drop(ds);
        ds = open(&b);
        verify(&ds, &m, seed);
        // What survived is now the durable state.
        let h = ds.open_disk("d").unwrap();
        let mut buf = vec![0u8; DISK_BYTES as usize];
        h.read_at(&mut buf, 0).unwrap();
        m.live = buf;
        m.flush();
    }
}

#[test]
fn flushed_writes_survive_simulated_power_cuts() {
    let runs: u64 = std::env::var("STRATA_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    for seed in 0..runs {
        one_run(seed);
    }
}
