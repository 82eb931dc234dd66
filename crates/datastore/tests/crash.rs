//! Crashes of an object-store datastore in the middle of what the
//! datastore interface does in several store requests, with the store in
//! memory (`strata_s3::fault`): no S3 server needed.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::path::Path;
use std::sync::Arc;

use strata_datastore::{open, Datastore, GroupSnapshotOptions, OpenOptions, Provisioning};
use strata_s3::fault::{Crash, FaultStore};
use strata_s3::StoreUrl;

const MIB: u64 = 1 << 20;

/// The datastore attached at `dir`, its requests going to `f`.
fn datastore(dir: &Path, f: &FaultStore) -> Arc<dyn Datastore> {
    let opts = OpenOptions {
        store_backend: Some(f.backend()),
        ..OpenOptions::default()
    };
    open(dir, &opts).unwrap()
}

fn names<T>(list: Vec<T>, name: impl Fn(&T) -> &str) -> Vec<String> {
    list.iter().map(|x| name(x).to_string()).collect()
}

/// A group snapshot is every member's snapshot record, then the group
/// object that makes them one (docs/BACKUP.md). Cut before the group
/// object: the group snapshot is absent, so are its members' records, and
/// the next group snapshot is whole and holds the write acknowledged
/// before the crash.
#[test]
fn a_group_snapshot_cut_before_its_group_object_is_absent_everywhere() {
    let f = FaultStore::new(5);
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://memory/ds").unwrap();
    let o = strata_s3::Options {
        backend: Some(f.backend()),
        ..Default::default()
    };
    strata_objstore::ObjectStoreDatastore::init(dir.path(), &url, &o).unwrap();
    let ds = datastore(dir.path(), &f);
    for d in ["d1", "d2"] {
        ds.create(d, MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
    }
    ds.group_create("g", &["d1".into(), "d2".into()], None, None)
        .unwrap();
    let d1 = ds.open("d1").unwrap();
    d1.write_at(&[1; 4096], 0, false).unwrap();
    d1.flush().unwrap();
    let opts = GroupSnapshotOptions::default();
    let s1 = ds.group_snapshot_create("g", "s1", &opts).unwrap();
    assert_eq!(s1.members.len(), 2);

    f.crash_at_key("/groups/", 0, Crash::Before);
    d1.write_at(&[2; 4096], 4096, false).unwrap();
    d1.flush().unwrap();
    let e = ds.group_snapshot_create("g", "s2", &opts).unwrap_err();
    let at = f.crashed().expect("crashed");
    assert!(at.contains("/s/"), "cut at the group object, not {at}: {e}");
    drop((d1, ds));

    let ds = datastore(dir.path(), &f.restart());
    let gs = ds.group_snapshots("g").unwrap();
    assert_eq!(names(gs, |s| &s.name), ["s1"], "the cut one is not listed");
    for d in ["d1", "d2"] {
        let snaps = ds.snapshots(d).unwrap();
        assert_eq!(names(snaps, |s| &s.name), ["s1"], "{d}");
    }
    let s2 = ds.group_snapshot_create("g", "s2", &opts).unwrap();
    assert_eq!(s2.members.len(), 2);
    let mut b = vec![0u8; 4096];
    ds.open("d1@s2").unwrap().read_at(&mut b, 4096).unwrap();
    assert_eq!(b, [2; 4096], "the write acknowledged before the crash");
    let gs = ds.group_snapshots("g").unwrap();
    assert_eq!(names(gs, |s| &s.name), ["s1", "s2"]);
}
