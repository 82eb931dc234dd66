//! Prometheus gauges of an object-store datastore's server: per disk it
//! holds open (upload backlog, writer or fenced, generation, commits,
//! compaction), of
//! its segment cache and of its last garbage collection.

use strata_datastore::ObjectStoreDatastore;
use strata_stats::Gauge;

/// The metrics of the disks this server has open and of its last GC.
#[expect(clippy::too_many_lines)]
pub(crate) fn gauges(store: &ObjectStoreDatastore) -> Vec<Gauge> {
    let mut out = Vec::new();
    let g =
        |name: &str, help: &str, disk: &str, v: f64| Gauge::new(name, help, v).label("disk", disk);
    for (name, d) in store.handles() {
        let m = d.manifest();
        let (writer, fenced) = d.ownership();
        let c = d.commit_stats();
        out.push(g(
            "strata_shared_unflushed_bytes",
            "Bytes acknowledged to clients and not yet in the object store (the upload backlog)",
            &name,
            d.unflushed_bytes() as f64,
        ));
        out.push(g(
            "strata_shared_writer",
            "1 if this server is the disk's writer (its generation is the newest)",
            &name,
            f64::from(u8::from(writer && fenced.is_none())),
        ));
        out.push(g(
            "strata_shared_fenced",
            "1 if another host claimed the disk from this server",
            &name,
            f64::from(u8::from(fenced.is_some())),
        ));
        out.push(g(
            "strata_shared_generation",
            "The disk's generation in the newest manifest this server knows",
            &name,
            f64::from(m.generation),
        ));
        out.push(g(
            "strata_shared_manifest_seq",
            "Sequence number of that manifest",
            &name,
            m.seq as f64,
        ));
        out.push(g(
            "strata_shared_commits_total",
            "FLUSHes that uploaded a segment and committed a manifest",
            &name,
            c.commits as f64,
        ));
        out.push(g(
            "strata_shared_commits_pipelined_total",
            "Commits issued while the one before them was still in flight (FORMAT.md §11.4b)",
            &name,
            c.pipelined as f64,
        ));
        out.push(g(
            "strata_shared_commit_failures_total",
            "Commits that failed (store unavailable, or fenced)",
            &name,
            c.failed as f64,
        ));
        out.push(g(
            "strata_shared_commit_seconds_total",
            "Time spent in successful commits",
            &name,
            c.seconds_total,
        ));
        out.push(g(
            "strata_shared_commit_seconds_max",
            "The longest successful commit",
            &name,
            c.seconds_max,
        ));
        out.push(g(
            "strata_shared_uploaded_bytes_total",
            "Bytes of segments uploaded",
            &name,
            c.uploaded_bytes as f64,
        ));
        let k = d.compact_stats();
        for (n, h, v) in [
            (
                "strata_shared_client_bytes_total",
                "Bytes of grains clients wrote to the disk through this server",
                d.client_bytes(),
            ),
            (
                "strata_shared_compact_passes_total",
                "Compaction passes run on the disk (FORMAT.md §11.7a)",
                k.passes,
            ),
            (
                "strata_shared_compact_rewritten_bytes_total",
                "Bytes of live grains compaction rewrote (its write amplification over client bytes)",
                k.rewritten_bytes,
            ),
            (
                "strata_shared_compact_dropped_grains_total",
                "Rewritten grains a client wrote again before their move was committed",
                k.dropped_grains,
            ),
            (
                "strata_shared_compact_emptied_bytes_total",
                "Bytes of objects compaction emptied for GC to free",
                k.emptied_bytes,
            ),
        ] {
            out.push(g(n, h, &name, v as f64));
        }
    }
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
    if let Some(r) = &store.last_gc() {
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
    }
    out
}
