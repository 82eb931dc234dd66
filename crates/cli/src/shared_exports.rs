//! The disks of an object-store datastore as a server holds them: one
//! [`SharedDisk`] per disk, shared by every connection and the control
//! socket (so their unflushed writes are one set), with the server's
//! metrics of them. Used by `serve` of an attached directory
//! (shared_serve.rs) and by a local datastore's server for the disks it
//! moved to an object store (placement.rs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_block::BlockDevice;
use strata_nbd::{ExportInfo, ExportProvider};
use strata_shared::gc::GcReport;
use strata_shared::{SharedDatastore, SharedDisk};
use strata_stats::{Gauge, StatsDevice, StatsRegistry};

use crate::shared_ops::ServedDisks;

pub struct SharedExports {
    ds: Arc<SharedDatastore>,
    /// Disks served incoming (hand-over), and how long their first write
    /// waits for the release.
    pub(crate) incoming: (Vec<String>, Duration),
    open: Mutex<HashMap<String, Arc<SharedDisk>>>,
    stats: Option<Arc<StatsRegistry>>,
    /// The last garbage collection this server ran (background or asked
    /// through its control socket), for the metrics.
    last_gc: Mutex<Option<GcReport>>,
}

impl SharedExports {
    pub(crate) fn new(ds: Arc<SharedDatastore>, stats: Option<Arc<StatsRegistry>>) -> Self {
        SharedExports {
            ds,
            incoming: (Vec::new(), Duration::ZERO),
            open: Mutex::new(HashMap::new()),
            stats,
            last_gc: Mutex::new(None),
        }
    }

    pub(crate) fn datastore(&self) -> &Arc<SharedDatastore> {
        &self.ds
    }

    /// Commit every disk this server writes (at shutdown); false if one
    /// failed (said on stderr).
    pub(crate) fn flush_all(&self) -> bool {
        let mut ok = true;
        for (name, d) in self.open.lock().unwrap().iter() {
            let (owner, fenced) = d.ownership();
            if let Some(f) = fenced {
                // Handed over: another host writes it now (not a failure of
                // this server; its clients were told at their FLUSH).
                eprintln!("strata: {f}");
                continue;
            }
            if !owner {
                continue;
            }
            if let Err(e) = d.commit() {
                eprintln!("strata: flushing disk {name} failed: {e}");
                ok = false;
            }
        }
        ok
    }

    /// The server's handle of `name`: one per disk, shared by every
    /// connection and the control socket. A handle that was fenced stays
    /// fenced (this host acknowledges nothing more for the disk) until
    /// `strata claim` on this host takes the disk back ([`Self::reopen`]).
    pub(crate) fn open_disk(&self, name: &str) -> Result<Arc<SharedDisk>, String> {
        let mut open = self.open.lock().unwrap();
        if let Some(d) = open.get(name) {
            return Ok(d.clone());
        }
        let d = SharedDisk::open(self.ds.clone(), name, false).map_err(|e| e.message)?;
        if self.incoming.0.iter().any(|n| n == name) {
            d.set_incoming(Some(self.incoming.1));
        }
        open.insert(name.to_string(), d.clone());
        Ok(d)
    }
}

impl SharedExports {
    /// The metrics of the disks this server has open and of the last GC.
    pub(crate) fn gauges(&self) -> Vec<Gauge> {
        let mut out = Vec::new();
        let g = |name: &str, help: &str, disk: &str, v: f64| {
            Gauge::new(name, help, v).label("disk", disk)
        };
        for (name, d) in self.open.lock().unwrap().iter() {
            let m = d.manifest();
            let (writer, fenced) = d.ownership();
            let c = d.commit_stats();
            out.push(g(
                "strata_shared_unflushed_bytes",
                "Bytes acknowledged to clients and not yet in the object store (the upload backlog)",
                name,
                d.unflushed_bytes() as f64,
            ));
            out.push(g(
                "strata_shared_writer",
                "1 if this server is the disk's writer (its generation is the newest)",
                name,
                f64::from(u8::from(writer && fenced.is_none())),
            ));
            out.push(g(
                "strata_shared_fenced",
                "1 if another host claimed the disk from this server",
                name,
                f64::from(u8::from(fenced.is_some())),
            ));
            out.push(g(
                "strata_shared_generation",
                "The disk's generation in the newest manifest this server knows",
                name,
                f64::from(m.generation),
            ));
            out.push(g(
                "strata_shared_manifest_seq",
                "Sequence number of that manifest",
                name,
                m.seq as f64,
            ));
            out.push(g(
                "strata_shared_commits_total",
                "FLUSHes that uploaded a segment and committed a manifest",
                name,
                c.commits as f64,
            ));
            out.push(g(
                "strata_shared_commit_failures_total",
                "Commits that failed (store unavailable, or fenced)",
                name,
                c.failed as f64,
            ));
            out.push(g(
                "strata_shared_commit_seconds_total",
                "Time spent in successful commits",
                name,
                c.seconds_total,
            ));
            out.push(g(
                "strata_shared_commit_seconds_max",
                "The longest successful commit",
                name,
                c.seconds_max,
            ));
            out.push(g(
                "strata_shared_uploaded_bytes_total",
                "Bytes of segments uploaded",
                name,
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
    fn disk(&self, name: &str) -> Result<Arc<SharedDisk>, String> {
        self.open_disk(name)
    }

    /// A new handle of `name` for connections from now on (after a fence).
    fn reopen(&self, name: &str) -> Result<Arc<SharedDisk>, String> {
        self.forget(name);
        self.open_disk(name)
    }

    fn forget(&self, name: &str) {
        self.open.lock().unwrap().remove(name);
    }

    fn gc(&self, dry_run: bool) -> Result<GcReport, strata_shared::Error> {
        let r = self.ds.gc(dry_run)?;
        *self.last_gc.lock().unwrap() = Some(r.clone());
        Ok(r)
    }
}

impl ExportProvider for SharedExports {
    fn list(&self) -> Vec<ExportInfo> {
        let disks = match self.ds.disks() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("strata: listing the store's disks failed: {e}");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (name, m) in disks {
            let owner = match &m.owner {
                Some(o) => format!("owner {} generation {}", o.name, m.generation),
                None => "no owner".into(),
            };
            out.push(ExportInfo {
                name: name.clone(),
                description: format!("object-store disk ({owner})"),
            });
            for s in &m.snapshots {
                out.push(ExportInfo {
                    name: format!("{name}@{}", s.name),
                    description: "snapshot (read-only)".into(),
                });
            }
        }
        out
    }

    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, String> {
        let dev = self.open_disk(name)? as Arc<dyn BlockDevice>;
        Ok(match &self.stats {
            // Every connection to one export shares one set of statistics.
            Some(reg) => Arc::new(StatsDevice::new(dev, reg.get_or_create(name))),
            None => dev,
        })
    }
}
