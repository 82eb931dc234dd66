//! `strata`: the command-line tool of the strata disk engine.
//!
//! A command line becomes a typed request (`args`), the request a typed
//! answer (strata-server's `ops` in this process, or the server that holds
//! the datastore through its control socket; `vmdk_ops` for VMDK files),
//! and the answer text (`output`). `serve` runs strata-server's server.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

mod action;
mod args;
mod group;
mod keys;
mod schedule;
mod serve_args;
mod target;
mod watch;

use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;
use strata_api::units::invalid;
use strata_api::wire::ReplyError;
use strata_api::{Error, ErrorKind, Request, Response, VmdkRequest};
use strata_engine::InitOptions;

use crate::action::{Action, Pipe};
use crate::args::{default_datastore, Cli};
use strata_cli::output::{self, Format};
use strata_server::serve::ServeConfig;
use strata_server::{object_store, ops, serve, vmdk_ops};
use watch::Reporter;

fn main() -> ExitCode {
    let cli = match <Cli as clap::Parser>::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    strata_server::logging::init(matches!(cli.cmd, args::Cmd::Serve(_)));
    let dir = cli.datastore.clone().unwrap_or_else(default_datastore);
    let format = if cli.json {
        Format::Json
    } else {
        Format::Human
    };
    match run(&cli, &dir, format) {
        Ok(code) => code,
        Err(e) => {
            match format {
                // Shaped as the API's error body (docs/API.md).
                Format::Json => {
                    eprintln!("{:#}", serde_json::json!({ "error": ReplyError::from(&e) }))
                }
                Format::Human => eprintln!("strata: error: {e}"),
            }
            ExitCode::from(failure_code(e.kind))
        }
    }
}

/// A command line clap refused (or `--help`, `--version`): as clap prints
/// it, or under `--json` shaped as the API's error body, exit code 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind as Clap;
    let json = std::env::args_os().any(|a| a == "--json");
    if !json || matches!(e.kind(), Clap::DisplayHelp | Clap::DisplayVersion) {
        e.exit()
    }
    let text = e.render().to_string();
    // What clap says before its usage lines, on one line.
    let said = text.split("\n\nUsage:").next().unwrap_or_default();
    let said = said
        .split("\n\nFor more information")
        .next()
        .unwrap_or_default();
    let said = said.trim_start_matches("error: ");
    let message = said.split_whitespace().collect::<Vec<_>>().join(" ");
    let error = serde_json::json!({ "error": { "kind": "invalid_argument", "message": message } });
    eprintln!("{error:#}");
    ExitCode::from(2)
}

/// The exit code of a command that failed, by kind (`args::EXIT_CODES`).
fn failure_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::OutOfRange => 2,
        ErrorKind::NotFound => 3,
        ErrorKind::AlreadyExists => 4,
        ErrorKind::Locked => 5,
        ErrorKind::Refused | ErrorKind::ReadOnly => 6,
        ErrorKind::NoSpace => 7,
        ErrorKind::Fenced | ErrorKind::Released => 8,
        ErrorKind::Unavailable => 9,
        ErrorKind::Unsupported => 10,
        ErrorKind::Corrupt => 11,
        ErrorKind::Io => 12,
        ErrorKind::Gone => 13,
    }
}

fn run(cli: &Cli, dir: &Path, format: Format) -> Result<ExitCode, Error> {
    let action = Action::try_from(&cli.cmd)?;
    if format == Format::Json && !action.has_answer() {
        return Err(invalid(
            "--json: this command has no answer to print as JSON (a local init prints one line; \
             --json goes with init --object-store)",
        ));
    }
    match action {
        Action::Init { capacity_bytes } => init(dir, capacity_bytes),
        Action::Shared { url, attach } => {
            output::print(&object_store::init_or_attach(dir, url, attach)?, format);
            Ok(ExitCode::SUCCESS)
        }
        Action::Serve(args) => serve::run(dir, cli.metadata_cache, &ServeConfig::try_from(args)?),
        Action::Completions(shell) => {
            // Into memory first: clap_complete panics on a failed write.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "strata", &mut script);
            output::stdout(&String::from_utf8_lossy(&script));
            Ok(ExitCode::SUCCESS)
        }
        Action::Manpages(out) => manpages(out),
        Action::Vmdk(request) => {
            let shrink = matches!(request, VmdkRequest::Shrink { .. });
            let mut watch = Reporter::new(shrink, "vmdk shrink".into(), false, format);
            let response = vmdk_ops::execute(&request, &mut watch);
            watch.finish();
            let response = response?;
            output::print(&response, format);
            Ok(exit_code(response.found_problems()))
        }
        Action::Snapshot { request, name } => {
            let list = dispatch(cli, dir, &request, format, false)?;
            output::print(&output::OneSnapshot::of(list, name)?, format);
            Ok(ExitCode::SUCCESS)
        }
        Action::Job(id) => {
            let list = dispatch(cli, dir, &Request::Jobs, format, false)?;
            output::print(&output::OneJob::of(list, id)?, format);
            Ok(ExitCode::SUCCESS)
        }
        Action::Stream { request, pipe } => stream(cli, dir, request, format, pipe),
        Action::Datastore {
            request,
            watch: true,
        } => loop {
            let response = dispatch(cli, dir, &request, format, cli.detach)?;
            output::stdout("\x1b[2J\x1b[H");
            output::print(&response, format);
            std::thread::sleep(std::time::Duration::from_secs(1));
        },
        Action::Datastore {
            request,
            watch: false,
        } => {
            let response = dispatch(cli, dir, &request, format, cli.detach)?;
            output::print(&response, format);
            Ok(exit_code(response.found_problems()))
        }
    }
}

/// Run a request whose stream is stdout or stdin: it reads or writes a
/// named pipe (in a directory only this user can enter) that a thread
/// here connects to stdin or stdout, so a server holding the datastore
/// streams through it just as this process would.
fn stream(
    cli: &Cli,
    dir: &Path,
    mut request: Request,
    format: Format,
    pipe: Pipe,
) -> Result<ExitCode, Error> {
    use std::os::unix::fs::DirBuilderExt;
    let io = |what: &str, e: std::io::Error| Error::new(ErrorKind::Io, format!("{what}: {e}"));
    // One stream per process: the pid names it.
    let tmp = std::env::temp_dir().join(format!("strata-pipe-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .map_err(|e| io(&tmp.display().to_string(), e))?;
    let fifo = tmp.join("stream");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: mkfifo(3) on a path we own.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        let e = std::io::Error::last_os_error();
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(io("mkfifo", e));
    }
    match &mut request {
        Request::ExportDiff { out, .. } => *out = fifo.clone(),
        Request::ImportDiff { path, .. } => *path = fifo.clone(),
        _ => unreachable!("args makes streams of export-diff and import-diff only"),
    }
    let f = fifo.clone();
    let pump = std::thread::spawn(move || -> std::io::Result<u64> {
        match pipe {
            Pipe::Out => {
                let mut from = std::fs::File::open(&f)?;
                let mut out = std::io::stdout().lock();
                let n = std::io::copy(&mut from, &mut out)?;
                std::io::Write::flush(&mut out)?;
                Ok(n)
            }
            Pipe::In => {
                let mut to = std::fs::OpenOptions::new().write(true).open(&f)?;
                std::io::copy(&mut std::io::stdin().lock(), &mut to)
            }
        }
    });
    let r = dispatch(cli, dir, &request, format, false);
    // Once the request ended, the other end of the pipe is closed; a
    // failed one may never have opened it (the thread then waits in
    // open(2) until this process exits).
    let pumped = match &r {
        Ok(_) => Some(pump.join().expect("pump thread")),
        Err(_) => None,
    };
    let _ = std::fs::remove_dir_all(&tmp);
    let mut response = r?;
    if let Some(Err(e)) = pumped {
        return Err(io("the stream", e));
    }
    if let Response::ExportDiff(x) = &mut response {
        x.file = "-".into();
    }
    // With the stream on stdout, the report goes to stderr.
    let text = output::render(&response, format);
    match pipe {
        Pipe::Out => eprint!("{text}"),
        Pipe::In => output::stdout(&text),
    }
    Ok(ExitCode::SUCCESS)
}

/// 1 for a command that ran and found problems (`check`), else success.
fn exit_code(found_problems: bool) -> ExitCode {
    ExitCode::from(u8::from(found_problems))
}

fn init(dir: &Path, capacity_bytes: u64) -> Result<ExitCode, Error> {
    strata_datastore::init(dir, &InitOptions { capacity_bytes })?;
    output::stdout(&format!("initialised datastore {}\n", dir.display()));
    Ok(ExitCode::SUCCESS)
}

/// Run a request at the datastore in `dir`, through its server if one
/// runs (strata-server's `ops::at_dir`), with a progress bar for people.
fn dispatch(
    cli: &Cli,
    dir: &Path,
    req: &Request,
    format: Format,
    detach: bool,
) -> Result<Response, Error> {
    let cache = cli.metadata_cache;
    strata_datastore::probe(dir).map_err(|e| match e.kind {
        ErrorKind::NotFound => {
            let hint = "run 'strata init' or pass --datastore";
            Error::new(
                e.kind,
                format!("no datastore at {} ({hint})", dir.display()),
            )
        }
        _ => e,
    })?;
    let mut watch = Reporter::new(req.shows_progress(), req.describe(), true, format);
    let opts = strata_datastore::OpenOptions {
        cache_bytes: cache,
        background: false,
        ..Default::default()
    };
    let r = ops::at_dir(dir, &opts, detach, req, &mut watch);
    watch.finish();
    r
}

/// `strata manpages DIR`: strata.1, and strata-COMMAND.1 (strata-alarm-set.1
/// for a command's command) for every command clap knows, hidden ones
/// and clap's `help` left out. The package (scripts/make-deb.sh) installs them.
fn manpages(out: &Path) -> Result<ExitCode, Error> {
    let io = |e: std::io::Error| Error::new(ErrorKind::Io, format!("{}: {e}", out.display()));
    std::fs::create_dir_all(out).map_err(io)?;
    clap_mangen::generate_to(Cli::command(), out).map_err(io)?;
    output::stdout(&format!("man pages in {}\n", out.display()));
    Ok(ExitCode::SUCCESS)
}
