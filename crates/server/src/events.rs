//! The event log (docs/FORMAT.md §13): every change of state a request
//! asks for, every job, alarm, forced interlock, dashboard login,
//! recovery, server start and stop, with its time, who asked and how it
//! ended, kept in the datastore's directory (an object store's: this
//! host's local directory) across restarts, bounded by rotation.
//!
//! One JSON line per event, appended with one write(2) under `flock` on
//! the file, so processes that share the directory (a server, the CLI
//! running a request itself) number their events one after the other.
//! Nothing is fsync'd per event (the change an event describes is durable
//! by its own commit; a killed process loses nothing already written,
//! only a power cut can lose the last events), but the server syncs the
//! file at its clean stop. A line cut short by a crash is skipped on
//! reading, and the next append starts a line of its own after it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use strata_api::event::{Event, EVENTS_LIMIT_DEFAULT, EVENTS_LIMIT_MAX};
use strata_api::units::utc;
use strata_api::Request;
use strata_engine::{Error, ErrorKind};

/// The log: the newest events.
pub const FILE: &str = "events.jsonl";
/// The log before the last rotation (replaced by the next).
pub const FILE_OLD: &str = "events.1.jsonl";
/// An append that would take [`FILE`] past this size first renames it to
/// [`FILE_OLD`]: the two hold at most about twice this.
pub const FILE_BYTES_MAX: u64 = 1 << 20;
/// A text field (target, actor, error, detail) is cut to this many bytes,
/// so that a line stays under [`LINE_BYTES_MAX`].
const TEXT_BYTES_MAX: usize = 1024;
/// The longest line an append writes.
pub const LINE_BYTES_MAX: usize = 4 * TEXT_BYTES_MAX + 512;
/// How much of a file's end is read for the last event's `seq`: a few
/// of the longest lines.
const TAIL_BYTES: u64 = 4 * LINE_BYTES_MAX as u64;
/// How many times an append opens the file again when another process
/// rotated it between its open and its lock.
const OPEN_TRIES: usize = 16;
/// What a file is read up to, at most (a file someone else grew past
/// every bound is read in part, not into all of memory).
const READ_BYTES_MAX: u64 = 4 * FILE_BYTES_MAX;
/// The actor of what the server does by itself.
pub const SERVER: &str = "server";

/// One event to append: `seq` and the time are the log's.
pub struct Entry<'a> {
    pub kind: &'a str,
    pub target: &'a str,
    pub actor: &'a str,
    pub result: Result<(), &'a Error>,
    pub detail: Option<String>,
}

/// Append `e` to the log in `dir`; a log that cannot be written is a
/// warning, never the failure of what it records.
pub fn record(dir: &Path, e: &Entry<'_>) {
    if let Err(err) = append(dir, e) {
        tracing::warn!(
            "event log {}: cannot record {} {}: {err}",
            dir.join(FILE).display(),
            e.kind,
            e.target
        );
    }
}

/// Log request `req` by `actor`, which ended with `result`, if it is a
/// change of state ([`Request::event_kind`]); also as a journal line.
pub fn request(dir: &Path, req: &Request, actor: &str, result: Result<(), &Error>) {
    let Some(kind) = req.event_kind() else { return };
    let target = req.event_target();
    // At info: the CLI's own log shows warnings only, and its stderr is
    // the error's (JSON under --json).
    match result {
        Ok(()) => tracing::info!(event = kind, target = %target, actor, result = "ok",
            "{kind} {target} by {actor}: ok"),
        Err(e) => tracing::info!(event = kind, target = %target, actor, result = e.kind.name(),
            "{kind} {target} by {actor}: {e}"),
    }
    let detail = req.event_detail();
    record(
        dir,
        &Entry {
            kind,
            target: &target,
            actor,
            result,
            detail,
        },
    );
}

/// Log that `req` by `actor`, forced, ends the sessions `ended` (its
/// clients, described; docs/INTERLOCKS.md). The journal has its line from
/// the interlock.
pub fn interlock(dir: &Path, req: &Request, actor: &str, ended: &str) {
    let target = req.event_target();
    let what = req.event_kind().unwrap_or("a request");
    let detail = Some(format!("{what} --force disconnected {ended}"));
    record(
        dir,
        &Entry {
            kind: "interlock",
            target: &target,
            actor,
            result: Ok(()),
            detail,
        },
    );
}

/// Log an alarm's change of state (`kind`: the alarm's; `what`: the
/// change and its figures), which the server reports (the journal has
/// its line from the alarm watcher).
pub fn alarm(dir: &Path, kind: &str, what: String) {
    record(
        dir,
        &Entry {
            kind: "alarm",
            target: kind,
            actor: SERVER,
            result: Ok(()),
            detail: Some(what),
        },
    );
}

/// Log that opening the datastore in `dir` recovered from an unclean stop
/// (`what`: how it found out).
pub fn recovery(dir: &Path, actor: &str, what: &str) {
    tracing::info!(event = "recovery", actor, "recovery: {what}");
    let detail = Some(what.to_string());
    record(
        dir,
        &Entry {
            kind: "recovery",
            target: "",
            actor,
            result: Ok(()),
            detail,
        },
    );
}

/// Log a server's start in `dir`, after a `recovery` event when the last
/// server did not stop cleanly (its `server_start` has no `server_stop`
/// after it) or the datastore says it recovered (`recovered`). Called
/// once the control socket is bound: no other server of the directory
/// runs then.
pub fn server_started(dir: &Path, recovered: Option<String>) {
    let last = read(dir, EVENTS_LIMIT_MAX as usize, None)
        .ok()
        .and_then(|es| {
            es.into_iter()
                .find(|e| e.kind == "server_start" || e.kind == "server_stop")
        })
        .filter(|e| e.kind == "server_start");
    let unclean = last.map(|e| {
        format!(
            "the server that started at {} ({}) did not stop cleanly",
            utc(e.time_unix_ms),
            e.detail.as_deref().unwrap_or("")
        )
    });
    let what: Vec<String> = unclean.into_iter().chain(recovered).collect();
    if !what.is_empty() {
        recovery(dir, SERVER, &what.join("; "));
    }
    let detail = Some(format!(
        "strata {}, pid {}",
        env!("CARGO_PKG_VERSION"),
        std::process::id()
    ));
    record(
        dir,
        &Entry {
            kind: "server_start",
            target: "",
            actor: SERVER,
            result: Ok(()),
            detail,
        },
    );
}

/// Log a server's clean stop in `dir`, and make the log durable.
pub fn server_stopped(dir: &Path) {
    let detail = Some(format!("pid {}", std::process::id()));
    record(
        dir,
        &Entry {
            kind: "server_stop",
            target: "",
            actor: SERVER,
            result: Ok(()),
            detail,
        },
    );
    let synced = File::open(dir.join(FILE))
        .and_then(|f| f.sync_all())
        .and_then(|()| File::open(dir)?.sync_all());
    if let Err(e) = synced {
        tracing::warn!("event log {}: sync: {e}", dir.join(FILE).display());
    }
}

/// `text` cut to `max` bytes (at a character boundary).
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `e` as the event numbered `seq`, its line (with its newline), at
/// most [`LINE_BYTES_MAX`] bytes.
fn line(seq: u64, e: &Entry<'_>) -> String {
    let text = encode(seq, e, TEXT_BYTES_MAX);
    if text.len() <= LINE_BYTES_MAX {
        return text;
    }
    // Escapes made it longer (a control character is six bytes in
    // JSON): cut harder.
    encode(seq, e, TEXT_BYTES_MAX / 8)
}

/// [`line`] with each text cut to `max` bytes.
fn encode(seq: u64, e: &Entry<'_>, max: usize) -> String {
    let cut = |t: &str| cut(t, max);
    let (result, error) = match e.result {
        Ok(()) => ("ok".to_string(), None),
        Err(err) => (err.kind.name().to_string(), Some(cut(&err.to_string()))),
    };
    let ev = Event {
        seq,
        time_unix_ms: now_unix_ms(),
        kind: e.kind.to_string(),
        target: cut(e.target),
        actor: cut(e.actor),
        result,
        error,
        detail: e.detail.as_deref().map(cut),
    };
    serde_json::to_string(&ev).expect("an event serialises") + "\n"
}

/// Hold `flock(LOCK_EX)` on `f` until it is closed.
fn lock(f: &File) -> std::io::Result<()> {
    // SAFETY: flock(2) on a descriptor `f` owns.
    match unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Whether `path` still names the file `f` has open (not renamed away).
fn still_at(f: &File, path: &Path) -> std::io::Result<bool> {
    let (a, b) = (f.metadata()?, std::fs::metadata(path)?);
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// Append `e` to the log in `dir`, numbered one past the last event;
/// its `seq`. Under the lock of the file at [`FILE`]: a process that
/// locked a file another has since rotated away opens the new one.
fn append(dir: &Path, e: &Entry<'_>) -> std::io::Result<u64> {
    let path = dir.join(FILE);
    for _ in 0..OPEN_TRIES {
        let mut f = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        lock(&f)?;
        if !still_at(&f, &path).unwrap_or(false) {
            continue;
        }
        let len = f.metadata()?.len();
        let last = match last_seq(&mut f, len)? {
            Some(s) => Some(s),
            None => match File::open(dir.join(FILE_OLD)) {
                Ok(mut old) => {
                    let n = old.metadata()?.len();
                    last_seq(&mut old, n)?
                }
                Err(_) => None,
            },
        };
        let mut text = line(last.unwrap_or(0) + 1, e);
        if len > 0 && len + text.len() as u64 > FILE_BYTES_MAX {
            // Rotate, then append to the new file under its own lock.
            std::fs::rename(&path, dir.join(FILE_OLD))?;
            continue;
        }
        if len > 0 && !ends_a_line(&mut f, len)? {
            // A line a crash cut short: the event starts a line of its own.
            text.insert(0, '\n');
        }
        f.write_all(text.as_bytes())?;
        return Ok(last.unwrap_or(0) + 1);
    }
    Err(std::io::Error::other(
        "another process kept rotating the log",
    ))
}

/// Whether the `len` bytes of `f` end with a newline.
fn ends_a_line(f: &mut File, len: u64) -> std::io::Result<bool> {
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(len - 1))?;
    f.read_exact(&mut b)?;
    Ok(b[0] == b'\n')
}

/// The `seq` of the last whole event in the first `len` bytes of `f`
/// (read from its last [`TAIL_BYTES`]); None when there is none.
fn last_seq(f: &mut File, len: u64) -> std::io::Result<Option<u64>> {
    let from = len.saturating_sub(TAIL_BYTES);
    f.seek(SeekFrom::Start(from))?;
    let mut tail = Vec::new();
    f.take(len - from).read_to_end(&mut tail)?;
    Ok(tail
        .split(|&b| b == b'\n')
        .rev()
        .find_map(|l| serde_json::from_slice::<Event>(l).ok())
        .map(|e| e.seq))
}

/// The events of one file, oldest first; lines that are not an event
/// (cut short by a crash) skipped. A missing file has none.
fn events_in(path: &Path) -> std::io::Result<Vec<Event>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut raw = Vec::new();
    f.take(READ_BYTES_MAX).read_to_end(&mut raw)?;
    Ok(raw
        .split(|&b| b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Event>(l).ok())
        .collect())
}

/// `events`: the newest `limit` events of the log in `dir` (None: the
/// default), newest first, only those about `target` when given
/// ([`Event::is_about`]).
pub fn read(dir: &Path, limit: usize, target: Option<&str>) -> Result<Vec<Event>, Error> {
    let io = |name: &str, e: std::io::Error| {
        Error::new(
            ErrorKind::Io,
            format!("event log {}: {e}", dir.join(name).display()),
        )
    };
    let mut all = events_in(&dir.join(FILE_OLD)).map_err(|e| io(FILE_OLD, e))?;
    all.extend(events_in(&dir.join(FILE)).map_err(|e| io(FILE, e))?);
    Ok(all
        .into_iter()
        .rev()
        .filter(|e| target.is_none_or(|t| e.is_about(t)))
        .take(limit)
        .collect())
}

/// The `events` request: its limit checked.
pub fn answer(dir: &Path, limit: Option<u32>, target: Option<&str>) -> Result<Vec<Event>, Error> {
    let limit = limit.unwrap_or(EVENTS_LIMIT_DEFAULT);
    if limit == 0 || limit > EVENTS_LIMIT_MAX {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("--limit is a number of events from 1 to {EVENTS_LIMIT_MAX}, not {limit}"),
        ));
    }
    read(dir, limit as usize, target)
}

/// `cli uid N (NAME)`: a user of the CLI, by uid.
pub fn user_actor(uid: u32) -> String {
    match user_name(uid) {
        Some(name) => format!("cli uid {uid} ({name})"),
        None => format!("cli uid {uid}"),
    }
}

/// This process's user, as [`user_actor`] names it: who runs a request
/// the CLI runs itself.
pub fn own_actor() -> String {
    // SAFETY: getuid(2) cannot fail.
    user_actor(unsafe { libc::getuid() })
}

/// The user at the other end of control connection `conn`
/// (`SO_PEERCRED`), as [`user_actor`] names it.
pub fn peer_actor(conn: &std::os::unix::net::UnixStream) -> String {
    match strata_block::peer::peer_cred(conn.as_raw_fd()) {
        Some(c) => user_actor(c.uid),
        None => "cli (peer unknown)".to_string(),
    }
}

/// The login name of `uid` (getpwuid_r), None when it has none.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: an all-zero passwd is a valid value to be overwritten.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into `pw` and `buf` (of the length given),
    // both alive for the call; `found` is set to `&pw` or null.
    let r =
        unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
    if r != 0 || found.is_null() || pw.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name points at a NUL-terminated string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok<'a>(kind: &'a str, target: &'a str) -> Entry<'a> {
        Entry {
            kind,
            target,
            actor: "test",
            result: Ok(()),
            detail: None,
        }
    }

    #[test]
    fn rotation_keeps_the_log_bounded_and_numbered() {
        let d = tempfile::tempdir().unwrap();
        let detail = "x".repeat(900);
        let n = 5_000u64;
        for i in 0..n {
            let target = format!("d{i}");
            let e = Entry {
                detail: Some(detail.clone()),
                ..ok("create", &target)
            };
            assert_eq!(append(d.path(), &e).unwrap(), i + 1);
        }
        let size = |f: &str| std::fs::metadata(d.path().join(f)).unwrap().len();
        assert!(size(FILE) <= FILE_BYTES_MAX, "{}", size(FILE));
        assert!(size(FILE_OLD) <= FILE_BYTES_MAX, "{}", size(FILE_OLD));
        let all = read(d.path(), usize::MAX, None).unwrap();
        // About two files' worth of the newest, numbered without a gap.
        assert!(all.len() > 1_500, "{} kept", all.len());
        assert_eq!(all[0].seq, n);
        assert_eq!(all[0].target, format!("d{}", n - 1));
        for w in all.windows(2) {
            assert_eq!(w[0].seq, w[1].seq + 1);
        }
    }

    #[test]
    fn a_line_cut_short_is_skipped_and_the_next_starts_its_own() {
        let d = tempfile::tempdir().unwrap();
        append(d.path(), &ok("create", "a")).unwrap();
        append(d.path(), &ok("create", "b")).unwrap();
        // A crash in the middle of the third line.
        let full = line(3, &ok("remove", "a"));
        let mut f = OpenOptions::new()
            .append(true)
            .open(d.path().join(FILE))
            .unwrap();
        f.write_all(&full.as_bytes()[..full.len() / 2]).unwrap();
        drop(f);
        assert_eq!(append(d.path(), &ok("snapshot", "b@s1")).unwrap(), 3);
        let all = read(d.path(), 10, None).unwrap();
        let got: Vec<(u64, &str)> = all.iter().map(|e| (e.seq, e.target.as_str())).collect();
        assert_eq!(got, [(3, "b@s1"), (2, "b"), (1, "a")]);
    }

    #[test]
    fn a_line_stays_within_its_bound_whatever_its_texts() {
        let long = "\u{1}".repeat(5000);
        let err = Error::new(ErrorKind::Io, long.clone());
        let e = Entry {
            kind: "create",
            target: &long,
            actor: &long,
            result: Err(&err),
            detail: Some("é".repeat(3000)),
        };
        let l = line(7, &e);
        assert!(l.len() <= LINE_BYTES_MAX, "{} bytes", l.len());
        let back: Event = serde_json::from_str(l.trim_end()).unwrap();
        assert_eq!(back.seq, 7);
        assert!(back.detail.unwrap().ends_with("..."));
    }

    #[test]
    fn appenders_at_once_number_every_event_once() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        append(&dir, &ok("create", &format!("t{t}-{i}"))).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut seqs: Vec<u64> = read(&dir, usize::MAX, None)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
    }

    #[test]
    fn a_target_and_a_limit_pick_the_newest_about_it() {
        let d = tempfile::tempdir().unwrap();
        for t in ["vm", "vm@s1", "other", "vm2", "vm"] {
            append(d.path(), &ok("x", t)).unwrap();
        }
        let got: Vec<u64> = answer(d.path(), Some(2), Some("vm"))
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(got, [5, 2]);
        assert!(answer(d.path(), Some(0), None).is_err());
    }

    #[test]
    fn a_server_start_without_a_stop_is_a_recovery() {
        let d = tempfile::tempdir().unwrap();
        server_started(d.path(), None);
        server_stopped(d.path());
        server_started(d.path(), None);
        let kinds = |d: &Path| -> Vec<String> {
            read(d, 100, None)
                .unwrap()
                .into_iter()
                .rev()
                .map(|e| e.kind)
                .collect()
        };
        assert_eq!(
            kinds(d.path()),
            ["server_start", "server_stop", "server_start"]
        );
        // Killed: no stop.
        server_started(d.path(), Some("replayed 3 log batches".into()));
        let all = read(d.path(), 2, None).unwrap();
        assert_eq!(all[1].kind, "recovery");
        let what = all[1].detail.as_deref().unwrap();
        assert!(
            what.contains("did not stop cleanly") && what.contains("replayed 3"),
            "{what}"
        );
    }
}
