//! Many threads writing 512-byte sectors that share 4 KiB grains (so every
//! write is a read-modify-write of a grain someone else is writing too),
//! while another thread takes, deletes and reclaims snapshots and trims.
//! Every sector must end with its owner's last write, and `check` be clean.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::{Arc, Barrier};

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, OpenOptions, Provisioning};
use strata_storage::{Backend, SimBackend};

const WRITERS: u64 = 4;
const GRAINS: u64 = 64;

fn sector(writer: u64, grain: u64, round: u32) -> Vec<u8> {
    let mut v = vec![0u8; 512];
    v[..8].copy_from_slice(&writer.to_le_bytes());
    v[8..16].copy_from_slice(&grain.to_le_bytes());
    v[16..20].copy_from_slice(&round.to_le_bytes());
    v
}

#[test]
fn concurrent_subgrain_writes_and_snapshots_lose_nothing() {
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let ds = Datastore::open(
        Arc::new(b.clone()) as Arc<dyn Backend>,
        &OpenOptions {
            cache_bytes: 64 * 4096,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    ds.create_disk("d", GRAINS * 4096, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let rounds = 200u32;
    // Every round starts right after a snapshot, so every grain is shared
    // and the first writes of all writers race to copy it.
    let barrier = Arc::new(Barrier::new(WRITERS as usize + 1));
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let h = ds.open_disk("d").unwrap();
        let barrier = barrier.clone();
        threads.push(std::thread::spawn(move || {
            for round in 1..=rounds {
                barrier.wait();
                for g in 0..GRAINS {
                    // Writer w owns sectors w and w+4 of every grain.
                    for s in [w, w + WRITERS] {
                        h.write_at(&sector(w, g, round), g * 4096 + s * 512, false)
                            .unwrap();
                    }
                }
                barrier.wait();
            }
        }));
    }
    let admin = {
        let ds = ds.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            for _ in 0..rounds {
                barrier.wait(); // writers start
                barrier.wait(); // writers done
                n += 1;
                ds.snapshot_create("d", &format!("s{n}"), "").unwrap();
                if n > 2 {
                    ds.snapshot_delete("d", &format!("s{}", n - 2)).unwrap();
                }
                ds.reclaim(500).unwrap();
                if n.is_multiple_of(5) {
                    ds.flush().unwrap();
                }
            }
            n
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    let snaps = admin.join().unwrap();
    assert_eq!(snaps, rounds);
    let h = ds.open_disk("d").unwrap();
    let mut buf = vec![0u8; (GRAINS * 4096) as usize];
    h.read_at(&mut buf, 0).unwrap();
    for g in 0..GRAINS {
        for s in 0..8u64 {
            let off = (g * 4096 + s * 512) as usize;
            let got = &buf[off..off + 512];
            assert_eq!(
                got,
                &sector(s % WRITERS, g, rounds)[..],
                "grain {g} sector {s}"
            );
        }
    }
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
    ds.close().unwrap();
    assert_eq!(ds.info().reclaiming, 0);
}

/// Writers on a disk and on its linked clone (which share grains through
/// a snapshot) race a thread that defragments both and consolidates free
/// space over and over (docs/FORMAT.md §10.2: every head's stripes held
/// while a region moves; §10.4: client I/O drained per batch). Every
/// sector ends with its owner's last write, in both disks and in the
/// snapshot, and `check` is clean.
#[test]
fn writes_racing_defrag_and_consolidation_of_shared_grains_lose_nothing() {
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let ds = Datastore::open(
        Arc::new(b.clone()) as Arc<dyn Backend>,
        &OpenOptions {
            cache_bytes: 64 * 4096,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    const G: u64 = 512;
    ds.create_disk("d", G * 4096, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let h = ds.open_disk("d").unwrap();
    // Grains written in a scattered order and placed in arrival order (not
    // each region in its own block), so every region is fragmented.
    ds.set_placement_regions(false);
    for i in 0..G {
        let g = (i * 197) % G;
        let mut v = vec![0u8; 4096];
        for s in 0..8u64 {
            v[(s * 512) as usize..(s * 512 + 512) as usize].copy_from_slice(&sector(
                s % WRITERS,
                g,
                0,
            ));
        }
        h.write_at(&v, g * 4096, false).unwrap();
    }
    ds.set_placement_regions(true);
    assert!(ds.disk_fragments("d").unwrap().0 > 100);
    ds.snapshot_create("d", "s", "").unwrap();
    ds.clone_linked("d@s", "c").unwrap();
    let snap = {
        let mut v = vec![0u8; (G * 4096) as usize];
        ds.open_disk("d@s").unwrap().read_at(&mut v, 0).unwrap();
        v
    };
    let rounds = 40u32;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Writers start once the defrag thread has begun its first pass: only
    // the scattered first layout has anything to move (the writers' own
    // copies land in order), so writers that got there first could leave
    // it nothing to race with.
    let defrag_started = Arc::new(std::sync::Barrier::new(2 * WRITERS as usize + 1));
    let mut threads = Vec::new();
    for disk in ["d", "c"] {
        for w in 0..WRITERS {
            let h = ds.open_disk(disk).unwrap();
            let defrag_started = defrag_started.clone();
            threads.push(std::thread::spawn(move || {
                defrag_started.wait();
                for round in 1..=rounds {
                    for i in 0..G {
                        let g = (i * 389 + u64::from(round) * 31) % G;
                        if (g + w).is_multiple_of(3) {
                            continue; // some grains stay shared
                        }
                        for s in [w, w + WRITERS] {
                            h.write_at(&sector(w, g, round), g * 4096 + s * 512, false)
                                .unwrap();
                        }
                    }
                }
            }));
        }
    }
    // Commits beside it (clients' flushes): a commit drains the I/O gate,
    // so a lock-order mistake between the gate and the stripes hangs here.
    let flusher = {
        let ds = ds.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                ds.flush().unwrap();
                std::thread::yield_now();
            }
        })
    };
    let defrag = {
        let ds = ds.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut moved = 0;
            let mut first = true;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if std::mem::take(&mut first) {
                    defrag_started.wait();
                }
                for disk in ["d", "c"] {
                    let r = ds
                        .defrag_disk(disk, false, &Default::default(), &mut |_, _| {})
                        .unwrap();
                    assert_eq!(r.grains_kept, 0, "{r:?}");
                    moved += r.moved_bytes;
                }
                // And free-space consolidation, which moves grains (data
                // and map nodes) down with client I/O drained per batch.
                let r = ds
                    .consolidate_free_space(&Default::default(), &mut |_, _| {})
                    .unwrap();
                assert_eq!(r.grains_kept, 0, "{r:?}");
                moved += r.moved_bytes;
            }
            moved
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let moved = defrag.join().unwrap();
    flusher.join().unwrap();
    eprintln!("defrag moved {moved} bytes while the writers ran");
    assert!(moved > 0, "the defrag thread never moved anything");
    for disk in ["d", "c"] {
        let mut buf = vec![0u8; (G * 4096) as usize];
        ds.open_disk(disk).unwrap().read_at(&mut buf, 0).unwrap();
        for g in 0..G {
            for s in 0..8u64 {
                let w = s % WRITERS;
                // Writer w skips grain g in every round, or writes it last
                // in the last one.
                let last = if (g + w).is_multiple_of(3) { 0 } else { rounds };
                let off = (g * 4096 + s * 512) as usize;
                assert_eq!(
                    &buf[off..off + 512],
                    &sector(w, g, last)[..],
                    "{disk}: grain {g} sector {s}"
                );
            }
        }
    }
    let mut v = vec![0u8; (G * 4096) as usize];
    ds.open_disk("d@s").unwrap().read_at(&mut v, 0).unwrap();
    assert!(v == snap, "the snapshot's bytes changed");
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
}
