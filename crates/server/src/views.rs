//! The datastore's answers in strata-api's types.
//!
//! strata-datastore's views (`DiskView`, `DatastoreView`) and
//! strata-objstore's reports (the store's `Summary`, `gc`, `check`,
//! `compact`) are, for now, types of their own with the fields and serde
//! shapes of strata-api's ([`strata_api::view`], [`strata_api::store`]).
//! Every such answer crosses into the API here, on its way into a
//! [`strata_api::Response`]: each conversion takes its value apart field by
//! field, so a field added on one side and not the other does not compile.
//! Once those crates answer in strata-api's types, this module goes.

use strata_api::{store, view};

/// A value of the datastore's, as strata-api's type of the same shape.
pub(crate) trait Api {
    type Out;
    fn api(self) -> Self::Out;
}

impl<T: Api> Api for Vec<T> {
    type Out = Vec<T::Out>;
    fn api(self) -> Self::Out {
        self.into_iter().map(Api::api).collect()
    }
}

impl<T: Api> Api for Option<T> {
    type Out = Option<T::Out>;
    fn api(self) -> Self::Out {
        self.map(Api::api)
    }
}

impl<T: Api> Api for Box<T> {
    type Out = Box<T::Out>;
    fn api(self) -> Self::Out {
        Box::new((*self).api())
    }
}

impl Api for strata_datastore::DiskView {
    type Out = view::DiskView;
    fn api(self) -> Self::Out {
        let strata_datastore::DiskView { info, object_store } = self;
        view::DiskView {
            info,
            object_store: object_store.api(),
        }
    }
}

impl Api for strata_datastore::StoreDisk {
    type Out = view::StoreDisk;
    fn api(self) -> Self::Out {
        let strata_datastore::StoreDisk {
            id,
            generation,
            owner,
            manifest,
            written_ms,
            fenced,
        } = self;
        view::StoreDisk {
            id,
            generation,
            owner: owner.api(),
            manifest,
            written_ms,
            fenced,
        }
    }
}

impl Api for strata_datastore::DatastoreView {
    type Out = view::DatastoreView;
    fn api(self) -> Self::Out {
        let strata_datastore::DatastoreView {
            info,
            cannot,
            object_store,
        } = self;
        view::DatastoreView {
            info,
            cannot: cannot.api(),
            object_store: object_store.api(),
        }
    }
}

impl Api for strata_datastore::Refusal {
    type Out = view::Refusal;
    fn api(self) -> Self::Out {
        let strata_datastore::Refusal { command, reason } = self;
        view::Refusal { command, reason }
    }
}

impl Api for strata_objstore::layout::Owner {
    type Out = store::Owner;
    fn api(self) -> Self::Out {
        let strata_objstore::layout::Owner { host, name, pid } = self;
        store::Owner { host, name, pid }
    }
}

impl Api for strata_objstore::Summary {
    type Out = store::Summary;
    fn api(self) -> Self::Out {
        let strata_objstore::Summary {
            url,
            endpoint,
            local_dir,
            me,
            root,
            disks,
            disk_objects,
            disk_bytes,
            probe,
            cache,
        } = self;
        store::Summary {
            url,
            endpoint,
            local_dir,
            me: me.api(),
            root: root.api(),
            disks,
            disk_objects,
            disk_bytes,
            probe: probe.api(),
            cache: cache.api(),
        }
    }
}

impl Api for strata_objstore::HostRef {
    type Out = store::HostRef;
    fn api(self) -> Self::Out {
        let strata_objstore::HostRef { host, name } = self;
        store::HostRef { host, name }
    }
}

impl Api for strata_objstore::RootObject {
    type Out = store::RootObject;
    fn api(self) -> Self::Out {
        let strata_objstore::RootObject {
            format,
            uuid,
            created_ms,
            created_by,
            grain_bytes,
            map_fanout,
            segment_max_bytes,
        } = self;
        store::RootObject {
            format,
            uuid,
            created_ms,
            created_by: created_by.api(),
            grain_bytes,
            map_fanout,
            segment_max_bytes,
        }
    }
}

impl Api for strata_objstore::ProbeSummary {
    type Out = store::ProbeSummary;
    fn api(self) -> Self::Out {
        let strata_objstore::ProbeSummary {
            racers,
            accepted,
            ms,
        } = self;
        store::ProbeSummary {
            racers,
            accepted,
            ms,
        }
    }
}

impl Api for strata_objstore::CacheStats {
    type Out = store::CacheStats;
    fn api(self) -> Self::Out {
        let strata_objstore::CacheStats {
            bytes,
            bound_bytes,
            segments,
            hits,
            misses,
            evictions,
            damaged,
            hot_fetched,
            shrunk,
            evicted_kept,
        } = self;
        store::CacheStats {
            bytes,
            bound_bytes,
            segments,
            hits,
            misses,
            evictions,
            damaged,
            hot_fetched,
            shrunk,
            evicted_kept,
        }
    }
}

impl Api for strata_objstore::gc::GcReport {
    type Out = store::GcReport;
    fn api(self) -> Self::Out {
        let strata_objstore::gc::GcReport {
            dry_run,
            claim,
            stored_bytes,
            segments,
            live_bytes,
            garbage_segments,
            garbage_bytes,
            in_flight_segments,
            deleted_segments,
            deleted_manifests,
            disks,
            holds,
            ms,
            live_share,
            sparse_objects,
            sparse_dead_bytes,
        } = self;
        store::GcReport {
            dry_run,
            claim,
            stored_bytes,
            segments,
            live_bytes,
            garbage_segments,
            garbage_bytes,
            in_flight_segments,
            deleted_segments,
            deleted_manifests,
            disks: disks.api(),
            holds,
            ms,
            live_share,
            sparse_objects,
            sparse_dead_bytes,
        }
    }
}

impl Api for strata_objstore::gc::DiskSpace {
    type Out = store::DiskSpace;
    fn api(self) -> Self::Out {
        let strata_objstore::gc::DiskSpace {
            name,
            id,
            exclusive_bytes,
            referenced_bytes,
        } = self;
        store::DiskSpace {
            name,
            id,
            exclusive_bytes,
            referenced_bytes,
        }
    }
}

impl Api for strata_objstore::gc::CheckReport {
    type Out = store::CheckReport;
    fn api(self) -> Self::Out {
        let strata_objstore::gc::CheckReport {
            disks,
            snapshots,
            holds,
            nodes,
            grains,
            errors,
        } = self;
        store::CheckReport {
            disks,
            snapshots,
            holds,
            nodes,
            grains,
            errors,
        }
    }
}

impl Api for strata_objstore::disk::CompactReport {
    type Out = store::CompactReport;
    fn api(self) -> Self::Out {
        let strata_objstore::disk::CompactReport {
            disk,
            dry_run,
            below_pct,
            objects,
            stored_bytes,
            live_bytes,
            candidates,
            candidate_bytes,
            rewritten_grains,
            rewritten_bytes,
            relocated_grains,
            dropped_grains,
            segments,
            emptied_bytes,
            ms,
        } = self;
        store::CompactReport {
            disk,
            dry_run,
            below_pct,
            objects,
            stored_bytes,
            live_bytes,
            candidates,
            candidate_bytes,
            rewritten_grains,
            rewritten_bytes,
            relocated_grains,
            dropped_grains,
            segments,
            emptied_bytes,
            ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde::Serialize;
    use serde_json::{json, Value};

    use super::Api;

    /// `doc` read as the datastore's `T`, then written as `T` and as the
    /// API's type: the same JSON, every field set.
    fn same_json<T>(doc: Value)
    where
        T: Api + Serialize + DeserializeOwned,
        T::Out: Serialize,
    {
        let t: T = serde_json::from_value(doc.clone()).unwrap();
        let theirs = serde_json::to_value(&t).unwrap();
        let ours = serde_json::to_value(t.api()).unwrap();
        assert_eq!(theirs, doc, "the sample names every field");
        assert_eq!(ours, theirs);
    }

    fn host(n: &str) -> Value {
        json!({ "host": format!("h-{n}"), "name": n })
    }

    fn summary() -> Value {
        json!({
            "url": "s3://b/p", "endpoint": "http://127.0.0.1:1", "local_dir": "/d",
            "me": host("me"),
            "root": {
                "format": 1, "uuid": "u", "created_ms": 5, "created_by": host("them"),
                "grain_bytes": 4096, "map_fanout": 512, "segment_max_bytes": 8388608
            },
            "disks": ["a", "b"], "disk_objects": 3, "disk_bytes": 4,
            "probe": { "racers": 8, "accepted": 1, "ms": 2.5 },
            "cache": {
                "bytes": 1, "bound_bytes": 2, "segments": 3, "hits": 4, "misses": 5,
                "evictions": 6, "damaged": 7, "hot_fetched": 8, "shrunk": 9, "evicted_kept": 10
            }
        })
    }

    fn disk() -> Value {
        json!({
            "name": "vm", "size_bytes": 1, "provisioning": "thin", "snapshots": 0,
            "current_snapshot": null, "parent": null,
            "object_store": {
                "id": "0000000a", "generation": 2,
                "owner": { "host": "h", "name": "n", "pid": 7 },
                "manifest": "m", "written_ms": 9, "fenced": "why"
            }
        })
    }

    #[test]
    fn the_store_answers_keep_their_json() {
        same_json::<strata_objstore::Summary>(summary());
        same_json::<strata_datastore::DiskView>(disk());
        same_json::<strata_objstore::gc::GcReport>(json!({
            "dry_run": true, "claim": "gc/1", "stored_bytes": 1, "segments": 2,
            "live_bytes": 3, "garbage_segments": 4, "garbage_bytes": 5,
            "in_flight_segments": 6, "deleted_segments": 7, "deleted_manifests": 8,
            "disks": [{
                "name": "vm", "id": "0000000a", "exclusive_bytes": 1, "referenced_bytes": 2
            }],
            "holds": 9, "ms": 10, "live_share": [1, 2], "sparse_objects": 11,
            "sparse_dead_bytes": 12
        }));
        same_json::<strata_objstore::gc::CheckReport>(json!({
            "disks": 1, "snapshots": 2, "holds": 3, "nodes": 4, "grains": 5,
            "errors": ["e"]
        }));
        same_json::<strata_objstore::disk::CompactReport>(json!({
            "disk": "vm", "dry_run": false, "below_pct": 85, "objects": 1,
            "stored_bytes": 2, "live_bytes": 3, "candidates": 4, "candidate_bytes": 5,
            "rewritten_grains": 6, "rewritten_bytes": 7, "relocated_grains": 8,
            "dropped_grains": 9, "segments": 10, "emptied_bytes": 11, "ms": 12
        }));
    }

    #[test]
    fn a_datastore_view_keeps_its_json() {
        let mut info = serde_json::to_value(strata_api::DatastoreInfo {
            location: "/d".into(),
            capacity_bytes: 1,
            capacity_follows_fs: true,
            used_bytes: 2,
            reserved_bytes: 3,
            reserved_held_bytes: 4,
            readied_bytes: 5,
            free_bytes: 6,
            provisioned_bytes: 7,
            overcommit_percent: 8,
            used_percent: 9,
            alarms: Vec::new(),
            disks: 10,
            snapshots: 11,
            metadata_cache_bytes: 12,
            cache_mode: "none".into(),
            reclaiming: 13,
            fail_stop: None,
            checkpoints: 14,
            layout: None,
        })
        .unwrap();
        info["cannot"] = json!([{ "command": "defrag", "reason": "r" }]);
        info["object_store"] = summary();
        same_json::<strata_datastore::DatastoreView>(info);
    }
}
