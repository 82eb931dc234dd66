//! What every kind of datastore promises through the one interface,
//! written once and run against each kind: a local datastore in a
//! temporary directory, and a directory attached to an object store on a
//! real SeaweedFS.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::path::Path;
use std::sync::Arc;

use strata_block::BlockDevice;
use strata_block::ZeroOptions;
use strata_datastore::{
    capability, open, Capability, ChangedRange, Datastore, ErrorKind, Kind, OpenOptions,
    Provisioning,
};
use strata_s3::{testing, StoreUrl};

const MIB: u64 = 1 << 20;

fn local(dir: &Path) -> Arc<dyn Datastore> {
    strata_engine::Datastore::init(
        Arc::new(strata_storage::FileBackend::new(dir)),
        &strata_engine::InitOptions { capacity_bytes: 0 },
    )
    .unwrap();
    open(dir, &OpenOptions::default()).unwrap()
}

/// None when SeaweedFS is missing and tools are optional (said on stderr).
fn object_store(dir: &Path) -> Option<Arc<dyn Datastore>> {
    testing::shared()?;
    let url = StoreUrl::parse(&format!(
        "s3://strata-datastore-test/contract-{:08x}",
        rand::random::<u32>()
    ))
    .unwrap();
    strata_objstore::ObjectStoreDatastore::init(dir, &url, &strata_s3::Options::default()).unwrap();
    Some(open(dir, &OpenOptions::default()).unwrap())
}

/// Run `case` on each kind.
fn each_kind(case: impl Fn(&dyn Datastore)) {
    let d = tempfile::tempdir().unwrap();
    let ds = local(d.path());
    assert_eq!(ds.kind(), Kind::Local);
    case(&*ds);
    ds.close().unwrap();
    let d = tempfile::tempdir().unwrap();
    if let Some(ds) = object_store(d.path()) {
        assert_eq!(ds.kind(), Kind::ObjectStore);
        case(&*ds);
        ds.close().unwrap();
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 512) as u8) | 1)
        .collect()
}

fn write(dev: &dyn BlockDevice, off: u64, data: &[u8]) {
    dev.write_at(data, off, false).unwrap();
}

fn read(dev: &dyn BlockDevice, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    dev.read_at(&mut b, off).unwrap();
    b
}

#[test]
fn list_info_and_status_answer_one_shape_for_each_kind() {
    each_kind(|ds| {
        for n in ["b", "a"] {
            ds.create(n, 2 * MIB, Provisioning::Thin, &mut |_, _| {})
                .unwrap();
        }
        let dev = ds.open("a").unwrap();
        write(&*dev, 0, &pattern(1, 4096));
        dev.flush().unwrap();
        ds.snapshot_create("a", "s1", "").unwrap();
        let list = ds.list().unwrap();
        let names: Vec<&str> = list.iter().map(|v| v.info.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "in name order");
        let a = ds.disk_view("a", true).unwrap();
        assert_eq!((a.info.size_bytes, a.info.snapshots), (2 * MIB, 1));
        assert_eq!(a.info.current_snapshot.as_deref(), Some("s1"));
        let st = ds.status().unwrap();
        assert_eq!((st.info.disks, st.info.snapshots), (2, 1));
        assert_eq!(st.info.provisioned_bytes, 4 * MIB);
        // The capability report is the table's.
        let cannot: Vec<&str> = st.cannot.iter().map(|r| r.command.as_str()).collect();
        let table: Vec<&str> = capability::refusals(ds.kind())
            .iter()
            .map(|(c, _)| c.command())
            .collect();
        assert_eq!(cannot, table);
        assert!(st.cannot.iter().all(|r| !r.reason.is_empty()));
        match ds.kind() {
            Kind::Local => {
                assert_eq!(a.info.allocated_bytes, Some(4096));
                assert!(a.object_store.is_none() && st.object_store.is_none());
            }
            Kind::ObjectStore => {
                // The writer is this process, which wrote `a`; `b` was
                // never written, so nobody claimed it.
                let w = a.object_store.as_ref().expect("a writer record");
                assert_eq!(w.owner.as_ref().map(|o| o.pid), Some(std::process::id()));
                assert!(w.generation >= 2 && w.fenced.is_none(), "{w:?}");
                let b = list[1].object_store.as_ref().expect("a writer record");
                assert!(b.owner.is_none(), "{b:?}");
                assert_eq!(a.info.allocated_bytes, None, "known to a GC mark only");
                let summary = st.object_store.expect("the store's summary");
                assert_eq!(summary.disks, ["a", "b"]);
            }
        }
    });
}

#[test]
fn a_disk_reads_back_what_was_written_and_zeros_elsewhere() {
    each_kind(|ds| {
        let info = ds
            .create("d", 4 * MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        assert_eq!(
            (info.info.name.as_str(), info.info.size_bytes),
            ("d", 4 * MIB)
        );
        assert!(ds.exists("d") && !ds.exists("e"));
        let dev = ds.open("d").unwrap();
        assert_eq!(dev.size_bytes(), 4 * MIB);
        write(&*dev, MIB, &pattern(3, 8192));
        dev.flush().unwrap();
        assert_eq!(read(&*dev, MIB, 8192), pattern(3, 8192));
        assert_eq!(read(&*dev, 0, 4096), vec![0; 4096]);
        // One device per disk in a process: a second open sees the writes.
        assert_eq!(read(&*ds.open("d").unwrap(), MIB, 8192), pattern(3, 8192));
        let names: Vec<String> = ds.export_names().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"d".to_string()), "{names:?}");
    });
}

#[test]
fn snapshots_keep_their_instant_and_form_a_tree_parents_first() {
    each_kind(|ds| {
        ds.create("d", 2 * MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let dev = ds.open("d").unwrap();
        write(&*dev, 0, &pattern(1, 4096));
        dev.flush().unwrap();
        let s1 = ds.snapshot_create("d", "s1", "first").unwrap();
        assert_eq!((s1.name.as_str(), s1.description.as_str()), ("s1", "first"));
        write(&*dev, 0, &pattern(2, 4096));
        dev.flush().unwrap();
        ds.snapshot_create("d", "s2", "").unwrap();
        write(&*dev, 0, &pattern(3, 4096));
        dev.flush().unwrap();
        let snaps = ds.snapshots("d").unwrap();
        let names: Vec<&str> = snaps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["s1", "s2"]);
        assert_eq!(snaps[1].parent.as_deref(), Some("s1"));
        assert!(snaps[1].current && !snaps[0].current);
        assert_eq!(read(&*ds.open("d@s1").unwrap(), 0, 4096), pattern(1, 4096));
        assert_eq!(read(&*ds.open("d@s2").unwrap(), 0, 4096), pattern(2, 4096));
        // Revert makes the head the snapshot again; delete leaves the rest.
        ds.snapshot_revert("d", "s1").unwrap();
        let dev = ds.open("d").unwrap();
        assert_eq!(read(&*dev, 0, 4096), pattern(1, 4096));
        assert_eq!(
            ds.disk_info("d").unwrap().current_snapshot.as_deref(),
            Some("s1")
        );
        ds.snapshot_delete("d", "s2").unwrap();
        let names: Vec<String> = ds
            .snapshots("d")
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["s1"]);
        assert!(ds.open("d@s2").is_err());
    });
}

#[test]
fn a_snapshot_id_is_never_given_again_even_to_a_reused_name() {
    each_kind(|ds| {
        ds.create("d", MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let first = ds.snapshot_create("d", "s", "").unwrap().id;
        let t = ds.snapshot_create("d", "t", "").unwrap().id;
        ds.snapshot_delete("d", "t").unwrap();
        ds.snapshot_delete("d", "s").unwrap();
        let again = ds.snapshot_create("d", "s", "").unwrap().id;
        assert!(again != first && again != t, "{first} {t} {again}");
        let listed: Vec<u64> = ds.snapshots("d").unwrap().iter().map(|s| s.id).collect();
        assert_eq!(listed, [again]);
    });
}

#[test]
fn changed_ranges_cover_every_write_between_two_versions() {
    each_kind(|ds| {
        ds.create("d", 8 * MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let dev = ds.open("d").unwrap();
        write(&*dev, 0, &pattern(1, 64 * 1024));
        dev.flush().unwrap();
        ds.snapshot_create("d", "a", "").unwrap();
        write(&*dev, 3 * MIB, &pattern(2, 4096));
        write(&*dev, 6 * MIB + 8192, &pattern(4, 8192));
        dev.flush().unwrap();
        ds.snapshot_create("d", "b", "").unwrap();
        // Exact at the grain (4 KiB) on both kinds: the two maps walked
        // together.
        let range = |offset, len, mapped| ChangedRange {
            offset,
            len,
            mapped,
        };
        assert_eq!(
            ds.changed_ranges(Some("d@a"), "d@b").unwrap(),
            [
                range(3 * MIB, 4096, true),
                range(6 * MIB + 8192, 8192, true)
            ]
        );
        // From nothing: the first snapshot's data.
        assert_eq!(
            ds.changed_ranges(None, "d@a").unwrap(),
            [range(0, 64 * 1024, true)]
        );
        assert_eq!(ds.changed_ranges(Some("d@b"), "d@b").unwrap(), vec![]);
        // A trim, zeros written over data, and data, none flushed yet:
        // the head against b sees them (zeros as unmapped).
        dev.unmap(0, 4096).unwrap();
        let zeros = ZeroOptions {
            may_unmap: true,
            fast_only: false,
            fua: false,
        };
        dev.write_zeroes(3 * MIB, 4096, zeros).unwrap();
        write(&*dev, 7 * MIB, &pattern(5, 4096));
        let want = [
            range(0, 4096, false),
            range(3 * MIB, 4096, false),
            range(7 * MIB, 4096, true),
        ];
        assert_eq!(ds.changed_ranges(Some("d@b"), "d").unwrap(), want);
        dev.flush().unwrap();
        assert_eq!(ds.changed_ranges(Some("d@b"), "d").unwrap(), want);
        // Extended: what is written past the old end counts; the other
        // way round, what b lacks.
        ds.extend("d", 2 << 30).unwrap();
        let big = ds.open("d").unwrap();
        write(&*big, (1 << 30) + 4096, &pattern(6, 4096));
        big.flush().unwrap();
        let mut more = want.to_vec();
        more.push(range((1 << 30) + 4096, 4096, true));
        assert_eq!(ds.changed_ranges(Some("d@b"), "d").unwrap(), more);
        ds.snapshot_create("d", "c", "").unwrap();
        assert_eq!(
            ds.changed_ranges(Some("d@c"), "d@b").unwrap(),
            [
                range(0, 4096, true),
                range(3 * MIB, 4096, true),
                range(7 * MIB, 4096, false)
            ]
        );
    });
}

#[test]
fn a_linked_clone_shares_the_snapshot_and_diverges_alone() {
    each_kind(|ds| {
        ds.create("gold", 2 * MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let dev = ds.open("gold").unwrap();
        write(&*dev, 4096, &pattern(7, 4096));
        dev.flush().unwrap();
        ds.snapshot_create("gold", "base", "").unwrap();
        let c = ds.clone_linked("gold@base", "vm1").unwrap();
        assert_eq!(c.info.size_bytes, 2 * MIB);
        let vm = ds.open("vm1").unwrap();
        assert_eq!(read(&*vm, 4096, 4096), pattern(7, 4096));
        write(&*vm, 4096, &pattern(9, 4096));
        vm.flush().unwrap();
        assert_eq!(
            read(&*ds.open("gold@base").unwrap(), 4096, 4096),
            pattern(7, 4096)
        );
        ds.remove("vm1").unwrap();
        assert!(!ds.exists("vm1"));
        assert_eq!(
            ds.open("vm1").err().map(|e| e.kind),
            Some(ErrorKind::NotFound)
        );
    });
}

#[test]
fn what_a_kind_cannot_do_is_refused_from_its_table() {
    each_kind(|ds| {
        let thick = ds.create("t", MIB, Provisioning::Zeroedthick, &mut |_, _| {});
        match capability::refusal(ds.kind(), Capability::Thick) {
            None => assert_eq!(thick.unwrap().info.provisioning, Provisioning::Zeroedthick),
            Some(why) => {
                let e = thick.unwrap_err();
                assert_eq!(e.kind, ErrorKind::Unsupported);
                assert!(e.message.contains(why), "{}", e.message);
                assert!(!ds.exists("t"));
            }
        }
        for cap in [Capability::Claims, Capability::Gc, Capability::Convert] {
            let r = ds.supports(cap);
            assert_eq!(r.is_ok(), capability::refusal(ds.kind(), cap).is_none());
        }
    });
}

#[test]
fn missing_disks_and_snapshots_are_named_errors() {
    each_kind(|ds| {
        let e = ds.open("nope").err().expect("no such disk");
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.contains("nope"), "{}", e.message);
        ds.create("d", MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let e = ds.open("d@nope").err().expect("no such snapshot");
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.contains("nope"), "{}", e.message);
        let e = ds
            .create("d", MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::AlreadyExists);
    });
}

/// An extend reaches a device already open, keeps what the disk held, and
/// the space past the old size reads zeros until written (on an object
/// store the map grows a level with that first write: FORMAT.md §11.5).
#[test]
fn an_extended_disk_grows_under_an_open_device_and_keeps_its_data() {
    each_kind(|ds| {
        ds.create("d", MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let dev = ds.open("d").unwrap();
        write(&*dev, 4096, &pattern(5, 8192));
        dev.flush().unwrap();
        ds.snapshot_create("d", "small", "").unwrap();
        let e = ds.extend("d", MIB / 2).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{}", e.message);
        assert!(ds.extend("d@small", 2 * MIB).is_err());
        // 600 MiB needs a map one level deeper than 1 MiB on both kinds.
        let size = 600 * MIB;
        assert_eq!(ds.extend("d", size).unwrap().info.size_bytes, size);
        assert_eq!(ds.disk_info("d").unwrap().size_bytes, size);
        assert_eq!(dev.size_bytes(), size);
        assert_eq!(read(&*dev, size - 8192, 8192), vec![0u8; 8192]);
        write(&*dev, size - 8192, &pattern(7, 8192));
        write(&*dev, 300 * MIB, &pattern(9, 4096));
        dev.flush().unwrap();
        assert_eq!(read(&*dev, 4096, 8192), pattern(5, 8192));
        ds.snapshot_create("d", "big", "").unwrap();
        // Snapshots read what was committed, through their own handles.
        let big = ds.open("d@big").unwrap();
        assert_eq!(big.size_bytes(), size);
        assert_eq!(read(&*big, 4096, 8192), pattern(5, 8192));
        assert_eq!(read(&*big, size - 8192, 8192), pattern(7, 8192));
        assert_eq!(read(&*big, 300 * MIB, 4096), pattern(9, 4096));
        assert_eq!(read(&*big, 100 * MIB, 4096), vec![0u8; 4096]);
        let small = ds.open("d@small").unwrap();
        assert_eq!(small.size_bytes(), MIB);
        assert_eq!(read(&*small, 4096, 8192), pattern(5, 8192));
    });
}

/// A kind is written by its name and read by it or by the name placement
/// files of earlier builds gave an object store ("shared").
#[test]
fn kinds_are_written_by_name_and_read_by_their_old_one() {
    assert_eq!(
        serde_json::to_string(&Kind::ObjectStore).unwrap(),
        "\"object-store\""
    );
    assert_eq!(serde_json::to_string(&Kind::Local).unwrap(), "\"local\"");
    for name in ["\"object-store\"", "\"shared\""] {
        assert_eq!(
            serde_json::from_str::<Kind>(name).unwrap(),
            Kind::ObjectStore
        );
    }
    assert!(serde_json::from_str::<Kind>("\"remote\"").is_err());
}

/// The collecting gc runs of one process (a user's `strata gc` sent to a
/// server, and the server's background run) take turns: neither is
/// fenced by the other's claim, and each deletes what it found
/// (FORMAT.md §11.7).
#[test]
fn one_process_gc_runs_take_turns_instead_of_fencing_each_other() {
    let d = tempfile::tempdir().unwrap();
    let Some(ds) = object_store(d.path()) else {
        return;
    };
    ds.create("d", 4 * MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let dev = ds.open("d").unwrap();
    write(&*dev, 0, &pattern(1, 65536));
    dev.flush().unwrap();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    (0..4)
                        .map(|_| ds.collect_garbage(false))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for run in runs {
            for r in run.join().unwrap() {
                let r = r.expect("a gc run of this process is never fenced by another");
                assert!(r.claim.is_some(), "{r:?}");
            }
        }
    });
    drop(dev);
    ds.close().unwrap();
}
