//! Consistency-group requests, and the quiesce-hook contract around a
//! group snapshot's cut (docs/BACKUP.md): `HOOK quiesce` before it,
//! `HOOK unquiesce` once after it whatever happened, and a pending file
//! that makes a restarted server run `unquiesce` a crash skipped.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_api::{GroupSnapshotReport, Request, Response};
use strata_datastore::{
    Datastore, Error, ErrorKind, GroupSnapshotOptions, QuiesceReport, QuiesceResult,
};

/// A hook's `quiesce` that has not finished by then is killed.
pub const QUIESCE_TIMEOUT_DEFAULT_S: u64 = 60;
/// Kept of a failing hook's stderr for the error.
const STDERR_KEPT_BYTES: usize = 2048;

/// Answer a group request; None for any other.
pub fn execute(ds: &dyn Datastore, req: &Request) -> Option<Result<Response, Error>> {
    Some(match req {
        Request::GroupCreate {
            name,
            disks,
            quiesce_hook,
            quiesce_timeout_s,
        } => ds
            .group_create(name, disks, quiesce_hook.clone(), *quiesce_timeout_s)
            .map(Response::Group),
        Request::GroupDelete { name } => ds
            .group_delete(name)
            .map(|()| Response::GroupDeleted { name: name.clone() }),
        Request::GroupMember { name, disk, add } => {
            ds.group_member(name, disk, *add).map(Response::Group)
        }
        Request::GroupList => ds.groups().map(Response::Groups),
        Request::GroupInfo { name } => ds.group_info(name).map(Response::Group),
        Request::GroupSnapshotCreate { .. } => {
            snapshot(ds, req).map(Response::GroupSnapshotCreated)
        }
        Request::GroupSnapshotList { group } => {
            ds.group_snapshots(group).map(Response::GroupSnapshots)
        }
        Request::GroupSnapshotDelete { group, snapshot } => ds
            .group_snapshot_delete(group, snapshot)
            .map(|()| Response::GroupSnapshotDeleted {
                group: group.clone(),
                snapshot: snapshot.clone(),
            }),
        Request::GroupSnapshotRevert {
            group, snapshot, ..
        } => ds
            .group_snapshot_revert(group, snapshot)
            .and_then(|()| ds.group_info(group))
            .and_then(|g| {
                g.disks
                    .iter()
                    .map(|d| ds.disk_view(d, false))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map(|disks| Response::GroupReverted {
                group: group.clone(),
                snapshot: snapshot.clone(),
                disks,
            }),
        Request::GroupClone {
            source,
            name,
            renames,
        } => ds.group_clone(source, name, renames).map(Response::Group),
        _ => return None,
    })
}

/// A hook run that `unquiesce` has not followed yet, kept in the
/// datastore's directory (FORMAT.md §1) while it lasts.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pending {
    group: String,
    snapshot: String,
    hook: String,
    disks: Vec<String>,
    datastore: PathBuf,
}

fn pending_path(dir: &Path, group: &str) -> PathBuf {
    dir.join(format!("quiesce-pending.{group}.json"))
}

impl Pending {
    fn save(&self) -> Result<(), Error> {
        let path = pending_path(&self.datastore, &self.group);
        let tmp = path.with_extension("json.tmp");
        let body = serde_json::to_vec(self).expect("serialisable");
        let io = |e: std::io::Error| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "cannot record the quiesce hook's run in {}: {e}",
                    path.display()
                ),
            )
        };
        {
            let mut f = std::fs::File::create(&tmp).map_err(io)?;
            std::io::Write::write_all(&mut f, &body).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, &path).map_err(io)?;
        if let Ok(d) = std::fs::File::open(&self.datastore) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn clear(&self) {
        let _ = std::fs::remove_file(pending_path(&self.datastore, &self.group));
    }

    fn hook(&self, timeout: Duration) -> Hook<'_> {
        Hook {
            cmd: &self.hook,
            env: vec![
                ("STRATA_GROUP", self.group.clone()),
                ("STRATA_SNAPSHOT", self.snapshot.clone()),
                ("STRATA_DISKS", self.disks.join(" ")),
                ("STRATA_DATASTORE", self.datastore.display().to_string()),
            ],
            timeout,
        }
    }
}

/// Run the `unquiesce` of every hook a dead process left pending in
/// `dir` (at server start, and before a group's next snapshot).
pub fn recover(dir: &Path, only_group: Option<&str>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(group) = name
            .strip_prefix("quiesce-pending.")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        if only_group.is_some_and(|g| g != group) {
            continue;
        }
        let p: Pending = match std::fs::read(e.path())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            Some(p) => p,
            None => {
                tracing::warn!("{}: unreadable, removed", e.path().display());
                let _ = std::fs::remove_file(e.path());
                continue;
            }
        };
        let r = p
            .hook(Duration::from_secs(QUIESCE_TIMEOUT_DEFAULT_S))
            .run("unquiesce");
        match r.result {
            QuiesceResult::Ok => tracing::info!(
                "group '{}': ran the unquiesce a stopped process left pending ({})",
                p.group,
                p.hook
            ),
            _ => tracing::warn!(
                "group '{}': the pending unquiesce failed: {}",
                p.group,
                r.error.unwrap_or_default()
            ),
        }
        p.clear();
    }
}

/// `group snapshot`: quiesce (if a hook is set), cut, unquiesce.
fn snapshot(ds: &dyn Datastore, req: &Request) -> Result<GroupSnapshotReport, Error> {
    let Request::GroupSnapshotCreate {
        group,
        snapshot,
        description,
        quiesce_hook,
        no_quiesce,
        ignore_quiesce_error,
        timeout_s,
        max_pause_ms,
    } = req
    else {
        unreachable!("called for group snapshots only")
    };
    let info = ds.group_info(group)?;
    let mut opts = GroupSnapshotOptions {
        description: description.clone(),
        quiesce: None,
        max_pause: max_pause_ms.map(Duration::from_millis),
    };
    let hook = if *no_quiesce {
        None
    } else {
        quiesce_hook.clone().or(info.quiesce_hook.clone())
    };
    let Some(hook) = hook else {
        return ds
            .group_snapshot_create(group, snapshot, &opts)
            .map(|snapshot| GroupSnapshotReport {
                snapshot,
                unquiesce: None,
            });
    };
    recover(ds.dir(), Some(group));
    let pending = Pending {
        group: group.clone(),
        snapshot: snapshot.clone(),
        hook,
        disks: info.disks.clone(),
        datastore: ds.dir().to_path_buf(),
    };
    let timeout = Duration::from_secs(
        timeout_s
            .or(info.quiesce_timeout_s)
            .unwrap_or(QUIESCE_TIMEOUT_DEFAULT_S),
    );
    pending.save()?;
    let quiesced = pending.hook(timeout).run("quiesce");
    let failed = quiesced.result != QuiesceResult::Ok;
    let r = if failed && !ignore_quiesce_error {
        Err(Error::new(
            ErrorKind::Refused,
            format!(
                "the quiesce hook of group '{group}' {}: nothing was created (add \
                 --ignore-quiesce-error for a crash-consistent snapshot anyway)",
                quiesced.error.clone().unwrap_or_default()
            ),
        ))
    } else {
        opts.quiesce = Some(quiesced);
        ds.group_snapshot_create(group, snapshot, &opts)
    };
    let unquiesced = unquiesce(&pending, timeout);
    r.map(|snapshot| GroupSnapshotReport {
        snapshot,
        unquiesce: Some(unquiesced),
    })
}

/// Run the hook's unquiesce and forget the pending record, whatever the
/// snapshot's outcome; a failure is logged and reported, not an error.
fn unquiesce(pending: &Pending, timeout: Duration) -> QuiesceReport {
    let unquiesced = pending.hook(timeout).run("unquiesce");
    pending.clear();
    if unquiesced.result != QuiesceResult::Ok {
        tracing::warn!(
            "group '{}': unquiesce failed: {}",
            pending.group,
            unquiesced.error.clone().unwrap_or_default()
        );
    }
    unquiesced
}

/// How a hook's `phase` ended, from its exit and the end of its stderr.
fn outcome(
    phase: &str,
    status: std::io::Result<std::process::ExitStatus>,
    stderr: &str,
) -> (QuiesceResult, Option<String>) {
    match status {
        Ok(s) if s.success() => (QuiesceResult::Ok, None),
        Ok(s) => {
            let tail = if stderr.is_empty() {
                String::new()
            } else {
                format!(": {stderr}")
            };
            (
                QuiesceResult::Failed,
                Some(format!("failed '{phase}' ({s}){tail}")),
            )
        }
        Err(e) => (
            QuiesceResult::Failed,
            Some(format!("could not be waited for ({phase}): {e}")),
        ),
    }
}

/// One hook command and its environment.
struct Hook<'a> {
    cmd: &'a str,
    env: Vec<(&'static str, String)>,
    timeout: Duration,
}

impl Hook<'_> {
    /// `sh -c 'CMD "$1"' strata-hook PHASE`, killed with its process
    /// group past the timeout; stdout discarded, stderr kept for errors.
    fn run(&self, phase: &str) -> QuiesceReport {
        let t0 = Instant::now();
        let report = |result, error: Option<String>| QuiesceReport {
            hook: self.cmd.to_string(),
            result,
            duration_ms: t0.elapsed().as_millis() as u64,
            error,
        };
        let spawned = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("{} \"$1\"", self.cmd))
            .arg("strata-hook")
            .arg(phase)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("STRATA_HOOK_PHASE", phase)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                return report(
                    QuiesceResult::Failed,
                    Some(format!("could not be started ({phase}): {e}")),
                )
            }
        };
        let pid = child.id() as i32;
        let mut stderr = child.stderr.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            let cut = buf.len().saturating_sub(STDERR_KEPT_BYTES);
            String::from_utf8_lossy(&buf[cut..]).trim().to_string()
        });
        let status = match rx.recv_timeout(self.timeout) {
            Ok(s) => s,
            Err(_) => {
                // SAFETY: kill(2) on the hook's own process group.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                let _ = rx.recv();
                let _ = reader.join();
                return report(
                    QuiesceResult::Timeout,
                    Some(format!(
                        "did not finish '{phase}' within {} s (killed)",
                        self.timeout.as_secs()
                    )),
                );
            }
        };
        let (result, error) = outcome(phase, status, &reader.join().unwrap_or_default());
        report(result, error)
    }
}
