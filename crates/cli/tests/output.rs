//! How answers print: every `Response` renders for people and as JSON,
//! a decoded answer prints as the local one, and the shapes scripts parse
//! keep their field names (the CLI's `output` module, through its library
//! target).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use serde_json::{json, Value};
use strata_api::store::{CheckReport as StoreCheckReport, Summary};
use strata_api::{
    AlarmEntry, AlarmState, AlarmStatus, CheckReport, DatastoreInfo, DatastoreView, DefragReport,
    DiskView, ExportReport, ExportStats, ExportedLink, FailStop, ImageFormat, ImportReport,
    Provisioning, Response, SnapshotInfo, VmdkServerStatus,
};
use strata_cli::output::*;

fn disk_info() -> DiskView {
    strata_api::DiskInfo {
        name: "vm".into(),
        size_bytes: 64 << 20,
        provisioning: Provisioning::Zeroedthick,
        allocated_bytes: Some(1 << 20),
        nb: Some(64),
        tbz: Some(63),
        snapshots: 2,
        current_snapshot: Some("base".into()),
        parent: None,
        parent_deleted: false,
        created_unix: Some(1_700_000_000),
        exclusive_bytes: Some(1 << 20),
        snapshot_space_bytes: Some(512 << 10),
        fragments: Some(3),
        packed_bytes: Some(0),
        limits: Default::default(),
        encryption: None,
    }
    .into()
}

/// A disk of an object store, as `list` answers it.
fn store_disk() -> DiskView {
    serde_json::from_value(json!({
        "name": "db", "size_bytes": 1u64 << 30, "provisioning": "thin", "snapshots": 1,
        "current_snapshot": "s1", "parent": null,
        "object_store": { "id": "0000002a", "generation": 3,
            "owner": { "host": "h1", "name": "alpha", "pid": 42 },
            "manifest": "disks/0000002a/m/0000000000000007", "written_ms": 1_700_000_000_000u64 }
    }))
    .unwrap()
}

fn store_summary() -> Summary {
    let me = json!({ "host": "h1", "name": "alpha" });
    serde_json::from_value(json!({
        "url": "s3://bucket/ds", "endpoint": "http://127.0.0.1:8333", "local_dir": "/srv/ds",
        "me": me, "disks": ["db"], "disk_objects": 5, "disk_bytes": 3u64 << 20, "probe": null,
        "root": { "format": 1, "uuid": "u-1", "created_ms": 1_700_000_000_000u64,
            "created_by": me, "grain_bytes": 4096, "map_fanout": 256,
            "segment_max_bytes": 8u64 << 20 }
    }))
    .unwrap()
}

fn snapshot(name: &str, parent: Option<&str>, current: bool) -> SnapshotInfo {
    SnapshotInfo {
        id: 7,
        name: name.into(),
        description: if parent.is_none() {
            "first".into()
        } else {
            String::new()
        },
        created_unix: 1_700_000_000,
        parent: parent.map(Into::into),
        size_bytes: 64 << 20,
        mapped_bytes: Some(2 << 20),
        exclusive_bytes: Some(1 << 20),
        current,
        group: None,
    }
}

/// Every kind of answer, as a server would send it.
fn every_response() -> Vec<Response> {
    let registry = strata_stats::StatsRegistry::new();
    registry.get_or_create("vm");
    vec![
        Response::Datastore(DatastoreView {
            object_store: None,
            cannot: vec![],
            clients: vec![],
            info: DatastoreInfo {
                location: "/ds".into(),
                capacity_bytes: 1 << 30,
                used_bytes: 1 << 20,
                logical_bytes: Some(4 << 20),
                reserved_bytes: 0,
                reserved_held_bytes: 0,
                readied_bytes: 0,
                free_bytes: (1 << 30) - (1 << 20),
                provisioned_bytes: 64 << 20,
                overcommit_percent: 6,
                capacity_follows_fs: false,
                used_percent: 0,
                alarms: vec![AlarmStatus {
                    kind: strata_api::AlarmKind::Usage,
                    state: AlarmState::Warning,
                    percent: 80,
                    warning_percent: 75,
                    alarm_percent: 85,
                }],
                disks: 1,
                snapshots: 2,
                metadata_cache_bytes: 128 << 20,
                cache_mode: "writeback".into(),
                reclaiming: 1,
                fail_stop: Some(FailStop {
                    cause: "write error".into(),
                    since_unix: 1_700_000_000,
                }),
                checkpoints: 3,
                layout: Some(strata_api::PoolLayout {
                    free_extents: 2,
                    free_extent_histogram: [("4k".to_string(), 1), ("16m+".to_string(), 1)]
                        .into_iter()
                        .collect(),
                    free_in_pool_bytes: (16 << 20) + 4096,
                    pool_bytes: 64 << 20,
                    pool_file_bytes: 48 << 20,
                }),
            },
        }),
        Response::Disks(vec![disk_info()]),
        Response::Disk(disk_info()),
        Response::Removed { name: "vm".into() },
        Response::SnapshotCreated {
            disk: "vm".into(),
            snapshot: snapshot("base", None, true),
        },
        Response::Snapshots(vec![
            snapshot("base", None, false),
            snapshot("two", Some("base"), true),
        ]),
        Response::SnapshotDeleted {
            disk: "vm".into(),
            snapshot: "two".into(),
        },
        Response::Check(CheckReport {
            errors: vec!["grain 7 leaked".into()],
            leaked_grains: 1,
            ..CheckReport::default()
        }),
        Response::Stats(
            registry
                .snapshot_all()
                .into_iter()
                .map(|(export, stats)| ExportStats { export, stats })
                .collect(),
        ),
        Response::Import(ImportReport {
            disk: disk_info(),
            format: ImageFormat::Raw,
            links: None,
            snapshots: vec![],
            base: None,
        }),
        Response::Export(ExportReport {
            target: "vm@base".into(),
            open: "/out/a.vmdk".into(),
            links: vec![ExportedLink {
                file: "/out/a.vmdk".into(),
                version: "vm@base".into(),
                subformat: "monolithicSparse".into(),
            }],
        }),
        Response::VmdkServer(VmdkServerStatus {
            server: "strata serve --vmdk".into(),
            pid: 42,
            export: "a".into(),
            file: "/v/a.vmdk".into(),
            read_only: false,
        }),
        Response::Alarms(vec![AlarmEntry {
            status: AlarmStatus {
                kind: strata_api::AlarmKind::Overcommit,
                state: AlarmState::Alarm,
                percent: 250,
                warning_percent: 100,
                alarm_percent: 200,
            },
            exec: Some("logger \"$STRATA_ALARM_STATE\"".into()),
        }]),
        // An object store's answers.
        Response::Disks(vec![store_disk()]),
        Response::Disk(store_disk()),
        Response::Datastore(
            serde_json::from_value(json!({
                "location": "s3://bucket/ds", "capacity_bytes": 0, "used_bytes": 3u64 << 20,
                "reserved_bytes": 0, "reserved_held_bytes": 0, "readied_bytes": 0, "free_bytes": 0,
                "provisioned_bytes": 1u64 << 30, "overcommit_percent": 0, "used_percent": 0,
                "alarms": [], "disks": 1, "snapshots": 1, "metadata_cache_bytes": 0,
                "cache_mode": "", "reclaiming": 0, "fail_stop": null, "checkpoints": 0,
                "object_store": store_summary(),
                "cannot": [{ "command": "convert", "reason": "thin is all there is" }]
            }))
            .unwrap(),
        ),
        Response::Joined {
            attached: true,
            summary: store_summary(),
        },
        Response::Claimed(store_disk()),
        Response::Released(store_disk()),
        Response::StoreCheck(StoreCheckReport {
            disks: 1,
            snapshots: 1,
            holds: 0,
            nodes: 3,
            grains: 10,
            errors: vec!["db: grain 3 of segment x: checksum".into()],
        }),
        Response::Gc(
            serde_json::from_value(json!({
                "dry_run": true, "claim": null, "stored_bytes": 3u64 << 20, "segments": 2,
                "live_bytes": 2u64 << 20, "garbage_segments": 1, "garbage_bytes": 1u64 << 20,
                "in_flight_segments": 0, "deleted_segments": 0, "deleted_manifests": 0,
                "holds": 0, "ms": 12, "disks": [{ "name": "db", "id": "0000002a",
                    "exclusive_bytes": 2u64 << 20, "referenced_bytes": 2u64 << 20 }]
            }))
            .unwrap(),
        ),
        Response::Defrag(DefragReport {
            disk: "vm".into(),
            dry_run: false,
            fragments_before: 4093,
            fragments_after: 2,
            mapped_bytes: 16 << 20,
            moved_bytes: 16 << 20,
            regions_moved: 16,
            regions_skipped: 1,
            grains_kept: 0,
        }),
        Response::Groups(vec![strata_api::GroupInfo {
            name: "vm1".into(),
            disks: vec!["vm1-os".into(), "vm1-data".into()],
            created_unix: 1_700_000_000,
            quiesce_hook: Some("/usr/local/bin/freeze dom1".into()),
            quiesce_timeout_s: Some(30),
            snapshots: 1,
        }]),
        Response::GroupSnapshotCreated(strata_api::GroupSnapshotReport {
            snapshot: strata_api::GroupSnapshotInfo {
                group: "vm1".into(),
                name: "nightly".into(),
                id: 17,
                description: String::new(),
                created_unix: 1_700_000_000,
                ready_to_use: true,
                consistency: strata_api::Consistency::Application,
                quiesce: Some(strata_api::QuiesceReport {
                    hook: "/usr/local/bin/freeze dom1".into(),
                    result: strata_api::QuiesceResult::Ok,
                    duration_ms: 812,
                    error: None,
                }),
                pause_us: 640,
                members: vec![strata_api::GroupMemberInfo {
                    disk: "vm1-os".into(),
                    snapshot: "nightly".into(),
                    id: 15,
                    size_bytes: 64 << 20,
                    exclusive_bytes: Some(4096),
                }],
                exclusive_bytes: Some(8192),
            },
            unquiesce: None,
        }),
    ]
}

#[test]
fn alarms_list_flat_with_their_command_and_show_states_in_capitals() {
    let r = every_response()
        .into_iter()
        .find(|r| matches!(r, Response::Alarms(_)))
        .unwrap();
    assert_eq!(
        r.json(),
        json!([{ "kind": "overcommit", "state": "alarm", "percent": 250,
                 "warning_percent": 100, "alarm_percent": 200,
                 "exec": "logger \"$STRATA_ALARM_STATE\"" }])
    );
    let text = render(&r, Format::Human);
    assert!(
        text.contains("overcommit") && text.contains("ALARM"),
        "{text}"
    );
    let status = render(&every_response()[0], Format::Human);
    assert!(
        status.contains("usage alarm:") && status.contains("WARNING"),
        "{status}"
    );
}

#[test]
fn an_answer_decoded_from_the_wire_prints_the_same_as_the_local_one() {
    for r in every_response() {
        let wire = serde_json::to_string(&r).unwrap();
        let back: Response = serde_json::from_str(&wire).unwrap();
        for f in [Format::Human, Format::Json] {
            assert_eq!(render(&back, f), render(&r, f), "{wire}");
        }
    }
}

#[test]
fn a_disk_prints_as_it_always_has() {
    assert_eq!(
        render(&Response::Disk(disk_info()), Format::Human),
        "name:            vm\n\
         size:            64 MiB (67108864 bytes)\n\
         provisioning:    zeroedthick\n\
         allocated:       1 MiB (1048576 bytes)\n\
         nb / tbz:        64 / 63 (1 MiB blocks)\n\
         fragments:       3 (1 = laid out in one run; 'strata defrag' lays it out)\n\
         exclusive:       1 MiB (1048576 bytes, freed by rm)\n\
         snapshots:       2\n\
         snapshot space:  512 KiB (524288 bytes, freed by deleting every snapshot)\n\
         current snapshot: base\n\
         parent:          -\n"
    );
}

#[test]
fn snapshots_print_as_a_tree_marking_the_live_state() {
    let r = Response::Snapshots(vec![
        snapshot("base", None, false),
        snapshot("two", Some("base"), true),
    ]);
    assert_eq!(
        render(&r, Format::Human),
        "base  (2 MiB, 1 MiB exclusive, first)\n  two  (2 MiB, 1 MiB exclusive)  <- you are here\n"
    );
}

#[test]
fn json_is_the_payload_with_todays_field_names() {
    let v = |r: Response| r.json();
    assert_eq!(
        v(Response::Removed { name: "vm".into() }),
        json!({ "removed": "vm" })
    );
    assert_eq!(
        v(Response::SnapshotDeleted {
            disk: "vm".into(),
            snapshot: "two".into()
        }),
        json!({ "deleted": "vm@two" })
    );
    let d = v(Response::Disk(disk_info()));
    assert_eq!(d["size_bytes"], 64 << 20);
    assert_eq!(d["provisioning"], "zeroedthick");
    assert_eq!(d["parent"], Value::Null);
    assert_eq!(d["exclusive_bytes"], 1 << 20);
    assert_eq!(d["snapshot_space_bytes"], 512 << 10);
    let s = v(every_response().remove(8));
    assert_eq!(s["vm"]["read"]["commands"], 0, "{s}");
    let i = v(every_response().remove(9));
    assert_eq!(i["format"], "raw");
    assert!(i.get("links").is_none(), "links are for VMDK imports only");
    let c = v(every_response().remove(7));
    assert_eq!(c["errors"][0], "grain 7 leaked");
    assert_eq!(d["fragments"], 3);
    // The pool's layout sits next to used_bytes, not under a key.
    let st = v(every_response().remove(0));
    assert_eq!(st["free_extents"], 2, "{st}");
    assert_eq!(st["free_extent_histogram"]["4k"], 1, "{st}");
    assert_eq!(st["pool_file_bytes"], 48 << 20, "{st}");
}

#[test]
fn group_answers_print_for_people() {
    let all = every_response();
    let find = |f: fn(&Response) -> bool| render(all.iter().find(|r| f(r)).unwrap(), Format::Human);
    assert_eq!(
        find(|r| matches!(r, Response::Groups(_))),
        "vm1  2 disk(s): vm1-os, vm1-data  1 snapshot(s)  hook: /usr/local/bin/freeze dom1 \
         (timeout 30 s)\n"
    );
    assert_eq!(
        find(|r| matches!(r, Response::GroupSnapshotCreated(_))),
        "created group snapshot vm1@nightly on 1 disk(s): application consistent, I/O held \
         640 µs\n"
    );
}

#[test]
fn defrag_and_the_pool_layout_print_for_people() {
    let r = every_response()
        .into_iter()
        .find(|r| matches!(r, Response::Defrag(_)))
        .unwrap();
    assert_eq!(
        render(&r, Format::Human),
        "vm: 4093 -> 2 fragments; moved 16 MiB in 16 regions of 1 MiB\n\
         1 regions left as they were: free space lies in short runs\n"
    );
    let status = render(&every_response()[0], Format::Human);
    assert!(
        status.contains("pool:         64 MiB (16 MiB free in 2 extents), 48 MiB on the host")
            && status.contains("free extents: 4k 1, 16m+ 1"),
        "{status}"
    );
}

#[test]
fn an_object_store_disk_shows_its_writer_and_no_allocation_it_does_not_know() {
    let list = render(&Response::Disks(vec![store_disk()]), Format::Human);
    assert_eq!(
        list,
        "NAME                           SIZE TYPE               ALLOCATED SNAPS  PARENT            GEN  WRITER\n\
         db                            1 GiB thin                       -     1  -                   3  alpha (host h1, pid 42)\n",
    );
    let info = render(&Response::Disk(store_disk()), Format::Human);
    assert!(!info.contains("nb / tbz"), "{info}");
    assert!(
        info.contains("writer:          alpha (host h1, pid 42)"),
        "{info}"
    );
    let j = Response::Disk(store_disk()).json();
    assert!(j.get("allocated_bytes").is_none(), "{j}");
    assert_eq!(j["object_store"]["owner"]["pid"], 42, "{j}");
    assert_eq!(j["object_store"]["generation"], 3, "{j}");
    assert_eq!(j["snapshots"], 1, "a count, as for a local disk: {j}");
    // A local disk's JSON has no such key.
    assert!(Response::Disk(disk_info())
        .json()
        .get("object_store")
        .is_none());
    let status = every_response()
        .into_iter()
        .find(|r| matches!(r, Response::Datastore(v) if v.object_store.is_some()))
        .unwrap();
    let text = render(&status, Format::Human);
    assert!(text.contains("capacity:     none set"), "{text}");
    assert!(
        text.ends_with("not on this kind: convert ('strata status --json' says why)\n"),
        "{text}"
    );
    assert_eq!(status.json()["cannot"][0]["reason"], "thin is all there is");
    assert_eq!(status.json()["object_store"]["url"], "s3://bucket/ds");
    assert_eq!(status.json()["provisioned_bytes"], 1 << 30);
}

#[test]
fn a_claim_made_without_a_server_shows_the_host_as_the_writer() {
    let mut v = store_disk();
    v.object_store.as_mut().unwrap().owner.as_mut().unwrap().pid = 0;
    let info = render(&Response::Disk(v.clone()), Format::Human);
    assert!(
        info.contains(
            "writer:          alpha (host h1, no process: claimed with no server running; its \
             next server writes it)"
        ),
        "{info}"
    );
    assert_eq!(
        render(&Response::Claimed(v), Format::Human),
        "claimed disk db: this host (alpha) is its writer, generation 3 (no server runs here: \
         the claim is the host's, and its next server writes the disk)\n"
    );
}

#[test]
fn a_check_with_problems_fails_the_command() {
    assert!(every_response()[7].found_problems());
    assert!(!Response::Check(CheckReport::default()).found_problems());
    assert!(every_response()
        .iter()
        .any(|r| matches!(r, Response::StoreCheck(_)) && r.found_problems()));
}
