//! Deep rekey of an encrypted object-store disk (FORMAT.md §16.7) with
//! the store in memory (`strata_s3::fault`): the pass crashed at every
//! store request it and the writes between its steps make, then resumed;
//! and the pass under a concurrent writer. Every version reads back
//! exactly, under whichever key the cursor gives each grain, and `check`
//! is clean.
#![allow(clippy::too_many_lines)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;
use std::time::Duration;

use strata_block::BlockDevice;
use strata_crypt::{KeyringRec, NewSlot, Unlocked, Xts};
use strata_objstore::{ObjectDisk, ObjectStoreDatastore, OpenOptions};
use strata_s3::fault::{Crash, FaultStore};
use strata_s3::{Options, StoreUrl};

const SECTOR: usize = 512;
const MIB: usize = 1 << 20;
/// Three regions of the pass (4 MiB each).
const DISK: usize = 12 * MIB;
const K1: &[u8] = b"the first secret, thirty-two bytes long";
const K2: &[u8] = b"the second secret, also long enough";

fn opts(f: &FaultStore) -> Options {
    Options {
        backend: Some(f.backend()),
        op_timeout: Duration::from_secs(10),
        ..Options::default()
    }
}

fn slot(secret: &[u8]) -> NewSlot<'_> {
    NewSlot::key_file(secret, 1_700_000_000)
}

/// Sector `s` as a write tagged `tag` leaves it.
fn sector(s: usize, tag: u8) -> [u8; SECTOR] {
    let mut b = [tag; SECTOR];
    b[..8].copy_from_slice(&(s as u64).to_le_bytes());
    b
}

/// `len` bytes at `off` as a write tagged `tag` leaves them.
fn data(off: usize, len: usize, tag: u8) -> Vec<u8> {
    (off / SECTOR..(off + len) / SECTOR)
        .flat_map(|s| sector(s, tag))
        .collect()
}

/// A datastore's local directory, the datastore, disk "vm" and what its
/// head holds.
type Fixture = (
    tempfile::TempDir,
    Arc<ObjectStoreDatastore>,
    Arc<ObjectDisk>,
    Vec<u8>,
);

/// An encrypted disk "vm" of [`DISK`] in a new datastore on `f`, under
/// [`K1`]: tag 1 everywhere, snapshot "s", tag 2 over two stretches,
/// flushed. The local directory, the datastore, the disk and what its
/// head holds.
fn encrypted_disk(f: &FaultStore) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://memory/ds").unwrap();
    let ds = Arc::new(
        ObjectStoreDatastore::init(dir.path(), &url, &opts(f))
            .unwrap()
            .0,
    );
    let (rec, keys) = KeyringRec::create(0, &slot(K1)).unwrap();
    let m = ds
        .create_disk_keyed("vm", DISK as u64, Some(rec.clone()))
        .unwrap();
    ds.hold_keys("vm", m.disk, Arc::new(keys), &rec).unwrap();
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    disk.write_at(&data(0, DISK, 1), 0, false).unwrap();
    disk.flush().unwrap();
    disk.snapshot_create("s", "").unwrap();
    let mut head = data(0, DISK, 1);
    for (off, len) in [(0, MIB), (9 * MIB, MIB)] {
        let d = data(off, len, 2);
        disk.write_at(&d, off as u64, false).unwrap();
        head[off..off + len].copy_from_slice(&d);
    }
    disk.flush().unwrap();
    (dir, ds, disk, head)
}

/// A deep rekey's begin record for `disk` (new data key, one keyslot for
/// `secret`), as `strata rekey --deep` writes it.
fn begin(ds: &Arc<ObjectStoreDatastore>, disk: &ObjectDisk, secret: &[u8]) {
    let (held, id) = (ds.clone(), disk.manifest().disk);
    disk.change_keyring(|k, keys| {
        let u = k.begin_deep(keys, &slot(secret))?;
        held.replace_keys(id, Arc::new(u));
        Ok(())
    })
    .unwrap();
}

/// [`encrypted_disk`] with a deep rekey begun to [`K2`].
fn encrypted(f: &FaultStore) -> Fixture {
    let (dir, ds, disk, head) = encrypted_disk(f);
    begin(&ds, &disk, K2);
    (dir, ds, disk, head)
}

/// The deep rekey's new data key as `ds` holds it for `disk`.
fn pass_key(ds: &ObjectStoreDatastore, disk: &ObjectDisk) -> Arc<Xts> {
    let m = disk.manifest();
    let d = m.keyring.as_ref().unwrap().deep_rekey.unwrap();
    let keys: Arc<Unlocked> = ds.held_keys(m.disk).unwrap();
    keys.key(d.to).unwrap().clone()
}

fn read_all(d: &ObjectDisk) -> Vec<u8> {
    let mut b = vec![0u8; DISK];
    d.read_at(&mut b, 0).unwrap();
    b
}

/// The first sector of `got` that is neither `want`'s nor, where a write
/// was cut, `maybe`'s.
fn wrong_sector(got: &[u8], want: &[u8], maybe: Option<&(usize, Vec<u8>)>) -> Option<usize> {
    (0..got.len() / SECTOR).find(|&s| {
        let r = s * SECTOR..(s + 1) * SECTOR;
        if got[r.clone()] == want[r.clone()] {
            return false;
        }
        !maybe.is_some_and(|(off, d)| {
            r.start >= *off
                && r.end <= off + d.len()
                && got[r.clone()] == d[r.start - off..r.end - off]
        })
    })
}

/// The pass from the cursor to the end, a write and a FLUSH after each
/// step (across the next region's start, so half under each key), with
/// `head` kept as the acknowledged contents and `cut` the write whose
/// FLUSH was not answered.
fn pass_with_writes(
    ds: &ObjectStoreDatastore,
    disk: &ObjectDisk,
    head: &mut [u8],
    cut: &mut Option<(usize, Vec<u8>)>,
    tag: &mut u8,
) -> strata_objstore::Result<u64> {
    let to = pass_key(ds, disk);
    let at = std::cell::Cell::new(0usize);
    disk.rekey_pass(&to, &mut |done, _| at.set(done as usize), &mut |_| {
        let off = (at.get() + 4 * MIB - MIB / 2).min(DISK - MIB);
        *tag += 1;
        let d = data(off, MIB, *tag);
        *cut = Some((off, d.clone()));
        disk.write_at(&d, off as u64, false)?;
        disk.flush()?;
        head[off..off + MIB].copy_from_slice(&d);
        *cut = None;
        Ok(())
    })
}

/// The end record, as `strata rekey --deep` writes it.
fn finish(disk: &ObjectDisk) {
    disk.finish_rekey().unwrap();
}

fn clean(ds: &ObjectStoreDatastore, what: &str) {
    let rep = ds.check().unwrap();
    assert!(rep.errors.is_empty(), "{what}: check: {:?}", rep.errors);
}

/// One run: the pass cut at its `n`-th store mutation (None: not cut).
/// The host comes back, unlocks with the new secret, finds every version
/// intact, resumes and ends the rekey. The mutations the run made.
fn run(n: Option<(u64, Crash)>) -> u64 {
    let what = format!("{n:?}");
    let f = FaultStore::new(7);
    let (dir, ds, disk, mut head) = encrypted(&f);
    let base = f.mutations();
    if let Some((n, how)) = n {
        f.crash_at_mutation(base + n, how);
    }
    let (mut cut, mut tag) = (None, 10u8);
    let r = pass_with_writes(&ds, &disk, &mut head, &mut cut, &mut tag);
    let made = f.mutations() - base;
    match (n, f.crashed()) {
        (None, _) => {
            r.unwrap();
            finish(&disk);
            assert!(wrong_sector(&read_all(&disk), &head, None).is_none());
            return made;
        }
        (Some((n, _)), None) => {
            assert!(n >= made, "{what}: no crash");
            return made;
        }
        (Some(_), Some(_)) => assert!(r.is_err(), "{what}: the pass outlived its crash"),
    }
    drop((disk, ds));

    let ds = Arc::new(
        ObjectStoreDatastore::open(dir.path(), &opts(&f.restart()), OpenOptions::default())
            .unwrap(),
    );
    // The begin record was durable: only the new secret opens it.
    assert!(ds.unlock("vm", K1).is_err(), "{what}");
    ds.unlock("vm", K2).unwrap();
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    let got = read_all(&disk);
    if let Some(s) = wrong_sector(&got, &head, cut.as_ref()) {
        panic!("{what}: sector {s} of the head after the crash");
    }
    head = got;
    let snap = ObjectDisk::open(ds.clone(), "vm@s", true).unwrap();
    assert!(read_all(&snap) == data(0, DISK, 1), "{what}: the snapshot");
    drop(snap);
    clean(&ds, &what);
    let mut cut = None;
    pass_with_writes(&ds, &disk, &mut head, &mut cut, &mut tag).unwrap();
    finish(&disk);
    ds.gc(false).unwrap();
    assert!(
        wrong_sector(&read_all(&disk), &head, None).is_none(),
        "{what}"
    );
    let snap = ObjectDisk::open(ds.clone(), "vm@s", true).unwrap();
    assert!(
        read_all(&snap) == data(0, DISK, 1),
        "{what}: the snapshot at the end"
    );
    clean(&ds, &what);
    made
}

#[test]
fn a_deep_rekey_cut_at_every_store_request_resumes_with_every_version() {
    let made = run(None);
    assert!(made > 6, "{made} mutations");
    let mut runs = 0;
    for n in 0..made {
        for how in [Crash::Before, Crash::After] {
            run(Some((n, how)));
            runs += 1;
        }
    }
    eprintln!("{runs} crashes");
}

/// A writer at random offsets and lengths, FLUSHing now and then, while
/// the pass runs: every byte it wrote and the snapshot read back exactly
/// (its writes into a step's region wait for the step's commit, and are
/// sealed under the key the new cursor gives them).
#[test]
fn a_deep_rekey_under_a_concurrent_writer_loses_and_garbles_nothing() {
    let f = FaultStore::new(11);
    let (_dir, ds, disk, head) = encrypted(&f);
    let to = pass_key(&ds, &disk);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (disk, done) = (disk.clone(), done.clone());
        let mut head = head;
        std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            // At least 400 writes, and on until the pass is over.
            for i in 0u32.. {
                if i >= 400 && done.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let sectors = (1 + x % 256) as usize;
                let first = ((x >> 20) as usize) % (DISK / SECTOR - sectors);
                let (off, len) = (first * SECTOR, sectors * SECTOR);
                let d = data(off, len, 20 + (i % 200) as u8);
                disk.write_at(&d, off as u64, false).unwrap();
                head[off..off + len].copy_from_slice(&d);
                if i % 16 == 0 {
                    disk.flush().unwrap();
                }
            }
            disk.flush().unwrap();
            head
        })
    };
    disk.rekey_pass(&to, &mut |_, _| {}, &mut |_| Ok(()))
        .unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let head = writer.join().unwrap();
    finish(&disk);
    let got = read_all(&disk);
    assert!(wrong_sector(&got, &head, None).is_none(), "the head");
    let snap = ObjectDisk::open(ds.clone(), "vm@s", true).unwrap();
    assert!(read_all(&snap) == data(0, DISK, 1), "the snapshot");
    clean(&ds, "after the pass");
}

/// FORMAT.md §16.7: a linked clone made while the pass is half way copies
/// the record with its cursor and both data keys, from the manifest that
/// gave it its snapshot's root: it reads the snapshot's data, and
/// finishes a deep rekey of its own.
#[test]
fn a_clone_made_half_way_reads_its_snapshot_and_finishes_its_own_rekey() {
    let f = FaultStore::new(13);
    let (_dir, ds, disk, head) = encrypted(&f);
    let to = pass_key(&ds, &disk);
    let mut clone = None;
    disk.rekey_pass(&to, &mut |_, _| {}, &mut |_| {
        if clone.is_none() {
            let m = ds.clone_linked("vm", "s", "c")?;
            let rec = m.keyring.clone().unwrap();
            assert!(rec.deep_rekey.is_some_and(|d| d.next_grain > 0), "{rec:?}");
            let keys = ds.held_keys(disk.manifest().disk).unwrap();
            ds.hold_keys("c", m.disk, keys, &rec)?;
            clone = Some(ObjectDisk::open(ds.clone(), "c", false)?);
        }
        Ok(())
    })
    .unwrap();
    finish(&disk);
    assert!(wrong_sector(&read_all(&disk), &head, None).is_none());
    let c = clone.expect("made after the first step");
    assert!(read_all(&c) == data(0, DISK, 1), "the clone");
    c.write_at(&data(5 * MIB, MIB, 9), 5 * MIB as u64, false)
        .unwrap();
    c.flush().unwrap();
    let to = pass_key(&ds, &c);
    c.rekey_pass(&to, &mut |_, _| {}, &mut |_| Ok(())).unwrap();
    finish(&c);
    let mut want = data(0, DISK, 1);
    want[5 * MIB..6 * MIB].copy_from_slice(&data(5 * MIB, MIB, 9));
    assert!(read_all(&c) == want, "the clone after its own rekey");
    assert!(c.manifest().keyring.as_ref().unwrap().deep_rekey.is_none());
    ds.gc(false).unwrap();
    assert!(read_all(&c) == want, "the clone after GC");
    clean(&ds, "clone");
}

const K3: &[u8] = b"the clone's own secret, long enough too";
const K4: &[u8] = b"the clone's next secret, long enough too";

/// The key indexes of the grains `disk`'s head maps (its tail and map).
fn key_indexes(disk: &ObjectDisk) -> std::collections::BTreeSet<u8> {
    let mut seen = std::collections::BTreeSet::new();
    for vg in 0..(DISK / 4096) as u64 {
        if let Some(e) = disk.entry_of(vg).unwrap() {
            seen.insert(e.key);
        }
    }
    seen
}

/// FORMAT.md §16.7: an own-key clone on an object store. Its record has
/// its own keyslot and data key; what it writes is under key index 1,
/// what it inherited stays under the source's key; compaction keeps the
/// indexes; a deep rekey of the clone puts everything under one new key,
/// index 0, and drops the own key; each secret opens only its disk.
#[test]
fn an_own_key_clone_writes_under_its_key_and_rekeys_to_one() {
    let f = FaultStore::new(17);
    let (dir, ds, vm, head) = encrypted_disk(&f);
    let keys = ds.held_keys(vm.manifest().disk).unwrap();
    let mut made = None;
    let m = ds
        .clone_linked_keyed("vm", "s", "t", |m| {
            let (rec, u) = m
                .keyring
                .as_ref()
                .unwrap()
                .own_key_clone(&keys, &slot(K3))
                .unwrap();
            made = Some(Arc::new(u));
            Ok(Some(rec))
        })
        .unwrap();
    let rec = m.keyring.clone().unwrap();
    assert_eq!(rec.own.len(), 1, "{rec:?}");
    ds.hold_keys("t", m.disk, made.unwrap(), &rec).unwrap();
    let t = ObjectDisk::open(ds.clone(), "t", false).unwrap();
    let mut want = data(0, DISK, 1);
    assert!(read_all(&t) == want, "inherited");
    // Whole grains, a sector inside an inherited grain, written twice
    // (half live objects for compaction).
    for tag in [7u8, 8] {
        let d = data(MIB, 2 * MIB, tag);
        t.write_at(&d, MIB as u64, false).unwrap();
        want[MIB..3 * MIB].copy_from_slice(&d);
        t.flush().unwrap();
    }
    let d = data(5 * MIB + 512, 512, 9);
    t.write_at(&d, (5 * MIB + 512) as u64, false).unwrap();
    want[5 * MIB + 512..5 * MIB + 1024].copy_from_slice(&d);
    t.flush().unwrap();
    assert!(read_all(&t) == want, "written");
    assert_eq!(key_indexes(&t), [0, 1].into(), "inherited and own");
    let c = t
        .compact(strata_objstore::disk::CompactOptions {
            below: 1.0,
            ..Default::default()
        })
        .unwrap();
    assert!(c.relocated_grains > 0, "{c:?}");
    assert!(read_all(&t) == want, "after compaction");
    assert_eq!(key_indexes(&t), [0, 1].into(), "compaction keeps indexes");
    assert!(read_all(&vm) == head, "the source");
    clean(&ds, "own-key clone");

    // Another process: each secret opens only its own disk.
    drop((t, vm, ds));
    let ds = Arc::new(
        ObjectStoreDatastore::open(dir.path(), &opts(&f), OpenOptions::default()).unwrap(),
    );
    assert!(
        ds.unlock("t", K1).is_err(),
        "the source's secret opens the clone"
    );
    assert!(
        ds.unlock("vm", K3).is_err(),
        "the clone's secret opens the source"
    );
    ds.unlock("t", K3).unwrap();
    let t = ObjectDisk::open(ds.clone(), "t", false).unwrap();
    assert!(read_all(&t) == want, "reopened");

    // A deep rekey of the clone: one new key, index 0, the own key gone.
    begin(&ds, &t, K4);
    let to = pass_key(&ds, &t);
    t.rekey_pass(&to, &mut |_, _| {}, &mut |_| Ok(())).unwrap();
    finish(&t);
    let rec = t.manifest().keyring.clone().unwrap();
    assert!(rec.own.is_empty() && rec.deep_rekey.is_none(), "{rec:?}");
    assert_eq!(key_indexes(&t), [0].into());
    assert!(read_all(&t) == want, "after the clone's deep rekey");
    ds.gc(false).unwrap();
    clean(&ds, "after the rekey");
    drop(t);
    assert!(ds.unlock("t", K3).is_err(), "the retired secret");
    ds.unlock("t", K4).unwrap();
}

/// An extend after the pass and a write past the old end: the end record
/// is refused (it would drop the key that write is under) until the pass
/// has gone over the new grains too.
#[test]
fn the_end_record_waits_for_a_disk_that_grew() {
    let f = FaultStore::new(19);
    let (_dir, ds, disk, mut head) = encrypted(&f);
    let to = pass_key(&ds, &disk);
    disk.rekey_pass(&to, &mut |_, _| {}, &mut |_| Ok(()))
        .unwrap();
    disk.extend((DISK + 4 * MIB) as u64).unwrap();
    let d = data(DISK, MIB, 5);
    disk.write_at(&d, DISK as u64, false).unwrap();
    disk.flush().unwrap();
    head.extend_from_slice(&d);
    head.resize(DISK + 4 * MIB, 0);
    let e = disk.finish_rekey().unwrap_err();
    assert!(e.message.contains("grew past"), "{e}");
    let mut b = vec![0u8; DISK + 4 * MIB];
    disk.read_at(&mut b, 0).unwrap();
    assert!(b == head, "before the rest of the pass");
    disk.rekey_pass(&to, &mut |_, _| {}, &mut |_| Ok(()))
        .unwrap();
    finish(&disk);
    disk.read_at(&mut b, 0).unwrap();
    assert!(b == head, "after the end record");
    clean(&ds, "grown");
}
