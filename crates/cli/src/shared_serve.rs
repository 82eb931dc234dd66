//! `strata serve` on a directory attached to an object-store datastore
//! (docs/MULTIHOST.md): every disk of the store as an NBD export (writable;
//! the first write, trim or FLUSH with writes claims it), every snapshot as
//! `DISK@SNAP` (read-only), through [`SharedExports`] (one handle per
//! disk); shutdown flushes every disk this server wrote.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use strata_engine::{Error, ErrorKind};
use strata_nbd::{ExportProvider, NbdServer};
use strata_objstore::Options;
use strata_shared::SharedDatastore;
use strata_stats::StatsRegistry;

use crate::serve::{self, ServeArgs};
use crate::shared_exports::SharedExports;
use crate::shared_ops::{engine_error, ServedDisks};

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
    let store = Arc::new(strata_datastore::ObjectStoreDatastore::new(
        Arc::new(SharedDatastore::open(dir, &opts).map_err(engine_error)?),
        dir,
    ));
    let ds = store.shared().clone();
    let stop = serve::stop_flag()?;
    let registry = Arc::new(StatsRegistry::new());
    for name in &args.incoming {
        ds.disk_id(name).map_err(engine_error)?;
    }
    store.set_incoming(strata_datastore::Incoming {
        disks: args.incoming.clone(),
        wait: Duration::from_secs(args.incoming_wait),
    });
    let exports = Arc::new(SharedExports::new(
        store,
        (!args.no_stats).then(|| registry.clone()),
    ));
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
        let (exports, registry) = (exports.clone(), registry.clone());
        crate::control::accept(ctl, "control", stop.clone(), move |conn| {
            crate::control::handle(conn, None, &mut |req, _| answer(&exports, &registry, req))
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
    let http = serve::start_http(
        args,
        Box::new(move || gauge_exports.gauges()),
        registry.clone(),
        Some(Arc::new(SharedBackend(exports.clone(), registry.clone()))),
    )?;
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

/// Run a request of this server's control socket or HTTP API: I/O
/// statistics from its registry, the rest by `shared_ops`.
fn answer(
    exports: &SharedExports,
    registry: &StatsRegistry,
    req: &crate::api::Request,
) -> Result<crate::api::Response, Error> {
    match req {
        crate::api::Request::Stats {
            disk,
            reset,
            recording,
        } => {
            if let Some(d) = disk {
                if !exports.list().iter().any(|e| &e.name == d) {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!("this server has no export named '{d}'"),
                    ));
                }
            }
            Ok(crate::ops::stats(
                registry,
                disk.as_deref(),
                *reset,
                *recording,
            ))
        }
        req => crate::shared_ops::execute(exports.datastore(), Some(exports), req),
    }
}

/// The HTTP API (`web`) of an object-store datastore's server: its
/// requests run as the control socket runs them.
struct SharedBackend(Arc<SharedExports>, Arc<StatsRegistry>);

impl crate::web::Backend for SharedBackend {
    fn run(&self, req: crate::api::Request) -> Result<crate::api::Response, Error> {
        answer(&self.0, &self.1, &req)
    }
    fn shared(&self) -> bool {
        true
    }
}
