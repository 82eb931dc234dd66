//! Deep rekey (docs/FORMAT.md §16.4) against the simulator: every version
//! of a lineage (the disk, its snapshot, a linked clone grown past it)
//! reads the same bytes under the new data key; the old secret opens
//! nothing; a power cut at any region leaves a datastore that opens with
//! the new secret, reads every byte right with the cursor wherever the last
//! commit left it, passes `check`, and finishes when the rekey is resumed.
#![allow(clippy::too_many_lines)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_crypt::NewSlot;
use strata_engine::{Datastore, NewDisk, NewKeys, Provisioning, SpaceWork};
use strata_storage::SimBackend;

const SIZE: u64 = 8 << 20;
const GRAIN: u64 = 4096;
const OLD: &[u8; 32] = b"old-secret-0123456789abcdef-0123";
const NEW: &[u8; 32] = b"new-secret-0123456789abcdef-0123";

fn slot(secret: &[u8]) -> NewSlot<'_> {
    NewSlot::key_file(secret, 1_700_000_000)
}

fn new_store() -> (SimBackend, Datastore) {
    common::new_sim(256 << 20)
}

/// Grains `[from, to)` of `target` written with bytes naming the grain and `tag`.
fn write(ds: &Datastore, target: &str, from: u64, to: u64, tag: u8) {
    let h = ds.open_disk(target).unwrap();
    for g in from..to {
        let data: Vec<u8> = (0..GRAIN)
            .map(|i| (i as u8) ^ (g as u8) ^ tag.wrapping_mul(31) | 1)
            .collect();
        h.write_at(&data, g * GRAIN, false).unwrap();
    }
    // A sector inside a grain too: sub-grain writes keep their sectors.
    h.write_at(&[tag; 512], from * GRAIN + 1024, false).unwrap();
    ds.flush().unwrap();
}

/// An encrypted disk `d` with a snapshot `d@s` and a linked clone `c`
/// of it grown past the disk, each written in part; what each reads.
fn lineage(ds: &Datastore) -> Vec<(&'static str, Vec<u8>)> {
    let s = slot(OLD);
    ds.create_disk_with(
        &NewDisk {
            name: "d",
            size_bytes: SIZE,
            provisioning: Provisioning::Thin,
            keys: NewKeys::Fresh(&s),
        },
        &mut |_, _| {},
    )
    .unwrap();
    let grains = SIZE / GRAIN;
    write(ds, "d", 0, grains * 3 / 4, 1);
    ds.snapshot_create("d", "s", "").unwrap();
    write(ds, "d", grains / 8, grains / 4, 2);
    ds.clone_linked("d@s", "c").unwrap();
    ds.extend_disk("c", SIZE * 2).unwrap();
    write(ds, "c", grains - 4, grains + 300, 3);
    ["d", "d@s", "c"]
        .into_iter()
        .map(|t| (t, common::read_all(ds, t)))
        .collect()
}

fn same(ds: &Datastore, want: &[(&str, Vec<u8>)], what: &str) {
    for (t, bytes) in want {
        assert!(common::read_all(ds, t) == *bytes, "{what}: bytes of {t}");
    }
}

fn data_key(ds: &Datastore, disk: &str) -> (u32, bool) {
    let e = ds.disk_info(disk).unwrap().encryption.unwrap();
    (e.data_key, e.deep_rekey.is_some())
}

#[test]
fn a_deep_rekey_moves_every_version_to_a_new_key() {
    let (b, ds) = new_store();
    let want = lineage(&ds);
    let pool_before = b.durable_len("pool.data");
    let n = SIZE * 2 / GRAIN;
    let r = ds
        .rekey_deep("d", Some(&slot(NEW)), &SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    assert!(!r.resumed);
    assert_eq!(r.data_key, 1);
    assert!(
        r.reencrypted_bytes > 0 && r.reencrypted_bytes <= n * GRAIN,
        "{r:?}"
    );
    assert_eq!(data_key(&ds, "d"), (1, false));
    assert_eq!(data_key(&ds, "c"), (1, false));
    same(&ds, &want, "after the rekey");
    assert!(ds.check().unwrap().is_clean());
    // A second run needs a new secret: nothing is under way.
    assert!(ds
        .rekey_deep("d", None, &SpaceWork::default(), &mut |_, _| {})
        .is_err());
    drop(ds);
    let ds = common::open_sim(&b);
    assert!(ds.unlock("d", OLD).is_err(), "the old secret still opens");
    ds.unlock("d", NEW).unwrap();
    same(&ds, &want, "reopened with the new secret");
    assert!(ds.check().unwrap().is_clean());
    let _ = pool_before;
}

#[test]
fn a_power_cut_in_a_deep_rekey_leaves_either_key_state_and_resumes() {
    let mut part_way = 0;
    for (seed, cut_at) in [(1u64, 1u64), (2, 3), (3, 7), (4, 12)] {
        let (b, ds) = new_store();
        let want = lineage(&ds);
        let mut regions = 0;
        let b2 = b.clone();
        let ds = Arc::new(ds);
        let ds2 = ds.clone();
        let r = ds.rekey_deep("d", Some(&slot(NEW)), &SpaceWork::default(), &mut |_, _| {
            regions += 1;
            // Commits between regions, so the cut finds the cursor part-way.
            if regions % 2 == 0 && regions < cut_at {
                ds2.flush().unwrap();
            }
            if regions == cut_at {
                b2.crash(seed);
            }
        });
        assert!(r.is_err(), "the cut after {cut_at} regions never came");
        drop(ds2);
        drop(ds);
        let ds = common::open_sim(&b);
        let what = format!("cut after {cut_at} regions (seed {seed})");
        // The first record is durable before the pass: only the new secret opens.
        assert!(ds.unlock("d", OLD).is_err(), "{what}: the old secret opens");
        ds.unlock("d", NEW).unwrap();
        let (_, under_way) = data_key(&ds, "d");
        assert!(under_way, "{what}: no rekey under way after the cut");
        let p = ds
            .disk_info("d")
            .unwrap()
            .encryption
            .unwrap()
            .deep_rekey
            .unwrap();
        if p.done_bytes > 0 && p.done_bytes < p.total_bytes {
            part_way += 1;
        }
        same(&ds, &want, &what);
        let report = ds.check().unwrap();
        assert!(report.is_clean(), "{what}: {:#?}", report.errors);
        // A new secret is refused while one is under way; none resumes it.
        assert!(ds
            .rekey_deep("d", Some(&slot(OLD)), &SpaceWork::default(), &mut |_, _| {})
            .is_err());
        let r = ds
            .rekey_deep("d", None, &SpaceWork::default(), &mut |_, _| {})
            .unwrap();
        assert!(r.resumed, "{what}");
        assert_eq!(data_key(&ds, "d"), (1, false), "{what}");
        same(&ds, &want, &format!("{what}, resumed"));
        assert!(ds.check().unwrap().is_clean(), "{what}");
    }
    // Reads across the cursor were checked: most cuts found it part-way.
    assert!(
        part_way >= 2,
        "only {part_way} cuts found the cursor part-way"
    );
}

/// Disks made and written while the pass runs (a snapshot, a linked clone,
/// writes on both sides of the cursor) are covered: the pass walks again
/// with the new disk's stripes held, and every version reads what was
/// written.
#[test]
fn disks_made_and_written_during_a_deep_rekey_end_under_the_new_key() {
    let (b, ds) = new_store();
    lineage(&ds);
    let grains = SIZE / GRAIN;
    let ds = Arc::new(ds);
    let ds2 = ds.clone();
    let mut regions = 0;
    let r = ds
        .rekey_deep("d", Some(&slot(NEW)), &SpaceWork::default(), &mut |_, _| {
            regions += 1;
            if regions == 3 {
                ds2.snapshot_create("d", "mid", "").unwrap();
                ds2.clone_linked("d@mid", "c2").unwrap();
                // Behind the cursor, at it, and ahead of it.
                write(&ds2, "c2", 0, 8, 7);
                write(&ds2, "c2", grains / 2, grains / 2 + 300, 8);
                write(&ds2, "d", 2 * 256, 2 * 256 + 300, 9);
            }
        })
        .unwrap();
    assert!(r.reencrypted_bytes > 0);
    let want: Vec<(&str, Vec<u8>)> = ["d", "d@s", "d@mid", "c", "c2"]
        .into_iter()
        .map(|t| (t, common::read_all(&ds, t)))
        .collect();
    assert_eq!(data_key(&ds, "c2"), (1, false));
    assert!(ds.check().unwrap().is_clean());
    drop(ds2);
    drop(ds);
    let ds = common::open_sim(&b);
    ds.unlock("d", NEW).unwrap();
    same(&ds, &want, "reopened");
    // What was written reads back (not only the same as before the reopen).
    let c2 = common::read_all(&ds, "c2");
    let g = (grains / 2 * GRAIN) as usize;
    assert_eq!(
        c2[g + 4],
        (4u8 ^ (grains / 2) as u8 ^ 8u8.wrapping_mul(31)) | 1
    );
}
