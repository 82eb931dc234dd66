//! Sessions of a FUSE mount: who has which export's file open (one
//! session per export and opening process), listed for `info` and ended
//! by a forced `rm` or revert (docs/INTERLOCKS.md).

use std::collections::BTreeMap;

use crate::{FuseServer, Shared};

/// The open files of one export by one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub export: String,
    /// The process that opened them (of the thread the kernel names).
    pub pid: u32,
    /// Whether every handle of them is read-only.
    pub read_only: bool,
    /// When the oldest of them was opened.
    pub since_unix: u64,
    /// How many handles.
    pub handles: usize,
}

/// The process of thread `tid`: a FUSE request names the thread that
/// made it, and a session is a process's.
pub(crate) fn process_of(tid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(tid)
}

pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Shared {
    fn sessions(&self) -> Vec<Session> {
        let mut by: BTreeMap<(String, u32), Session> = BTreeMap::new();
        for h in self.handles.lock().values() {
            let export = h.export.lock().clone();
            let s = by
                .entry((export.clone(), h.pid))
                .or_insert_with(|| Session {
                    export,
                    pid: h.pid,
                    read_only: true,
                    since_unix: h.since_unix,
                    handles: 0,
                });
            s.read_only &= h.read_only;
            s.since_unix = s.since_unix.min(h.since_unix);
            s.handles += 1;
        }
        by.into_values().collect()
    }

    fn revoke(&self, export: &str, pid: u32) -> usize {
        let mut handles = self.handles.lock();
        let gone: Vec<u64> = handles
            .iter()
            .filter(|(_, h)| *h.export.lock() == export && h.pid == pid)
            .map(|(&fh, _)| fh)
            .collect();
        let mut revoked = self.revoked.lock();
        for fh in &gone {
            handles.remove(fh);
            revoked.insert(*fh);
        }
        gone.len()
    }
}

impl FuseServer {
    /// Who has files of the mount open now, by export and process.
    pub fn sessions(&self) -> Vec<Session> {
        self.sh.sessions()
    }

    /// Open files follow a rename: each export `rename` maps to a new
    /// name is listed under it from now on (its handles keep their device;
    /// the directory shows the new name at once, from the datastore).
    pub fn rename_exports(&self, rename: &dyn Fn(&str) -> Option<String>) {
        for h in self.sh.handles.lock().values() {
            let mut e = h.export.lock();
            if let Some(new) = rename(&e) {
                *e = new;
            }
        }
    }

    /// End the session of `pid` on `export`: its handles drop their
    /// devices and answer every later request with EIO until the process
    /// closes them (a forced `rm` or revert). How many handles went.
    pub fn revoke(&self, export: &str, pid: u32) -> usize {
        self.sh.revoke(export, pid)
    }
}
