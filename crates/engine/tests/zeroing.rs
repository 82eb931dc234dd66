//! WRITE_ZEROES options against each provisioning, on the simulator:
//! `fast_only` zeroes through the map or is refused with Unsupported
//! before anything changes, and without `may_unmap` the range stays
//! allocated (block status reports no hole) while it reads as zeros.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::Arc;

use strata_block::{BlockDevice, ErrorKind as BlockKind, ZeroOptions};
use strata_engine::{Datastore, DiskHandle, Provisioning};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const SIZE: u64 = 4 * MIB;

const FAST: ZeroOptions = ZeroOptions {
    may_unmap: true,
    fast_only: true,
    fua: false,
};
const NO_HOLE: ZeroOptions = ZeroOptions {
    may_unmap: false,
    fast_only: false,
    fua: false,
};

fn new_store() -> Datastore {
    common::new_sim(256 << 20).1
}

/// A disk of `prov` named `name` with a pattern over its first MiB.
fn disk_with_data(ds: &Datastore, name: &str, prov: Provisioning) -> Arc<DiskHandle> {
    ds.create_disk(name, SIZE, prov, &mut |_, _| {}).unwrap();
    let h = ds.open_disk(name).unwrap();
    h.write_at(&pattern(MIB as usize), 0, false).unwrap();
    h
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / 512 % 251) as u8 + 1).collect()
}

fn read(h: &DiskHandle, offset: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    h.read_at(&mut b, offset).unwrap();
    b
}

/// Whether block status reports a hole anywhere in the range.
fn has_hole(h: &DiskHandle, offset: u64, len: u64) -> bool {
    h.block_status(offset, len).unwrap().iter().any(|x| x.hole)
}

#[test]
fn fast_zero_changes_only_the_map_or_is_refused_leaving_the_data() {
    let ds = new_store();
    let data = pattern(MIB as usize);
    for prov in [Provisioning::Thin, Provisioning::Zeroedthick] {
        let h = disk_with_data(&ds, &format!("{prov:?}"), prov);
        // Whole grains: given back through the map.
        h.write_zeroes(0, 256 * KIB, FAST).unwrap();
        assert_eq!(read(&h, 0, 256 * KIB), vec![0u8; 256 * 1024], "{prov:?}");
        assert!(has_hole(&h, 0, 256 * KIB), "{prov:?}");
        // A partial grain over data would take a write: refused, the
        // whole grains next to it untouched too.
        let e = h.write_zeroes(512 * KIB, 4 * KIB + 512, FAST).unwrap_err();
        assert_eq!(e.kind, BlockKind::Unsupported, "{prov:?}: {e}");
        assert_eq!(read(&h, 0, MIB)[256 * 1024..], data[256 * 1024..]);
        // A partial grain over a hole already reads as zeros.
        h.write_zeroes(2 * MIB + 512, 8 * KIB, FAST).unwrap();
    }
    // An eager-zeroed disk zeroes by writing zeros into its grains.
    let h = disk_with_data(&ds, "eager", Provisioning::Eagerzeroedthick);
    let e = h.write_zeroes(0, SIZE, FAST).unwrap_err();
    assert_eq!(e.kind, BlockKind::Unsupported, "{e}");
    assert!(e.to_string().contains("eagerzeroedthick"), "{e}");
    assert_eq!(read(&h, 0, MIB), data);
    // Without fast_only it zeroes and stays allocated.
    let slow = ZeroOptions {
        fast_only: false,
        ..FAST
    };
    h.write_zeroes(0, SIZE, slow).unwrap();
    assert_eq!(read(&h, 0, MIB), vec![0u8; MIB as usize]);
    assert!(!has_hole(&h, 0, SIZE));
    assert!(ds.check().unwrap().is_clean());
}

#[test]
fn zeroes_without_unmap_leave_the_range_allocated_on_every_provisioning() {
    let ds = new_store();
    for prov in [
        Provisioning::Thin,
        Provisioning::Zeroedthick,
        Provisioning::Eagerzeroedthick,
    ] {
        let name = format!("{prov:?}");
        let h = disk_with_data(&ds, &name, prov);
        // Over data shared with a snapshot, over data of the disk alone,
        // over a range never written, with partial grains at both ends.
        ds.snapshot_create(&name, "s", "").unwrap();
        h.write_at(&pattern(256 * KIB as usize), 512 * KIB, false)
            .unwrap();
        for (offset, len) in [
            (0, 256 * KIB),
            (512 * KIB, 256 * KIB),
            (2 * MIB, 256 * KIB),
            (3 * MIB + 512, 64 * KIB),
        ] {
            h.write_zeroes(offset, len, NO_HOLE).unwrap();
            let zeros = vec![0u8; len as usize];
            assert_eq!(read(&h, offset, len), zeros, "{prov:?} at {offset}");
            assert!(!has_hole(&h, offset, len), "{prov:?}: a hole at {offset}");
        }
        // Fast zeroing cannot keep a range allocated: refused.
        let fast = ZeroOptions {
            fast_only: true,
            ..NO_HOLE
        };
        let e = h.write_zeroes(256 * KIB, 4 * KIB, fast).unwrap_err();
        assert_eq!(e.kind, BlockKind::Unsupported, "{prov:?}: {e}");
        let data = pattern(MIB as usize);
        assert_eq!(read(&h, 256 * KIB, 4 * KIB), data[256 * 1024..260 * 1024]);
        let snap = ds.open_disk(&format!("{name}@s")).unwrap();
        assert_eq!(read(&snap, 0, MIB), pattern(MIB as usize), "{prov:?}");
    }
    // The zeros take space on a thin disk: the 1 MiB written, the 256 KiB
    // never written, and the 17 grains the last range touches.
    let thin = ds.disk_info("Thin").unwrap().allocated_bytes.unwrap();
    assert_eq!(thin, MIB + 256 * KIB + 17 * 4 * KIB, "thin allocated");
    assert!(ds.check().unwrap().is_clean());
}
