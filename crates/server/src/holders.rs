//! Who holds a VMDK file. The locks themselves (`strata_vmdk::lock`) are
//! OFD locks, which do not say who holds them; so every strata process that
//! locks a chain leaves one small record per locked file in the holder
//! directory, and a refused open reads the records of its file to name the
//! holder (a server with its control socket, or a `vmdk shrink`).
//!
//! Records: `<runtime>/holders/<dev>-<inode>.<pid>` (one JSON object), where
//! `<runtime>` is `$STRATA_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/strata`,
//! else `/tmp/strata-<uid>`. Keyed by device and inode, so any path to the
//! file finds them. A clean exit removes them; a killed process leaves
//! them, and readers skip (and delete) records whose process is gone. The
//! records only name the holder: the locks alone decide who may open.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_vmdk::chain::ExtentImpl;
use strata_vmdk::VmdkImage;

/// One record: who holds one file, and how.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    pid: u32,
    /// The program, e.g. "strata serve --vmdk".
    what: String,
    /// Its control socket, if it has one.
    socket: Option<String>,
    file: String,
    lock: LockMode,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LockMode {
    Exclusive,
    Shared,
}

impl LockMode {
    fn name(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
        }
    }
}

/// The folder holding the records of this user's strata processes.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STRATA_RUNTIME_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("strata");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/strata-{uid}"))
}

fn holders_dir() -> PathBuf {
    runtime_dir().join("holders")
}

fn key(file: &Path) -> Option<String> {
    let m = std::fs::metadata(file).ok()?;
    Some(format!("{}-{}", m.dev(), m.ino()))
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The records this process wrote; dropping it removes them.
#[derive(Default)]
pub struct Records {
    paths: Vec<PathBuf>,
}

impl Drop for Records {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Every file a chain opened, as paths, with whether it is the writable
/// top link's (locked exclusively) or not (locked shared).
pub fn chain_files(img: &VmdkImage, dir: &Path) -> Vec<(PathBuf, bool)> {
    let mut out = Vec::new();
    for l in &img.links {
        out.push((dir.join(&l.name), l.writable));
        for e in &l.extents {
            let name = match &e.imp {
                ExtentImpl::Flat { name, .. } => name.clone(),
                ExtentImpl::Sparse(s) => s.name().to_string(),
                ExtentImpl::Zero => continue,
            };
            out.push((dir.join(name), l.writable));
        }
    }
    out
}

/// Record this process as the holder of every file of `img` (opened from
/// `dir`): `what` names the program, `socket` is its control socket.
/// Best effort: a record that cannot be written only makes a later refusal
/// less specific.
pub fn record(img: &VmdkImage, dir: &Path, what: &str, socket: Option<&Path>) -> Records {
    let mut recs = Records::default();
    let hd = holders_dir();
    if std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&hd)
        .is_err()
    {
        return recs;
    }
    let pid = std::process::id();
    for (file, exclusive) in chain_files(img, dir) {
        let Some(k) = key(&file) else { continue };
        let body = Record {
            pid,
            what: what.to_string(),
            socket: socket.map(|s| s.display().to_string()),
            file: file.display().to_string(),
            lock: if exclusive {
                LockMode::Exclusive
            } else {
                LockMode::Shared
            },
        };
        let body = serde_json::to_string(&body).expect("serialisable");
        let p = hd.join(format!("{k}.{pid}"));
        if std::fs::write(&p, body).is_ok() {
            recs.paths.push(p);
        }
    }
    recs
}

/// The live holders recorded for `file`, as phrases for people, e.g.
/// "strata serve --vmdk (pid 42, control socket /v/a.vmdk.strata.sock)".
pub fn describe(file: &Path) -> Vec<String> {
    let mut out: Vec<String> = live(file)
        .into_iter()
        .map(|r| {
            let (what, lock, pid) = (&r.what, r.lock.name(), r.pid);
            match &r.socket {
                Some(s) => format!("{what} (pid {pid}, control socket {s}, {lock} lock)"),
                None => format!("{what} (pid {pid}, {lock} lock)"),
            }
        })
        .collect();
    out.sort();
    out
}

/// The live processes holding `file` exclusively that have a control
/// socket (a writable server), as (pid, socket): who can shrink it online.
pub fn servers(file: &Path) -> Vec<(u32, PathBuf)> {
    live(file)
        .into_iter()
        .filter(|r| matches!(r.lock, LockMode::Exclusive))
        .filter_map(|r| Some((r.pid, PathBuf::from(r.socket?))))
        .collect()
}

/// The records of live processes (other than this one) holding `file`.
fn live(file: &Path) -> Vec<Record> {
    let (Some(k), Ok(rd)) = (key(file), std::fs::read_dir(holders_dir())) else {
        return Vec::new();
    };
    let prefix = format!("{k}.");
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().to_string();
        if !name.starts_with(&prefix) {
            continue;
        }
        let Ok(r) = std::fs::read_to_string(ent.path())
            .map_err(|_| ())
            .and_then(|t| serde_json::from_str::<Record>(&t).map_err(|_| ()))
        else {
            continue;
        };
        let pid = r.pid;
        if pid == std::process::id() {
            continue;
        }
        if !alive(pid) {
            let _ = std::fs::remove_file(ent.path()); // left by a killed process
            continue;
        }
        out.push(r);
    }
    out
}
