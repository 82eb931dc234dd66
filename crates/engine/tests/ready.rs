//! Readied space (docs/FORMAT.md §7.1): host space allocated ahead of the
//! pool's end for first writes, on a real file system, following the
//! pool as it grows and going back to the host with free-space return.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use strata_block::BlockDevice;
use strata_engine::{Datastore, Provisioning, SpaceWork};

mod common;

const MIB: u64 = 1 << 20;

/// (length, bytes allocated on the host) of the pool file.
fn pool_file(dir: &Path) -> (u64, u64) {
    let m = std::fs::metadata(dir.join(strata_format::FILE_POOL)).unwrap();
    (m.len(), m.blocks() * 512)
}

fn write_mib(ds: &Datastore, disk: &str, from_mib: u64, mib: u64, tag: u8) {
    let h = ds.open_disk(disk).unwrap();
    for i in from_mib..from_mib + mib {
        h.write_at(&vec![tag; MIB as usize], i * MIB, false)
            .unwrap();
    }
}

#[test]
fn readied_space_leads_the_pool_and_goes_back_with_free_space_return() {
    let dir = tempfile::tempdir().unwrap();
    let ds = common::init_dir(dir.path());
    ds.create_disk("t", 256 * MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    // Off: nothing is readied, however the pool grows.
    write_mib(&ds, "t", 0, 4, 1);
    assert!(!ds.ready_space());
    assert_eq!(ds.info().readied_bytes, 0);

    // On, at most 16 MiB: readied past the pool end, held on the host,
    // reported apart from the reservations (there are none).
    ds.set_ready_bytes(16 * MIB);
    assert!(ds.ready_space(), "the pool is at its end: a step is due");
    assert!(!ds.ready_space(), "nothing more is due right after");
    let info = ds.info();
    assert_eq!(info.readied_bytes, 16 * MIB, "{info:?}");
    assert_eq!(info.reserved_held_bytes, 0, "{info:?}");
    let (len, allocated) = pool_file(dir.path());
    let pool_end = ds.pool_layout().unwrap().pool_bytes;
    assert_eq!(len, pool_end + 16 * MIB);
    assert!(
        allocated >= 16 * MIB + 4 * MIB,
        "the readied space is allocated on the host: {allocated} bytes"
    );

    // Writes take the readied blocks; the next step tops it up again
    // (doubling: the last amount was used up within a second, up to the
    // 16 MiB asked).
    write_mib(&ds, "t", 4, 12, 2);
    assert!(ds.info().readied_bytes < 8 * MIB);
    assert!(ds.ready_space());
    assert_eq!(ds.info().readied_bytes, 16 * MIB);
    let (len, _) = pool_file(dir.path());
    assert_eq!(len, ds.pool_layout().unwrap().pool_bytes + 16 * MIB);

    // Everything written reads back; the checker counts nothing wrong.
    let h = ds.open_disk("t").unwrap();
    let mut buf = vec![0u8; MIB as usize];
    for i in 0..16 {
        h.read_at(&mut buf, i * MIB).unwrap();
        assert!(
            buf.iter().all(|&b| b == if i < 4 { 1 } else { 2 }),
            "MiB {i}"
        );
    }
    drop(h);
    assert!(ds.check().unwrap().is_clean());

    // Free-space return gives the readied space back with the rest.
    ds.remove_disk("t").unwrap();
    ds.flush().unwrap();
    ds.flush().unwrap();
    ds.consolidate_free_space(&SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    assert_eq!(ds.info().readied_bytes, 0);
    let (len, allocated) = pool_file(dir.path());
    assert_eq!(len, ds.pool_layout().unwrap().pool_bytes);
    assert!(allocated < 2 * MIB, "{allocated} bytes still held");

    // Reopened, the datastore takes the file as it finds it, and checks.
    ds.close().unwrap();
    drop(ds);
    let ds = common::open_dir(dir.path()).unwrap();
    assert!(ds.check().unwrap().is_clean());
}

#[test]
fn readied_space_is_apart_from_what_thick_disks_hold() {
    let dir = tempfile::tempdir().unwrap();
    let ds = common::init_dir(dir.path());
    ds.create_disk("z", 8 * MIB, Provisioning::Zeroedthick, &mut |_, _| {})
        .unwrap();
    ds.create_disk("t", 64 * MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let held = ds.info().reserved_held_bytes;
    assert!(held >= 8 * MIB, "{held}");
    ds.set_ready_bytes(32 * MIB);
    write_mib(&ds, "t", 0, 2, 3);
    assert!(ds.ready_space());
    let info = ds.info();
    // Rounded up to a whole block past the (unaligned) target.
    assert!(
        (32 * MIB..=33 * MIB).contains(&info.readied_bytes),
        "{info:?}"
    );
    assert!(info.reserved_held_bytes >= 8 * MIB, "{info:?}");
    // The thick disk still writes its whole reservation.
    write_mib(&ds, "z", 0, 8, 4);
    ds.flush().unwrap();
    assert!(ds.check().unwrap().is_clean());
}
