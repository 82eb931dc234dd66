//! The control socket of a running server (its side; the protocol and
//! the client are strata-api's `wire`): CLI commands reach the datastore
//! the server holds open, so snapshots and clones work while disks are
//! served.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use strata_api::wire::Reply;
use strata_api::{Request, Response, VmdkServerStatus};
use strata_engine::{Error, ErrorKind};
use strata_vmdk::VmdkImage;

use crate::jobs::Jobs;
use crate::ops::{execute, Ctx, Mover};

/// Longest request line accepted.
const REQUEST_BYTES_MAX: u64 = 1 << 20;

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
    let reps = x.img.shrink_online(rate, progress)?;
    Ok(Response::VmdkShrink(reps))
}

/// Accept control connections until `stop` is set (checked between
/// connections), each answered by `on_conn` on a thread of its own (named
/// `NAME-conn`). Every server's control socket runs on this loop.
pub(crate) fn accept(
    listener: UnixListener,
    name: &str,
    stop: Arc<AtomicBool>,
    on_conn: impl Fn(UnixStream) + Send + Sync + 'static,
) -> Acceptor {
    let on_conn = Arc::new(on_conn);
    let conn_name = format!("{name}-conn");
    let waker = listener.try_clone().ok();
    let thread = thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let f = on_conn.clone();
                let _ = thread::Builder::new()
                    .name(conn_name.clone())
                    .spawn(move || f(conn));
            }
        })
        .expect("spawn control thread");
    Acceptor { thread, waker }
}

/// A control socket's accepting thread.
pub struct Acceptor {
    thread: thread::JoinHandle<()>,
    /// The listening socket, to wake the thread with.
    waker: Option<UnixListener>,
}

impl Acceptor {
    /// With the loop's `stop` set: wake it and wait for it to end. The
    /// listening socket is shut down rather than connected to, so that a
    /// socket file deleted under the server (its datastore directory
    /// removed) does not leave the thread waiting in accept(2) and the
    /// server unable to stop.
    pub fn stop(self) {
        match &self.waker {
            // SAFETY: shutdown(2) on a descriptor the listener owns; on
            // Linux it ends a blocked accept(2) with EINVAL.
            Some(l) => unsafe {
                libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR);
            },
            None => return,
        }
        let _ = self.thread.join();
    }
}

/// What a server with a datastore runs requests against: its datastore,
/// `--vmdk` exports, statistics, jobs and placement. The control socket
/// and the HTTP API (`web`) both run requests here.
pub struct Handler {
    /// The server's datastore, either kind.
    pub ds: crate::placement::Store,
    pub vmdks: Vec<VmdkExport>,
    pub stats: Arc<strata_stats::StatsRegistry>,
    pub jobs: Arc<Jobs>,
    pub mover: Option<Arc<dyn Mover + Send + Sync>>,
    /// Who has which disk open.
    pub clients: Arc<crate::clients::Clients>,
}

impl Handler {
    /// What requests run against here, logged as `actor`'s when it is
    /// given.
    fn ctx<'a>(&'a self, actor: Option<&'a str>) -> Ctx<'a> {
        Ctx {
            ds: &*self.ds,
            stats: Some(&self.stats),
            jobs: Some(&*self.jobs),
            control: None,
            mover: self.mover.as_deref().map(|m| m as &dyn Mover),
            clients: Some(&self.clients),
            actor,
        }
    }

    /// Run `f` with this handler's request context, without an actor (a
    /// request `f` runs logs its own).
    pub fn with_ctx(&self, f: &mut dyn FnMut(&Ctx<'_>)) {
        f(&self.ctx(None))
    }

    /// Run one request here (a job's too, in this thread), asked by
    /// `actor` (the event log's: `events`).
    pub fn run(
        &self,
        req: &Request,
        actor: &str,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Response, Error> {
        match req {
            Request::VmdkShrink {
                path,
                rate_bytes_per_sec,
            } => {
                let r = vmdk_shrink(&self.vmdks, path, *rate_bytes_per_sec, progress);
                crate::events::request(self.ds.dir(), req, actor, r.as_ref().map(|_| ()));
                r
            }
            req => execute(&self.ctx(Some(actor)), req, progress),
        }
    }

    /// Start a long request as a job of the server, asked by `actor`.
    pub fn start_job(&self, req: Request, actor: &str) -> Arc<crate::jobs::Job> {
        self.jobs
            .start(req, self.ds.clone(), Some(self.stats.clone()), actor)
    }
}

impl crate::web::Backend for Handler {
    fn run(&self, req: Request, actor: &str) -> Result<Response, Error> {
        if req.is_job() {
            // Refused at once rather than as a failed job, unless the disk
            // lives in another datastore (its kind decides there).
            let placed = match &req {
                Request::Convert { name, .. } | Request::Defrag { name, .. } => {
                    self.mover.as_ref().is_some_and(|m| m.serves(name))
                }
                _ => false,
            };
            if !placed {
                if let Err(e) = crate::ops::refuse_unsupported(&*self.ds, &req) {
                    crate::events::request(self.ds.dir(), &req, actor, Err(&e));
                    return Err(e);
                }
            }
            return Ok(Response::JobStarted(self.start_job(req, actor).info()));
        }
        Handler::run(self, &req, actor, &mut |_, _| {})
    }
    fn record(&self, e: &crate::events::Entry<'_>) {
        crate::events::record(self.ds.dir(), e);
    }
    fn shared(&self) -> bool {
        // Disks with writers (the dashboard's writer and generation).
        self.ds
            .supports(strata_datastore::Capability::Claims)
            .is_ok()
    }
}

/// Serve control requests until `stop` is set (checked between connections).
pub fn spawn_server(
    listener: UnixListener,
    handler: Arc<Handler>,
    stop: Arc<AtomicBool>,
) -> Acceptor {
    accept(listener, "control", stop, move |conn| {
        let actor = crate::events::peer_actor(&conn);
        let start = |req: Request| handler.start_job(req, &actor);
        handle(conn, Some(&start), &mut |req, progress| {
            handler.run(req, &actor, progress)
        })
    })
}

/// The control socket of a VMDK-only server (no datastore) for one export:
/// answers `status` and `vmdk_shrink` (of this export), refuses every
/// other request, until `stop` is set.
pub fn spawn_vmdk_server(
    listener: UnixListener,
    status: VmdkServerStatus,
    export: VmdkExport,
    stop: Arc<AtomicBool>,
) -> Acceptor {
    accept(listener, "control-vmdk", stop, move |conn| {
        let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        handle(conn, None, &mut |req, progress| {
            match req {
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
        }
        })
    })
}

/// Answer one connection: read its request, run it with `run`, relaying
/// progress; a long request is started as a job with `start_job` (when the
/// server keeps jobs) and followed.
pub(crate) type Run<'a> =
    dyn FnMut(&Request, &mut dyn FnMut(u64, u64)) -> Result<Response, Error> + 'a;

/// The request line a client sent (up to its newline, at most
/// `REQUEST_BYTES_MAX` bytes), read into a buffer of our own rather than
/// a `BufReader`'s, so that nothing of it outlives the wipe in `handle`.
/// The client sends its one line and waits for the answer, so nothing
/// after the newline is read. None if the client went away first.
fn request_line(mut conn: UnixStream) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut line = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let r = loop {
        match conn.read(&mut chunk) {
            Ok(0) => break !line.is_empty(),
            Ok(n) => {
                line.extend_from_slice(&chunk[..n]);
                if chunk[..n].contains(&b'\n') {
                    break true;
                }
                if line.len() as u64 > REQUEST_BYTES_MAX {
                    break true; // the parse then refuses it
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    strata_api::key::wipe(&mut chunk);
    if !r {
        strata_api::key::wipe(&mut line);
        return None;
    }
    Some(line)
}

pub(crate) fn handle(
    conn: UnixStream,
    start_job: Option<&dyn Fn(Request) -> Arc<crate::jobs::Job>>,
    run: &mut Run<'_>,
) {
    let mut out = match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    };
    let Some(mut line) = request_line(conn) else {
        return;
    };
    let parsed = serde_json::from_slice::<Request>(&line);
    // The line may hold a secret (unlock, key add, create --encrypt): the
    // parsed `Secret` wipes itself when dropped, the line here.
    strata_api::key::wipe(&mut line);
    drop(line);
    let reply = match parsed {
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
                        Ok(r) => Reply::Ok(Box::new(r)),
                        Err(e) => Reply::failed(&e),
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
                Ok(r) => Reply::Ok(Box::new(r)),
                Err(e) => Reply::failed(&e),
            }
        }
    };
    let _ = writeln!(out, "{}", reply.line());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_line_is_read_to_its_newline_and_no_further() {
        let (mut client, server) = UnixStream::pair().unwrap();
        client.write_all(b"{\"op\":\"list\"}\n").unwrap();
        assert_eq!(request_line(server).unwrap(), b"{\"op\":\"list\"}\n");
        // A client gone before sending anything gives no line; one that
        // sent part of a line and closed gives that part (which the
        // parser then refuses).
        let (client, server) = UnixStream::pair().unwrap();
        drop(client);
        assert!(request_line(server).is_none());
        let (mut client, server) = UnixStream::pair().unwrap();
        client.write_all(b"{\"op\":").unwrap();
        drop(client);
        assert_eq!(request_line(server).unwrap(), b"{\"op\":");
    }

    #[test]
    fn an_endless_line_stops_past_the_limit() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            let junk = vec![b'x'; 64 * 1024];
            while client.write_all(&junk).is_ok() {}
        });
        let line = request_line(server).unwrap();
        assert!(line.len() as u64 > REQUEST_BYTES_MAX);
        assert!(line.len() as u64 <= REQUEST_BYTES_MAX + 4096);
        writer.join().unwrap();
    }
}
