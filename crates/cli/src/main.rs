//! `strata`: the command-line tool of the strata disk engine.
//!
//! A command line becomes a typed request (`args`), the request a typed
//! answer (strata-server's `ops` in this process, or the server that holds
//! the datastore through its control socket; `vmdk_ops` for VMDK files),
//! and the answer text (`output`). `serve` runs strata-server's server.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

mod action;
mod args;
mod serve_args;

use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use strata_api::{wire, Error, ErrorKind, Request, Response, VmdkRequest};
use strata_engine::InitOptions;

use crate::action::{Action, Pipe};
use crate::args::{default_datastore, Cli};
use strata_cli::output::{self, progress_bar, Format};
use strata_server::serve::ServeConfig;
use strata_server::{object_store, ops, serve, vmdk_ops};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(matches!(cli.cmd, args::Cmd::Serve(_)));
    let dir = cli.datastore.clone().unwrap_or_else(default_datastore);
    match run(&cli, &dir) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata: error: {e}");
            ExitCode::from(failure_code(e.kind))
        }
    }
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

fn run(cli: &Cli, dir: &Path) -> Result<ExitCode, Error> {
    let action = Action::try_from(&cli.cmd)?;
    match action {
        Action::Init { capacity_bytes } => init(dir, capacity_bytes),
        Action::Shared {
            url,
            attach,
            format,
        } => {
            output::print(&object_store::init_or_attach(dir, url, attach)?, format);
            Ok(ExitCode::SUCCESS)
        }
        Action::Serve(args) => serve::run(dir, cli.metadata_cache, &ServeConfig::from(args)),
        Action::Completions(shell) => {
            // Into memory first: clap_complete panics on a failed write.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "strata", &mut script);
            use std::io::Write;
            match std::io::stdout().write_all(&script) {
                // Its reader went away (`| head`): nothing more to say.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(Error::new(ErrorKind::Io, format!("stdout: {e}")))
                }
                _ => Ok(ExitCode::SUCCESS),
            }
        }
        Action::Manpages(out) => manpages(out),
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
        Action::Stream {
            request,
            format,
            pipe,
        } => stream(cli, dir, request, format, pipe),
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
    let r = dispatch(dir, cli.metadata_cache, false, &request);
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
        Pipe::In => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
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
    strata_datastore::init(dir, &InitOptions { capacity_bytes })?;
    println!("initialised datastore {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

/// Run a request in this process, or through the server that holds the
/// datastore (a local one: the server holds its lock; an object store:
/// this host's server, so that a disk's owner-only changes are made by
/// the process that writes it).
fn dispatch(dir: &Path, cache: u64, detach: bool, req: &Request) -> Result<Response, Error> {
    if let Err(e) = strata_datastore::probe(dir) {
        return Err(match e.kind {
            ErrorKind::NotFound => Error::new(
                ErrorKind::NotFound,
                format!(
                    "no datastore at {} (run 'strata init' or pass --datastore)",
                    dir.display()
                ),
            ),
            _ => e,
        });
    }
    let bar = make_bar(req);
    let mut progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let opts = strata_datastore::OpenOptions {
        cache_bytes: cache,
        background: false,
        ..Default::default()
    };
    // A server of the directory answers on its control socket (it holds a
    // local datastore's lock; an object store's disks are written by it);
    // a socket file nobody answers is a stopped server's.
    let sock = dir.join(strata_format::FILE_CONTROL);
    let r = if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
        wire::request(&sock, req, detach, &mut progress)
    } else {
        here(&*strata_datastore::open(dir, &opts)?, req, &mut progress)
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    r
}

/// Run a request on a datastore opened by this process, then close it.
fn here(
    ds: &dyn strata_datastore::Datastore,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    let r = ops::execute(&ops::Ctx::only(ds), req, progress);
    ds.close()?;
    r
}

fn make_bar(req: &Request) -> Option<indicatif::ProgressBar> {
    progress_bar(
        req.shows_progress(),
        "{spinner} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
}

/// `strata manpages DIR`: strata.1, and strata-COMMAND.1 (strata-alarm-set.1
/// for a command's command) for every command clap knows, hidden ones
/// left out. The package (scripts/make-deb.sh) installs them.
fn manpages(out: &Path) -> Result<ExitCode, Error> {
    let io = |e: std::io::Error, what: &Path| {
        Error::new(ErrorKind::Io, format!("{}: {e}", what.display()))
    };
    std::fs::create_dir_all(out).map_err(|e| io(e, out))?;
    let mut cmd = Cli::command();
    // Sets each command's display name (strata-serve) and usage line.
    cmd.build();
    let mut stack = vec![cmd];
    let mut written = 0;
    while let Some(c) = stack.pop() {
        let name = c
            .get_display_name()
            .unwrap_or_else(|| c.get_name())
            .to_string();
        let path = out.join(format!("{name}.1"));
        let mut page = Vec::new();
        clap_mangen::Man::new(c.clone())
            .render(&mut page)
            .map_err(|e| io(e, &path))?;
        std::fs::write(&path, page).map_err(|e| io(e, &path))?;
        written += 1;
        stack.extend(
            c.get_subcommands()
                .filter(|s| !s.is_hide_set() && s.get_name() != "help")
                .cloned(),
        );
    }
    println!("{written} man pages in {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// Log events (`tracing`) go to the systemd journal when stderr is the
/// service's journal stream (systemd sets JOURNAL_STREAM to its device and
/// inode): each with its priority (error 3, warn 4, info 5) and its fields
/// as STRATA_* journal fields (STRATA_EVENT=alarm, STRATA_KIND=usage...).
/// Otherwise to stderr, one line each: time, level, where, message and
/// fields. STRATA_LOG sets the filter; by default a server logs at info
/// (its start, stop, alarm changes, claims, fences, jobs, refused clients)
/// and the other commands only warnings and errors.
fn init_logging(serving: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // fuser warns when its own unmount at the end finds the mount gone:
    // strata-fuse unmounts first (lazily when busy).
    let default = if serving {
        "warn,fuser=error,strata=info"
    } else {
        "warn,fuser=error"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let registry = tracing_subscriber::registry().with(filter);
    if stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(j) => {
                registry
                    .with(
                        j.with_field_prefix(Some("STRATA".into()))
                            .with_syslog_identifier("strata".into()),
                    )
                    .init();
                return;
            }
            Err(e) => eprintln!("strata: no journal ({e}); logging to stderr"),
        }
    }
    registry
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours only for a person at a terminal, not in a file.
                .with_ansi(
                    std::io::IsTerminal::is_terminal(&std::io::stderr())
                        && std::env::var_os("NO_COLOR").is_none(),
                ),
        )
        .init();
}

/// Whether stderr is the journal stream systemd connected this service
/// to (JOURNAL_STREAM is "DEVICE:INODE" of it; a child whose stderr was
/// redirected elsewhere inherits the variable but not the stream).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.split_once(':') else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}
