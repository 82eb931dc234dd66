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
use strata_shared::{SharedDatastore, SharedDisk};

use crate::serve::{self, ServeArgs};
use crate::shared_cmd::engine_error;

pub struct SharedExports {
    ds: Arc<SharedDatastore>,
    open: Mutex<HashMap<String, Arc<SharedDisk>>>,
}

impl SharedExports {
    /// The server's handle of `name`: one per disk, shared by every
    /// connection and the control socket. A handle that was fenced stays
    /// fenced (this host acknowledges nothing more for the disk) until
    /// `strata claim` on this host takes the disk back ([`Self::reopen`]).
    pub fn disk(&self, name: &str) -> Result<Arc<SharedDisk>, String> {
        let mut open = self.open.lock().unwrap();
        if let Some(d) = open.get(name) {
            return Ok(d.clone());
        }
        let d = SharedDisk::open(self.ds.clone(), name, false).map_err(|e| e.message)?;
        open.insert(name.to_string(), d.clone());
        Ok(d)
    }
}

impl SharedExports {
    /// A new handle of `name` for connections from now on (after a fence).
    pub fn reopen(&self, name: &str) -> Result<Arc<SharedDisk>, String> {
        self.forget(name);
        self.disk(name)
    }

    /// Drop the server's handle of `name` (it is being removed).
    pub fn forget(&self, name: &str) {
        self.open.lock().unwrap().remove(name);
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
        Ok(self.disk(name)? as Arc<dyn BlockDevice>)
    }
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
    let exports = Arc::new(SharedExports {
        ds: ds.clone(),
        open: Mutex::new(HashMap::new()),
    });
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
    let ctl_path = dir.join(crate::shared_cmd::CONTROL_SOCKET);
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
        let (exports, stop) = (exports.clone(), stop.clone());
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                for conn in ctl.incoming() {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let exports = exports.clone();
                    let _ = std::thread::Builder::new()
                        .name("control-conn".into())
                        .spawn(move || {
                            crate::control::handle(conn, None, &mut |req, _| {
                                crate::shared_cmd::execute(&exports.ds, Some(&exports), req)
                            })
                        });
                }
            })
            .expect("spawn control thread")
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
    serve::wait_and_shut_down(&stop, &server, None, args);
    let _ = std::os::unix::net::UnixStream::connect(&ctl_path);
    let _ = ctl_thread.join();
    let _ = std::fs::remove_file(&ctl_path);
    let mut failed = false;
    for (name, d) in exports.open.lock().unwrap().iter() {
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
            failed = true;
        }
    }
    if failed {
        eprintln!("strata: not every disk could be flushed (above)");
        return Ok(ExitCode::from(1));
    }
    eprintln!("strata: disks flushed");
    Ok(ExitCode::SUCCESS)
}
