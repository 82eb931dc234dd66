//! `strata`: the command-line tool of the strata disk engine.
//!
//! A command line becomes a typed request (`args`), the request a typed
//! answer (strata-server's `ops` in this process, or the server that holds
//! the datastore through its control socket; `vmdk_ops` for VMDK files),
//! and the answer text (`output`). `serve` runs strata-server's server.

mod args;
mod output;
mod serve_args;
mod shared_cmd;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use strata_engine::{Datastore, Error, ErrorKind, InitOptions};
use strata_storage::FileBackend;

use crate::args::{default_datastore, Action, Cli};
use crate::output::{progress_bar, Format};
use strata_datastore::{try_lock, LockOutcome};
use strata_server::api::{Request, Response, VmdkRequest};
use strata_server::serve::ServeConfig;
use strata_server::{ops, serve, vmdk_ops, wire};

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
                // fuser warns when its own unmount at the end finds the mount
                // gone: strata-fuse unmounts first (lazily when busy).
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fuser=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let dir = cli.datastore.clone().unwrap_or_else(default_datastore);
    match run(&cli, &dir) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata: error: {}", e.message);
            ExitCode::from(1)
        }
    }
}

fn run(cli: &Cli, dir: &Path) -> Result<ExitCode, Error> {
    let action = Action::try_from(&cli.cmd)?;
    // A directory attached to an object-store datastore takes only what
    // works there; init/attach --object-store and VMDK commands run as
    // anywhere else.
    if strata_shared::is_shared(dir)
        && !matches!(action, Action::Shared { .. } | Action::Vmdk { .. })
    {
        return match &action {
            Action::Serve(args) => serve::run(dir, cli.metadata_cache, &ServeConfig::from(&**args)),
            _ => shared_cmd::run(dir, &action),
        };
    }
    match action {
        Action::Init { capacity_bytes } => init(dir, capacity_bytes),
        Action::Shared {
            url,
            attach,
            format,
        } => shared_cmd::init_or_attach(dir, url, attach, format).map(|()| ExitCode::SUCCESS),
        Action::Serve(args) => serve::run(dir, cli.metadata_cache, &ServeConfig::from(args)),
        Action::Vmdk { request, format } => {
            let bar = progress_bar(
                format == Format::Human && matches!(request, VmdkRequest::Shrink { .. }),
                "{spinner} [{bar:40}] {percent}% eta {eta}",
            );
            let response = vmdk_ops::execute(&request, &mut |done, total| {
                if let Some(b) = &bar {
                    b.set_length(total);
                    b.set_position(done);
                }
            });
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            let response = response?;
            output::print(&response, format);
            Ok(exit_code(response.found_problems()))
        }
        Action::Datastore {
            request,
            format,
            watch: true,
        } => loop {
            let response = dispatch(dir, cli.metadata_cache, cli.detach, &request)?;
            print!("\x1b[2J\x1b[H");
            output::print(&response, format);
            std::thread::sleep(std::time::Duration::from_secs(1));
        },
        Action::Datastore {
            request,
            format,
            watch: false,
        } => {
            let response = dispatch(dir, cli.metadata_cache, cli.detach, &request)?;
            output::print(&response, format);
            Ok(exit_code(response.found_problems()))
        }
    }
}

/// 1 for a command that ran and found problems (`check`), else success.
fn exit_code(found_problems: bool) -> ExitCode {
    if found_problems {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn init(dir: &Path, capacity_bytes: u64) -> Result<ExitCode, Error> {
    std::fs::create_dir_all(dir).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!("cannot create {}: {e}", dir.display()),
        )
    })?;
    let lock = match try_lock(dir)? {
        LockOutcome::Locked(f) => f,
        LockOutcome::Held(pid) => return Err(held(dir, pid)),
    };
    Datastore::init(
        std::sync::Arc::new(FileBackend::new(dir)),
        &InitOptions { capacity_bytes },
    )?;
    drop(lock);
    println!("initialised datastore {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

fn held(dir: &Path, pid: Option<u32>) -> Error {
    let who = pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
    Error::new(
        ErrorKind::Locked,
        format!(
            "datastore {} is in use by another process{who}",
            dir.display()
        ),
    )
}

/// Run a request locally, or through the server that holds the datastore.
fn dispatch(dir: &Path, cache: u64, detach: bool, req: &Request) -> Result<Response, Error> {
    if !dir.join(strata_format::FILE_SUPER).exists() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no datastore at {} (run 'strata init' or pass --datastore)",
                dir.display()
            ),
        ));
    }
    let bar = make_bar(req);
    let mut progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let r = match try_lock(dir)? {
        LockOutcome::Locked(lock) => {
            let ds = strata_datastore::open_locked(
                dir,
                lock,
                &strata_datastore::OpenOptions {
                    cache_bytes: cache,
                    ..Default::default()
                },
            )?;
            let r = ops::execute(
                &ops::Ctx {
                    ds: &strata_datastore::LocalDatastore::new(ds.clone(), dir),
                    stats: None,
                    jobs: None,
                    control: None,
                    mover: None,
                },
                req,
                &mut progress,
            );
            ds.close()?;
            r
        }
        LockOutcome::Held(pid) => {
            let sock = dir.join(strata_format::FILE_CONTROL);
            if !sock.exists() {
                return Err(held(dir, pid));
            }
            wire::request(&sock, req, detach, &mut progress)
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    r
}

fn make_bar(req: &Request) -> Option<indicatif::ProgressBar> {
    progress_bar(
        req.shows_progress(),
        "{spinner} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
}
