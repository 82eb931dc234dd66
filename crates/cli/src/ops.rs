//! Every datastore command as a serialisable request, executed the same way
//! whether the CLI opened the datastore itself or a running server does it
//! for the CLI over the control socket.

use std::fs::{File, OpenOptions as FsOpen};
use std::io::{Read, Seek, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use strata_engine::{Datastore, Error, ErrorKind, OpenOptions, Provisioning};
use strata_storage::FileBackend;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    List,
    Info {
        name: String,
    },
    Create {
        name: String,
        size_bytes: u64,
        provisioning: Provisioning,
    },
    Remove {
        name: String,
    },
    Extend {
        name: String,
        size_bytes: u64,
    },
    SnapshotCreate {
        disk: String,
        snapshot: String,
        description: String,
    },
    SnapshotList {
        disk: String,
    },
    SnapshotRevert {
        disk: String,
        snapshot: String,
    },
    SnapshotDelete {
        disk: String,
        snapshot: String,
    },
    CloneLinked {
        source: String,
        name: String,
    },
    CloneFull {
        source: String,
        name: String,
        provisioning: Provisioning,
    },
    Check,
    /// I/O statistics of one export (or all), optionally reset after
    /// reading, and recording paused (false) or resumed (true) after that.
    Stats {
        disk: Option<String>,
        reset: bool,
        #[serde(default)]
        recording: Option<bool>,
    },
    /// Import a VMDK chain, raw or qcow2 image as a new disk.
    Import {
        path: std::path::PathBuf,
        name: String,
        provisioning: Provisioning,
        format: Option<String>,
    },
    /// Export a disk or snapshot as VMDK (optionally its snapshot path as a chain).
    Export {
        target: String,
        out: std::path::PathBuf,
        subformat: String,
        chain: bool,
        adapter: String,
    },
}

impl Request {
    /// Whether the request may take long enough to deserve a progress bar.
    pub fn shows_progress(&self) -> bool {
        matches!(
            self,
            Request::CloneFull { .. }
                | Request::Import { .. }
                | Request::Export { .. }
                | Request::Create {
                    provisioning: Provisioning::Eagerzeroedthick,
                    ..
                }
        )
    }
}

fn to_value<T: Serialize>(v: T) -> Value {
    serde_json::to_value(v).expect("serialisable")
}

/// Run one request against an open datastore.
/// What a request runs against: the datastore and, inside a server, the
/// I/O statistics of its exports.
pub struct Ctx<'a> {
    pub ds: &'a Datastore,
    pub stats: Option<&'a strata_stats::StatsRegistry>,
}

/// Run one request.
pub fn execute(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Value, Error> {
    let ds = ctx.ds;
    Ok(match req {
        Request::Status => to_value(ds.info()),
        Request::List => to_value(ds.list_disks()),
        Request::Info { name } => to_value(ds.disk_info(name)?),
        Request::Create {
            name,
            size_bytes,
            provisioning,
        } => to_value(ds.create_disk(name, *size_bytes, *provisioning, progress)?),
        Request::Remove { name } => {
            ds.remove_disk(name)?;
            json!({ "removed": name })
        }
        Request::Extend { name, size_bytes } => to_value(ds.extend_disk(name, *size_bytes)?),
        Request::SnapshotCreate {
            disk,
            snapshot,
            description,
        } => to_value(ds.snapshot_create(disk, snapshot, description)?),
        Request::SnapshotList { disk } => to_value(ds.snapshot_list(disk)?),
        Request::SnapshotRevert { disk, snapshot } => {
            ds.snapshot_revert(disk, snapshot)?;
            to_value(ds.disk_info(disk)?)
        }
        Request::SnapshotDelete { disk, snapshot } => {
            ds.snapshot_delete(disk, snapshot)?;
            json!({ "deleted": format!("{disk}@{snapshot}") })
        }
        Request::CloneLinked { source, name } => to_value(ds.clone_linked(source, name)?),
        Request::CloneFull {
            source,
            name,
            provisioning,
        } => to_value(ds.clone_full(source, name, *provisioning, progress)?),
        Request::Check => to_value(ds.check()?),
        Request::Import {
            path,
            name,
            provisioning,
            format,
        } => crate::vmdk_cmd::import(ds, path, name, *provisioning, format.as_deref(), progress)?,
        Request::Export {
            target,
            out,
            subformat,
            chain,
            adapter,
        } => {
            let sub = strata_vmdk::Subformat::parse(subformat)
                .map_err(|e| Error::new(ErrorKind::InvalidArgument, e))?;
            crate::vmdk_cmd::export(ds, target, out, sub, *chain, adapter, progress)?
        }
        Request::Stats {
            disk,
            reset,
            recording,
        } => {
            let Some(reg) = ctx.stats else {
                return Err(Error::new(
                    ErrorKind::Refused,
                    "I/O statistics are kept by a running server: start 'strata serve' for this datastore",
                ));
            };
            let snaps: Vec<(String, strata_stats::StatsSnapshot)> = match disk {
                Some(d) => {
                    ds.open_disk(d)?; // a clear error for a name that does not exist
                    let stats = reg.get_or_create(d);
                    let mut snap = stats.snapshot();
                    if *reset {
                        stats.reset();
                    }
                    if let Some(on) = *recording {
                        stats.set_recording(on);
                        snap.recording = on;
                    }
                    vec![(d.clone(), snap)]
                }
                None => {
                    let mut all = reg.snapshot_all();
                    if *reset {
                        reg.reset_all();
                    }
                    if let Some(on) = *recording {
                        reg.set_recording_all(on);
                        for (_, snap) in &mut all {
                            snap.recording = on;
                        }
                    }
                    all
                }
            };
            serde_json::from_str(&strata_stats::render_json(&snaps)).expect("stats JSON")
        }
    })
}

pub enum LockOutcome {
    Locked(File),
    /// Another process holds it; its pid if it wrote one.
    Held(Option<u32>),
}

/// Take the datastore's lock without waiting.
pub fn try_lock(dir: &Path) -> Result<LockOutcome, Error> {
    let path = dir.join(strata_format::FILE_LOCK);
    let mut f = FsOpen::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", path.display())))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        return Ok(LockOutcome::Held(s.trim().parse().ok()));
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = write!(f, "{}", std::process::id());
    Ok(LockOutcome::Locked(f))
}

/// Open a datastore directory for exclusive use.
pub fn open_local(dir: &Path, lock: File, cache_bytes: u64) -> Result<Datastore, Error> {
    Datastore::open(
        Arc::new(FileBackend::new(dir)),
        &OpenOptions { cache_bytes },
        Some(lock),
    )
}
