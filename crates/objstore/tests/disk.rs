//! Disks of an object-store datastore against a real SeaweedFS on loopback:
//! what one host flushes another reads, a claim fences the old writer, of
//! concurrent claims one wins, nothing acknowledged by a FLUSH depends on
//! the local directory, and random I/O matches a model through commits and
//! reopenings.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::path::Path;
use std::sync::Arc;

use strata_block::{BlockDevice, ZeroOptions};
use strata_objstore::{ErrorKind, ObjectDisk, ObjectStoreDatastore};
use strata_s3::{testing, Options, StoreUrl};

const MIB: u64 = 1 << 20;

/// A fresh datastore (a new prefix) and its URL; None without SeaweedFS.
fn store(name: &str) -> Option<StoreUrl> {
    testing::shared()?;
    Some(
        StoreUrl::parse(&format!(
            "s3://strata-objstore-test/{name}-{:08x}",
            rand::random::<u32>()
        ))
        .unwrap(),
    )
}

fn init(dir: &Path, url: &StoreUrl) -> Arc<ObjectStoreDatastore> {
    Arc::new(
        ObjectStoreDatastore::init(dir, url, &Options::default())
            .unwrap()
            .0,
    )
}

fn attach(dir: &Path, url: &StoreUrl) -> Arc<ObjectStoreDatastore> {
    Arc::new(
        ObjectStoreDatastore::attach(dir, url, &Options::default())
            .unwrap()
            .0,
    )
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add((i / 512) as u8) ^ (i as u8))
        .collect()
}

/// Bytes no grain of which compresses (§18.6), for byte counts of raw
/// grains.
fn noise(seed: u8, len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(seed);
    (0..len).map(|_| xorshift(&mut x) as u8).collect()
}

/// The next number of xorshift state `x` (never 0 if `x` is not).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// `len` bytes of numbered lines of text, from line `first` on: each
/// grain packs to well under its 4 KiB (§18.6), and lines from another
/// `first` make other grains.
fn text(first: u64, len: usize) -> Vec<u8> {
    let mut t = Vec::with_capacity(len + 64);
    let mut n = first;
    while t.len() < len {
        t.extend_from_slice(
            format!("line {n}: grains packed where that saves an eighth. ").as_bytes(),
        );
        n += 1;
    }
    t.truncate(len);
    t
}

fn read(d: &ObjectDisk, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    d.read_at(&mut b, off).unwrap();
    b
}

#[test]
fn what_one_host_flushes_another_reads_and_a_claim_fences_the_writer() {
    let Some(url) = store("two-hosts") else {
        return;
    };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    a.create_disk("vm", 64 * MIB).unwrap();
    let err = a.create_disk("vm", MIB).unwrap_err();
    assert_eq!(err.kind, ErrorKind::AlreadyExists, "{err}");

    let disk_a = ObjectDisk::open(a.clone(), "vm", false).unwrap();
    assert_eq!(disk_a.ownership(), (false, None), "opening claims nothing");
    // Whole grains, a sub-grain write, a write across a leaf (1 MiB)
    // boundary and one far out in the map.
    disk_a.write_at(&pattern(1, 8192), 0, false).unwrap();
    disk_a
        .write_at(&pattern(2, 512), 4096 + 1024, false)
        .unwrap();
    disk_a
        .write_at(&pattern(3, 12288), MIB - 4096, false)
        .unwrap();
    disk_a.write_at(&pattern(4, 4096), 60 * MIB, false).unwrap();
    assert!(disk_a.ownership().0, "the first write claimed the disk");
    assert_eq!(disk_a.unflushed_bytes(), 6 * 4096);
    disk_a.flush().unwrap();
    assert_eq!(disk_a.unflushed_bytes(), 0);

    let mut expect = pattern(1, 8192);
    expect[4096 + 1024..4096 + 1536].copy_from_slice(&pattern(2, 512));

    // Host B: a directory of its own.
    let b = attach(db.path(), &url);
    let disk_b = ObjectDisk::open(b.clone(), "vm", false).unwrap();
    assert_eq!(read(&disk_b, 0, 8192), expect);
    assert_eq!(read(&disk_b, MIB - 4096, 12288), pattern(3, 12288));
    assert_eq!(read(&disk_b, 60 * MIB, 4096), pattern(4, 4096));
    assert_eq!(read(&disk_b, 2 * MIB, 4096), vec![0u8; 4096]);
    let ext = disk_b.block_status(0, 64 * MIB).unwrap();
    assert_eq!(
        (ext[0].hole, ext[0].len_bytes, ext[1].hole),
        (false, 8192, true)
    );
    assert_eq!(disk_b.ownership(), (false, None), "reading claims nothing");

    // B's write does not take the disk from a writer that may be live
    // elsewhere (FORMAT.md §11.6); B claims, and A's next commit is fenced.
    let e = disk_b.write_at(&pattern(5, 4096), 0, false).unwrap_err();
    assert!(e.message.contains("strata claim vm"), "{e}");
    assert_eq!(disk_b.ownership(), (false, None));
    disk_b.claim().unwrap();
    disk_b.write_at(&pattern(5, 4096), 0, false).unwrap();
    disk_b.flush().unwrap();
    disk_a.write_at(&pattern(6, 4096), 8192, false).unwrap();
    let err = disk_a.flush().unwrap_err();
    assert!(
        err.message.contains("fenced") && err.message.contains("generation 3"),
        "{err}"
    );
    let mut buf = vec![0u8; 4096];
    assert!(
        disk_a.write_at(&buf, 0, false).is_err(),
        "acknowledges nothing more"
    );
    assert!(disk_a.read_at(&mut buf, 0).is_err());
    let m = b.newest_manifest(disk_b.manifest().disk).unwrap();
    assert_eq!(m.generation, 3);
    assert_eq!(m.owner.unwrap().host, b.config().me.host);

    // B's flushed write survives B losing its local directory.
    drop(disk_b);
    drop(b);
    std::fs::remove_dir_all(db.path()).unwrap();
    let b = attach(db.path(), &url);
    let disk_b = ObjectDisk::open(b, "vm", true).unwrap();
    assert_eq!(read(&disk_b, 0, 4096), pattern(5, 4096));
    assert_eq!(read(&disk_b, 4096, 4096), expect[4096..].to_vec());
    assert_eq!(
        read(&disk_b, 8192, 4096),
        vec![0u8; 4096],
        "A's fenced write is not there"
    );
}

#[test]
fn of_32_concurrent_claims_one_owner_remains() {
    let Some(url) = store("claims") else { return };
    let d = tempfile::tempdir().unwrap();
    // Default time limits: SeaweedFS queues the losers' creates for
    // seconds, but a loser reads the winner's manifest and stops waiting.
    let ds = init(d.path(), &url);
    ds.create_disk("vm", MIB).unwrap();
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let ds = ds.clone();
            std::thread::spawn(move || ds.claim("vm"))
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // A claim that read the disk after another one landed is a takeover
    // of it, not a race with it: several may succeed one after another,
    // each with a higher generation, and every one but the last is fenced
    // at its first commit (what_one_host_flushes_... tests that). Racing
    // claims of one generation: exactly one wins.
    let mut won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert!(!won.is_empty(), "{results:?}");
    won.sort_by_key(|m| m.generation);
    for w in won.windows(2) {
        assert!(
            w[0].generation < w[1].generation,
            "two winners of one generation: {won:?}"
        );
    }
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.kind, ErrorKind::Fenced, "{e}");
            assert!(e.message.contains("was claimed by"), "{e}");
        }
    }
    let id = ds.disk_id("vm").unwrap();
    let newest = ds.newest_manifest(id).unwrap();
    assert_eq!(
        &newest,
        *won.last().unwrap(),
        "the last winner owns the disk"
    );
    assert_eq!(newest.seq, 1 + won.len() as u64, "one manifest per winner");
}

/// Random writes, sub-grain writes, zeroes and trims against a model,
/// with flushes and reopenings (by this host and a fresh one) between.
#[test]
fn random_io_matches_a_model_through_commits_and_reopenings() {
    let Some(url) = store("model") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    let size = 3 * MIB + 512 * 3; // not a whole grain: the last one is partial
    a.create_disk("m", size).unwrap();
    let mut model = vec![0u8; size as usize];
    let mut disk = ObjectDisk::open(a.clone(), "m", false).unwrap();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for step in 0..400 {
        let sectors = size / 512;
        let off = next(sectors) * 512;
        let len = ((1 + next(24)) * 512).min(size - off);
        match next(10) {
            0..=5 => {
                let data = pattern(step as u8, len as usize);
                disk.write_at(&data, off, false).unwrap();
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            6 => {
                disk.write_zeroes(off, len, ZeroOptions::default()).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            7 => {
                // Only whole grains are released.
                disk.unmap(off, len).unwrap();
                let lo = off.div_ceil(4096) * 4096;
                let hi = (off + len) / 4096 * 4096;
                if lo < hi {
                    model[lo as usize..hi as usize].fill(0);
                }
            }
            8 => disk.flush().unwrap(),
            _ => {
                let got = read(&disk, off, len as usize);
                assert_eq!(
                    got,
                    &model[off as usize..(off + len) as usize],
                    "step {step}"
                );
            }
        }
        if step % 100 == 99 {
            disk.flush().unwrap();
            disk = ObjectDisk::open(a.clone(), "m", false).unwrap();
            assert_eq!(read(&disk, 0, size as usize), model, "after reopening");
        }
    }
    disk.flush().unwrap();
    let b = attach(db.path(), &url);
    let other = ObjectDisk::open(b, "m", true).unwrap();
    assert_eq!(read(&other, 0, size as usize), model, "from another host");
}

/// Whether block status reports a hole anywhere in the range.
fn has_hole(d: &ObjectDisk, off: u64, len: u64) -> bool {
    d.block_status(off, len).unwrap().iter().any(|x| x.hole)
}

#[test]
fn fast_zero_changes_only_the_map_or_is_refused_leaving_the_data() {
    let Some(url) = store("fast-zero") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let a = init(dir.path(), &url);
    a.create_disk("z", 4 * MIB).unwrap();
    let disk = ObjectDisk::open(a.clone(), "z", false).unwrap();
    let data = pattern(5, MIB as usize);
    disk.write_at(&data, 0, false).unwrap();
    let fast = ZeroOptions {
        may_unmap: true,
        fast_only: true,
        fua: false,
    };
    // Whole grains become holes; a partial grain over a hole reads as
    // zeros already.
    disk.write_zeroes(0, 256 * 1024, fast).unwrap();
    assert!(has_hole(&disk, 0, 256 * 1024));
    disk.write_zeroes(2 * MIB + 512, 8192, fast).unwrap();
    assert!(has_hole(&disk, 2 * MIB, 12288));
    // A partial grain over data takes a write: refused, nothing changed.
    let e = disk.write_zeroes(512 * 1024, 4096 + 512, fast).unwrap_err();
    assert_eq!(e.kind, strata_block::ErrorKind::Unsupported, "{e}");
    let mut want = data.clone();
    want[..256 * 1024].fill(0);
    assert_eq!(read(&disk, 0, MIB as usize), want);
    disk.flush().unwrap();
    assert_eq!(read(&disk, 0, MIB as usize), want, "after a commit");
}

fn store_of(url: &StoreUrl) -> strata_s3::ObjectStore {
    strata_s3::ObjectStore::connect(url, &Options::default()).unwrap()
}

/// Bytes of every object under `disks/`.
fn stored(url: &StoreUrl) -> u64 {
    store_of(url)
        .list("disks/", None)
        .unwrap()
        .iter()
        .map(|l| l.size)
        .sum()
}

fn segment_keys(url: &StoreUrl) -> Vec<String> {
    store_of(url)
        .list("disks/", None)
        .unwrap()
        .into_iter()
        .map(|l| l.key)
        .filter(|k| k.contains("/s/"))
        .collect()
}

/// Issue 64 item 4 (FORMAT.md §18.6): segments sealed with their grains
/// LZ4-compressed where that saves an eighth. The same writes take less
/// than half the bytes they take with compression off; every object
/// verifies as the version its writer chose; a host with a cold cache
/// reads every byte back by whole objects, and one without prefetch by
/// ranged GETs of the stored bytes alone, then again from its sparse
/// files; `check` is clean and GC counts the packed bytes.
#[test]
fn sealed_segments_pack_what_shrinks_and_every_host_reads_it_back() {
    use strata_objstore::layout::{verify_segment, SegId};
    use strata_objstore::OpenOptions;
    let (Some(url), Some(raw)) = (store("packed"), store("unpacked")) else {
        return;
    };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    drop(init(db.path(), &raw));
    let off = |compress| OpenOptions {
        compress,
        prefetch: compress,
        ..OpenOptions::default()
    };
    let b =
        Arc::new(ObjectStoreDatastore::open(db.path(), &Options::default(), off(false)).unwrap());
    // 8 MiB of text, 3 MiB of noise, 1 MiB of text: more than a
    // manifest's payload holds, so sealed segments too.
    let mut want = text(0, 8 << 20);
    want.extend_from_slice(&noise(3, 3 << 20));
    want.extend_from_within(..1 << 20);
    for ds in [&a, &b] {
        ds.create_disk("p", 16 * MIB).unwrap();
        let d = ObjectDisk::open(ds.clone(), "p", false).unwrap();
        d.write_at(&want, 0, false).unwrap();
        d.flush().unwrap();
        assert_eq!(read(&d, 0, want.len()), want);
    }
    let (packed, unpacked) = (stored(&url), stored(&raw));
    assert!(
        packed * 2 < unpacked && unpacked > want.len() as u64,
        "{packed} bytes stored packed, {unpacked} not"
    );
    for (u, placed) in [(&url, true), (&raw, false)] {
        // Segments of grains as the writer chose; those of map nodes
        // alone stay version 1 (nodes are read at computed offsets).
        let mut with_grains = 0;
        for k in segment_keys(u) {
            assert!(SegId::from_key(&k).is_some(), "{k}");
            let obj = store_of(u).get(&k).unwrap();
            let info = verify_segment(&k, &obj).unwrap();
            if info.grains > 0 {
                with_grains += 1;
                assert_eq!(info.placed, placed, "{k}");
            }
        }
        assert!(with_grains > 0);
    }
    // Cold hosts: whole objects, then ranged GETs and sparse files.
    for prefetch in [true, false] {
        let dc = tempfile::tempdir().unwrap();
        drop(attach(dc.path(), &url));
        let c = Arc::new(
            ObjectStoreDatastore::open(
                dc.path(),
                &Options::default(),
                OpenOptions {
                    prefetch,
                    ..OpenOptions::default()
                },
            )
            .unwrap(),
        );
        let d = ObjectDisk::open(c.clone(), "p", true).unwrap();
        for _ in 0..2 {
            for at in (0..want.len()).step_by(1 << 20).rev() {
                assert_eq!(
                    read(&d, at as u64, 1 << 20),
                    want[at..at + (1 << 20)],
                    "{at}"
                );
            }
        }
        let chk = c.check().unwrap();
        assert!(chk.errors.is_empty(), "{chk:?}");
        assert_eq!(chk.grains, (want.len() / 4096) as u64, "{chk:?}");
    }
    let g = a.gc(true).unwrap();
    assert!(
        g.live_bytes < (want.len() as u64) / 2 && g.live_bytes > 3 << 20,
        "{g:?}"
    );
}

/// Compaction by a host that seals compressed packs the raw grains it
/// moves (FORMAT.md §18.6): a disk written by a host without it, then
/// three quarters overwritten, shrinks in the store as its partly live
/// objects are compacted and collected, and every byte reads back on a
/// third host.
#[test]
fn compaction_packs_the_raw_grains_it_moves() {
    use strata_objstore::disk::CompactOptions;
    use strata_objstore::OpenOptions;
    let Some(url) = store("repack") else { return };
    let (da, db, dc) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    drop(init(da.path(), &url));
    drop(attach(db.path(), &url));
    drop(attach(dc.path(), &url));
    let open = |dir: &Path, compress| {
        let opts = OpenOptions {
            compress,
            ..OpenOptions::default()
        };
        Arc::new(ObjectStoreDatastore::open(dir, &Options::default(), opts).unwrap())
    };
    // Host A, raw: 8 MiB, then its first 6 MiB again (other text).
    let a = open(da.path(), false);
    a.create_disk("r", 16 * MIB).unwrap();
    let d = ObjectDisk::open(a.clone(), "r", false).unwrap();
    let mut want = text(0, 8 << 20);
    d.write_at(&want, 0, false).unwrap();
    d.flush().unwrap();
    let second = text(1 << 30, 6 << 20);
    d.write_at(&second, 0, false).unwrap();
    d.flush().unwrap();
    want[..6 << 20].copy_from_slice(&second);
    drop(d);
    let before = a.gc(false).unwrap();
    assert!(before.live_bytes >= 8 << 20, "written raw: {before:?}");
    // Host B, compressing, takes the disk and compacts it.
    let b = open(db.path(), true);
    let d = ObjectDisk::open(b.clone(), "r", false).unwrap();
    d.claim().unwrap();
    let r = d
        .compact(CompactOptions {
            below: 0.5,
            ..Default::default()
        })
        .unwrap();
    assert!(r.relocated_grains > 0, "{r:?}");
    drop(d);
    let after = b.gc(false).unwrap();
    // The first write's last 2 MiB (512 grains) moved packed; the
    // second's 6 MiB, fully live where it lies, stayed raw.
    assert!(
        after.live_bytes + MIB < before.live_bytes
            && after.live_plain_bytes >= after.live_bytes + MIB
            && before.live_plain_bytes == before.live_bytes,
        "compaction should pack what it moved: {before:?} {after:?}"
    );
    let c = open(dc.path(), false);
    let d = ObjectDisk::open(c.clone(), "r", true).unwrap();
    assert_eq!(read(&d, 0, want.len()), want);
    let chk = c.check().unwrap();
    assert!(chk.errors.is_empty(), "{chk:?}");
}

/// Issue 12: a snapshot on A, a linked clone of it on B, garbage
/// collection while both read: bytes identical, check clean, and what GC
/// deletes is exactly what nothing live reaches.
#[test]
fn snapshot_on_one_host_clone_on_another_and_gc_while_both_read() {
    let Some(url) = store("clone-gc") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    a.create_disk("golden", 8 * MIB).unwrap();
    let golden = ObjectDisk::open(a.clone(), "golden", false).unwrap();
    let base = noise(7, 4 * MIB as usize);
    golden.write_at(&base, 0, false).unwrap();
    golden.flush().unwrap();
    golden.snapshot_create("base", "the image").unwrap();
    // Overwrite the first MiB twice: the first overwrite's segment is
    // reached by nothing once the second is committed. (Noise
    // throughout: a MiB is stored as a MiB, §18.6, as the counts below
    // say.)
    golden.write_at(&noise(8, MIB as usize), 0, false).unwrap();
    golden.flush().unwrap();
    let mut now = base.clone();
    now[..MIB as usize].copy_from_slice(&noise(9, MIB as usize));
    golden.write_at(&now[..MIB as usize], 0, false).unwrap();
    golden.flush().unwrap();

    let b = attach(db.path(), &url);
    let err = b.clone_linked("golden", "nope", "vm1").unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    b.clone_linked("golden", "base", "vm1").unwrap();
    let vm1 = ObjectDisk::open(b.clone(), "vm1", false).unwrap();
    assert_eq!(read(&vm1, 0, 4 * MIB as usize), base);
    let mut vm1_now = base.clone();
    vm1_now[2 * MIB as usize..2 * MIB as usize + 8192].copy_from_slice(&noise(10, 8192));
    vm1.write_at(
        &vm1_now[2 * MIB as usize..2 * MIB as usize + 8192],
        2 * MIB,
        false,
    )
    .unwrap();
    vm1.flush().unwrap();

    // Only the owner deletes a snapshot; B is refused, naming A.
    let on_b = ObjectDisk::open(b.clone(), "golden", false).unwrap();
    let err = on_b.snapshot_delete("base").unwrap_err();
    assert_eq!(err.kind, ErrorKind::Fenced, "{err}");
    assert!(err.message.contains("is written by"), "{err}");
    golden.snapshot_delete("base").unwrap();

    let before = segment_keys(&url);
    let stored_before = stored(&url);
    // Readers on both hosts during GC.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = [
        (golden.clone(), now.clone()),
        (vm1.clone(), vm1_now.clone()),
    ]
    .into_iter()
    .map(|(d, want)| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds == 0 {
                assert_eq!(read(&d, 0, 4 * MIB as usize), want);
                rounds += 1;
            }
            rounds
        })
    })
    .collect();
    let rep = a.gc(false).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    // The first overwrite's MiB: the payload of its commit's manifest,
    // which nothing reaches once the second overwrite is committed.
    assert!(rep.deleted_manifests >= 1, "{rep:?}");
    assert_eq!(segment_keys(&url), before, "{rep:?}");
    assert!(
        stored(&url) + MIB <= stored_before,
        "{} -> {}: {rep:?}",
        stored_before,
        stored(&url)
    );
    let chk = b.check().unwrap();
    assert!(chk.errors.is_empty(), "{chk:?}");
    assert_eq!(chk.disks, 2);
    assert_eq!(chk.holds, 1);
    // A fresh host reads the same bytes (nothing it needs was collected).
    let dc = tempfile::tempdir().unwrap();
    let c = attach(dc.path(), &url);
    assert_eq!(
        read(
            &ObjectDisk::open(c.clone(), "vm1", true).unwrap(),
            0,
            4 * MIB as usize
        ),
        vm1_now
    );
    assert_eq!(
        read(
            &ObjectDisk::open(c.clone(), "golden", true).unwrap(),
            0,
            4 * MIB as usize
        ),
        now
    );
    // Exclusive space (what removing the disk would free): golden's new
    // first MiB; for the clone its 8 KiB and the snapshot's first MiB,
    // which only its hold keeps now that the snapshot is deleted.
    let golden_space = rep.disks.iter().find(|d| d.name == "golden").unwrap();
    assert!(golden_space.exclusive_bytes >= MIB, "{rep:?}");
    let vm1_space = rep.disks.iter().find(|d| d.name == "vm1").unwrap();
    assert!(
        vm1_space.exclusive_bytes >= MIB + 8192 && vm1_space.exclusive_bytes < 2 * MIB,
        "{rep:?}"
    );

    // Removing the clone drops its hold: what only it reached (its own
    // write, in its commit's payload) goes at the next GC, golden's stays.
    drop(vm1);
    b.remove_disk("vm1").unwrap();
    assert!(b.holds().unwrap().is_empty());
    let rep = c.gc(false).unwrap();
    assert!(rep.deleted_segments + rep.deleted_manifests >= 1, "{rep:?}");
    let chk = c.check().unwrap();
    assert!(chk.errors.is_empty() && chk.disks == 1, "{chk:?}");
    let dd = tempfile::tempdir().unwrap();
    let d = attach(dd.path(), &url);
    assert_eq!(
        read(
            &ObjectDisk::open(d, "golden", true).unwrap(),
            0,
            4 * MIB as usize
        ),
        now
    );
}

/// A fenced writer's upload is an orphan GC collects; a torn segment is
/// an error naming its key, in reads and in check.
#[test]
fn fenced_uploads_are_collected_and_torn_segments_named() {
    let Some(url) = store("orphans") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    a.create_disk("vm", 16 * MIB).unwrap();
    let disk_a = ObjectDisk::open(a.clone(), "vm", false).unwrap();
    disk_a.write_at(&pattern(1, 65536), 0, false).unwrap();
    disk_a.flush().unwrap();
    // One PUT per commit (§11.4a): the grains rode in the manifest.
    assert!(segment_keys(&url).is_empty());
    let b = attach(db.path(), &url);
    b.claim("vm").unwrap();
    // A commit of more than one payload uploads the rest as a segment
    // first (generation 2) and then fails at its manifest.
    disk_a
        .write_at(&pattern(2, 9 * MIB as usize), 0, false)
        .unwrap();
    assert!(disk_a.flush().is_err());
    let keys = segment_keys(&url);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let rep = b.gc(false).unwrap();
    assert_eq!(rep.deleted_segments, 1, "{rep:?}");
    assert!(segment_keys(&url).is_empty());
    // What holds the live grains: the payload of A's commit, named by
    // the tail of B's claim.
    let newest = b.newest_manifest(b.disk_id("vm").unwrap()).unwrap();
    let left: Vec<String> = newest
        .tail
        .values()
        .flatten()
        .map(|e| e.seg.key())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");

    // Tear the live payload: cut its manifest short in the store.
    let st = store_of(&url);
    let whole = st.get(&left[0]).unwrap();
    st.put(&left[0], whole.slice(..whole.len() / 2)).unwrap();
    let dc = tempfile::tempdir().unwrap();
    let c = attach(dc.path(), &url);
    let disk_c = ObjectDisk::open(c.clone(), "vm", true).unwrap();
    // A grain past the cut cannot be read; one before it is still what
    // its entry's CRC says, so it is served.
    let mut buf = vec![0u8; 65536];
    let err = disk_c.read_at(&mut buf, 0).unwrap_err();
    assert!(err.to_string().contains(&left[0]), "{err}");
    assert_eq!(read(&disk_c, 0, 4096), pattern(1, 4096));
    let chk = c.check().unwrap();
    assert_eq!(chk.errors.len(), 1, "{chk:?}");
    assert!(chk.errors[0].contains(&left[0]), "{chk:?}");
}

/// A datastore as builds before one-PUT commits left it (FORMAT.md §11.5
/// format 1: grains and map nodes in segments, `STRMAN01` manifests)
/// reads as it is and takes format-2 commits on top; GC and check stay
/// clean, and another host reads the result.
#[test]
fn a_format_1_datastore_reads_and_takes_new_commits() {
    use strata_objstore::layout::{Entry, Manifest, MapNode, SegId, SegmentBuilder};
    let Some(url) = store("format1") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    let st = store_of(&url);
    // Disk 7 of 4 MiB (two levels): 16 grains of one segment, their leaf
    // and the root in it, written the old way.
    let id = 7u32;
    let seg = SegId {
        disk: id,
        gen: 1,
        ctr: 0,
    };
    let old = pattern(3, 16 * 4096);
    let mut b = SegmentBuilder::new(seg);
    let mut leaf = MapNode::empty(0, id, 1, 0);
    for g in 0..16 {
        leaf.entries[g] = Some(b.add_grain(g as u64, &old[g * 4096..(g + 1) * 4096]));
    }
    let leaf_e = b.add_node(&leaf);
    let mut root = MapNode::empty(1, id, 1, 0);
    root.entries[0] = Some(leaf_e);
    let root_e: Entry = b.add_node(&root);
    st.put(&seg.key(), b.seal(1).into()).unwrap();
    let m = Manifest {
        written_ms: 1,
        nonce: 1,
        root: Some(root_e),
        next_ctr: 1,
        ..Manifest::first(id, 4 * MIB, 2)
    };
    st.put(&m.key(), m.encode_v1().into()).unwrap();
    st.put("names/old", br#"{"disk":7}"#.to_vec().into())
        .unwrap();

    let d = ObjectDisk::open(a.clone(), "old", false).unwrap();
    assert_eq!(read(&d, 0, old.len()), old);
    let mut want = old.clone();
    want[8192..12288].copy_from_slice(&pattern(4, 4096));
    d.write_at(&want[8192..12288], 8192, false).unwrap();
    d.flush().unwrap();
    assert_eq!(read(&d, 0, want.len()), want);
    // A snapshot folds the tail into the old map (copy-on-write).
    d.snapshot_create("s", "").unwrap();
    let b_host = attach(db.path(), &url);
    let on_b = ObjectDisk::open(b_host.clone(), "old", true).unwrap();
    assert_eq!(read(&on_b, 0, want.len()), want);
    let snap = ObjectDisk::open(b_host.clone(), "old@s", true).unwrap();
    assert_eq!(read(&snap, 0, want.len()), want);
    let rep = b_host.gc(false).unwrap();
    assert_eq!(
        rep.deleted_segments, 0,
        "the old segment holds live grains: {rep:?}"
    );
    let chk = b_host.check().unwrap();
    assert!(chk.errors.is_empty(), "{chk:?}");
    assert_eq!(read(&on_b, 0, want.len()), want);
}

/// Random 4 KiB writes in many small commits (FORMAT.md §11.4a): the tail
/// grows, a background fold turns it into map nodes and a later commit
/// names it (grains rewritten meanwhile stay in the tail and shadow the
/// map), a tail never passes its bound, and what the writer reads, another
/// host reads, before and after GC, with check clean.
#[test]
fn random_writes_fold_their_tail_and_read_back_everywhere() {
    let Some(url) = store("fold") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    let size = 64 * MIB;
    a.create_disk("f", size).unwrap();
    let d = ObjectDisk::open(a.clone(), "f", false).unwrap();
    let mut model = vec![0u8; size as usize];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let (mut longest, mut folded) = (0usize, false);
    for c in 0..90u32 {
        for i in 0..64u32 {
            // Half the writes fall in the first 4 MiB: rewritten often.
            let g = if i % 2 == 0 {
                next(1024)
            } else {
                next(size / 4096)
            };
            let data = pattern((c * 64 + i) as u8, 4096);
            d.write_at(&data, g * 4096, false).unwrap();
            model[(g * 4096) as usize..(g * 4096 + 4096) as usize].copy_from_slice(&data);
        }
        d.flush().unwrap();
        let tail = d.manifest().tail.len();
        assert!(tail <= 4096, "commit {c}: a tail of {tail} entries");
        folded |= tail < longest;
        longest = longest.max(tail);
        if c % 16 == 5 {
            // Let a background fold finish before the next commits.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    }
    assert!(folded, "no fold was named (longest tail {longest})");
    assert!(d.manifest().root.is_some());
    // Each commit's payload keeps grains nobody rewrote: GC frees
    // nothing whole yet (compaction is what would), and deletes nothing
    // anything reaches.
    let rep = same_everywhere(&d, "f", &attach(db.path(), &url), &model);
    assert!(rep.live_bytes <= rep.stored_bytes, "{rep:?}");
}

/// Uploads between FLUSHes (FORMAT.md §11.4a): a stream of writes seals
/// 8 MiB segments that upload before any FLUSH; writes read back at once
/// whether unsealed, sealed and uploading, or uploaded; a writer that
/// rewrites everything while another thread flushes over and over ends
/// with the newest bytes, on this host and on another, before and after
/// GC, with check clean.
#[test]
fn streamed_writes_upload_before_a_flush_and_stay_exact_through_commits() {
    let Some(url) = store("stream") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    let size = 48 * MIB;
    a.create_disk("s", size).unwrap();
    let d = ObjectDisk::open(a.clone(), "s", false).unwrap();
    for i in 0..24u64 {
        let data = pattern(i as u8, MIB as usize);
        d.write_at(&data, i * MIB, false).unwrap();
        assert_eq!(
            read(&d, i * MIB, MIB as usize),
            data,
            "MiB {i} just written"
        );
        if i > 0 {
            let back = pattern((i - 1) as u8, MIB as usize);
            assert_eq!(read(&d, (i - 1) * MIB, MIB as usize), back, "MiB {}", i - 1);
        }
    }
    // Sealed segments went up with no FLUSH.
    let t = std::time::Instant::now();
    while segment_keys(&url).len() < 2 {
        assert!(
            t.elapsed().as_secs() < 30,
            "no segment uploaded before a FLUSH"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(d.manifest().seq, 2, "only the claim: nothing committed yet");

    // Rewrite everything (two passes) while another thread flushes.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                d.flush().unwrap();
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
            n
        })
    };
    let mut model = vec![0u8; size as usize];
    for pass in 0..2u64 {
        for i in 0..(size / MIB) {
            let data = pattern((pass * 64 + i) as u8 ^ 0x5a, MIB as usize);
            d.write_at(&data, i * MIB, false).unwrap();
            model[(i * MIB) as usize..((i + 1) * MIB) as usize].copy_from_slice(&data);
            // While commits run: the newest bytes, wherever they are.
            let j = i.saturating_sub(9);
            assert!(
                read(&d, j * MIB, (i - j + 1) as usize * MIB as usize)
                    == model[(j * MIB) as usize..((i + 1) * MIB) as usize],
                "pass {pass}, MiB {j}..={i}"
            );
        }
    }
    // The same 8 MiB over and over: grains of a batch being committed
    // are sealed again meanwhile, and reads must take the newer seal.
    for round in 0..40u64 {
        for i in 0..8u64 {
            let data = pattern((round * 8 + i) as u8 ^ 0xa5, MIB as usize);
            d.write_at(&data, i * MIB, false).unwrap();
            model[(i * MIB) as usize..((i + 1) * MIB) as usize].copy_from_slice(&data);
            assert!(
                read(&d, 0, 8 * MIB as usize) == model[..8 * MIB as usize],
                "round {round}, MiB {i}"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(flusher.join().unwrap() > 0);
    d.flush().unwrap();
    let rep = same_everywhere(&d, "s", &attach(db.path(), &url), &model);
    assert!(
        rep.deleted_segments > 0,
        "the first pass's segments: {rep:?}"
    );
}

/// A seal compresses its grains with the disk's state let go, from
/// copies: a grain another writer replaces meanwhile must stay the newer
/// write, not the copy sealed (FORMAT.md §11.4a). One thread streams
/// text (each MiB once, so every 8 MiB seals); another overwrites grains
/// of the MiB the first finished last (unsealed, or in the seal being
/// prepared) with noise, while a third flushes now and then; every host
/// reads the model back.
#[test]
fn a_grain_rewritten_while_its_seal_is_prepared_keeps_the_newer_write() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    use std::sync::Mutex;
    let Some(url) = store("reseal") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    let size = 64 * MIB;
    a.create_disk("r", size).unwrap();
    let d = ObjectDisk::open(a.clone(), "r", false).unwrap();
    let model = Arc::new(Mutex::new(vec![0u8; size as usize]));
    // MiBs the streamer has finished: the rewriter's grains lie below.
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let rewriter = {
        let (d, model, done, stop) = (d.clone(), model.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut n = 0u64;
            while !stop.load(SeqCst) {
                let m = done.load(SeqCst);
                if m == 0 {
                    std::thread::yield_now();
                    continue;
                }
                let off = (m - 1) * MIB + (xorshift(&mut x) % 256) * 4096;
                let data = noise(n as u8, 4096);
                d.write_at(&data, off, false).unwrap();
                model.lock().unwrap()[off as usize..off as usize + 4096].copy_from_slice(&data);
                n += 1;
            }
            n
        })
    };
    let flusher = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(40));
                d.flush().unwrap();
            }
        })
    };
    for i in 0..size / MIB {
        let data = text(i * 100_000, MIB as usize);
        // The model first: the rewriter only goes where this is done.
        model.lock().unwrap()[(i * MIB) as usize..((i + 1) * MIB) as usize].copy_from_slice(&data);
        d.write_at(&data, i * MIB, false).unwrap();
        done.store(i + 1, SeqCst);
    }
    stop.store(true, SeqCst);
    let rewrites = rewriter.join().unwrap();
    flusher.join().unwrap();
    assert!(rewrites > 0);
    d.flush().unwrap();
    let model = model.lock().unwrap().clone();
    same_everywhere(&d, "r", &attach(db.path(), &url), &model);
}

/// `model` is what writer `d` (disk `name`) reads, and what host `b`
/// reads before and after a GC (whose report is returned), with check
/// clean both times.
fn same_everywhere(
    d: &ObjectDisk,
    name: &str,
    b: &Arc<ObjectStoreDatastore>,
    model: &[u8],
) -> strata_api::store::GcReport {
    assert!(read(d, 0, model.len()) == model, "the writer's view");
    let on_b = ObjectDisk::open(b.clone(), name, true).unwrap();
    assert!(read(&on_b, 0, model.len()) == model, "another host's view");
    let chk = b.check().unwrap();
    assert!(chk.errors.is_empty(), "{chk:?}");
    let rep = b.gc(false).unwrap();
    let fresh = ObjectDisk::open(b.clone(), name, true).unwrap();
    assert!(read(&fresh, 0, model.len()) == model, "after GC");
    assert!(read(d, 0, model.len()) == model, "the writer after GC");
    let chk = b.check().unwrap();
    assert!(chk.errors.is_empty(), "{chk:?}");
    rep
}

/// Compaction (FORMAT.md §11.7a): random 4 KiB overwrites leave payloads
/// partly live; passes run while another thread keeps overwriting the
/// same grains, and a relocation must never bring back a grain written
/// after the pass read it. Afterwards GC frees the emptied objects:
/// stored falls near live, and every host reads exactly the model.
#[test]
fn compaction_empties_partly_live_objects_and_loses_no_newer_write() {
    use std::sync::Mutex;
    use strata_objstore::disk::CompactOptions;
    let Some(url) = store("compact") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    let size = 16 * MIB;
    let grains = size / 4096;
    a.create_disk("c", size).unwrap();
    let d = ObjectDisk::open(a.clone(), "c", false).unwrap();
    let model = Arc::new(Mutex::new(vec![0u8; size as usize]));
    // Random 4 KiB writes, a FLUSH every 64 (one payload each).
    let churn = move |d: &ObjectDisk, model: &Mutex<Vec<u8>>, n: u64, seed: u64| {
        let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
        for i in 0..n {
            // Uniform over the disk: overwrites at random.
            let vg = xorshift(&mut x) % grains;
            let data = pattern((i ^ seed) as u8, 4096);
            d.write_at(&data, vg * 4096, false).unwrap();
            model.lock().unwrap()[(vg * 4096) as usize..((vg + 1) * 4096) as usize]
                .copy_from_slice(&data);
            if i % 64 == 63 {
                d.flush().unwrap();
            }
        }
        d.flush().unwrap();
    };
    churn(&d, &model, 3 * grains, 1);
    let before = a.gc(false).unwrap();
    assert!(
        before.sparse_objects > 10 && before.stored_bytes * 2 > before.live_bytes * 3,
        "overwrites should leave partly live objects: {before:?}"
    );
    // Passes while another thread overwrites the grains they move.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (d, model, stop) = (d.clone(), model.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seed = 7;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                churn(&d, &model, 256, seed);
                seed += 1;
            }
        })
    };
    let mut dropped = 0;
    let mut relocated = 0;
    for _ in 0..2 {
        let r = d
            .compact(CompactOptions {
                below: 0.9,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            r.relocated_grains + r.dropped_grains,
            r.rewritten_grains,
            "{r:?}"
        );
        dropped += r.dropped_grains;
        relocated += r.relocated_grains;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        relocated > 0 && dropped > 0,
        "the passes should move grains and lose some to newer writes: {relocated} moved, {dropped} dropped"
    );
    // Quiet now: one more pass empties every partly live object.
    let r = d
        .compact(CompactOptions {
            below: 0.9,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.dropped_grains, 0, "{r:?}");
    let model = model.lock().unwrap().clone();
    let after = same_everywhere(&d, "c", &attach(db.path(), &url), &model);
    assert!(
        after.deleted_segments + after.deleted_manifests > 0,
        "{after:?}"
    );
    let rep = a.gc(true).unwrap();
    assert!(
        rep.stored_bytes * 10 <= rep.live_bytes * 12,
        "stored should be within 1.2x live after compaction and GC: {rep:?}"
    );
}

/// A hand-over (FORMAT.md §11.6b): a host serving a disk incoming reads
/// what the writer committed a moment ago, not a manifest up to a second
/// old (a migrated guest resumes there and reads at once what it wrote on
/// the source), and once the writer released, its first write claims.
#[test]
fn an_incoming_host_reads_the_writers_last_commit_at_once() {
    let Some(url) = store("incoming") else { return };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    a.create_disk("m", 4 * MIB).unwrap();
    let w = ObjectDisk::open(a.clone(), "m", false).unwrap();
    w.write_at(&pattern(1, 65536), 0, false).unwrap();
    w.flush().unwrap();
    let b = attach(db.path(), &url);
    let inc = ObjectDisk::open(b.clone(), "m", false).unwrap();
    inc.set_incoming(Some(std::time::Duration::from_secs(30)));
    assert!(read(&inc, 0, 65536) == pattern(1, 65536));
    // Commits right before the guest stops on the source: read here at
    // once, each of them.
    for i in 2..12u8 {
        w.write_at(&pattern(i, 65536), 0, false).unwrap();
        w.flush().unwrap();
        assert!(
            read(&inc, 0, 65536) == pattern(i, 65536),
            "commit {i}: the incoming host read an older commit"
        );
    }
    w.release().unwrap();
    inc.write_at(&pattern(99, 4096), 65536, false).unwrap();
    inc.flush().unwrap();
    assert!(
        inc.ownership().0,
        "the first write after the release claims"
    );
    assert!(read(&inc, 0, 65536) == pattern(11, 65536));
}

/// FORMAT.md §11.4b: a stale writer's pipelined manifest whose predecessor
/// lost its key to a claim (an orphan) is read past by every reader,
/// skipped by the claimer's next commit, and collected by GC; one whose
/// predecessor is missing (in flight) is read past until a claim makes
/// it an orphan; a valid pipelined manifest is read as the newest.
#[test]
fn orphans_of_a_fenced_pipeline_are_read_past_skipped_and_collected() {
    use strata_objstore::layout::{manifest_key, Manifest, PrevRef};
    let Some(url) = store("orphans") else { return };
    let (da, db, dc) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let a = init(da.path(), &url);
    a.create_disk("vm", 16 * MIB).unwrap();
    let id = a.disk_id("vm").unwrap();
    let st = store_of(&url);
    let disk_a = ObjectDisk::open(a.clone(), "vm", false).unwrap();
    disk_a.write_at(&pattern(1, 8192), 0, false).unwrap();
    disk_a.flush().unwrap();
    let man_a = a.newest_manifest(id).unwrap();

    // B claims (manifest s+1, with its marker); A, pipelining, had s+2
    // in flight on its own s+1, which lost the key: an orphan.
    let b = attach(db.path(), &url);
    let disk_b = ObjectDisk::open(b.clone(), "vm", false).unwrap();
    disk_b.claim().unwrap();
    let claim = b.newest_manifest(id).unwrap();
    assert_eq!(claim.seq, man_a.seq + 1);
    assert_eq!(
        claim.prev,
        Some(PrevRef::of(&man_a)),
        "a manifest names its predecessor"
    );
    let orphan = |seq: u64, prev: PrevRef| Manifest {
        seq,
        nonce: rand::random(),
        written_ms: 1,
        pipelined: true,
        prev: Some(prev),
        size_bytes: 32 * MIB,
        ..man_a.clone()
    };
    let o = orphan(
        claim.seq + 1,
        PrevRef {
            seq: claim.seq,
            nonce: claim.nonce ^ 1,
        },
    );
    st.put_create(&o.key(), o.encode(&[]).into()).unwrap();

    // Every reader reads past it.
    let c = attach(dc.path(), &url);
    let newest = c.newest_manifest(id).unwrap();
    assert_eq!((newest.seq, newest.nonce), (claim.seq, claim.nonce));
    let on_c = ObjectDisk::open(c.clone(), "vm", true).unwrap();
    assert_eq!(
        on_c.size_bytes(),
        16 * MIB,
        "the orphan's size is never seen"
    );
    assert_eq!(read(&on_c, 0, 8192), pattern(1, 8192));

    // B's next commit meets it and goes one key higher.
    disk_b.write_at(&pattern(2, 4096), 4096, false).unwrap();
    disk_b.flush().unwrap();
    let after = c.newest_manifest(id).unwrap();
    assert_eq!(after.seq, o.seq + 1, "the commit skipped the orphan's key");
    assert_eq!(after.prev, Some(PrevRef::of(&claim)));
    let mut want = pattern(1, 8192);
    want[4096..].copy_from_slice(&pattern(2, 4096));
    let on_c = ObjectDisk::open(c.clone(), "vm", true).unwrap();
    assert_eq!(read(&on_c, 0, 8192), want);

    // A pipelined manifest whose predecessor is missing (still in
    // flight): read past, kept by GC.
    let gap = orphan(
        after.seq + 2,
        PrevRef {
            seq: after.seq + 1,
            nonce: 99,
        },
    );
    st.put_create(&gap.key(), gap.encode(&[]).into()).unwrap();
    assert_eq!(c.newest_manifest(id).unwrap().seq, after.seq);
    let rep = c.gc(false).unwrap();
    assert!(rep.deleted_manifests >= 1, "{rep:?}");
    assert_eq!(
        st.size_of(&o.key()).unwrap(),
        None,
        "GC collected the orphan"
    );
    assert!(
        st.size_of(&gap.key()).unwrap().is_some(),
        "kept: it may be in flight"
    );
    assert!(st.size_of(&manifest_key(id, claim.seq)).unwrap().is_some());
    let chk = c.check().unwrap();
    assert!(chk.errors.is_empty(), "{chk:?}");

    // B commits at the gap (which makes the manifest above it an
    // orphan), then past it; a snapshot (a manifest without a payload)
    // is one more commit.
    disk_b.write_at(&pattern(3, 4096), 0, false).unwrap();
    disk_b.flush().unwrap();
    assert_eq!(c.newest_manifest(id).unwrap().seq, after.seq + 1);
    disk_b.write_at(&pattern(4, 4096), 8192, false).unwrap();
    disk_b.flush().unwrap();
    disk_b.snapshot_create("s", "").unwrap();
    let last = c.newest_manifest(id).unwrap();
    assert!(last.seq > gap.seq, "{} over {}", last.seq, gap.seq);
    want[..4096].copy_from_slice(&pattern(3, 4096));
    want.extend_from_slice(&pattern(4, 4096));
    let on_c = ObjectDisk::open(c.clone(), "vm", true).unwrap();
    assert_eq!(read(&on_c, 0, 12288), want);
    let snap = ObjectDisk::open(c.clone(), "vm@s", true).unwrap();
    assert_eq!(read(&snap, 0, 12288), want);
    c.gc(false).unwrap();
    assert_eq!(
        st.size_of(&gap.key()).unwrap(),
        None,
        "an orphan now: collected"
    );
    assert_eq!(
        read(&ObjectDisk::open(c.clone(), "vm", true).unwrap(), 0, 12288),
        want
    );

    // A valid pipelined manifest (its predecessor there, with its nonce)
    // is the newest.
    let valid = Manifest {
        seq: last.seq + 1,
        nonce: rand::random(),
        pipelined: true,
        prev: Some(PrevRef::of(&last)),
        size_bytes: 32 * MIB,
        ..last.clone()
    };
    st.put_create(&valid.key(), valid.encode(&[]).into())
        .unwrap();
    let on_c = ObjectDisk::open(c.clone(), "vm", true).unwrap();
    assert_eq!(on_c.size_bytes(), 32 * MIB);
    assert_eq!(read(&on_c, 0, 12288), want);
}

/// FORMAT.md §11.4b: FLUSHes from several threads issue commits on top of
/// commits still in flight; another host claims in the middle: every
/// FLUSH the first host answered is in what the second reads, the first
/// is fenced, and the store holds no pipelined manifest that readers take
/// wrongly (another host, GC and check agree).
#[test]
fn pipelined_commits_keep_every_answered_flush_across_a_claim() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let Some(url) = store("pipelined") else {
        return;
    };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = init(da.path(), &url);
    a.create_disk("vm", 64 * MIB).unwrap();
    let disk_a = ObjectDisk::open(a.clone(), "vm", false).unwrap();
    disk_a.write_at(&pattern(0, 4096), 0, false).unwrap();
    disk_a.flush().unwrap();
    const THREADS: u64 = 4;
    // Thread t writes version v of its own 64 KiB at t MiB, then flushes;
    // `acked[t]` is the last version a FLUSH answered.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let version = |t: u64, v: u64| pattern((t * 61 + v) as u8, 65536);
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (d, acked, stop) = (disk_a.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                for v in 1.. {
                    if stop.load(Ordering::Relaxed) {
                        return v;
                    }
                    let buf = version(t, v);
                    if d.write_at(&buf, t * MIB, false).is_err() || d.flush().is_err() {
                        return v;
                    }
                    acked[t as usize].store(v, Ordering::Relaxed);
                }
                unreachable!()
            })
        })
        .collect();
    // Until commits were issued on top of ones in flight (and at least a
    // few hundred milliseconds of writes); then B claims while they go on.
    let t0 = std::time::Instant::now();
    while disk_a.commit_stats().pipelined == 0 || t0.elapsed().as_millis() < 300 {
        assert!(
            t0.elapsed().as_secs() < 60,
            "no commit was issued on top of another in a minute: {:?}",
            disk_a.commit_stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let b = attach(db.path(), &url);
    let disk_b = ObjectDisk::open(b.clone(), "vm", false).unwrap();
    disk_b.claim().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let written: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(disk_a.flush().is_err(), "A is fenced");
    for t in 0..THREADS {
        let got = read(&disk_b, t * MIB, 65536);
        let acked = acked[t as usize].load(Ordering::Relaxed);
        let v = (acked..=written[t as usize])
            .find(|&v| version(t, v) == got)
            .unwrap_or_else(|| {
                panic!("thread {t}: B reads no version from {acked} (the last answered) up")
            });
        assert!(v >= acked);
    }
    let c = attach(tempfile::tempdir().unwrap().path(), &url);
    let on_c = ObjectDisk::open(c.clone(), "vm", true).unwrap();
    for t in 0..THREADS {
        assert_eq!(read(&on_c, t * MIB, 65536), read(&disk_b, t * MIB, 65536));
    }
    c.gc(false).unwrap();
    let chk = c.check().unwrap();
    assert!(chk.errors.is_empty(), "{chk:?}");
    disk_b.write_at(&pattern(9, 4096), 0, false).unwrap();
    disk_b.flush().unwrap();
    assert_eq!(
        read(&ObjectDisk::open(c, "vm", true).unwrap(), 0, 4096),
        pattern(9, 4096)
    );
}

/// Block status and reads walk the map a leaf at a time (a cursor over
/// the grains of one leaf): over runs of data and holes that cross leaf
/// boundaries, in the map (a snapshot folds the head's tail into it), the
/// head's tail and the unflushed overlay, of the disk and of its
/// snapshot, both say what was written, grain by grain (no SeaweedFS
/// needed).
#[test]
fn block_status_and_reads_across_leaves_say_what_was_written() {
    let store = strata_s3::fault::FaultStore::new(11);
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://memory/leaves").unwrap();
    let o = Options {
        backend: Some(store.backend()),
        ..Default::default()
    };
    let ds = Arc::new(ObjectStoreDatastore::init(d.path(), &url, &o).unwrap().0);
    let grains = 40 * 256 + 17; // 40 leaves and a part
    ds.create_disk("vm", grains * G).unwrap();
    let disk = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    let mut present = vec![false; grains as usize];
    // Runs of data that start and end on either side of leaf edges.
    let kept = |g: u64| g % 256 < 3 || g % 256 > 250 || (g / 97) % 3 == 1;
    for g in (0..grains).filter(|&g| kept(g)) {
        disk.write_at(&leaf_body(g), g * G, false).unwrap();
        present[g as usize] = true;
    }
    disk.flush().unwrap();
    disk.snapshot_create("s", "").unwrap();
    let at_snapshot = present.clone();
    // Then more in the head's tail, and a few left unflushed.
    for g in [255, 256, 5000, 5001, 5002] {
        disk.write_at(&leaf_body(g), g * G, false).unwrap();
        present[g as usize] = true;
    }
    disk.flush().unwrap();
    for g in [511, 512, grains - 1] {
        disk.write_at(&leaf_body(g), g * G, false).unwrap();
        present[g as usize] = true;
    }
    says_what_was_written(&disk, &present);
    let snap = ObjectDisk::open(ds.clone(), "vm@s", true).unwrap();
    says_what_was_written(&snap, &at_snapshot);
}

const G: u64 = 4096;

fn leaf_body(g: u64) -> Vec<u8> {
    vec![(g % 251) as u8 | 1; G as usize]
}

/// `disk`'s block status (whole, and from inside one leaf to inside
/// another) and a read of all of it, against `present` grain by grain.
fn says_what_was_written(disk: &ObjectDisk, present: &[bool]) {
    let grains = present.len() as u64;
    let mut want: Vec<(bool, u64)> = Vec::new();
    for &p in present {
        match want.last_mut() {
            Some((hole, n)) if *hole != p => *n += G,
            _ => want.push((!p, G)),
        }
    }
    let status = |from: u64, to: u64| -> Vec<(bool, u64)> {
        let got = disk.block_status(from, to - from).unwrap();
        got.iter().map(|e| (e.hole, e.len_bytes)).collect()
    };
    assert_eq!(status(0, grains * G), want);
    let (from, to) = (300 * G + 512, 1300 * G - 512);
    let mut part = Vec::new();
    let mut at = from;
    for g in from / G..to.div_ceil(G) {
        let end = ((g + 1) * G).min(to);
        match part.last_mut() {
            Some((hole, n)) if *hole != present[g as usize] => *n += end - at,
            _ => part.push((!present[g as usize], end - at)),
        }
        at = end;
    }
    assert_eq!(status(from, to), part);
    let mut all = vec![0u8; (grains * G) as usize];
    disk.read_at(&mut all, 0).unwrap();
    for (g, &p) in present.iter().enumerate() {
        let at = g * G as usize;
        let expect = if p {
            leaf_body(g as u64)
        } else {
            vec![0; G as usize]
        };
        assert!(all[at..at + G as usize] == expect[..], "grain {g}");
    }
}
