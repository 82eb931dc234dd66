//! The disks of an object-store datastore as a server holds them: one
//! [`SharedDisk`] per disk, shared by every connection and the control
//! socket (so their unflushed writes are one set), with the server's
//! metrics of them. Used by `serve` of an attached directory
//! (shared_serve.rs) and by a local datastore's server for the disks it
//! moved to an object store (placement.rs).

use std::sync::{Arc, Mutex};

use strata_block::BlockDevice;
use strata_datastore::ObjectStoreDatastore;
use strata_engine::Error;
use strata_nbd::{ExportInfo, ExportProvider};
use strata_shared::gc::GcReport;
use strata_shared::{SharedDatastore, SharedDisk};
use strata_stats::{Gauge, StatsDevice, StatsRegistry};

use crate::shared_ops::ServedDisks;

pub struct SharedExports {
    /// The datastore and this server's one handle per disk.
    store: Arc<ObjectStoreDatastore>,
    stats: Option<Arc<StatsRegistry>>,
    /// The last garbage collection this server ran (background or asked
    /// through its control socket), for the metrics.
    last_gc: Mutex<Option<GcReport>>,
}

impl SharedExports {
    pub(crate) fn new(store: Arc<ObjectStoreDatastore>, stats: Option<Arc<StatsRegistry>>) -> Self {
        SharedExports {
            store,
            stats,
            last_gc: Mutex::new(None),
        }
    }

    pub(crate) fn datastore(&self) -> &Arc<SharedDatastore> {
        self.store.shared()
    }

    /// Commit every disk this server writes (at shutdown); false if one
    /// failed (said on stderr).
    pub(crate) fn flush_all(&self) -> bool {
        let failed = self.store.flush_all();
        for (name, e) in &failed {
            eprintln!("strata: flushing disk {name} failed: {e}");
        }
        failed.is_empty()
    }

    /// The server's handle of `name` (see `ObjectStoreDatastore::disk`).
    pub(crate) fn open_disk(&self, name: &str) -> Result<Arc<SharedDisk>, Error> {
        self.store.disk(name)
    }
}

impl SharedExports {
    /// The metrics of the disks this server has open and of the last GC.
    pub(crate) fn gauges(&self) -> Vec<Gauge> {
        let mut out = Vec::new();
        let g = |name: &str, help: &str, disk: &str, v: f64| {
            Gauge::new(name, help, v).label("disk", disk)
        };
        for (name, d) in self.store.handles() {
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
        }
        if let Some(r) = &*self.last_gc.lock().unwrap() {
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
}

impl ServedDisks for SharedExports {
    fn disk(&self, name: &str) -> Result<Arc<SharedDisk>, Error> {
        self.store.disk(name)
    }

    /// A new handle of `name` for connections from now on (after a fence).
    fn reopen(&self, name: &str) -> Result<Arc<SharedDisk>, Error> {
        self.store.reopen(name)
    }

    fn forget(&self, name: &str) {
        self.store.forget(name)
    }

    fn gc(&self, dry_run: bool) -> Result<GcReport, strata_shared::Error> {
        let r = self.datastore().gc(dry_run)?;
        *self.last_gc.lock().unwrap() = Some(r.clone());
        Ok(r)
    }
}

impl ExportProvider for SharedExports {
    fn list(&self) -> Vec<ExportInfo> {
        use strata_datastore::Datastore as _;
        self.store
            .export_names()
            .into_iter()
            .map(|(name, description)| ExportInfo { name, description })
            .collect()
    }

    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, String> {
        let dev = self.open_disk(name).map_err(|e| e.message)? as Arc<dyn BlockDevice>;
        Ok(match &self.stats {
            // Every connection to one export shares one set of statistics.
            Some(reg) => Arc::new(StatsDevice::new(dev, reg.get_or_create(name))),
            None => dev,
        })
    }
}
