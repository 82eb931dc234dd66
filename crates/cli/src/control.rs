//! The control socket of a running server: CLI commands reach the
//! datastore the server holds open, so snapshots and clones work while
//! disks are served.
//!
//! Protocol: one JSON request line from the client (a [`Request`]); the
//! server answers, for a long request it runs as a job (`jobs`), with one
//! `{"job":JOBINFO}` line first; then zero or more
//! `{"progress":[done,total]}` lines, then one line that is
//! `{"ok":RESPONSE}` (a [`Response`], tagged by its kind) or
//! `{"error":{"kind":K,"message":M}}`, and closes. Each line is a
//! [`Reply`], so both ends read and write the same types. A client that
//! closes the connection early leaves the job running.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use serde::{Deserialize, Serialize};
use strata_engine::{Datastore, Error, ErrorKind};
use strata_vmdk::VmdkImage;

use crate::api::{JobInfo, Request, Response, VmdkServerStatus};
use crate::jobs::Jobs;
use crate::ops::{execute, Ctx};

/// Longest request line accepted.
const REQUEST_BYTES_MAX: u64 = 1 << 20;

/// One line from the server.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    /// The job the request runs as.
    Job(JobInfo),
    /// Work done so far, out of a total (bytes, or whatever the request counts).
    Progress([u64; 2]),
    Ok(Response),
    Error(ReplyError),
}

#[derive(Debug, Serialize, Deserialize)]
struct ReplyError {
    /// The [`ErrorKind`] by name (see [`kind_name`]).
    kind: String,
    message: String,
}

impl Reply {
    fn error(kind: ErrorKind, message: impl Into<String>) -> Reply {
        Reply::Error(ReplyError {
            kind: kind_name(kind).to_string(),
            message: message.into(),
        })
    }

    fn line(&self) -> String {
        serde_json::to_string(self).expect("serialisable")
    }
}

fn kind_name(k: ErrorKind) -> &'static str {
    match k {
        ErrorKind::NotFound => "not_found",
        ErrorKind::AlreadyExists => "already_exists",
        ErrorKind::InvalidArgument => "invalid_argument",
        ErrorKind::NoSpace => "no_space",
        ErrorKind::Locked => "locked",
        ErrorKind::Refused => "refused",
        ErrorKind::Corrupt => "corrupt",
        ErrorKind::Io => "io",
        ErrorKind::Gone => "gone",
    }
}

fn kind_from(s: &str) -> ErrorKind {
    match s {
        "not_found" => ErrorKind::NotFound,
        "already_exists" => ErrorKind::AlreadyExists,
        "invalid_argument" => ErrorKind::InvalidArgument,
        "no_space" => ErrorKind::NoSpace,
        "locked" => ErrorKind::Locked,
        "refused" => ErrorKind::Refused,
        "corrupt" => ErrorKind::Corrupt,
        "gone" => ErrorKind::Gone,
        _ => ErrorKind::Io,
    }
}

/// A `--vmdk` export as its server's control socket knows it: what a
/// `vmdk_shrink` request is matched against (docs/FORMAT.md §9.5).
#[derive(Clone)]
pub struct VmdkExport {
    /// The top file as given to `serve --vmdk`.
    pub path: PathBuf,
    pub img: Arc<VmdkImage>,
}

/// Whether two paths name the same file (device and inode).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// `vmdk_shrink`: shrink the export whose top file is `path`, online.
fn vmdk_shrink(
    exports: &[VmdkExport],
    path: &Path,
    rate: Option<u64>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    let Some(x) = exports.iter().find(|x| same_file(&x.path, path)) else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("this server does not serve {}", path.display()),
        ));
    };
    let reps = x
        .img
        .shrink_online(rate, progress)
        .map_err(crate::vmdk_cmd::verr)?;
    Ok(Response::VmdkShrink(reps))
}

/// Serve control requests until `stop` is set (checked between connections).
/// `vmdk_shrink` requests are answered for `vmdks`, the other ones by the
/// datastore.
pub fn spawn_server(
    listener: UnixListener,
    ds: Datastore,
    vmdks: Vec<VmdkExport>,
    stats: Arc<strata_stats::StatsRegistry>,
    jobs: Arc<Jobs>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let ds = ds.clone();
                let stats = stats.clone();
                let vmdks = vmdks.clone();
                let jobs = jobs.clone();
                let _ = thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        let start = |req: Request| jobs.start(req, ds.clone(), Some(stats.clone()));
                        handle(conn, Some(&start), &mut |req, progress| match req {
                            Request::VmdkShrink {
                                path,
                                rate_bytes_per_sec,
                            } => vmdk_shrink(&vmdks, path, *rate_bytes_per_sec, progress),
                            req => execute(
                                &Ctx {
                                    ds: &ds,
                                    stats: Some(&stats),
                                    jobs: Some(&jobs),
                                    control: None,
                                },
                                req,
                                progress,
                            ),
                        })
                    });
            }
        })
        .expect("spawn control thread")
}

/// The control socket of a VMDK-only server (no datastore) for one export:
/// answers `status` and `vmdk_shrink` (of this export), refuses every
/// other request, until `stop` is set.
pub fn spawn_vmdk_server(
    listener: UnixListener,
    status: VmdkServerStatus,
    export: VmdkExport,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .name("control-vmdk".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let status = status.clone();
                let export = export.clone();
                let _ = thread::Builder::new()
                    .name("control-vmdk-conn".into())
                    .spawn(move || {
                        handle(conn, None, &mut |req, progress| match req {
                            Request::Status => Ok(Response::VmdkServer(status.clone())),
                            Request::VmdkShrink {
                                path,
                                rate_bytes_per_sec,
                            } => vmdk_shrink(
                                std::slice::from_ref(&export),
                                path,
                                *rate_bytes_per_sec,
                                progress,
                            ),
                            _ => Err(Error::new(
                                ErrorKind::Refused,
                                "this server serves VMDK files only (no datastore); it answers status and vmdk_shrink only",
                            )),
                        })
                    });
            }
        })
        .expect("spawn control thread")
}

/// Answer one connection: read its request, run it with `run`, relaying
/// progress; a long request is started as a job with `start_job` (when the
/// server keeps jobs) and followed.
type Run<'a> = dyn FnMut(&Request, &mut dyn FnMut(u64, u64)) -> Result<Response, Error> + 'a;

fn handle(
    conn: UnixStream,
    start_job: Option<&dyn Fn(Request) -> Arc<crate::jobs::Job>>,
    run: &mut Run<'_>,
) {
    let mut out = match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    };
    let mut reader = BufReader::new(std::io::Read::take(conn, REQUEST_BYTES_MAX));
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let reply = match serde_json::from_str::<Request>(&line) {
        Err(e) => Reply::error(
            ErrorKind::InvalidArgument,
            format!("bad control request: {e}"),
        ),
        Ok(req) if req.is_job() && start_job.is_some() => {
            let job = start_job.expect("checked")(req);
            if writeln!(out, "{}", Reply::Job(job.info()).line()).is_err() {
                return;
            }
            // Stream the job's progress until it ends; a client that goes
            // away leaves it running.
            let mut last = None;
            loop {
                let (p, result) = job.wait(std::time::Duration::from_millis(100));
                if let Some(r) = result {
                    break match r {
                        Ok(r) => Reply::Ok(r),
                        Err(e) => Reply::error(e.kind, e.message),
                    };
                }
                if last != Some(p) {
                    last = Some(p);
                    if writeln!(out, "{}", Reply::Progress([p.0, p.1]).line()).is_err() {
                        return;
                    }
                }
            }
        }
        Ok(req) => {
            let mut last = std::time::Instant::now();
            let mut progress = |done: u64, total: u64| {
                if last.elapsed().as_millis() >= 100 || done == total {
                    last = std::time::Instant::now();
                    let _ = writeln!(out, "{}", Reply::Progress([done, total]).line());
                }
            };
            match run(&req, &mut progress) {
                Ok(r) => Reply::Ok(r),
                Err(e) => Reply::error(e.kind, e.message),
            }
        }
    };
    let _ = writeln!(out, "{}", reply.line());
}

/// Send a request to a running server and wait for its answer.
///
/// A long request runs as a job of the server: with `detach`, this returns
/// as soon as the job has started (`Response::JobStarted`).
pub fn request(
    socket: &Path,
    req: &Request,
    detach: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    let mut s = UnixStream::connect(socket).map_err(|e| {
        Error::new(
            ErrorKind::Locked,
            format!(
                "the datastore is in use and its server does not answer at {}: {e}",
                socket.display()
            ),
        )
    })?;
    let line = serde_json::to_string(req).expect("serialisable");
    writeln!(s, "{line}").map_err(|e| Error::new(ErrorKind::Io, format!("control socket: {e}")))?;
    let reader = BufReader::new(s);
    for line in reader.lines() {
        let line = line.map_err(|e| Error::new(ErrorKind::Io, format!("control socket: {e}")))?;
        let reply: Reply = serde_json::from_str(&line)
            .map_err(|e| Error::new(ErrorKind::Io, format!("bad answer from server: {e}")))?;
        match reply {
            Reply::Job(info) if detach => return Ok(Response::JobStarted(info)),
            Reply::Job(info) => {
                use std::io::IsTerminal;
                if std::io::stderr().is_terminal() {
                    eprintln!(
                        "job {}: {} (Ctrl-C detaches; the server goes on: 'strata jobs')",
                        info.id, info.what
                    );
                }
            }
            Reply::Progress([done, total]) => progress(done, total),
            Reply::Ok(r) => return Ok(r),
            Reply::Error(e) => return Err(Error::new(kind_from(&e.kind), e.message)),
        }
    }
    Err(Error::new(
        ErrorKind::Io,
        "the server closed the control connection without an answer",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lines_keep_their_shapes() {
        assert_eq!(Reply::Progress([1, 2]).line(), r#"{"progress":[1,2]}"#);
        assert_eq!(
            Reply::error(ErrorKind::NotFound, "no disk named 'x'").line(),
            r#"{"error":{"kind":"not_found","message":"no disk named 'x'"}}"#
        );
        let ok = Reply::Ok(Response::Removed { name: "vm".into() }).line();
        assert_eq!(ok, r#"{"ok":{"removed":{"name":"vm"}}}"#);
        match serde_json::from_str::<Reply>(&ok).unwrap() {
            Reply::Ok(Response::Removed { name }) => assert_eq!(name, "vm"),
            other => panic!("decoded as {other:?}"),
        }
    }

    #[test]
    fn every_error_kind_survives_the_socket() {
        use ErrorKind::*;
        for k in [
            NotFound,
            AlreadyExists,
            InvalidArgument,
            NoSpace,
            Locked,
            Refused,
            Corrupt,
            Io,
            Gone,
        ] {
            assert_eq!(kind_from(kind_name(k)), k);
        }
    }
}
