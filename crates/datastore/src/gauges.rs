//! A datastore's Prometheus gauges ([`crate::Datastore::gauges`]): its
//! space and alarms, either kind; a local datastore's checkpoints, pool
//! layout and disks; an object store's open disks (upload backlog, writer
//! or fenced, generation, commits, compaction), segment cache, store
//! requests and last garbage collection.

use strata_stats::Gauge;

use crate::{DatastoreInfo, GcReport, ObjectStoreDatastore};

/// A datastore's space and alarms as gauges, either kind.
pub(crate) fn space(i: &DatastoreInfo) -> Vec<Gauge> {
    let overcommit = if i.capacity_bytes == 0 {
        0.0
    } else {
        i.provisioned_bytes as f64 / i.capacity_bytes as f64
    };
    let mut g: Vec<Gauge> = [
        (
            "strata_datastore_capacity_bytes",
            "Bytes the datastore may hold",
            i.capacity_bytes as f64,
        ),
        (
            "strata_datastore_used_bytes",
            "Bytes held by data and map nodes",
            i.used_bytes as f64,
        ),
        (
            "strata_datastore_reserved_bytes",
            "Bytes reserved by thick disks and not yet written",
            i.reserved_bytes as f64,
        ),
        (
            "strata_datastore_provisioned_bytes",
            "Sum of the virtual sizes of all disks",
            i.provisioned_bytes as f64,
        ),
        (
            "strata_datastore_overcommit_ratio",
            "Provisioned bytes over capacity",
            overcommit,
        ),
        (
            "strata_datastore_used_percent",
            "Used plus reserved bytes over capacity, in percent (the usage alarm's figure)",
            i.used_percent as f64,
        ),
    ]
    .into_iter()
    .map(|(name, help, v)| Gauge::new(name, help, v))
    .collect();
    if let Some(logical) = i.logical_bytes {
        g.push(Gauge::new(
            "strata_datastore_logical_bytes",
            "Mapped bytes of every disk and snapshot, as if nothing were shared",
            logical as f64,
        ));
    }
    g.extend(i.alarms.iter().flat_map(alarm));
    g
}

/// One alarm's state and thresholds, labelled with its kind.
fn alarm(a: &strata_api::alarm::AlarmStatus) -> Vec<Gauge> {
    [
        (
            "strata_alarm_state",
            "State of the datastore alarm: 0 ok, 1 warning, 2 alarm (strata alarm list)",
            f64::from(a.state.level()),
        ),
        (
            "strata_alarm_percent",
            "The figure the alarm watches, in percent",
            a.percent as f64,
        ),
        (
            "strata_alarm_warning_percent",
            "The alarm's warning threshold, in percent",
            a.warning_percent as f64,
        ),
        (
            "strata_alarm_alarm_percent",
            "The alarm's alarm threshold, in percent",
            a.alarm_percent as f64,
        ),
    ]
    .into_iter()
    .map(|(name, help, v)| Gauge::new(name, help, v).label("kind", a.kind.as_str()))
    .collect()
}

/// What only a local datastore measures: its checkpoints and fail-stop,
/// its pool's layout and each disk's figures.
pub(crate) fn local(ds: &strata_engine::Datastore, i: &DatastoreInfo) -> Vec<Gauge> {
    let mut g = vec![
        Gauge::new(
            "strata_datastore_checkpoints",
            "Checkpoints completed since the datastore was opened",
            i.checkpoints as f64,
        ),
        Gauge::new(
            "strata_datastore_fail_stopped",
            "1 when the datastore stopped accepting writes after an error (see strata status)",
            if i.fail_stop.is_some() { 1.0 } else { 0.0 },
        ),
    ];
    // The pool's layout and each disk's fragments are walked in bounded
    // steps (docs/FORMAT.md §10.1); a scrape pays for them, the I/O path
    // waits for one step at most.
    if let Ok(l) = ds.pool_layout() {
        g.push(Gauge::new(
            "strata_datastore_pool_file_bytes",
            "Bytes pool.data occupies on the host file system (allocated blocks)",
            l.pool_file_bytes as f64,
        ));
        g.push(Gauge::new(
            "strata_datastore_free_extents",
            "Runs of free grains below the pool end",
            l.free_extents as f64,
        ));
        for (class, _) in strata_engine::layout::FREE_EXTENT_CLASSES {
            g.push(
                Gauge::new(
                    "strata_datastore_free_extents_by_size",
                    "Runs of free grains below the pool end, by run length",
                    l.free_extent_histogram.get(class).copied().unwrap_or(0) as f64,
                )
                .label("size", class),
            );
        }
    }
    for d in ds.list_disks() {
        g.extend(local_disk(ds, &d));
    }
    g
}

/// The metrics of the disks this process has open in an object store, of
/// its cache and store requests, and of its last GC.
pub(crate) fn object_store(store: &ObjectStoreDatastore) -> Vec<Gauge> {
    let mut out = Vec::new();
    for (name, d) in store.handles() {
        out.extend(open_disk(&name, &d));
    }
    out.extend(store_requests(store));
    out.extend(cache(store));
    if let Some(r) = &store.last_gc() {
        out.extend(last_gc(r));
    }
    out
}

/// One open disk's upload backlog, ownership, commits and compaction.
fn open_disk(name: &str, d: &strata_objstore::ObjectDisk) -> Vec<Gauge> {
    let m = d.manifest();
    let (writer, fenced) = d.ownership();
    let c = d.commit_stats();
    [
        (
            "strata_shared_unflushed_bytes",
            "Bytes acknowledged to clients and not yet in the object store (the upload backlog)",
            d.unflushed_bytes() as f64,
        ),
        (
            "strata_shared_writer",
            "1 if this server is the disk's writer (its generation is the newest)",
            f64::from(u8::from(writer && fenced.is_none())),
        ),
        (
            "strata_shared_fenced",
            "1 if another host claimed the disk from this server",
            f64::from(u8::from(fenced.is_some())),
        ),
        (
            "strata_shared_generation",
            "The disk's generation in the newest manifest this server knows",
            f64::from(m.generation),
        ),
        (
            "strata_shared_manifest_seq",
            "Sequence number of that manifest",
            m.seq as f64,
        ),
        (
            "strata_shared_commits_total",
            "FLUSHes that uploaded a segment and committed a manifest",
            c.commits as f64,
        ),
        (
            "strata_shared_commits_pipelined_total",
            "Commits issued while the one before them was still in flight (FORMAT.md §11.4b)",
            c.pipelined as f64,
        ),
        (
            "strata_shared_commit_failures_total",
            "Commits that failed (store unavailable, or fenced)",
            c.failed as f64,
        ),
        (
            "strata_shared_commit_seconds_total",
            "Time spent in successful commits",
            c.seconds_total,
        ),
        (
            "strata_shared_commit_seconds_max",
            "The longest successful commit",
            c.seconds_max,
        ),
        (
            "strata_shared_uploaded_bytes_total",
            "Bytes of segments uploaded",
            c.uploaded_bytes as f64,
        ),
    ]
    .into_iter()
    .chain(compaction(d))
    .map(|(n, h, v)| Gauge::new(n, h, v).label("disk", name))
    .collect()
}

/// What compaction did to an open disk: (name, help, value).
fn compaction(d: &strata_objstore::ObjectDisk) -> [(&'static str, &'static str, f64); 5] {
    let k = d.compact_stats();
    [
        (
            "strata_shared_client_bytes_total",
            "Bytes of grains clients wrote to the disk through this server",
            d.client_bytes() as f64,
        ),
        (
            "strata_shared_compact_passes_total",
            "Compaction passes run on the disk (FORMAT.md §11.7a)",
            k.passes as f64,
        ),
        (
            "strata_shared_compact_rewritten_bytes_total",
            "Bytes of live grains compaction rewrote (its write amplification over client bytes)",
            k.rewritten_bytes as f64,
        ),
        (
            "strata_shared_compact_dropped_grains_total",
            "Rewritten grains a client wrote again before their move was committed",
            k.dropped_grains as f64,
        ),
        (
            "strata_shared_compact_emptied_bytes_total",
            "Bytes of objects compaction emptied for GC to free",
            k.emptied_bytes as f64,
        ),
    ]
}

/// This process's requests to the object store, by kind.
fn store_requests(store: &ObjectStoreDatastore) -> Vec<Gauge> {
    let mut out = Vec::new();
    let r = store.shared().store_requests();
    for (op, v) in [
        ("put", r.puts),
        ("create", r.creates),
        ("get", r.gets),
        ("range_get", r.range_gets),
        ("head", r.heads),
        ("list", r.lists),
        ("delete", r.deletes),
    ] {
        out.push(
            Gauge::new(
                "strata_shared_store_requests_total",
                "Requests this server made to the object store, by kind (a retried one counts once)",
                v as f64,
            )
            .label("op", op),
        );
    }
    out
}

/// This host's segment cache.
fn cache(store: &ObjectStoreDatastore) -> Vec<Gauge> {
    let mut out = Vec::new();
    let c = store.shared().cache_stats();
    for (n, h, v) in [
        (
            "strata_shared_cache_bytes",
            "Bytes of segments this host's cache holds",
            c.bytes,
        ),
        (
            "strata_shared_cache_bound_bytes",
            "The cache's bound (--store-cache)",
            c.bound_bytes,
        ),
        (
            "strata_shared_cache_segments",
            "Segments this host's cache holds",
            c.segments,
        ),
        (
            "strata_shared_cache_hits_total",
            "Grain and map-node reads a cached segment served",
            c.hits,
        ),
        (
            "strata_shared_cache_misses_total",
            "Grain and map-node reads that went to the store",
            c.misses,
        ),
        (
            "strata_shared_cache_evictions_total",
            "Cached segments deleted to stay within the bound",
            c.evictions,
        ),
        (
            "strata_shared_cache_hot_fetched_total",
            "Segments fetched ahead because a disk's hot set named them",
            c.hot_fetched,
        ),
        (
            "strata_shared_cache_shrunk_total",
            "Whole cached objects turned into sparse files of the grains read from them",
            c.shrunk,
        ),
        (
            "strata_shared_cache_evicted_kept_total",
            "Evicted whole cached objects whose read grains were kept as sparse files",
            c.evicted_kept,
        ),
        (
            "strata_shared_cache_damaged_total",
            "Cached segments that failed verification (deleted; read from the store)",
            c.damaged,
        ),
    ] {
        out.push(Gauge::new(n, h, v as f64));
    }
    out
}

/// The figures of the last garbage collection this process ran.
fn last_gc(r: &GcReport) -> Vec<Gauge> {
    let mut out = Vec::new();
    for (n, h, v) in [
        (
            "strata_shared_stored_bytes",
            "Bytes of all segments in the store, at the last GC",
            r.stored_bytes,
        ),
        (
            "strata_shared_live_bytes",
            "Bytes reached from a live root, at the last GC",
            r.live_bytes,
        ),
        (
            "strata_shared_live_plain_bytes",
            "What the live bytes would take uncompressed (compress-at-seal's saving), at the last GC",
            r.live_plain_bytes,
        ),
        (
            "strata_shared_garbage_bytes",
            "Bytes in segments nothing reaches (the GC backlog), at the last GC",
            r.garbage_bytes,
        ),
        (
            "strata_shared_gc_deleted_segments",
            "Segments the last GC deleted",
            r.deleted_segments,
        ),
    ] {
        out.push(Gauge::new(n, h, v as f64));
    }
    out
}

/// One local disk's figures, labelled with its name.
fn local_disk(ds: &strata_engine::Datastore, d: &crate::DiskInfo) -> Vec<Gauge> {
    let disk = |name: &str, help: &str, v: f64| Gauge::new(name, help, v).label("disk", &d.name);
    let mut g = Vec::new();
    if let Ok((f, packed)) = ds.disk_fragments(&d.name) {
        g.push(disk(
            "strata_disk_fragments",
            "Physical runs of the disk's data in logical order (1 = one run)",
            f as f64,
        ));
        g.push(disk(
            "strata_disk_packed_bytes",
            "The disk's mapped bytes held compressed (strata compress), uncompressed",
            packed as f64,
        ));
    }
    g.push(
        disk(
            "strata_disk_size_bytes",
            "Virtual size of the disk",
            d.size_bytes as f64,
        )
        .label("provisioning", d.provisioning.as_str()),
    );
    g.push(disk(
        "strata_disk_allocated_bytes",
        "Bytes mapped in the disk's live state",
        d.allocated_bytes.unwrap_or_default() as f64,
    ));
    g.push(disk(
        "strata_disk_snapshots",
        "Snapshots of the disk",
        d.snapshots as f64,
    ));
    g
}
