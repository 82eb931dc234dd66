//! `clone --full` of a disk that is being written copies the disk as it was
//! at one instant: a writer keeps stamping a rising generation into the
//! first and then the last grain, so at every instant the first grain's
//! generation is the last grain's or one more. A copy that read the first
//! grain early and the last one later would show the last one newer.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{FullClone, Provisioning};

mod common;

const DISK_BYTES: u64 = 32 << 20;
const LAST: u64 = DISK_BYTES - 4096;

fn stamp(gen: u64) -> Vec<u8> {
    gen.to_le_bytes().repeat(512)
}

fn generation(h: &dyn BlockDevice, at: u64) -> u64 {
    let mut b = vec![0u8; 4096];
    h.read_at(&mut b, at).unwrap();
    u64::from_le_bytes(b[..8].try_into().unwrap())
}

#[test]
fn a_full_clone_of_a_disk_under_writes_is_one_instant_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = common::init_dir(dir.path());
    ds.create_disk("d", DISK_BYTES, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let d = ds.open_disk("d").unwrap();
    // Data between the two stamped grains, so a copy takes a while.
    d.write_at(&vec![7u8; (DISK_BYTES - 8192) as usize], 4096, false)
        .unwrap();
    d.write_at(&stamp(0), 0, false).unwrap();
    d.write_at(&stamp(0), LAST, false).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut gen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                gen += 1;
                d.write_at(&stamp(gen), 0, false).unwrap();
                d.write_at(&stamp(gen), LAST, false).unwrap();
            }
            gen
        })
    };
    for i in 0..4 {
        let name = format!("c{i}");
        ds.clone_full(
            &FullClone {
                source: "d",
                name: &name,
                provisioning: Provisioning::Thin,
                work: Default::default(),
            },
            &mut |_, _| {},
        )
        .unwrap();
        let c = ds.open_disk(&name).unwrap();
        let (first, last) = (generation(&*c, 0), generation(&*c, LAST));
        assert!(
            first == last || first == last + 1,
            "clone {i}: first grain at generation {first}, last at {last}: not one instant"
        );
        let mut mid = vec![0u8; 1 << 20];
        c.read_at(&mut mid, 1 << 20).unwrap();
        assert!(mid.iter().all(|&b| b == 7));
    }
    stop.store(true, Ordering::Relaxed);
    let gens = writer.join().unwrap();
    assert!(gens > 4, "the writer barely ran ({gens} generations)");
    // The implicit snapshots are gone and were never listed.
    assert!(ds.snapshot_list("d").unwrap().is_empty());
    assert_eq!(ds.info().snapshots, 0);
    assert!(ds.export_names().iter().all(|(n, _)| !n.contains('@')));
    assert!(ds.check().unwrap().is_clean());
}
