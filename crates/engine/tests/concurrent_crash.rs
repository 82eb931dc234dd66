//! Power cuts while several threads write and flush, and checkpoints run
//! beside them (client commits continue into the next log while a
//! checkpoint writes pages). Each writer stamps a rising generation into
//! its own grains and remembers, per grain, the generation its last
//! successful flush covered; after the cut every grain must hold at least
//! that generation (flushed writes survive) and at most the last one
//! written (nothing invented), and `check` must be clean.
//!
//! An admin thread converts the disk between provisioning types beside
//! the writers (the eager fill and the zero scan decide under the write
//! stripes).
//!
//! The threads are real, so interleavings vary from run to run; the
//! deterministic single-thread crash test (crash.rs) replays from seeds.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, Provisioning, SpaceWork};
use strata_storage::SimBackend;

const WRITERS: u64 = 3;
const GRAINS_PER_WRITER: u64 = 96;

fn open(b: &SimBackend) -> Datastore {
    let ds = common::open_sim(b);
    // Readied space (FORMAT.md §7.1) by its own thread, beside the writers.
    ds.set_ready_bytes(1 << 20);
    ds.start_readier();
    ds
}

fn stamp(gen: u64) -> Vec<u8> {
    gen.to_le_bytes().repeat(512)
}

/// Per writer and grain: (generation covered by a completed flush, last written).
type Ledger = Vec<Vec<(u64, u64)>>;

fn one_run(run: u64) {
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let ds = open(&b);
    let grains = WRITERS * GRAINS_PER_WRITER;
    ds.create_disk("d", grains * 4096, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let ledger: Arc<Mutex<Ledger>> =
        Arc::new(Mutex::new(vec![
            vec![(0, 0); GRAINS_PER_WRITER as usize];
            WRITERS as usize
        ]));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (h, ledger, stop) = (ds.open_disk("d").unwrap(), ledger.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut gen = 0u64;
            let mut written = vec![0u64; GRAINS_PER_WRITER as usize];
            while !stop.load(Ordering::Relaxed) {
                gen += 1;
                let k = (gen * 7 + w) % GRAINS_PER_WRITER;
                let g = w * GRAINS_PER_WRITER + k;
                {
                    // Record the write as possible before it can land.
                    let mut l = ledger.lock().unwrap();
                    l[w as usize][k as usize].1 = gen;
                }
                if h.write_at(&stamp(gen), g * 4096, false).is_err() {
                    break;
                }
                written[k as usize] = gen;
                if gen.is_multiple_of(5) {
                    if h.flush().is_err() {
                        break;
                    }
                    let mut l = ledger.lock().unwrap();
                    for (i, &x) in written.iter().enumerate() {
                        l[w as usize][i].0 = l[w as usize][i].0.max(x);
                    }
                }
            }
        }));
    }
    // Checkpoints beside the writers, and snapshots that make writes copy.
    let admin = {
        let (ds, stop) = (ds.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let r = if i.is_multiple_of(3) {
                    ds.snapshot_create("d", &format!("s{i}"), "")
                        .and_then(|_| ds.snapshot_delete("d", &format!("s{i}")))
                } else if i % 3 == 1 {
                    // Converting under the writers: the eager fill and the
                    // zero scan of a convert to thin must never overwrite
                    // or release a grain a writer wrote meanwhile.
                    let to = [
                        Provisioning::Eagerzeroedthick,
                        Provisioning::Thin,
                        Provisioning::Zeroedthick,
                    ][(i / 3 % 3) as usize];
                    ds.convert_disk("d", to, &SpaceWork::default(), &mut |_, _| {})
                        .map(|_| ())
                } else {
                    ds.close()
                };
                if r.is_err() {
                    break;
                }
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(20 + run % 30));
    b.crash(run);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    admin.join().unwrap();
    drop(ds);
    let ds = open(&b);
    let h = ds.open_disk("d").unwrap();
    let l = ledger.lock().unwrap();
    for w in 0..WRITERS {
        for k in 0..GRAINS_PER_WRITER {
            let mut buf = vec![0u8; 4096];
            h.read_at(&mut buf, (w * GRAINS_PER_WRITER + k) * 4096)
                .unwrap();
            // An unflushed write in place may be torn at sector
            // granularity: each sector is whole, old or new.
            let (flushed, last) = l[w as usize][k as usize];
            for (si, sector) in buf.chunks(512).enumerate() {
                let got = u64::from_le_bytes(sector[..8].try_into().unwrap());
                assert!(
                    sector == &stamp(got)[..512],
                    "run {run}: writer {w} grain {k} sector {si} is torn inside or foreign"
                );
                assert!(
                    got >= flushed,
                    "run {run}: writer {w} grain {k} lost a flushed write ({got} < {flushed})"
                );
                assert!(
                    got <= last,
                    "run {run}: writer {w} grain {k} holds generation {got}, never written ({last})"
                );
            }
        }
    }
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "run {run}: {:#?}", r.errors);
}

#[test]
fn flushed_writes_survive_power_cuts_during_concurrent_checkpoints() {
    let runs: u64 = std::env::var("STRATA_CONCURRENT_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    for run in 0..runs {
        one_run(run);
    }
}
