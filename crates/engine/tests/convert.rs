//! Converting a disk's provisioning (docs/FORMAT.md §7.3), zero detection
//! and punchzero (§7.4), against the simulator: the bytes never change, the
//! figures follow the type, and a power cut in the middle of a conversion
//! leaves a consistent disk that converting again finishes.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, Provisioning, SpaceWork};
use strata_storage::SimBackend;

const SIZE: u64 = 8 << 20;

fn new_store() -> (SimBackend, Datastore) {
    common::new_sim(256 << 20)
}

/// A disk with data, literal zero grains (written with zero detection
/// off, so they are mapped) and holes; returns its bytes.
fn fill(ds: &Datastore, name: &str) -> Vec<u8> {
    ds.create_disk(name, SIZE, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let h = ds.open_disk(name).unwrap();
    let mut want = vec![0u8; SIZE as usize];
    ds.set_detect_zeroes(false);
    for (i, off) in (0..SIZE).step_by(192 << 10).enumerate() {
        let len = 64 << 10;
        let data: Vec<u8> = if i % 3 == 0 {
            vec![0; len]
        } else {
            (0..len).map(|j| (j as u8) ^ (i as u8) | 1).collect()
        };
        h.write_at(&data, off, false).unwrap();
        want[off as usize..off as usize + len].copy_from_slice(&data);
    }
    ds.set_detect_zeroes(true);
    ds.flush().unwrap();
    want
}

fn convert(ds: &Datastore, name: &str, to: Provisioning) -> strata_engine::Result<()> {
    ds.convert_disk(name, to, &SpaceWork::default(), &mut |_, _| {})
        .map(|_| ())
}

#[test]
fn convert_round_trip_keeps_bytes_and_figures_follow_the_type() {
    let (_b, ds) = new_store();
    let want = fill(&ds, "d");
    let thin = ds.disk_info("d").unwrap();
    let data_bytes = thin.allocated_bytes.unwrap();

    convert(&ds, "d", Provisioning::Eagerzeroedthick).unwrap();
    let i = ds.disk_info("d").unwrap();
    assert_eq!(i.provisioning, Provisioning::Eagerzeroedthick);
    assert_eq!(i.allocated_bytes.unwrap(), SIZE);
    assert_eq!((i.nb.unwrap(), i.tbz.unwrap()), (SIZE >> 20, 0));
    assert_eq!(ds.info().reserved_bytes, 0, "an eager disk has it all");
    assert_eq!(common::read_all(&ds, "d"), want);

    convert(&ds, "d", Provisioning::Thin).unwrap();
    let i = ds.disk_info("d").unwrap();
    assert_eq!(i.provisioning, Provisioning::Thin);
    let zero_grains = (0..SIZE).step_by(192 << 10).step_by(3).count() as u64 * (64 << 10);
    assert_eq!(
        i.allocated_bytes.unwrap(),
        data_bytes - zero_grains,
        "thin again: only non-zero data stays allocated"
    );
    assert_eq!(common::read_all(&ds, "d"), want);

    convert(&ds, "d", Provisioning::Zeroedthick).unwrap();
    let i = ds.disk_info("d").unwrap();
    assert_eq!(i.provisioning, Provisioning::Zeroedthick);
    assert_eq!(ds.info().reserved_bytes, SIZE - i.allocated_bytes.unwrap());
    assert_eq!(common::read_all(&ds, "d"), want);
    assert!(ds.check().unwrap().is_clean());
}

#[test]
fn a_power_cut_in_the_middle_of_a_convert_leaves_a_consistent_disk() {
    use Provisioning::*;
    let plans = [
        (Thin, Eagerzeroedthick),
        (Eagerzeroedthick, Thin),
        (Thin, Zeroedthick),
        (Zeroedthick, Eagerzeroedthick),
    ];
    for (from, to) in plans {
        for (seed, cut_at) in [(1u64, 1u64), (2, 3), (3, 6)] {
            let (b, ds) = new_store();
            let want = fill(&ds, "d");
            if from != Thin {
                convert(&ds, "d", from).unwrap();
            }
            let mut cut = common::cut_at_call(&b, cut_at, seed);
            let r = ds.convert_disk("d", to, &SpaceWork::default(), &mut cut);
            drop(ds);
            let cut = r.is_err();
            let ds = common::open_sim(&b);
            let what = format!("{from:?} -> {to:?}, cut after {cut_at} regions (seed {seed})");
            assert_eq!(
                common::read_all(&ds, "d"),
                want,
                "bytes after a cut: {what}"
            );
            let report = ds.check().unwrap();
            assert!(report.is_clean(), "{what}: {:#?}", report.errors);
            let i = ds.disk_info("d").unwrap();
            assert!(
                i.provisioning == from || i.provisioning == to || i.provisioning == Zeroedthick,
                "{what}: left as {:?}",
                i.provisioning
            );
            // Converting again finishes the job.
            convert(&ds, "d", to).unwrap();
            let i = ds.disk_info("d").unwrap();
            assert_eq!(i.provisioning, to, "{what}");
            if to == Eagerzeroedthick {
                assert_eq!(
                    (i.allocated_bytes.unwrap(), i.tbz.unwrap()),
                    (SIZE, 0),
                    "{what}"
                );
            }
            assert_eq!(
                common::read_all(&ds, "d"),
                want,
                "{what}: bytes after finishing"
            );
            assert!(ds.check().unwrap().is_clean(), "{what}");
            assert!(cut || to == Zeroedthick, "{what}: the cut never came");
        }
    }
}

#[test]
fn literal_zeros_allocate_nothing_on_thin_disks_and_release_what_they_overwrite() {
    let (_b, ds) = new_store();
    ds.create_disk("t", 32 << 20, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let h = ds.open_disk("t").unwrap();
    let zeros = vec![0u8; 1 << 20];
    for i in 0..16u64 {
        h.write_at(&zeros, i << 20, false).unwrap();
    }
    ds.flush().unwrap();
    assert_eq!(ds.disk_info("t").unwrap().allocated_bytes.unwrap(), 0);

    let data = vec![0x5au8; 4 << 20];
    h.write_at(&data, 4 << 20, false).unwrap();
    assert_eq!(ds.disk_info("t").unwrap().allocated_bytes.unwrap(), 4 << 20);
    // Zeros over data give it back; a zero write inside one grain keeps
    // the grain (the rest of it is data) with zeros where written.
    h.write_at(&vec![0u8; 2 << 20], 4 << 20, false).unwrap();
    h.write_at(&[0u8; 512], (6 << 20) + 512, false).unwrap();
    ds.flush().unwrap();
    assert_eq!(ds.disk_info("t").unwrap().allocated_bytes.unwrap(), 2 << 20);
    let mut back = vec![0u8; 4 << 20];
    h.read_at(&mut back, 4 << 20).unwrap();
    let mut want = vec![0u8; 4 << 20];
    want[2 << 20..].fill(0x5a);
    want[(2 << 20) + 512..(2 << 20) + 1024].fill(0);
    assert_eq!(back, want);

    // Thick disks keep their blocks.
    ds.create_disk("z", 4 << 20, Provisioning::Zeroedthick, &mut |_, _| {})
        .unwrap();
    let z = ds.open_disk("z").unwrap();
    z.write_at(&zeros, 0, false).unwrap();
    assert_eq!(ds.disk_info("z").unwrap().allocated_bytes.unwrap(), 1 << 20);
    assert!(ds.check().unwrap().is_clean());
}

#[test]
fn punchzero_releases_zero_grains_and_refuses_thick_disks() {
    let (_b, ds) = new_store();
    let want = fill(&ds, "d");
    let before = ds.disk_info("d").unwrap().allocated_bytes.unwrap();
    let r = ds
        .punch_zero("d", &SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    assert_eq!(r.scanned_bytes, SIZE);
    assert!(r.released_bytes > 0);
    assert_eq!(r.allocated_bytes, before - r.released_bytes);
    assert_eq!(common::read_all(&ds, "d"), want);
    // After a snapshot, zeros written over its data (detection off) are
    // released from the head; the snapshot keeps its data.
    ds.snapshot_create("d", "s", "").unwrap();
    ds.set_detect_zeroes(false);
    let h = ds.open_disk("d").unwrap();
    h.write_at(&vec![0u8; 64 << 10], 192 << 10, false).unwrap();
    ds.set_detect_zeroes(true);
    let mid = ds.disk_info("d").unwrap().allocated_bytes.unwrap();
    let r = ds
        .punch_zero("d", &SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    assert_eq!(r.released_bytes, 64 << 10);
    assert_eq!(r.allocated_bytes, mid - (64 << 10));
    assert_eq!(common::read_all(&ds, "d@s"), want);
    ds.create_disk("z", 1 << 20, Provisioning::Zeroedthick, &mut |_, _| {})
        .unwrap();
    let e = ds
        .punch_zero("z", &SpaceWork::default(), &mut |_, _| {})
        .unwrap_err();
    assert!(e.message.contains("convert --type thin"), "{e}");
    assert!(ds.check().unwrap().is_clean());
}

#[test]
fn a_full_host_leaves_thick_disks_their_space_across_power_cuts() {
    use strata_storage::Backend;
    for seed in 0..4u64 {
        let b = SimBackend::new();
        Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
        b.limit_space(Some(200 << 20));
        let ds = common::open_sim(&b);
        ds.create_disk("z", 8 << 20, Provisioning::Zeroedthick, &mut |_, _| {})
            .unwrap();
        ds.create_disk("t", 8 << 20, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let held = ds.info().reserved_held_bytes;
        assert!(held >= 8 << 20, "the host holds only {held} bytes");
        // Another file takes every byte left.
        let filler = b.open("filler", true).unwrap();
        let mut at = 0u64;
        while filler.write_at(&[7u8; 4096], at).is_ok() {
            at += 4096;
        }
        // Every byte of the thick disk can still be written and flushed,
        // through checkpoints.
        let z = ds.open_disk("z").unwrap();
        for i in 0..128u64 {
            z.write_at(&[i as u8 | 1; 64 << 10], i << 16, false)
                .unwrap();
            if i % 32 == 31 {
                ds.flush().unwrap();
            }
        }
        ds.close().unwrap();
        // A thin disk cannot take what is left of the tail.
        let t = ds.open_disk("t").unwrap();
        let mut refused = false;
        for i in 0..128u64 {
            if let Err(e) = t.write_at(&[0x11; 64 << 10], i << 16, false) {
                assert_eq!(e.kind, strata_block::ErrorKind::NoSpace, "{e:?}");
                refused = true;
                break;
            }
        }
        assert!(refused, "8 MiB of thin data fit on a full host");
        assert!(ds.info().fail_stop.is_none());
        ds.flush().unwrap();
        drop(ds);
        b.crash(seed);
        let ds = common::open_sim(&b);
        let mut buf = vec![0u8; 8 << 20];
        ds.open_disk("z").unwrap().read_at(&mut buf, 0).unwrap();
        for (i, chunk) in buf.chunks(64 << 10).enumerate() {
            assert!(
                chunk.iter().all(|&x| x == i as u8 | 1),
                "seed {seed}: chunk {i}"
            );
        }
        assert!(ds.check().unwrap().is_clean(), "seed {seed}");
    }
}
