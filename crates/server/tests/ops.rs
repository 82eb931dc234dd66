//! The server library at its boundary: datastore requests, as the API's
//! typed values, run through `ops::execute` against both kinds of
//! datastore in this process: a local one in a temporary directory, and
//! one attached to an object store kept in memory (`strata_s3::fault`).
//! What a client gets back (the answer, or the error's kind) is checked
//! without spawning the binary or an S3 server; the CLI tests
//! (crates/cli/tests) go through the command line and real clients.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;

use strata_api::{Provisioning, Request, Response};
use strata_block::{Error, Kind};
use strata_datastore::{Datastore, OpenOptions};
use strata_s3::fault::FaultStore;
use strata_server::ops;

const MIB: u64 = 1 << 20;

/// A datastore of one kind, open in this process.
struct Home {
    kind: &'static str,
    _dir: tempfile::TempDir,
    ds: Arc<dyn Datastore>,
}

impl Home {
    fn local() -> Home {
        let dir = tempfile::tempdir().unwrap();
        strata_datastore::init(dir.path(), &Default::default()).unwrap();
        let ds = strata_datastore::open(dir.path(), &OpenOptions::default()).unwrap();
        Home {
            kind: "local",
            _dir: dir,
            ds,
        }
    }

    fn object_store() -> Home {
        let store = FaultStore::new(7);
        let dir = tempfile::tempdir().unwrap();
        let url = strata_s3::StoreUrl::parse("s3://memory/ops").unwrap();
        let o = strata_s3::Options {
            backend: Some(store.backend()),
            ..Default::default()
        };
        strata_objstore::ObjectStoreDatastore::init(dir.path(), &url, &o).unwrap();
        let opts = OpenOptions {
            store_backend: Some(store.backend()),
            ..OpenOptions::default()
        };
        let ds = strata_datastore::open(dir.path(), &opts).unwrap();
        Home {
            kind: "object store",
            _dir: dir,
            ds,
        }
    }

    fn both() -> [Home; 2] {
        [Home::local(), Home::object_store()]
    }

    /// `req` as a server or the CLI runs it.
    fn run(&self, req: Request) -> Result<Response, Error> {
        ops::execute(&ops::Ctx::only(&*self.ds), &req, &mut |_, _| {})
    }

    fn ok(&self, req: Request) -> Response {
        let what = format!("{req:?}");
        self.run(req)
            .unwrap_or_else(|e| panic!("{}: {what}: {e}", self.kind))
    }

    /// The kind of the error `req` ends with.
    fn fails(&self, req: Request) -> Kind {
        let what = format!("{req:?}");
        match self.run(req) {
            Ok(r) => panic!("{}: {what} answered {r:?}", self.kind),
            Err(e) => e.kind,
        }
    }

    fn write(&self, target: &str, byte: u8, offset: u64, len: usize) {
        let d = self.ds.open(target).unwrap();
        d.write_at(&vec![byte; len], offset, false).unwrap();
        d.flush().unwrap();
    }

    fn read(&self, target: &str, offset: u64, len: usize) -> Vec<u8> {
        let d = self.ds.open(target).unwrap();
        let mut b = vec![0u8; len];
        d.read_at(&mut b, offset).unwrap();
        b
    }
}

fn create(name: &str, size_bytes: u64) -> Request {
    Request::Create {
        name: name.into(),
        size_bytes,
        provisioning: Provisioning::Thin,
        encrypt: None,
    }
}

fn disk(r: Response) -> strata_api::DiskView {
    match r {
        Response::Disk(v) => v,
        other => panic!("not a disk: {other:?}"),
    }
}

fn names(r: Response) -> Vec<String> {
    match r {
        Response::Disks(v) => v.into_iter().map(|d| d.info.name).collect(),
        Response::Snapshots(v) => v.into_iter().map(|s| s.name).collect(),
        other => panic!("not a list: {other:?}"),
    }
}

/// A disk's life as a client drives it, the same requests and the same
/// answers on both kinds: create, list, snapshot, diff, linked clone,
/// revert, extend, remove.
#[test]
fn a_disk_lives_the_same_life_on_both_kinds() {
    for h in Home::both() {
        let k = h.kind;
        let v = disk(h.ok(create("vm", 8 * MIB)));
        assert_eq!(
            (v.info.name.as_str(), v.info.size_bytes),
            ("vm", 8 * MIB),
            "{k}"
        );
        assert_eq!(v.object_store.is_some(), k == "object store", "{k}: {v:?}");
        assert_eq!(names(h.ok(Request::List)), ["vm"], "{k}");

        h.write("vm", 0xa1, 0, 64 << 10);
        match h.ok(Request::SnapshotCreate {
            disk: "vm".into(),
            snapshot: "s1".into(),
            description: "before".into(),
        }) {
            Response::SnapshotCreated { disk, snapshot } => {
                assert_eq!((disk.as_str(), snapshot.name.as_str()), ("vm", "s1"), "{k}")
            }
            other => panic!("{k}: {other:?}"),
        }
        h.write("vm", 0xb2, MIB, 64 << 10);

        // What changed since s1: the second write, and only it.
        let Response::Diff(d) = h.ok(Request::Diff {
            target: "vm".into(),
            from: "vm@s1".into(),
            totals: false,
        }) else {
            panic!("{k}: not a diff")
        };
        let ranges = d.ranges.expect("ranges");
        assert!(!ranges.is_empty(), "{k}: {ranges:?}");
        assert!(
            ranges
                .iter()
                .all(|r| r.offset >= MIB && r.offset + r.length <= 2 * MIB),
            "{k}: {ranges:?}"
        );

        // A linked clone of s1 holds s1's data, not the head's.
        let c = disk(h.ok(Request::CloneLinked {
            source: "vm@s1".into(),
            name: "c".into(),
            own_key: None,
        }));
        assert_eq!(c.info.size_bytes, 8 * MIB, "{k}");
        assert_eq!(h.read("c", 0, 4096), vec![0xa1; 4096], "{k}");
        assert_eq!(h.read("c", MIB, 4096), vec![0; 4096], "{k}");

        // Revert: the head is s1 again.
        h.ok(Request::SnapshotRevert {
            disk: "vm".into(),
            snapshot: "s1".into(),
            force: false,
        });
        assert_eq!(h.read("vm", MIB, 4096), vec![0; 4096], "{k}");
        assert_eq!(h.read("vm", 0, 4096), vec![0xa1; 4096], "{k}");
        assert_eq!(
            names(h.ok(Request::SnapshotList { disk: "vm".into() })),
            ["s1"],
            "{k}"
        );

        let v = disk(h.ok(Request::Extend {
            name: "vm".into(),
            size_bytes: 16 * MIB,
            by: false,
        }));
        assert_eq!(v.info.size_bytes, 16 * MIB, "{k}");
        let v = disk(h.ok(Request::Extend {
            name: "vm".into(),
            size_bytes: 8 * MIB,
            by: true,
        }));
        assert_eq!(v.info.size_bytes, 24 * MIB, "{k}");

        for name in ["c", "vm"] {
            match h.ok(Request::Remove {
                name: name.into(),
                force: false,
            }) {
                Response::Removed { name: n } => assert_eq!(n, name, "{k}"),
                other => panic!("{k}: {other:?}"),
            }
        }
        assert!(names(h.ok(Request::List)).is_empty(), "{k}");
        h.ds.close().unwrap();
    }
}

/// Each failure reaches the caller of `execute` with its kind, on both
/// kinds, so that every transport maps the same kind the same way.
#[test]
fn failures_keep_their_kind_through_execute() {
    for h in Home::both() {
        let k = h.kind;
        h.ok(create("vm", 4 * MIB));
        assert_eq!(h.fails(create("vm", 4 * MIB)), Kind::AlreadyExists, "{k}");
        assert_eq!(
            h.fails(Request::Info {
                name: "nosuch".into()
            }),
            Kind::NotFound,
            "{k}"
        );
        assert_eq!(
            h.fails(create("no/slash", 4 * MIB)),
            Kind::InvalidArgument,
            "{k}"
        );
        assert_eq!(
            h.fails(Request::SnapshotRevert {
                disk: "vm".into(),
                snapshot: "never".into(),
                force: false,
            }),
            Kind::NotFound,
            "{k}"
        );
        assert_eq!(
            h.fails(Request::Extend {
                name: "vm".into(),
                size_bytes: MIB,
                by: false,
            }),
            Kind::InvalidArgument,
            "{k}: shrinking"
        );
        // What one kind does and the other does not is Unsupported, asked
        // of the datastore, not decided by the kind's name.
        let other_kinds = match k {
            "local" => Request::Gc { dry_run: true },
            _ => Request::Defrag {
                name: "vm".into(),
                dry_run: true,
                rate_bytes_per_sec: None,
            },
        };
        assert_eq!(h.fails(other_kinds), Kind::Unsupported, "{k}");
        h.ds.close().unwrap();
    }
}

/// A consistency group on both kinds: created, snapshotted without a
/// hook, listed, cloned whole, deleted.
#[test]
fn a_consistency_group_is_the_same_on_both_kinds() {
    for h in Home::both() {
        let k = h.kind;
        for d in ["a", "b"] {
            h.ok(create(d, 4 * MIB));
        }
        h.write("a", 0x11, 0, 4096);
        h.ok(Request::GroupCreate {
            name: "g".into(),
            disks: vec!["a".into(), "b".into()],
            quiesce_hook: None,
            quiesce_timeout_s: None,
        });
        let Response::GroupSnapshotCreated(r) = h.ok(Request::GroupSnapshotCreate {
            group: "g".into(),
            snapshot: "s1".into(),
            description: String::new(),
            quiesce_hook: None,
            no_quiesce: true,
            ignore_quiesce_error: false,
            timeout_s: None,
            max_pause_ms: None,
        }) else {
            panic!("{k}: not a group snapshot")
        };
        assert_eq!(r.snapshot.members.len(), 2, "{k}: {r:?}");
        h.write("a", 0x22, 0, 4096);
        let Response::GroupSnapshots(l) = h.ok(Request::GroupSnapshotList { group: "g".into() })
        else {
            panic!("{k}: not a list")
        };
        assert_eq!(l.len(), 1, "{k}: {l:?}");
        h.ok(Request::GroupClone {
            source: "g@s1".into(),
            name: "g2".into(),
            renames: vec![("a".into(), "a2".into()), ("b".into(), "b2".into())],
        });
        assert_eq!(h.read("a2", 0, 4096), vec![0x11; 4096], "{k}");
        assert_eq!(h.read("a", 0, 4096), vec![0x22; 4096], "{k}");
        h.ok(Request::GroupDelete { name: "g2".into() });
        h.ds.close().unwrap();
    }
}

/// `check` of either kind answers with its own report and finds nothing
/// wrong with what the requests above leave.
#[test]
fn check_is_clean_after_requests_on_both_kinds() {
    for h in Home::both() {
        let k = h.kind;
        h.ok(create("vm", 4 * MIB));
        h.write("vm", 0x5a, 0, 128 << 10);
        h.ok(Request::SnapshotCreate {
            disk: "vm".into(),
            snapshot: "s".into(),
            description: String::new(),
        });
        match h.ok(Request::Check) {
            Response::Check(r) => assert!(r.errors.is_empty(), "{k}: {r:?}"),
            Response::StoreCheck(r) => assert!(r.errors.is_empty(), "{k}: {r:?}"),
            other => panic!("{k}: {other:?}"),
        }
        h.ds.close().unwrap();
    }
}

/// The exports that write files (VMDK links, a chain of them, a LUKS image,
/// a diff stream) run as jobs that can be cancelled: stopped at a step
/// (by `strata jobs cancel`, or by their server stopping) they remove what
/// they wrote and say so, on either kind; run again they succeed.
#[test]
fn an_export_stopped_part_way_removes_what_it_wrote() {
    use strata_api::{Secret, Subformat};
    use strata_engine::WorkControl;
    for h in Home::both() {
        let k = h.kind;
        h.ok(create("vm", 8 * MIB));
        for mib in 0..4u64 {
            h.write("vm", 0x40 + mib as u8, mib * MIB, 64 << 10);
        }
        h.ok(Request::SnapshotCreate {
            disk: "vm".into(),
            snapshot: "s".into(),
            description: String::new(),
        });
        for mib in 4..8u64 {
            h.write("vm", 0x40 + mib as u8, mib * MIB, 64 << 10);
        }
        let dir = tempfile::tempdir().unwrap();
        let vmdk = |file: &str, subformat, chain| Request::Export {
            target: "vm".into(),
            out: dir.path().join(file),
            subformat,
            chain,
            adapter: "lsilogic".into(),
            luks: None,
        };
        let exports = [
            vmdk("chain.vmdk", Subformat::SeSparse, true),
            vmdk("stream.vmdk", Subformat::StreamOptimized, false),
            vmdk("flat.vmdk", Subformat::MonolithicFlat, false),
            Request::Export {
                target: "vm".into(),
                out: dir.path().join("vm.luks"),
                subformat: Subformat::MonolithicSparse,
                chain: false,
                adapter: "lsilogic".into(),
                luks: Some(Secret::new(b"a passphrase".to_vec())),
            },
            Request::ExportDiff {
                target: "vm".into(),
                from: Some("s".into()),
                out: dir.path().join("vm.diff"),
            },
        ];
        for req in exports {
            // A whole run first: how many steps it reports.
            let mut steps = 0;
            ops::execute(&ops::Ctx::only(&*h.ds), &req, &mut |_, _| steps += 1)
                .unwrap_or_else(|e| panic!("{k}: {req:?}: {e}"));
            let files = std::fs::read_dir(dir.path()).unwrap().count();
            assert!(
                files > 0 && steps > 1,
                "{k}: {req:?}: {files} files, {steps} steps"
            );
            for f in std::fs::read_dir(dir.path()).unwrap() {
                std::fs::remove_file(f.unwrap().path()).unwrap();
            }
            // Stopped at its last step, when it has written all it will.
            let control = Arc::new(WorkControl::default());
            let ctx = ops::Ctx {
                control: Some(control.clone()),
                ..ops::Ctx::only(&*h.ds)
            };
            let mut seen = 0;
            let e = ops::execute(&ctx, &req, &mut |_, _| {
                seen += 1;
                if seen == steps - 1 {
                    control.cancel_with("stopped: the server stops");
                }
            })
            .map(|r| panic!("{k}: {req:?} answered {r:?}"))
            .unwrap_err()
            .to_string();
            assert!(
                e.starts_with("stopped: the server stops: the partial"),
                "{k}: {e}"
            );
            assert!(e.contains("was removed"), "{k}: {e}");
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(left.is_empty(), "{k}: {req:?} left {left:?}");
            // Nothing in the way of running it again.
            ops::execute(&ops::Ctx::only(&*h.ds), &req, &mut |_, _| {})
                .unwrap_or_else(|e| panic!("{k}: {req:?} again: {e}"));
            for f in std::fs::read_dir(dir.path()).unwrap() {
                std::fs::remove_file(f.unwrap().path()).unwrap();
            }
        }
        h.ds.close().unwrap();
    }
}
