//! `dedup` (docs/FORMAT.md §17.2) against the simulator: equal grains at
//! the same virtual grain become one, exactly as many as the estimate
//! said; every disk, snapshot and clone reads the same bytes after; writes
//! after the pass redirect instead of changing a neighbour; thick disks
//! keep their grains; a power cut in the middle leaves a consistent
//! datastore that running again finishes; clients writing during the pass
//! lose nothing.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{Datastore, DedupReport, Provisioning, SpaceWork};

const SIZE: u64 = 8 << 20;
const GRAIN: u64 = 4096;
const GRAINS: u64 = SIZE / GRAIN;

/// The common bytes of grain `g` (what every copy of an image holds).
fn common(g: u64) -> Vec<u8> {
    (0..GRAIN)
        .map(|i| (i as u8).wrapping_mul(7) ^ (g as u8) ^ (g >> 8) as u8 | 1)
        .collect()
}

/// Bytes of grain `g` that no other disk holds.
fn own(g: u64, tag: u8) -> Vec<u8> {
    let mut b = common(g);
    b[0] = tag;
    b[4095] = tag ^ 0x5a;
    b
}

fn write(
    ds: &Datastore,
    disk: &str,
    grains: impl Iterator<Item = u64>,
    bytes: impl Fn(u64) -> Vec<u8>,
) {
    let h = ds.open_disk(disk).unwrap();
    for g in grains {
        h.write_at(&bytes(g), g * GRAIN, false).unwrap();
    }
    ds.flush().unwrap();
}

fn dedup(ds: &Datastore, names: &[&str]) -> strata_engine::Result<DedupReport> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    ds.dedup(&names, &SpaceWork::default(), &mut |_, _| {})
}

const TARGETS: [&str; 7] = ["a", "a@s", "b", "b@s", "bc", "c", "t"];

/// Disks holding copies of one image: "a" (all of it, a snapshot "s",
/// then its first 100 grains written again with the same bytes), "b" (all
/// but every 7th grain, which is its own; a snapshot "s" and a linked
/// clone "bc" of it whose first 50 grains are written with the image's
/// bytes), "c" (the first half), and "t", zeroed-thick, all of it (a
/// snapshot, then its first 10 grains written again with the same bytes).
/// Returns the grains re-sharing frees: per virtual grain, the distinct
/// grains holding the image's bytes there, less one.
fn copies(ds: &Datastore) -> u64 {
    for (d, p) in [
        ("a", Provisioning::Thin),
        ("b", Provisioning::Thin),
        ("c", Provisioning::Thin),
        ("t", Provisioning::Zeroedthick),
    ] {
        ds.create_disk(d, SIZE, p, &mut |_, _| {}).unwrap();
    }
    write(ds, "a", 0..GRAINS, common);
    ds.snapshot_create("a", "s", "").unwrap();
    write(ds, "a", 0..100, common);
    write(ds, "b", 0..GRAINS, |g| {
        if g % 7 == 0 {
            own(g, 0xb0)
        } else {
            common(g)
        }
    });
    ds.snapshot_create("b", "s", "").unwrap();
    ds.clone_linked("b@s", "bc").unwrap();
    write(ds, "bc", 0..50, common);
    write(ds, "c", 0..GRAINS / 2, common);
    write(ds, "t", 0..GRAINS, common);
    // A thick disk's head and snapshot holding equal grains: still never
    // shareable (the estimate counts none of them either).
    ds.snapshot_create("t", "s", "").unwrap();
    write(ds, "t", 0..10, common);
    (0..GRAINS)
        .map(|v| {
            u64::from(v < 100)
                + u64::from(v % 7 != 0)
                + u64::from(v < 50)
                + u64::from(v < GRAINS / 2)
        })
        .sum()
}

fn snapshot_all(ds: &Datastore) -> Vec<Vec<u8>> {
    TARGETS.iter().map(|t| common::read_all(ds, t)).collect()
}

fn assert_same(ds: &Datastore, want: &[Vec<u8>], what: &str) {
    for (t, w) in TARGETS.iter().zip(want) {
        assert!(
            common::read_all(ds, t) == *w,
            "{what}: the bytes of {t} changed"
        );
    }
    let report = ds.check().unwrap();
    assert!(report.is_clean(), "{what}: {:#?}", report.errors);
}

#[test]
fn equal_grains_at_one_offset_become_one_as_the_estimate_said() {
    let (_b, ds) = common::new_sim(256 << 20);
    let freed = copies(&ds);
    let want = snapshot_all(&ds);
    let est = ds
        .dedup_estimate(&[], &SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    assert_eq!(est.same_offset_bytes, freed * GRAIN, "{est:#?}");
    let r = dedup(&ds, &[]).unwrap();
    assert_eq!(r.freed_bytes, freed * GRAIN, "{r:#?}");
    assert_eq!(
        r.used_bytes_before - r.used_bytes_after,
        freed * GRAIN,
        "{r:#?}"
    );
    assert_eq!(
        (r.grains_kept, r.regions_skipped, r.regions),
        (0, 0, GRAINS / 256)
    );
    assert_eq!(ds.info().used_bytes, r.used_bytes_after);
    assert_same(&ds, &want, "after the pass");
    // Nothing is left to merge, and the estimate agrees.
    let again = dedup(&ds, &[]).unwrap();
    assert_eq!(again.freed_bytes, 0, "{again:#?}");
    let est = ds
        .dedup_estimate(&[], &SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    assert_eq!(est.same_offset_bytes, 0, "{est:#?}");
    // The zeroed-thick copy kept its own grains: removing it frees them all.
    let used = ds.info().used_bytes;
    ds.remove_disk("t").unwrap();
    while ds.reclaim(1 << 20).unwrap() {}
    ds.flush().unwrap();
    assert!(
        used - ds.info().used_bytes >= SIZE,
        "thick grains were shared"
    );
    // A write to a merged grain redirects: the others keep their bytes.
    let mut want = want;
    write(&ds, "c", [3u64].into_iter(), |g| own(g, 0xcc));
    want[5][3 * GRAIN as usize..4 * GRAIN as usize].copy_from_slice(&own(3, 0xcc));
    want.truncate(6);
    for (t, w) in TARGETS.iter().zip(&want) {
        assert!(
            common::read_all(&ds, t) == *w,
            "after a write to c: the bytes of {t}"
        );
    }
    assert!(ds.check().unwrap().is_clean());
}

#[test]
fn only_the_named_disks_are_compared() {
    let (_b, ds) = common::new_sim(256 << 20);
    copies(&ds);
    let want = snapshot_all(&ds);
    // "c" alone holds one copy per grain: nothing to merge.
    assert_eq!(dedup(&ds, &["c"]).unwrap().freed_bytes, 0);
    // "a" and "c": a's two copies of its first 100 grains, and c's half.
    let r = dedup(&ds, &["a", "c"]).unwrap();
    assert_eq!(r.freed_bytes, (100 + GRAINS / 2) * GRAIN, "{r:#?}");
    assert_eq!(r.versions, 3);
    assert_same(&ds, &want, "after a and c");
    assert!(dedup(&ds, &["a@s"]).is_err(), "a snapshot is refused");
    assert!(dedup(&ds, &["nope"]).is_err(), "a missing disk is refused");
}

#[test]
fn a_power_cut_in_the_middle_of_the_pass_leaves_a_consistent_datastore() {
    for (seed, cut_at) in [(1u64, 1u64), (2, 3), (3, 6)] {
        let (b, ds) = common::new_sim(256 << 20);
        let freed = copies(&ds);
        let want = snapshot_all(&ds);
        let used = ds.info().used_bytes;
        let mut cut = common::cut_at_call(&b, cut_at, seed);
        let r = ds.dedup(&[], &SpaceWork::default(), &mut cut);
        assert!(r.is_err(), "the cut after {cut_at} regions never came");
        drop(ds);
        let ds = common::open_sim(&b);
        let what = format!("cut after {cut_at} regions (seed {seed})");
        assert_same(&ds, &want, &what);
        // Running again finishes: used space ends where one whole pass ends.
        dedup(&ds, &[]).unwrap();
        assert_eq!(used - ds.info().used_bytes, freed * GRAIN, "{what}");
        assert_same(&ds, &want, &format!("{what}, then run again"));
    }
}

#[test]
fn clients_writing_during_the_pass_lose_nothing() {
    let (_b, ds) = common::new_sim(256 << 20);
    copies(&ds);
    let ds = Arc::new(ds);
    let writer = {
        let ds = ds.clone();
        std::thread::spawn(move || {
            // Writes over "a" and "c", some of the image's bytes (which the
            // pass may merge), some their own, flushed now and then.
            let (a, c) = (ds.open_disk("a").unwrap(), ds.open_disk("c").unwrap());
            let mut want_a = common::read_all(&ds, "a");
            let mut want_c = common::read_all(&ds, "c");
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for i in 0..3000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let g = x % GRAINS;
                let bytes = if i % 3 == 0 {
                    own(g, i as u8)
                } else {
                    common(g)
                };
                let (h, want) = if x & 1 == 0 {
                    (&a, &mut want_a)
                } else {
                    (&c, &mut want_c)
                };
                h.write_at(&bytes, g * GRAIN, false).unwrap();
                want[(g * GRAIN) as usize..((g + 1) * GRAIN) as usize].copy_from_slice(&bytes);
                if i % 500 == 0 {
                    h.flush().unwrap();
                }
            }
            (want_a, want_c)
        })
    };
    let mut freed = 0;
    for _ in 0..3 {
        freed += dedup(&ds, &[]).unwrap().freed_bytes;
    }
    let (want_a, want_c) = writer.join().unwrap();
    assert!(freed > 0);
    assert!(common::read_all(&ds, "a") == want_a, "a");
    assert!(common::read_all(&ds, "c") == want_c, "c");
    let report = ds.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
    // With the clients quiet, a last pass leaves nothing for the estimate.
    dedup(&ds, &[]).unwrap();
    let est = ds
        .dedup_estimate(&[], &SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    assert_eq!(est.same_offset_bytes, 0, "{est:#?}");
}
