//! What a snapshot holds: `exclusive_bytes` of a snapshot, and
//! `exclusive_bytes` / `snapshot_space_bytes` of a disk, equal exactly what
//! deleting them frees once reclaiming ends (docs/FORMAT.md §7), across
//! snapshot trees, overwrites, linked clones, reverts, multi-level maps and
//! orphans still being reclaimed when the figure is read.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, Provisioning};
use strata_storage::SimBackend;

const MIB: u64 = 1 << 20;

fn fresh() -> (SimBackend, Datastore) {
    let b = SimBackend::new();
    Datastore::init(std::sync::Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let ds = common::open_sim(&b);
    (b, ds)
}

/// Reclaim everything, make it durable; the datastore's used bytes then.
fn settle(ds: &Datastore) -> u64 {
    while ds.reclaim(u64::MAX).unwrap() {}
    ds.flush().unwrap();
    assert_eq!(ds.info().reclaiming, 0);
    ds.info().used_bytes
}

fn write(ds: &Datastore, disk: &str, offset: u64, len: u64, byte: u8) {
    let h = ds.open_disk(disk).unwrap();
    h.write_at(&vec![byte; len as usize], offset, false)
        .unwrap();
}

fn exclusive(ds: &Datastore, disk: &str, snap: &str) -> u64 {
    ds.snapshot_list(disk)
        .unwrap()
        .into_iter()
        .find(|s| s.name == snap)
        .unwrap_or_else(|| panic!("{disk}@{snap} listed"))
        .exclusive_bytes
        .expect("the engine knows a snapshot's exclusive bytes")
}

/// A history with shared and exclusive data at every level of a 3-level
/// map (a 2 GiB disk: data 1 GiB apart lives under different level-1
/// nodes): a chain of snapshots with overwrites, a branch after a revert,
/// a snapshot equal to the head, and a linked clone that writes.
fn build(ds: &Datastore) {
    ds.create_disk("a", 2 << 30, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    write(ds, "a", 0, 6 * MIB, 1);
    write(ds, "a", 1 << 30, 3 * MIB, 2);
    ds.snapshot_create("a", "s1", "").unwrap();
    write(ds, "a", 2 * MIB, 2 * MIB, 3); // s1 keeps its old 2 MiB
    write(ds, "a", (1 << 30) + 64 * 4096, 4096, 4); // one grain in the far leaf
    ds.snapshot_create("a", "s2", "").unwrap();
    write(ds, "a", 8 * MIB, 4 * MIB, 5); // new data, shared by s3 and the head
    ds.snapshot_create("a", "s3", "").unwrap();
    write(ds, "a", 9 * MIB, MIB, 6); // s3 keeps 1 MiB only it holds
    ds.clone_linked("a@s2", "c").unwrap();
    write(ds, "c", 0, MIB, 7); // the clone's own data
    ds.snapshot_revert("a", "s2").unwrap(); // the head's changes since s2 go
    write(ds, "a", 20 * MIB, 512 * 1024, 8); // a branch below s2
    ds.snapshot_create("a", "s4", "").unwrap(); // s4 is the head
                                                // Disk b: two snapshots share data the head overwrote, so it is
                                                // exclusive to neither but freed by deleting both.
    ds.create_disk("b", 64 * MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    write(ds, "b", 0, 3 * MIB, 9);
    ds.snapshot_create("b", "t1", "").unwrap();
    ds.snapshot_create("b", "t2", "").unwrap();
    write(ds, "b", 0, 3 * MIB, 10);
    settle(ds);
}

#[test]
fn each_snapshot_frees_exactly_its_exclusive_bytes() {
    let (_b, ds) = fresh();
    build(&ds);
    // Figures that tell apart a right answer from "always 0" or "mapped".
    assert_eq!(exclusive(&ds, "a", "s4"), 0, "s4 shares the head's map");
    assert!(
        exclusive(&ds, "a", "s3") >= 4 * MIB,
        "s3 alone holds 8..12 MiB"
    );
    let s1 = exclusive(&ds, "a", "s1");
    assert!(s1 >= 2 * MIB, "s1 holds its overwritten 2 MiB: {s1}");
    assert!(
        s1 < ds.snapshot_list("a").unwrap()[0].mapped_bytes.unwrap(),
        "s1 shares most of what it maps"
    );
    // Delete them one at a time; each figure is read first while the
    // previous deletion is still an orphan, then again after its reclaim.
    let mut prev: Option<(&str, u64, u64)> = None; // (snapshot, used before, figure)
    for snap in ["s2", "s3", "s1", "s4"] {
        let while_orphans = exclusive(&ds, "a", snap);
        let used = settle(&ds);
        if let Some((p, used_before, figure)) = prev {
            assert_eq!(
                used_before - used,
                figure,
                "deleting a@{p}: freed vs figure"
            );
        }
        let figure = exclusive(&ds, "a", snap);
        assert_eq!(
            while_orphans, figure,
            "a@{snap}: the figure must not depend on whether orphans are reclaimed yet"
        );
        ds.snapshot_delete("a", snap).unwrap();
        prev = Some((snap, used, figure));
    }
    let (p, used_before, figure) = prev.unwrap();
    assert_eq!(
        used_before - settle(&ds),
        figure,
        "deleting a@{p}: freed vs figure"
    );
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
}

#[test]
fn snapshot_space_is_what_deleting_all_snapshots_frees() {
    for disk in ["a", "b"] {
        let (_b, ds) = fresh();
        build(&ds);
        let info = ds.disk_info_with_space(disk).unwrap();
        let space = info
            .snapshot_space_bytes
            .expect("info carries snapshot_space_bytes");
        let sum: u64 = ds
            .snapshot_list(disk)
            .unwrap()
            .iter()
            .map(|s| s.exclusive_bytes.unwrap())
            .sum();
        assert!(space >= sum, "{disk}: {space} < sum of parts {sum}");
        if disk == "b" {
            assert_eq!(sum, 0, "t1 and t2 share everything they hold");
            assert!(space >= 3 * MIB, "b's snapshots hold 3 MiB: {space}");
        }
        let used = settle(&ds);
        for s in ds.snapshot_list(disk).unwrap() {
            ds.snapshot_delete(disk, &s.name).unwrap();
        }
        let freed = used - settle(&ds);
        assert_eq!(freed, space, "{disk}: deleting all snapshots");
        let after = ds.disk_info_with_space(disk).unwrap();
        assert_eq!(after.snapshot_space_bytes, Some(0));
    }
}

#[test]
fn disk_exclusive_is_what_rm_frees_less_what_clones_share() {
    // Each order: remove one disk with the other disks still there.
    for disk in ["a", "c", "b"] {
        let (_b, ds) = fresh();
        build(&ds);
        let figure = ds
            .disk_info_with_space(disk)
            .unwrap()
            .exclusive_bytes
            .unwrap();
        assert!(figure > 0, "{disk} holds data of its own");
        let used = settle(&ds);
        ds.remove_disk(disk).unwrap();
        let freed = used - settle(&ds);
        assert_eq!(freed, figure, "rm {disk}");
        let r = ds.check().unwrap();
        assert!(r.is_clean(), "{:#?}", r.errors);
    }
    // The clone shares a@s2: with `a` gone, what it shares becomes its own.
    let (_b, ds) = fresh();
    build(&ds);
    let c_before = ds
        .disk_info_with_space("c")
        .unwrap()
        .exclusive_bytes
        .unwrap();
    ds.remove_disk("a").unwrap();
    // Read while a's versions are still orphans: already counted as c's.
    let c_pending = ds
        .disk_info_with_space("c")
        .unwrap()
        .exclusive_bytes
        .unwrap();
    let used = settle(&ds);
    let c_after = ds
        .disk_info_with_space("c")
        .unwrap()
        .exclusive_bytes
        .unwrap();
    assert_eq!(c_pending, c_after);
    assert!(c_after >= c_before + 8 * MIB, "{c_before} -> {c_after}");
    ds.remove_disk("c").unwrap();
    assert_eq!(used - settle(&ds), c_after);
    // Everything is gone but disk b.
    assert_eq!(
        settle(&ds),
        ds.disk_info_with_space("b")
            .unwrap()
            .exclusive_bytes
            .unwrap()
    );
}

/// The cost follows what is exclusive: a snapshot that shares all but one
/// path of a wide map reads that path's nodes, not the shared leaves. With
/// a cold cache and map reads failing after a few, its figure still comes
/// out; the disk's (which must read every leaf) does not.
#[test]
fn a_shared_subtree_is_never_read() {
    let (b, ds) = fresh();
    ds.create_disk("w", 2 << 30, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    // One grain in each of 64 leaves (2 MiB apart), in both halves of the
    // 3-level map.
    for i in 0..64u64 {
        let at = (i % 32) * 2 * MIB + (i / 32) * (1 << 30);
        write(&ds, "w", at, 4096, i as u8 + 1);
    }
    ds.snapshot_create("w", "s", "").unwrap();
    write(&ds, "w", 0, 4096, 0xEE); // s alone keeps one grain, its leaf and path
    settle(&ds);
    let want = exclusive(&ds, "w", "s");
    // Root, one level-1 node, one leaf and one data grain.
    assert_eq!(want, 4 * 4096);
    ds.close().unwrap();
    drop(ds);
    let ds = common::open_sim(&b);
    b.fail_reads_after(Some(strata_format::FILE_POOL), 8);
    assert_eq!(exclusive(&ds, "w", "s"), want);
    let e = ds.disk_info_with_space("w").unwrap_err();
    assert!(
        e.to_string().contains("pool.data") || e.to_string().contains("I/O"),
        "{e}"
    );
    b.heal_reads();
    assert!(
        ds.disk_info_with_space("w")
            .unwrap()
            .exclusive_bytes
            .unwrap()
            > 64 * 4096
    );
}
