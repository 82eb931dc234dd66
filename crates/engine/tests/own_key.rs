//! Own-key clones (docs/FORMAT.md §16.4): a linked clone with a key of its
//! own shares what it inherits (no copy-up), reads it under the source's
//! key and writes under its own, whatever the writes (whole grains, a
//! sector inside an inherited grain, holes, in place, zeros); every
//! version keeps its bytes through snapshots, defrag, free-space return,
//! a full clone, `check` and a power cut; and a deep rekey of the source
//! copies what the clone shares instead of moving it.
#![allow(clippy::too_many_lines)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::collections::HashMap;

use strata_block::{BlockDevice, ZeroOptions};
use strata_crypt::NewSlot;
use strata_engine::{Datastore, FullClone, NewDisk, NewKeys, Provisioning, SpaceWork};
use strata_storage::SimBackend;

const SIZE: u64 = 8 << 20;
const GRAIN: u64 = 4096;
const SOURCE: &[u8; 32] = b"source-secret-0123456789abcdef-0";
const CLONE: &[u8; 32] = b"clone-secret-0123456789abcdef-01";
const GRAND: &[u8; 32] = b"grand-secret-0123456789abcdef-01";
const THIRD: &[u8; 32] = b"third-secret-0123456789abcdef-01";

fn slot(secret: &[u8]) -> NewSlot<'_> {
    NewSlot::key_file(secret, 1_700_000_000)
}

/// `n` grains of bytes naming the grain and `tag`.
fn pattern(first: u64, n: u64, tag: u8) -> Vec<u8> {
    (0..n * GRAIN)
        .map(|i| ((i / GRAIN + first) as u8) ^ (i as u8) ^ tag.wrapping_mul(37) | 1)
        .collect()
}

/// What each disk and snapshot must read, kept apart from the engine.
type Model = HashMap<String, Vec<u8>>;

fn write(ds: &Datastore, m: &mut Model, target: &str, at: u64, data: &[u8]) {
    let h = ds.open_disk(target).unwrap();
    h.write_at(data, at, false).unwrap();
    let at = at as usize;
    m.get_mut(target).unwrap()[at..at + data.len()].copy_from_slice(data);
}

/// `src` (a disk or snapshot) as `new` reads it: a snapshot, a clone.
fn copy(m: &mut Model, src: &str, new: &str) {
    let bytes = m[src].clone();
    m.insert(new.into(), bytes);
}

fn read_all(ds: &Datastore, target: &str) -> Vec<u8> {
    let h = ds.open_disk(target).unwrap();
    let mut buf = vec![0u8; h.size_bytes() as usize];
    h.read_at(&mut buf, 0).unwrap();
    buf
}

fn same(ds: &Datastore, m: &Model, what: &str) {
    for (t, bytes) in m {
        assert!(read_all(ds, t) == *bytes, "{what}: the bytes of {t}");
    }
}

fn clean(ds: &Datastore, what: &str) {
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{what}: {:#?}", r.errors);
}

/// An encrypted disk `d` (half written) with a snapshot `d@s`, and `c`,
/// an own-key clone of it.
fn source_and_clone(ds: &Datastore) -> Model {
    let mut m = Model::new();
    m.insert("d".into(), vec![0; SIZE as usize]);
    let s = slot(SOURCE);
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
    write(ds, &mut m, "d", 0, &pattern(0, grains / 2, 1));
    ds.snapshot_create("d", "s", "").unwrap();
    copy(&mut m, "d", "d@s");
    ds.flush().unwrap();
    let used = ds.check().unwrap().data_grains;
    let info = ds.clone_linked_own_key("d@s", "c", &slot(CLONE)).unwrap();
    let e = info.encryption.expect("the clone is encrypted");
    assert!(!e.locked, "the clone is unlocked when it is made");
    assert_eq!(
        ds.check().unwrap().data_grains,
        used,
        "an own-key clone copies nothing"
    );
    copy(&mut m, "d@s", "c");
    m
}

/// Writes of every kind to the own-key clone `c`: whole grains over
/// inherited ones, a sector inside an inherited grain (its other sectors
/// change key), a sub-grain write over a hole, rewrites in place, and
/// zeros over inherited grains.
fn write_every_kind(ds: &Datastore, m: &mut Model, target: &str, tag: u8) {
    let grains = SIZE / GRAIN;
    write(ds, m, target, 8 * GRAIN, &pattern(8, 16, tag));
    write(ds, m, target, 40 * GRAIN + 1024, &[tag; 512]);
    write(
        ds,
        m,
        target,
        (grains - 3) * GRAIN + 512,
        &[tag ^ 0x55; 1536],
    );
    write(ds, m, target, 10 * GRAIN, &pattern(10, 2, tag ^ 1));
    write(ds, m, target, 12 * GRAIN + 2048, &[tag ^ 2; 512]);
    let h = ds.open_disk(target).unwrap();
    let z = ZeroOptions {
        may_unmap: false,
        fast_only: false,
        fua: false,
    };
    let (at, n) = (100 * GRAIN + 512, 3 * GRAIN);
    h.write_zeroes(at, n, z).unwrap();
    m.get_mut(target).unwrap()[at as usize..(at + n) as usize].fill(0);
    ds.flush().unwrap();
}

#[test]
fn an_own_key_clone_reads_what_it_inherits_and_writes_under_its_own_key() {
    let (b, ds) = common::new_sim(256 << 20);
    let mut m = source_and_clone(&ds);
    same(&ds, &m, "the clone as made");
    write_every_kind(&ds, &mut m, "c", 7);
    // The source goes on as before, under its key.
    write(&ds, &mut m, "d", 9 * GRAIN, &pattern(9, 4, 3));
    write(&ds, &mut m, "d", 40 * GRAIN + 3072, &[3; 512]);
    ds.snapshot_create("c", "t", "").unwrap();
    copy(&mut m, "c", "c@t");
    write_every_kind(&ds, &mut m, "c", 9);
    // A linked clone of the own-key clone shares its keyring, and an
    // own-key clone of it gets a key of its own again (key index 2).
    ds.clone_linked("c@t", "c2").unwrap();
    copy(&mut m, "c@t", "c2");
    write(&ds, &mut m, "c2", 30 * GRAIN, &pattern(30, 3, 11));
    ds.clone_linked_own_key("c@t", "g", &slot(GRAND)).unwrap();
    copy(&mut m, "c@t", "g");
    write_every_kind(&ds, &mut m, "g", 13);
    same(&ds, &m, "after the writes");
    clean(&ds, "after the writes");

    // Moves carry each grain's key index: defrag of every disk and a
    // free-space return, with no key needed.
    for d in ["d", "c", "c2", "g"] {
        ds.defrag_disk(d, false, &SpaceWork::default(), &mut |_, _| {})
            .unwrap();
    }
    ds.remove_disk("c2").unwrap();
    m.remove("c2");
    ds.consolidate_free_space(&SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    same(&ds, &m, "after defrag and free-space return");
    clean(&ds, "after defrag and free-space return");

    // Each keyring opens with its own secret only.
    drop(ds);
    let ds = common::open_sim(&b);
    assert!(
        ds.unlock("c", SOURCE).is_err(),
        "the source's secret opens the clone"
    );
    assert!(
        ds.unlock("g", CLONE).is_err(),
        "the clone's secret opens its clone"
    );
    ds.unlock("d", SOURCE).unwrap();
    assert!(
        ds.is_locked("c").unwrap() && ds.open_disk("c").is_err(),
        "the source's keys open the clone"
    );
    ds.unlock("c", CLONE).unwrap();
    ds.unlock("g", GRAND).unwrap();
    same(&ds, &m, "reopened");
    clean(&ds, "reopened");

    // A full clone copies the own-key clone's data under a copy of its keys.
    let copy = FullClone {
        source: "g",
        name: "g-copy",
        provisioning: Provisioning::Thin,
        work: SpaceWork::default(),
    };
    ds.clone_full(&copy, &mut |_, _| {}).unwrap();
    assert!(read_all(&ds, "g-copy") == m["g"], "the full clone's bytes");
    clean(&ds, "after the full clone");
}

/// A deep rekey of the source copies what an own-key clone shares with it
/// (the clone keeps reading the old grains under the old key) and moves
/// the rest; every version reads its bytes, with each secret, after it.
#[test]
fn a_deep_rekey_of_the_source_copies_what_an_own_key_clone_shares() {
    let (b, ds) = common::new_sim(256 << 20);
    let mut m = source_and_clone(&ds);
    // A plain linked clone of the source (its lineage: moved with it) and
    // a snapshot of the own-key clone (the other side: kept as it is).
    ds.clone_linked("d@s", "e").unwrap();
    copy(&mut m, "d@s", "e");
    write(&ds, &mut m, "e", 3 * GRAIN, &pattern(3, 2, 21));
    write_every_kind(&ds, &mut m, "c", 5);
    ds.snapshot_create("c", "t", "").unwrap();
    copy(&mut m, "c", "c@t");
    write(&ds, &mut m, "d", 500 * GRAIN, &pattern(500, 16, 6));
    let used = ds.check().unwrap().data_grains;
    let r = ds
        .rekey_deep(
            "d",
            Some(&slot(GRAND)),
            &SpaceWork::default(),
            &mut |_, _| {},
        )
        .unwrap();
    assert!(r.copied_bytes > 0, "{r:?}");
    assert!(r.copied_bytes < r.reencrypted_bytes, "{r:?}");
    // Only what the other keyring shares is stored twice.
    let grew = ds.check().unwrap().data_grains - used;
    assert_eq!(grew * GRAIN, r.copied_bytes, "{r:?}");
    same(&ds, &m, "after the deep rekey");
    clean(&ds, "after the deep rekey");
    assert_eq!(ds.disk_info("d").unwrap().encryption.unwrap().data_key, 1);
    drop(ds);
    let ds = common::open_sim(&b);
    assert!(
        ds.unlock("d", SOURCE).is_err(),
        "the old secret opens the source"
    );
    ds.unlock("d", GRAND).unwrap();
    ds.unlock("c", CLONE).unwrap();
    same(&ds, &m, "reopened");
    clean(&ds, "reopened");
}

/// A deep rekey of an own-key clone re-encrypts what it inherited (index
/// 0) and what it wrote (its own key) under one new key, index 0, and ends
/// with no own table; what it shares with its source and with an own-key
/// clone of its own is copied; writes during the pass land right.
#[test]
fn a_deep_rekey_of_an_own_key_clone_leaves_one_key() {
    let (b, ds) = common::new_sim(256 << 20);
    let mut m = source_and_clone(&ds);
    write_every_kind(&ds, &mut m, "c", 5);
    ds.snapshot_create("c", "t", "").unwrap();
    copy(&mut m, "c", "c@t");
    ds.clone_linked_own_key("c@t", "g", &slot(GRAND)).unwrap();
    copy(&mut m, "c@t", "g");
    write(&ds, &mut m, "g", 9 * GRAIN, &pattern(9, 3, 17));
    ds.clone_linked("c@t", "c2").unwrap();
    copy(&mut m, "c@t", "c2");
    write(&ds, &mut m, "c", 600 * GRAIN, &pattern(600, 8, 4));
    let ds = std::sync::Arc::new(ds);
    let ds2 = ds.clone();
    let mut regions = 0;
    let mut during = m.clone();
    let r = ds
        .rekey_deep(
            "c",
            Some(&slot(THIRD)),
            &SpaceWork::default(),
            &mut |_, _| {
                regions += 1;
                // Writes on both sides of the cursor while the pass runs.
                if regions == 3 {
                    for at in [GRAIN + 512, 1000 * GRAIN, 30 * GRAIN] {
                        write(&ds2, &mut during, "c", at, &pattern(at / GRAIN, 1, 23));
                    }
                }
            },
        )
        .unwrap();
    drop(ds2);
    let ds = std::sync::Arc::into_inner(ds).unwrap();
    let m = during;
    assert!(r.copied_bytes > 0, "{r:?}");
    let e = ds.disk_info("c").unwrap().encryption.unwrap();
    assert_eq!(e.data_key, 2, "a new key after the own one");
    same(&ds, &m, "after the deep rekey of the own-key clone");
    clean(&ds, "after the deep rekey of the own-key clone");
    drop(ds);
    let ds = common::open_sim(&b);
    assert!(
        ds.unlock("c", CLONE).is_err(),
        "the old secret opens the clone"
    );
    for (d, k) in [("d", SOURCE), ("c", THIRD), ("g", GRAND)] {
        ds.unlock(d, k).unwrap();
    }
    same(&ds, &m, "reopened");
    clean(&ds, "reopened");
}

/// A power cut at any region of such a rekey leaves both sides reading
/// their bytes; resumed, it ends with the same.
#[test]
fn a_power_cut_in_a_deep_rekey_that_copies_keeps_both_sides() {
    for (seed, at) in [(1u64, 1u32), (2, 2), (3, 3), (4, 5)] {
        let (b, ds) = common::new_sim(256 << 20);
        let mut m = source_and_clone(&ds);
        write_every_kind(&ds, &mut m, "c", 8);
        write(&ds, &mut m, "d", 700 * GRAIN, &pattern(700, 300, 2));
        let cut = Cut {
            disk: "d",
            new: GRAND,
            seed,
            at,
        };
        cut_and_resume(&b, ds, &m, &cut, &[("d", GRAND), ("c", CLONE)]);
    }
}

/// A deep rekey of `disk` to secret `new`, cut by a power failure after
/// `at` regions (with `seed`).
struct Cut<'a> {
    disk: &'a str,
    new: &'a [u8],
    seed: u64,
    at: u32,
}

/// Run `cut` on `ds` (on `b`, its writes flushed first and every second
/// region before the cut); reopened and unlocked with `secrets`, every
/// disk reads what `m` says and `check` is clean, and so after the rekey
/// is resumed.
fn cut_and_resume(
    b: &SimBackend,
    ds: Datastore,
    m: &Model,
    cut: &Cut<'_>,
    secrets: &[(&str, &[u8])],
) {
    ds.flush().unwrap();
    let ds = std::sync::Arc::new(ds);
    let ds2 = ds.clone();
    let b2 = b.clone();
    let mut regions = 0;
    let r = ds.rekey_deep(
        cut.disk,
        Some(&slot(cut.new)),
        &SpaceWork::default(),
        &mut |_, _| {
            regions += 1;
            if regions % 2 == 0 && regions < cut.at {
                ds2.flush().unwrap();
            }
            if regions == cut.at {
                b2.crash(cut.seed);
            }
        },
    );
    assert!(r.is_err(), "the cut after {} regions never came", cut.at);
    drop(ds2);
    drop(ds);
    let ds = common::open_sim(b);
    let what = format!("cut after {} regions (seed {})", cut.at, cut.seed);
    for (d, k) in secrets {
        ds.unlock(d, k).unwrap();
    }
    same(&ds, m, &what);
    clean(&ds, &what);
    ds.rekey_deep(cut.disk, None, &SpaceWork::default(), &mut |_, _| {})
        .unwrap();
    same(&ds, m, &format!("{what}, resumed"));
    clean(&ds, &format!("{what}, resumed"));
}

#[test]
fn own_key_clones_are_refused_where_they_cannot_be() {
    let (_b, ds) = common::new_sim(256 << 20);
    ds.create_disk("plain", SIZE, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    ds.snapshot_create("plain", "s", "").unwrap();
    let e = ds
        .clone_linked_own_key("plain@s", "x", &slot(CLONE))
        .unwrap_err();
    assert!(e.message.contains("not encrypted"), "{e}");
    source_and_clone(&ds);
    let e = ds.clone_linked_own_key("d", "x", &slot(CLONE)).unwrap_err();
    assert!(e.message.contains("needs a snapshot"), "{e}");
    let e = ds
        .clone_linked_own_key("d@s", "c", &slot(CLONE))
        .unwrap_err();
    assert!(e.message.contains("already exists"), "{e}");
    // A locked source cannot lend its keys.
    ds.lock("d").unwrap();
    let e = ds
        .clone_linked_own_key("d@s", "x", &slot(CLONE))
        .unwrap_err();
    assert!(e.message.contains("locked"), "{e}");
    assert!(ds.disk_info("x").is_err(), "nothing was made");
}

/// Every write flushed before a power cut reads back afterwards, across
/// the clone's first writes over what it inherited.
#[test]
fn a_power_cut_keeps_an_own_key_clones_flushed_writes() {
    for seed in 1..=4u64 {
        let (b, ds) = common::new_sim(256 << 20);
        let mut m = source_and_clone(&ds);
        write_every_kind(&ds, &mut m, "c", seed as u8);
        let want = m.clone();
        // Unflushed writes after the last flush may go either way.
        write(&ds, &mut m, "c", 200 * GRAIN, &pattern(200, 8, 99));
        b.crash(seed);
        drop(ds);
        let ds = common::open_sim(&b);
        ds.unlock("d", SOURCE).unwrap();
        ds.unlock("c", CLONE).unwrap();
        let what = format!("seed {seed}");
        for (t, bytes) in &want {
            let now = read_all(&ds, t);
            let mut got = now.clone();
            if t == "c" {
                // The unflushed range reads old or new, never anything else.
                let r = (200 * GRAIN) as usize..(208 * GRAIN) as usize;
                let new = pattern(200, 8, 99);
                assert!(
                    now[r.clone()] == bytes[r.clone()] || now[r.clone()] == new[..],
                    "{what}: the unflushed range of c"
                );
                got[r.clone()].copy_from_slice(&bytes[r]);
            }
            assert!(got == *bytes, "{what}: the bytes of {t}");
        }
        clean(&ds, &what);
    }
}

/// Two disks that write the same bytes at the same place under the same
/// key store the same ciphertext (the tweak is the virtual sector); an
/// own-key clone's does not match either: its writes are under a key of
/// its own. Read from the pool file itself.
#[test]
fn an_own_key_clones_writes_are_not_under_the_sources_key() {
    let dir = tempfile::tempdir().unwrap();
    let ds = common::init_dir(dir.path());
    let mut m = source_and_clone(&ds);
    ds.clone_linked("d@s", "e").unwrap();
    copy(&mut m, "d@s", "e");
    let data = pattern(77, 1, 42);
    for t in ["d", "e", "c"] {
        write(&ds, &mut m, t, 300 * GRAIN, &data);
    }
    ds.flush().unwrap();
    let pool = std::fs::read(dir.path().join("pool.data")).unwrap();
    let mut seen: HashMap<&[u8], u32> = HashMap::new();
    for block in pool.chunks(GRAIN as usize) {
        if block.iter().any(|&x| x != 0) {
            *seen.entry(block).or_insert(0) += 1;
        }
    }
    let twice: Vec<u32> = seen.values().copied().filter(|&n| n > 1).collect();
    assert_eq!(
        twice,
        [2],
        "the source and its plain clone store one ciphertext twice, the own-key clone another"
    );
    assert!(
        !pool.windows(data.len()).any(|w| w == data),
        "plaintext in the pool"
    );
}

/// A power cut part-way through a deep rekey of an own-key clone: reopened
/// (the clone's cipher then has the cursor's split and its own key), every
/// disk reads its bytes, and the resumed pass ends with one key.
#[test]
fn a_power_cut_in_a_deep_rekey_of_an_own_key_clone_resumes() {
    for (seed, at) in [(5u64, 1u32), (6, 3), (7, 6)] {
        let (b, ds) = common::new_sim(256 << 20);
        let mut m = source_and_clone(&ds);
        write_every_kind(&ds, &mut m, "c", 3);
        write(&ds, &mut m, "c", 900 * GRAIN, &pattern(900, 200, 1));
        let cut = Cut {
            disk: "c",
            new: THIRD,
            seed,
            at,
        };
        cut_and_resume(&b, ds, &m, &cut, &[("d", SOURCE), ("c", THIRD)]);
    }
}
