//! Writes that install many grains are logged as runs (docs/FORMAT.md §5,
//! MAP_RUN and REF_RUN): replay after a power cut rebuilds them exactly,
//! a cut in the middle of their flush loses nothing that was flushed
//! before, and a later partial overwrite after a snapshot redirects only
//! the grains it touches.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, Provisioning};
use strata_storage::SimBackend;

mod common;

const MIB: usize = 1 << 20;

fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / 4096) as u8 ^ tag).collect()
}

fn read(ds: &Datastore, name: &str, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    ds.open_disk(name)
        .unwrap()
        .read_at(&mut buf, offset)
        .unwrap();
    buf
}

fn new_store() -> (SimBackend, Datastore) {
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let ds = common::open_sim(&b);
    ds.create_disk("d", 4 * MIB as u64, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    (b, ds)
}

#[test]
fn runs_replay_after_a_power_cut_and_a_cut_mid_flush_keeps_what_was_flushed() {
    for seed in 0..24u64 {
        let (b, ds) = new_store();
        // Flushed: 1 MiB in one write (256 grains, one run), 2 MiB more in
        // 256 KiB writes; then an unflushed 1 MiB, cut inside its flush.
        ds.open_disk("d")
            .unwrap()
            .write_at(&pattern(1, MIB), 0, false)
            .unwrap();
        for i in 0..8u64 {
            ds.open_disk("d")
                .unwrap()
                .write_at(
                    &pattern(2 + i as u8, MIB / 4),
                    MIB as u64 + i * (MIB as u64 / 4),
                    false,
                )
                .unwrap();
        }
        ds.flush().unwrap();
        ds.open_disk("d")
            .unwrap()
            .write_at(&pattern(9, MIB), 3 * MIB as u64, false)
            .unwrap();
        b.fail_writes_after(seed % 6);
        let _ = ds.flush();
        b.crash(seed);
        drop(ds);
        let ds = common::open_sim(&b);
        assert_eq!(read(&ds, "d", 0, MIB), pattern(1, MIB), "seed {seed}");
        for i in 0..8u64 {
            assert_eq!(
                read(&ds, "d", MIB as u64 + i * (MIB as u64 / 4), MIB / 4),
                pattern(2 + i as u8, MIB / 4),
                "seed {seed}: piece {i}"
            );
        }
        // The cut flush's megabyte reads either as written or as the hole
        // it was, grain by grain never anything else.
        let last = read(&ds, "d", 3 * MIB as u64, MIB);
        let want = pattern(9, MIB);
        for (g, (got, w)) in last.chunks(4096).zip(want.chunks(4096)).enumerate() {
            assert!(
                got == w || got.iter().all(|&x| x == 0),
                "seed {seed}: grain {g} of the cut write is neither"
            );
        }
        let r = ds.check().unwrap();
        assert!(r.is_clean(), "seed {seed}: {:?}", r.errors);
        let info = ds.disk_info("d").unwrap();
        let mapped = info.allocated_bytes.unwrap();
        assert!(
            (3 * MIB as u64..=4 * MIB as u64).contains(&mapped),
            "seed {seed}: {mapped}"
        );
    }
}

#[test]
fn a_partial_overwrite_after_a_snapshot_redirects_only_its_grains() {
    let (b, ds) = new_store();
    // 2 MiB = one leaf's 512 grains, installed as runs.
    let first = pattern(3, 2 * MIB);
    ds.open_disk("d")
        .unwrap()
        .write_at(&first, 0, false)
        .unwrap();
    ds.snapshot_create("d", "s", "").unwrap();
    // 64 KiB in the middle of the run.
    let patch = pattern(7, 64 << 10);
    ds.open_disk("d")
        .unwrap()
        .write_at(&patch, 400 << 10, false)
        .unwrap();
    ds.flush().unwrap();
    b.crash(1);
    drop(ds);
    let ds = common::open_sim(&b);
    let mut want = first.clone();
    want[400 << 10..464 << 10].copy_from_slice(&patch);
    assert_eq!(read(&ds, "d", 0, 2 * MIB), want);
    assert_eq!(read(&ds, "d@s", 0, 2 * MIB), first);
    // The snapshot alone holds the 16 overwritten grains, and the root and
    // leaf the head copied to change them: nothing else.
    let s = &ds.snapshot_list("d").unwrap()[0];
    assert_eq!(s.exclusive_bytes, Some((16 + 2) * 4096), "{s:?}");
    let info = ds.disk_info("d").unwrap();
    assert_eq!(info.allocated_bytes, Some(2 * MIB as u64));
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:?}", r.errors);
    assert_eq!((r.leaked_grains, r.overshared_grains), (0, 0));
}
