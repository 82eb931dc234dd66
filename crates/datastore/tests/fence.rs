//! A disk fenced on one host (another host claimed it, and this one found
//! out at its next commit), as the datastore interface answers it, with
//! the store in memory (`strata_s3::fault`): no S3 server needed.

use std::path::Path;
use std::sync::Arc;

use strata_datastore::{open, Datastore, ErrorKind, OpenOptions, Provisioning, Role};
use strata_s3::fault::FaultStore;
use strata_s3::StoreUrl;

const MIB: u64 = 1 << 20;

/// The datastore attached at `dir` as a server opens it, its requests
/// going to `f`.
fn server(dir: &Path, f: &FaultStore) -> Arc<dyn Datastore> {
    let opts = OpenOptions {
        store_backend: Some(f.backend()),
        role: Role::Server,
        ..OpenOptions::default()
    };
    open(dir, &opts).unwrap()
}

/// A fenced head is refused to whoever opens it (with the fence's reason,
/// naming the disk and who claimed it), while the device opened before
/// keeps failing its I/O, `disk_view` still answers with the fence, the
/// disk's snapshots open, and a claim on the fenced host takes it back.
#[test]
fn a_fenced_head_is_refused_to_new_opens_until_it_is_claimed_back() {
    let f = FaultStore::new(7);
    let url = StoreUrl::parse("s3://memory/ds").unwrap();
    let o = strata_s3::Options {
        backend: Some(f.backend()),
        ..Default::default()
    };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    strata_objstore::ObjectStoreDatastore::init(da.path(), &url, &o).unwrap();
    strata_objstore::ObjectStoreDatastore::attach(db.path(), &url, &o).unwrap();
    let a = server(da.path(), &f);
    let b = server(db.path(), &f);
    a.create("d", MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let dev = a.open("d").unwrap();
    dev.write_at(&[1; 4096], 0, false).unwrap();
    dev.flush().unwrap();
    a.snapshot_create("d", "s", "").unwrap();

    b.claim_disk("d", None).unwrap();
    dev.write_at(&[2; 4096], 0, false).unwrap();
    assert_eq!(dev.flush().unwrap_err().kind, ErrorKind::Fenced);

    let e = a.open("d").err().expect("a fenced head opens");
    assert_eq!(e.kind, ErrorKind::Fenced, "{e}");
    assert!(
        e.message
            .contains("disk 'd' is fenced on this host: it was claimed by")
            && e.message.contains("(host "),
        "{e}"
    );
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        dev.read_at(&mut buf, 0).unwrap_err().kind,
        ErrorKind::Fenced
    );
    let view = a.disk_view("d", false).unwrap();
    assert!(view.object_store.unwrap().fenced.is_some());
    let snap = a.open("d@s").unwrap();
    snap.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![1; 4096]);

    a.claim_disk("d", None).unwrap();
    let back = a.open("d").unwrap();
    back.read_at(&mut buf, 0).unwrap();
    assert_eq!(
        buf,
        vec![1; 4096],
        "the fenced host's unflushed write is dropped"
    );
    back.write_at(&[3; 4096], 0, false).unwrap();
    back.flush().unwrap();
    assert!(a
        .disk_view("d", false)
        .unwrap()
        .object_store
        .unwrap()
        .fenced
        .is_none());
    // The device opened before the fence stays fenced.
    assert_eq!(
        dev.read_at(&mut buf, 0).unwrap_err().kind,
        ErrorKind::Fenced
    );
    drop((dev, snap, back));
    a.close().unwrap();
    // B lost the disk to A's claim in turn: its stop says so.
    assert_eq!(b.close().unwrap_err().kind, ErrorKind::Fenced);
}
