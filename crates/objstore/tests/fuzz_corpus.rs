//! Replays the committed corpus of the fuzz target `objstore_objects`
//! (fuzz/corpus/objstore_objects) through `strata_objstore::fuzzing`, as the
//! fuzz target does: none may panic, and the objects a real datastore
//! wrote (`valid_*`) must decode.
//!
//! The seeds are objects a datastore wrote into a real SeaweedFS, written
//! by `write_seeds` (ignored; it needs SeaweedFS):
//! `cargo test -p strata-objstore --test fuzz_corpus -- --ignored write_seeds`.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_block::BlockDevice;
use strata_objstore::fuzzing::{self, ObjectKind};
use strata_objstore::layout::{manifest_of_key, Manifest, SegId, NODE_BYTES, SEG_HEADER_BYTES};
use strata_objstore::{ObjectDisk, ObjectStoreDatastore, KEY_ROOT};
use strata_s3::{testing, ObjectStore, Options, StoreUrl};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/objstore_objects")
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(29).wrapping_add((i / 4096) as u8) ^ (i as u8 & 0x3f))
        .collect()
}

fn with(kind: ObjectKind, parts: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![kind.selector()];
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

/// Objects of a datastore built in SeaweedFS: the root object, manifests
/// (format 2, with payloads and tails, before and after a snapshot folded
/// the tail into the map), segments with grains and map nodes; and those
/// of an encrypted disk.
#[test]
#[ignore = "writes fuzz/corpus; needs SeaweedFS; run by hand to regenerate the seeds"]
fn write_seeds() {
    testing::shared().expect("SeaweedFS");
    let url = StoreUrl::parse(&format!(
        "s3://strata-objstore-test/fuzz-seeds-{:08x}",
        rand::random::<u32>()
    ))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ds = Arc::new(
        ObjectStoreDatastore::init(dir.path(), &url, &Options::default())
            .unwrap()
            .0,
    );
    ds.create_disk("vm", 64 << 20).unwrap();
    let d = ObjectDisk::open(ds.clone(), "vm", false).unwrap();
    d.write_at(&pattern(1, 16384), 0, false).unwrap();
    d.write_at(&pattern(2, 4096), 3 << 20, false).unwrap();
    d.flush().unwrap();
    d.write_at(&pattern(3, 4096), 40 << 20, true).unwrap();
    d.snapshot_create("s", "before").unwrap();
    d.write_at(&pattern(4, 8192), 4096, false).unwrap();
    d.flush().unwrap();
    drop(d);
    // An encrypted disk (FORMAT.md §16.7): manifests with a keyring
    // (STRMAN04/05) and segments of ciphertext.
    let slot = strata_crypt::NewSlot::key_file(&[9u8; 32], 1);
    let (rec, keys) = strata_crypt::KeyringRec::create(0, &slot).unwrap();
    let m = ds
        .create_disk_keyed("enc", 16 << 20, Some(rec.clone()))
        .unwrap();
    ds.hold_keys("enc", m.disk, Arc::new(keys), &rec).unwrap();
    let e = ObjectDisk::open(ds.clone(), "enc", false).unwrap();
    e.write_at(&pattern(5, 16384), 0, false).unwrap();
    e.flush().unwrap();
    e.snapshot_create("s", "").unwrap();
    e.write_at(&pattern(6, 4096), 8192, true).unwrap();
    // An own-key clone of it: key indexes in its tail and, once a
    // snapshot folded the tail, in its map's leaves.
    let held = ds.held_keys(m.disk).unwrap();
    let own_slot = strata_crypt::NewSlot::key_file(&[10u8; 32], 1);
    let mut made = None;
    let c = ds
        .clone_linked_keyed("enc", "s", "own", |m| {
            let (r, u) = m
                .keyring
                .as_ref()
                .unwrap()
                .own_key_clone(&held, &own_slot)
                .unwrap();
            made = Some(Arc::new(u));
            Ok(Some(r))
        })
        .unwrap();
    ds.hold_keys("own", c.disk, made.unwrap(), c.keyring.as_ref().unwrap())
        .unwrap();
    let o = ObjectDisk::open(ds.clone(), "own", false).unwrap();
    o.write_at(&pattern(7, 8192), 4096, false).unwrap();
    o.flush().unwrap();
    o.snapshot_create("t", "").unwrap();
    drop(o);
    // A deep rekey of the source: manifests with the cursor at each step.
    let new_slot = strata_crypt::NewSlot::key_file(&[11u8; 32], 1);
    e.change_keyring(|k, keys| {
        let u = k.begin_deep(keys, &new_slot)?;
        ds.replace_keys(m.disk, Arc::new(u));
        Ok(())
    })
    .unwrap();
    let to = {
        let d = e.manifest().keyring.as_ref().unwrap().deep_rekey.unwrap();
        ds.held_keys(m.disk).unwrap().key(d.to).unwrap().clone()
    };
    e.rekey_pass(&to, &mut |_, _| {}, &mut |_| Ok(())).unwrap();
    drop(e);

    let store = ObjectStore::connect(&url, &Options::default()).unwrap();
    let out = corpus();
    std::fs::create_dir_all(&out).unwrap();
    // Names carry the disk's random id: last time's seeds go first.
    for e in std::fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("valid_")
        {
            std::fs::remove_file(p).unwrap();
        }
    }
    let mut n = 0;
    let mut write = |name: String, b: Vec<u8>| {
        std::fs::write(out.join(name), b).unwrap();
        n += 1;
    };
    for l in store.list("", None).unwrap() {
        let obj = store.get(&l.key).unwrap();
        let tag = l.key.replace('/', "_");
        if l.key == KEY_ROOT {
            write("valid_root".into(), with(ObjectKind::Root, &[&obj]));
        } else if let Some((disk, seq)) = manifest_of_key(&l.key) {
            let m = Manifest::decode(&l.key, &obj).unwrap();
            let k = [&disk.to_le_bytes()[..], &seq.to_le_bytes()[..]].concat();
            write(
                format!("valid_manifest_{tag}"),
                with(ObjectKind::Manifest, &[&k, &obj]),
            );
            let payload = obj.len()
                - Manifest::needs(&l.key, obj.len() as u64, &obj[obj.len() - 32..])
                    .unwrap()
                    .unwrap() as usize;
            if payload > 0 {
                write(
                    format!("valid_payload_{tag}"),
                    with(ObjectKind::Segment, &[&obj[..payload]]),
                );
            }
            if let Some(node) = m.root_node() {
                write(
                    format!("valid_root_node_{tag}"),
                    with(ObjectKind::MapNode, &[&node.encode()]),
                );
            }
            if let Some((_, Some(e))) = m.tail.iter().next() {
                let mut b = [0u8; 24];
                strata_objstore::layout::Entry::encode(Some(e), &mut b);
                write(format!("valid_entry_{tag}"), with(ObjectKind::Entry, &[&b]));
            }
        } else if SegId::from_key(&l.key).is_some() {
            write(
                format!("valid_segment_{tag}"),
                with(ObjectKind::Segment, &[&obj]),
            );
            write(
                format!("valid_segment_header_{tag}"),
                with(ObjectKind::SegmentHeader, &[&obj[..SEG_HEADER_BYTES]]),
            );
            let info = strata_objstore::layout::verify_segment(&l.key, &obj).unwrap();
            for j in 0..info.nodes.min(2) {
                let at = info.node_offset(j) as usize;
                let node = &obj[at..at + NODE_BYTES];
                write(
                    format!("valid_node_{tag}_{j}"),
                    with(ObjectKind::MapNode, &[node]),
                );
                write(
                    format!("valid_node_fixed_{tag}_{j}"),
                    with(ObjectKind::MapNodeFixedCrc, &[node]),
                );
            }
        }
    }
    write(
        "valid_entry_hole".into(),
        with(ObjectKind::Entry, &[&[0u8; 24]]),
    );
    assert!(n >= 8, "only {n} seeds written");
}

#[test]
fn every_seed_decodes_without_panic_and_the_real_ones_decode() {
    let mut n = 0;
    let mut kinds = std::collections::HashSet::new();
    for e in std::fs::read_dir(corpus()).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let s = fuzzing::objects(&std::fs::read(&path).unwrap());
        if name.starts_with("valid_") {
            assert!(s.decoded, "{name}: {s:?}");
            kinds.insert(format!("{:?}", s.kind.unwrap()));
        }
        n += 1;
    }
    assert_eq!(kinds.len(), 7, "seeds of every kind: {kinds:?}");
    assert!(n >= 10, "only {n} seeds");
}
