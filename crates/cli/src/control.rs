//! The control socket of a running server: CLI commands reach the
//! datastore the server holds open, so snapshots and clones work while
//! disks are served.
//!
//! Protocol: one JSON request line from the client; the server answers with
//! zero or more `{"progress":[done,total]}` lines, then one line that is
//! `{"ok":VALUE}` or `{"error":{"kind":K,"message":M}}`, and closes.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use serde_json::{json, Value};
use strata_engine::{Datastore, Error, ErrorKind};

use crate::ops::{execute, Ctx, Request};

/// Longest request line accepted.
const REQUEST_BYTES_MAX: u64 = 1 << 20;

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

/// Serve control requests until `stop` is set (checked between connections).
pub fn spawn_server(
    listener: UnixListener,
    ds: Datastore,
    stats: Arc<strata_stats::StatsRegistry>,
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
                let _ = thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        handle(
                            conn,
                            &Ctx {
                                ds: &ds,
                                stats: Some(&stats),
                            },
                        )
                    });
            }
        })
        .expect("spawn control thread")
}

/// The control socket of a VMDK-only server (no datastore): answers
/// `status` with `status`, refuses every other request, until `stop` is set.
pub fn spawn_vmdk_server(
    listener: UnixListener,
    status: Value,
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
                let Ok(mut out) = conn.try_clone() else {
                    continue;
                };
                let mut reader = BufReader::new(std::io::Read::take(conn, REQUEST_BYTES_MAX));
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let reply = match serde_json::from_str::<Request>(&line) {
                    Ok(Request::Status) => json!({ "ok": status }),
                    _ => json!({"error": {"kind": "refused", "message":
                        "this server serves VMDK files only (no datastore); it answers status only"}}),
                };
                let _ = writeln!(out, "{reply}");
            }
        })
        .expect("spawn control thread")
}

fn handle(conn: UnixStream, ctx: &Ctx<'_>) {
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
        Err(e) => {
            json!({"error": {"kind": "invalid_argument", "message": format!("bad control request: {e}")}})
        }
        Ok(req) => {
            let mut last = std::time::Instant::now();
            let mut progress = |done: u64, total: u64| {
                if last.elapsed().as_millis() >= 100 || done == total {
                    last = std::time::Instant::now();
                    let _ = writeln!(out, "{}", json!({"progress": [done, total]}));
                }
            };
            match execute(ctx, &req, &mut progress) {
                Ok(v) => json!({ "ok": v }),
                Err(e) => json!({"error": {"kind": kind_name(e.kind), "message": e.message}}),
            }
        }
    };
    let _ = writeln!(out, "{reply}");
}

/// Send a request to a running server and wait for its answer.
pub fn request(
    socket: &Path,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Value, Error> {
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
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| Error::new(ErrorKind::Io, format!("bad answer from server: {e}")))?;
        if let Some(p) = v.get("progress").and_then(|p| p.as_array()) {
            if let (Some(d), Some(t)) = (
                p.first().and_then(|x| x.as_u64()),
                p.get(1).and_then(|x| x.as_u64()),
            ) {
                progress(d, t);
            }
            continue;
        }
        if let Some(ok) = v.get("ok") {
            return Ok(ok.clone());
        }
        if let Some(e) = v.get("error") {
            let kind = kind_from(e.get("kind").and_then(|k| k.as_str()).unwrap_or("io"));
            let msg = e
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or("unknown error");
            return Err(Error::new(kind, msg));
        }
    }
    Err(Error::new(
        ErrorKind::Io,
        "the server closed the control connection without an answer",
    ))
}
