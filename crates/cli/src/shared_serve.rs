//! `strata serve` on a directory attached to an object-store datastore
//! (docs/MULTIHOST.md): every disk of the store as an NBD export (writable;
//! the first write, trim or FLUSH with writes claims it), every snapshot as
//! `DISK@SNAP` (read-only). All connections to one disk share one
//! [`SharedDisk`], so their unflushed writes are one set; shutdown flushes
//! every disk this server wrote.

use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_block::BlockDevice;
use strata_engine::{Error, ErrorKind};
use strata_nbd::{ExportInfo, ExportProvider, NbdServer};
use strata_objstore::Options;
use strata_shared::gc::GcReport;
use strata_shared::{SharedDatastore, SharedDisk};
use strata_stats::{Gauge, StatsDevice, StatsRegistry};

use crate::serve::{self, ServeArgs};
use crate::shared_cmd::{engine_error, ServedDisks};

pub struct SharedExports {
    ds: Arc<SharedDatastore>,
    /// Disks served incoming (hand-over), and how long their first write
    /// waits for the release.
    incoming: (Vec<String>, Duration),
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
    fn gauges(&self) -> Vec<Gauge> {
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

/// Garbage collection every `interval_s` seconds (0: never) until `stop`.
fn spawn_gc(
    exports: Arc<SharedExports>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    interval_s: u64,
) -> Option<std::thread::JoinHandle<()>> {
    if interval_s == 0 {
        return None;
    }
    let t = std::thread::Builder::new()
        .name("gc".into())
        .spawn(move || {
            let mut next = std::time::Instant::now() + Duration::from_secs(interval_s);
            while !stop.load(Ordering::Acquire) {
                if std::time::Instant::now() >= next {
                    match exports.gc(false) {
                        Ok(r) if r.deleted_segments > 0 => eprintln!(
                            "strata: gc deleted {} segments ({} bytes)",
                            r.deleted_segments, r.garbage_bytes
                        ),
                        Ok(_) => {}
                        Err(e) => eprintln!("strata: gc: {e}"),
                    }
                    next = std::time::Instant::now() + Duration::from_secs(interval_s);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
        .expect("spawn gc thread");
    Some(t)
}

/// Serve an object-store datastore's disks over NBD until SIGTERM/SIGINT.
pub fn run(dir: &Path, args: &ServeArgs) -> Result<ExitCode, Error> {
    if args.nbd_unix.is_none() && args.nbd_tcp.is_none() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "nothing to serve on: give --nbd-unix PATH or --nbd-tcp HOST:PORT \
             (object-store datastores are served over NBD so far)",
        ));
    }
    for (given, what) in [
        (!args.vhost_user_blk.is_empty(), "--vhost-user-blk"),
        (args.fuse.is_some(), "--fuse"),
        (!args.vmdk.is_empty(), "--vmdk"),
    ] {
        if given {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "{what} does not work on object-store datastores yet (they are served over \
                     NBD: docs/MULTIHOST.md)"
                ),
            ));
        }
    }
    let opts = Options {
        op_timeout: Duration::from_secs(args.store_timeout),
        ..Options::default()
    };
    let ds = Arc::new(SharedDatastore::open(dir, &opts).map_err(engine_error)?);
    let stop = serve::stop_flag()?;
    let registry = Arc::new(StatsRegistry::new());
    for name in &args.incoming {
        ds.disk_id(name).map_err(engine_error)?;
    }
    let mut exports = SharedExports::new(ds.clone(), (!args.no_stats).then(|| registry.clone()));
    exports.incoming = (
        args.incoming.clone(),
        Duration::from_secs(args.incoming_wait),
    );
    let exports = Arc::new(exports);
    let server = NbdServer::new(exports.clone(), serve::nbd_options(args));
    let names: Vec<String> = exports.list().into_iter().map(|e| e.name).collect();
    let example = names.first().cloned().unwrap_or_else(|| "DISK".into());
    println!(
        "strata: serving object-store datastore {} as host {} ({})",
        ds.config().url,
        ds.config().me.name,
        ds.config().me.host
    );
    serve::listen(&server, args, &example)?;
    // The control socket: CLI commands of this host reach the disks this
    // server has open (a snapshot is taken by the process that writes).
    let ctl_path = dir.join(strata_format::FILE_CONTROL);
    if std::os::unix::net::UnixStream::connect(&ctl_path).is_ok() {
        return Err(Error::new(
            ErrorKind::Locked,
            format!(
                "another server of this directory answers at {}: one server per local directory",
                ctl_path.display()
            ),
        ));
    }
    let _ = std::fs::remove_file(&ctl_path);
    let ctl = UnixListener::bind(&ctl_path)
        .map_err(|e| Error::new(ErrorKind::Io, format!("bind {}: {e}", ctl_path.display())))?;
    let ctl_thread = {
        let exports = exports.clone();
        crate::control::accept(ctl, "control", stop.clone(), move |conn| {
            crate::control::handle(conn, None, &mut |req, _| {
                crate::shared_cmd::execute(&exports.ds, Some(&*exports), req)
            })
        })
    };
    if names.is_empty() {
        println!("  no disks yet: create one with 'strata create NAME --size 10G'");
    } else {
        println!("  exports: {}", names.join(", "));
    }
    println!(
        "  a disk is claimed by its first write; FLUSH waits up to {} s for the store",
        args.store_timeout
    );
    println!(
        "  control socket {} (strata commands use it automatically)",
        ctl_path.display()
    );
    println!("  stop with Ctrl-C or SIGTERM (flushes)");
    let gauge_exports = exports.clone();
    let http = serve::start_http(args, Box::new(move || gauge_exports.gauges()), registry)?;
    let gc_thread = spawn_gc(exports.clone(), stop.clone(), args.gc_interval);
    serve::wait_and_shut_down(&stop, &server, http, args);
    if let Some(t) = gc_thread {
        let _ = t.join();
    }
    let _ = std::os::unix::net::UnixStream::connect(&ctl_path);
    let _ = ctl_thread.join();
    let _ = std::fs::remove_file(&ctl_path);
    if !exports.flush_all() {
        eprintln!("strata: not every disk could be flushed (above)");
        return Ok(ExitCode::from(1));
    }
    eprintln!("strata: disks flushed");
    Ok(ExitCode::SUCCESS)
}
