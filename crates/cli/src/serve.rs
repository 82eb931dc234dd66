//! `strata serve`: export every disk over NBD, answer CLI commands on the
//! control socket, and shut down cleanly (flush + checkpoint) on SIGTERM/SIGINT.

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use strata_block::BlockDevice;
use strata_engine::{Datastore, Error, ErrorKind};
use strata_nbd::{ExportInfo, ExportProvider, NbdServer, ServerOptions};

use crate::control;
use crate::ops::{self, LockOutcome};

#[derive(Args)]
pub struct ServeArgs {
    /// Serve NBD on this Unix socket path
    #[arg(long)]
    nbd_unix: Option<PathBuf>,
    /// Serve NBD on this TCP address (e.g. 127.0.0.1:10809)
    #[arg(long)]
    nbd_tcp: Option<String>,
    /// Create the datastore first if the directory has none
    #[arg(long)]
    init: bool,
}

struct Exports {
    ds: Datastore,
}

impl ExportProvider for Exports {
    fn list(&self) -> Vec<ExportInfo> {
        self.ds
            .export_names()
            .into_iter()
            .map(|(name, description)| ExportInfo { name, description })
            .collect()
    }

    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, String> {
        self.ds
            .open_disk(name)
            .map(|h| h as Arc<dyn BlockDevice>)
            .map_err(|e| e.message)
    }
}

/// Remove a leftover socket file; refuse to touch anything that is not a socket.
fn remove_stale_socket(p: &Path) -> Result<(), Error> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(p).map_err(|e| io_err("remove stale socket", e))
        }
        Ok(_) => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{} exists and is not a socket; refusing to replace it",
                p.display()
            ),
        )),
        Err(_) => Ok(()),
    }
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("{what}: {e}"))
}

pub fn run(dir: &Path, cache: u64, args: &ServeArgs) -> Result<ExitCode, Error> {
    if args.nbd_unix.is_none() && args.nbd_tcp.is_none() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "nothing to serve on: give --nbd-unix PATH and/or --nbd-tcp HOST:PORT",
        ));
    }
    if args.init && !dir.join(strata_format::FILE_SUPER).exists() {
        std::fs::create_dir_all(dir).map_err(|e| io_err("create datastore directory", e))?;
        Datastore::init(
            Arc::new(strata_storage::FileBackend::new(dir)),
            &Default::default(),
        )?;
    }
    if !dir.join(strata_format::FILE_SUPER).exists() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no datastore at {} (run 'strata init' or pass --init)",
                dir.display()
            ),
        ));
    }
    let lock = match ops::try_lock(dir)? {
        LockOutcome::Locked(f) => f,
        LockOutcome::Held(pid) => {
            return Err(Error::new(
                ErrorKind::Locked,
                format!(
                    "datastore {} is already served or in use{}",
                    dir.display(),
                    pid.map(|p| format!(" by pid {p}")).unwrap_or_default()
                ),
            ))
        }
    };
    let ds = ops::open_local(dir, lock, cache)?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| io_err("signal handler", e))?;
    }

    // The control socket: we hold the lock, so an existing file is stale.
    let ctl_path = dir.join(strata_format::FILE_CONTROL);
    let _ = std::fs::remove_file(&ctl_path);
    let ctl = UnixListener::bind(&ctl_path)
        .map_err(|e| io_err(&format!("bind {}", ctl_path.display()), e))?;
    let ctl_thread = control::spawn_server(ctl, ds.clone(), stop.clone());

    let server = NbdServer::new(
        Arc::new(Exports { ds: ds.clone() }),
        ServerOptions::default(),
    );
    let names: Vec<String> = ds.export_names().into_iter().map(|(n, _)| n).collect();
    let example = names.first().cloned().unwrap_or_else(|| "DISK".into());
    println!("strata: serving datastore {}", dir.display());
    if let Some(p) = &args.nbd_unix {
        remove_stale_socket(p)?;
        let l = UnixListener::bind(p).map_err(|e| io_err(&format!("bind {}", p.display()), e))?;
        server.serve_unix(l).map_err(|e| io_err("serve unix", e))?;
        println!("  NBD on unix socket {}", p.display());
        println!(
            "    e.g. nbdinfo 'nbd+unix:///{example}?socket={}'",
            p.display()
        );
        println!(
            "         qemu-img info 'nbd+unix:///{example}?socket={}'",
            p.display()
        );
    }
    if let Some(a) = &args.nbd_tcp {
        let l = TcpListener::bind(a).map_err(|e| io_err(&format!("bind {a}"), e))?;
        let addr = l.local_addr().map_err(|e| io_err("local addr", e))?;
        server.serve_tcp(l).map_err(|e| io_err("serve tcp", e))?;
        println!("  NBD on tcp {addr}");
        println!("    e.g. nbdinfo nbd://{addr}/{example}");
    }
    if names.is_empty() {
        println!(
            "  no disks yet: create one with 'strata create NAME --size 10G' (works while serving)"
        );
    } else {
        println!("  exports: {}", names.join(", "));
    }
    println!(
        "  control socket {} (strata commands use it automatically)",
        ctl_path.display()
    );
    println!("  stop with Ctrl-C or SIGTERM (flushes and checkpoints)");

    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("strata: shutting down");
    server.shutdown();
    // Wake the control thread so it sees the stop flag.
    let _ = std::os::unix::net::UnixStream::connect(&ctl_path);
    let _ = ctl_thread.join();
    let _ = std::fs::remove_file(&ctl_path);
    if let Some(p) = &args.nbd_unix {
        let _ = std::fs::remove_file(p);
    }
    ds.close()?;
    eprintln!("strata: datastore flushed and closed");
    Ok(ExitCode::SUCCESS)
}
