//! The one place the command line becomes typed requests ([`Action`]),
//! one function per family of commands. Checks that need no datastore (a
//! subformat's name, `--type` on a linked clone, an alarm's thresholds)
//! happen here, so a remote server sees only requests that make sense.
//! How the answer is printed (`--json`) is the command line's, not the
//! action's: every answer has both forms.

use std::path::PathBuf;

use strata_api::request::absolute;
use strata_api::units::{invalid, sectors_up, NewSize};
use strata_api::{
    AlarmRule, Error, ImageFormat, IoLimits, JobAction, Provisioning, Request, Subformat,
    VmdkRequest,
};

use crate::args::{AlarmCmd, Cmd, JobCmd, SnapCmd, VhostCmd, VmdkCmd};
use crate::serve_args::ServeArgs;
use crate::target::names;

/// The action of a command whose FILE may be `-`: a stream through
/// stdin or stdout (`main` makes the pipe and fills in its path), else a
/// datastore request naming the file (absolute).
fn stream_or_file<'a>(
    file: &str,
    pipe: Pipe,
    request: impl FnOnce(PathBuf) -> Request,
) -> Result<Action<'a>, Error> {
    Ok(if file == "-" {
        Action::Stream {
            request: request(PathBuf::new()),
            pipe,
        }
    } else {
        datastore(request(absolute(std::path::Path::new(file))?))
    })
}

/// Which way a [`Action::Stream`]'s data flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipe {
    /// The request writes the stream: copied to stdout.
    Out,
    /// The request reads the stream: copied from stdin.
    In,
}

/// What a command line asks for, typed.
pub enum Action<'a> {
    /// `init`: make a datastore (0: the file system's free space).
    Init { capacity_bytes: u64 },
    /// `init --object-store URL` and `attach --object-store URL`.
    Shared { url: &'a str, attach: bool },
    /// `serve`
    Serve(&'a ServeArgs),
    /// `completions SHELL`
    Completions(clap_complete::Shell),
    /// `manpages DIR`
    Manpages(&'a std::path::Path),
    /// A datastore request, run here or by the server holding the datastore.
    Datastore {
        request: Request,
        /// Run again every second until interrupted (`stats --watch`).
        watch: bool,
    },
    /// `export-diff ... -` / `import-diff - ...`: a datastore request whose
    /// stream is this process's stdout (`Out`) or stdin (`In`), through a
    /// pipe the request names.
    Stream { request: Request, pipe: Pipe },
    /// A command on VMDK files, run here.
    Vmdk(VmdkRequest),
    /// `info DISK@SNAP`: the snapshot, out of its disk's snapshot list.
    Snapshot { request: Request, name: &'a str },
    /// `jobs show ID`: the job, out of the server's list.
    Job(u64),
}

impl Action<'_> {
    /// Whether the action answers with something `--json` can print
    /// (a local `init`, `serve`, `completions` and `manpages` do not).
    pub fn has_answer(&self) -> bool {
        !matches!(
            self,
            Action::Init { .. } | Action::Serve(_) | Action::Completions(_) | Action::Manpages(_)
        )
    }
}

impl<'a> TryFrom<&'a Cmd> for Action<'a> {
    type Error = Error;

    fn try_from(cmd: &'a Cmd) -> Result<Action<'a>, Error> {
        match cmd {
            Cmd::Init { .. }
            | Cmd::Attach { .. }
            | Cmd::Serve(_)
            | Cmd::Completions { .. }
            | Cmd::Manpages { .. } => local_action(cmd),
            Cmd::Vmdk(_) => vmdk_action(cmd),
            Cmd::Claim { .. } | Cmd::Release { .. } | Cmd::Gc { .. } | Cmd::Compact { .. } => {
                object_store_action(cmd)
            }
            Cmd::Status
            | Cmd::Grow { .. }
            | Cmd::Alarm(_)
            | Cmd::Check
            | Cmd::Jobs { .. }
            | Cmd::Events { .. }
            | Cmd::Vhost(_) => store_action(cmd),
            Cmd::List
            | Cmd::Info { .. }
            | Cmd::Create { .. }
            | Cmd::Rm { .. }
            | Cmd::Rename { .. }
            | Cmd::Extend { .. }
            | Cmd::Convert { .. } => disk_action(cmd),
            Cmd::Limit { .. } | Cmd::Punchzero { .. } => limit_action(cmd),
            Cmd::Move { .. } | Cmd::Defrag { .. } | Cmd::Dedup { .. } | Cmd::Compress { .. } => {
                layout_action(cmd)
            }
            Cmd::Snapshot(_) | Cmd::Group(_) | Cmd::Schedule(_) => snapshot_action(cmd),
            Cmd::Unlock { disk, key } => Ok(datastore(crate::keys::unlock(disk, key)?)),
            Cmd::Lock { disk, force } => {
                Ok(datastore(Request::Key(strata_api::KeyRequest::Lock {
                    name: disk.clone(),
                    force: *force,
                })))
            }
            Cmd::Key(k) => Ok(datastore(crate::keys::key(k)?)),
            Cmd::Rekey {
                disk,
                key,
                new,
                deep,
                rate,
            } => {
                let deep = deep.then_some(*rate);
                Ok(datastore(crate::keys::rekey(disk, key, new, deep)?))
            }
            Cmd::Clone { .. } => clone_action(cmd),
            Cmd::ExportDiff { .. } | Cmd::ImportDiff { .. } | Cmd::Diff { .. } => diff_action(cmd),
            Cmd::Stats { .. } | Cmd::Import { .. } | Cmd::Export { .. } => data_action(cmd),
        }
    }
}

/// A datastore request, run here or by the server holding the datastore.
fn datastore<'a>(request: Request) -> Action<'a> {
    Action::Datastore {
        request,
        watch: false,
    }
}

/// What a family's function answers for a command of another family
/// (`try_from` sends each command to its own).
fn not_this_family() -> Error {
    invalid("this command has no action here")
}

/// What runs here without a datastore: init and attach, serve, completions, man
/// pages.
fn local_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Init {
            capacity,
            object_store: None,
        } => Action::Init {
            capacity_bytes: capacity.unwrap_or(0),
        },
        Cmd::Init {
            object_store: Some(url),
            ..
        } => Action::Shared { url, attach: false },
        Cmd::Attach { object_store } => Action::Shared {
            url: object_store,
            attach: true,
        },
        Cmd::Serve(args) => Action::Serve(args),
        Cmd::Completions { shell } => Action::Completions(*shell),
        Cmd::Manpages { dir } => Action::Manpages(dir),
        _ => return Err(not_this_family()),
    })
}

/// `strata vmdk`: commands on VMDK files, run here.
fn vmdk_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(Action::Vmdk(match cmd {
        Cmd::Vmdk(VmdkCmd::Info { path }) => VmdkRequest::Info { path: path.clone() },
        Cmd::Vmdk(VmdkCmd::Check { path, repair }) => VmdkRequest::Check {
            path: path.clone(),
            repair: *repair,
        },
        Cmd::Vmdk(VmdkCmd::Shrink { path, rate }) => VmdkRequest::Shrink {
            path: path.clone(),
            rate_bytes_per_sec: *rate,
        },
        _ => return Err(not_this_family()),
    }))
}

/// An object store's own commands: claim, release, gc, compact.
fn object_store_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(datastore(match cmd {
        Cmd::Claim {
            name,
            handover,
            wait,
        } => Request::Claim {
            name: name.clone(),
            handover: *handover,
            wait_seconds: handover.then_some(*wait),
        },
        Cmd::Release { name } => Request::Release { name: name.clone() },
        Cmd::Gc { dry_run } => Request::Gc { dry_run: *dry_run },
        Cmd::Compact {
            name,
            below,
            dry_run,
        } => Request::Compact {
            name: name.clone(),
            below_pct: Some(*below),
            dry_run: *dry_run,
        },
        _ => return Err(not_this_family()),
    }))
}

/// The datastore as a whole: status, capacity, alarms, check, jobs.
fn store_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(datastore(match cmd {
        Cmd::Status => Request::Status,
        Cmd::Grow { capacity } => Request::Grow {
            capacity_bytes: *capacity,
        },
        Cmd::Alarm(AlarmCmd::Set {
            kind,
            warning,
            alarm,
            exec,
        }) => {
            let rule = AlarmRule {
                kind: *kind,
                warning_percent: *warning,
                alarm_percent: *alarm,
                exec: exec.clone(),
            };
            // Checked here too, so a mistake needs no datastore.
            rule.validate()?;
            Request::AlarmSet {
                rule,
                keep_exec: exec.is_none(),
            }
        }
        Cmd::Alarm(AlarmCmd::List) => Request::AlarmList,
        Cmd::Jobs { action: None } => Request::Jobs,
        Cmd::Jobs {
            action: Some(JobCmd::Show { id }),
        } => return Ok(Action::Job(*id)),
        Cmd::Jobs {
            action: Some(job), ..
        } => {
            let (id, action) = match job {
                JobCmd::Pause { id } => (id, JobAction::Pause),
                JobCmd::Resume { id } => (id, JobAction::Resume),
                JobCmd::Cancel { id } => (id, JobAction::Cancel),
                JobCmd::Show { .. } => unreachable!("matched above"),
            };
            Request::JobControl { id: *id, action }
        }
        Cmd::Check => Request::Check,
        Cmd::Events { limit, target } => Request::Events {
            limit: Some(*limit),
            target: target.clone(),
        },
        Cmd::Vhost(VhostCmd::Add { disk, socket }) => Request::VhostAdd {
            disk: disk.clone(),
            socket: socket_path(socket)?,
        },
        Cmd::Vhost(VhostCmd::Remove { socket, force }) => Request::VhostRemove {
            socket: socket_path(socket)?,
            force: *force,
        },
        Cmd::Vhost(VhostCmd::List) => Request::VhostList,
        _ => return Err(not_this_family()),
    }))
}

/// One disk: list, info, create, rm, extend, convert.
fn disk_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(datastore(match cmd {
        Cmd::List => Request::List,
        Cmd::Info { name } => match strata_engine::split_target(name) {
            (disk, Some(_)) => {
                let request = Request::SnapshotList { disk: disk.into() };
                return Ok(Action::Snapshot { request, name });
            }
            _ => Request::Info { name: name.clone() },
        },
        Cmd::Create {
            name,
            size,
            provisioning,
            encrypt,
            key,
            key_label,
        } => Request::Create {
            name: name.clone(),
            size_bytes: sectors(*size)?,
            provisioning: *provisioning,
            encrypt: match encrypt {
                true => key.grant(key_label.as_ref())?,
                false if key.secret_given() => {
                    return Err(invalid("a key for a new disk goes with --encrypt"))
                }
                false => None,
            },
        },
        Cmd::Rm { name, force } => Request::Remove {
            name: name.clone(),
            force: *force,
        },
        Cmd::Rename { name, to } => rename(name, to)?,
        Cmd::Extend { name, size } => {
            let (bytes, by) = match *size {
                NewSize::To(b) => (b, false),
                NewSize::By(b) => (b, true),
            };
            Request::Extend {
                name: name.clone(),
                size_bytes: sectors(bytes)?,
                by,
            }
        }
        Cmd::Convert {
            name,
            provisioning,
            rate,
        } => Request::Convert {
            name: name.clone(),
            provisioning: *provisioning,
            rate_bytes_per_sec: *rate,
        },
        _ => return Err(not_this_family()),
    }))
}

/// A disk's I/O limits and zero reclaim.
fn limit_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(datastore(match cmd {
        Cmd::Limit {
            name,
            iops,
            bps,
            burst,
            clear,
        } => {
            if !clear && iops.is_none() && bps.is_none() {
                return Err(invalid(
                    "give --iops N and/or --bps SIZE (and optionally --burst SECONDS), or --clear",
                ));
            }
            Request::Limit {
                name: name.clone(),
                limits: IoLimits {
                    iops: *iops,
                    bps: *bps,
                    burst_seconds: *burst,
                },
            }
        }
        Cmd::Punchzero { name, rate } => Request::PunchZero {
            name: name.clone(),
            rate_bytes_per_sec: *rate,
        },
        _ => return Err(not_this_family()),
    }))
}

/// Where a disk lives and how it is laid out: move, defrag.
fn layout_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(datastore(match cmd {
        Cmd::Move {
            name,
            to,
            provisioning,
            head_only,
            rate,
        } => Request::Move {
            name: name.clone(),
            to: absolute(to)?,
            head_only: *head_only,
            provisioning: *provisioning,
            rate_bytes_per_sec: *rate,
        },
        Cmd::Defrag {
            name: Some(name),
            free_space: false,
            dry_run,
            rate,
        } => Request::Defrag {
            name: name.clone(),
            dry_run: *dry_run,
            rate_bytes_per_sec: *rate,
        },
        Cmd::Defrag { rate, .. } => Request::DefragFreeSpace {
            rate_bytes_per_sec: *rate,
        },
        Cmd::Dedup {
            disks,
            rate,
            estimate: true,
        } => Request::DedupEstimate {
            disks: disks.clone(),
            rate_bytes_per_sec: *rate,
        },
        Cmd::Dedup { disks, rate, .. } => Request::Dedup {
            disks: disks.clone(),
            rate_bytes_per_sec: *rate,
        },
        Cmd::Compress { disks, codec, rate } => Request::Compress {
            disks: disks.clone(),
            codec: *codec,
            rate_bytes_per_sec: *rate,
        },
        _ => return Err(not_this_family()),
    }))
}

/// Snapshots and groups.
fn snapshot_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(datastore(match cmd {
        Cmd::Snapshot(SnapCmd::Create { at, description }) => {
            let (disk, snapshot) = names(&at.target, at.snapshot.as_deref())?;
            let description = description.clone();
            Request::SnapshotCreate {
                disk,
                snapshot,
                description,
            }
        }
        Cmd::Group(g) => g.request()?,
        Cmd::Schedule(s) => s.request()?,
        Cmd::Snapshot(SnapCmd::List { disk }) => Request::SnapshotList { disk: disk.clone() },
        Cmd::Snapshot(SnapCmd::Revert { at, force }) => {
            let (disk, snapshot) = names(&at.target, at.snapshot.as_deref())?;
            let force = *force;
            Request::SnapshotRevert {
                disk,
                snapshot,
                force,
            }
        }
        Cmd::Snapshot(SnapCmd::Rename { target, to }) => {
            if !target.contains('@') {
                return Err(invalid(format!(
                    "which snapshot of '{target}'? give {target}@SNAP NEW"
                )));
            }
            rename(target, to)?
        }
        Cmd::Snapshot(SnapCmd::Delete { at, force }) => {
            let (disk, snapshot) = names(&at.target, at.snapshot.as_deref())?;
            let force = *force;
            Request::SnapshotDelete {
                disk,
                snapshot,
                force,
            }
        }
        _ => return Err(not_this_family()),
    }))
}

/// A socket path as the server matches it: absolute, its directory
/// resolved (`./a.sock`, `../run/a.sock` and a symlinked directory name
/// the same socket).
fn socket_path(p: &std::path::Path) -> Result<std::path::PathBuf, Error> {
    let p = absolute(p)?;
    let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(invalid(format!("{} is not a socket path", p.display())));
    };
    match std::fs::canonicalize(dir) {
        Ok(dir) => Ok(dir.join(name)),
        Err(e) => Err(invalid(format!("{}: {e}", dir.display()))),
    }
}

/// `rename DISK NEW`, `rename DISK@SNAP NEW` (or `DISK@NEW`).
fn rename(name: &str, to: &str) -> Result<Request, Error> {
    let (disk, snap) = strata_engine::split_target(name);
    let Some(snapshot) = snap else {
        return Ok(Request::Rename {
            name: name.into(),
            to: to.into(),
        });
    };
    let to = match strata_engine::split_target(to) {
        (new, None) => new,
        (d, Some(new)) if d == disk => new,
        (d, Some(_)) => {
            return Err(invalid(format!(
                "a snapshot stays with its disk: rename {name} to SNAP or {disk}@SNAP, not {d}@..."
            )))
        }
    };
    Ok(Request::SnapshotRename {
        disk: disk.into(),
        snapshot: snapshot.into(),
        to: to.into(),
    })
}

/// Linked and full clones.
fn clone_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(datastore(match cmd {
        Cmd::Clone {
            own_key: false,
            new,
            ..
        } if new.given() => {
            return Err(invalid(
                "--new-key-* and --label go with --own-key (a clone with a key of its own)",
            ));
        }
        Cmd::Clone {
            source,
            name,
            full: true,
            provisioning,
            to,
            rate,
            ..
        } => Request::CloneFull {
            source: source.clone(),
            name: name.clone(),
            provisioning: *provisioning,
            to: to.as_deref().map(absolute).transpose()?,
            rate_bytes_per_sec: *rate,
        },
        Cmd::Clone {
            provisioning: p, ..
        } if *p != Provisioning::Thin => {
            return Err(invalid(
                "--type applies to full clones only (a linked clone is thin); add --full",
            ));
        }
        Cmd::Clone {
            source,
            name,
            own_key,
            new,
            ..
        } => Request::CloneLinked {
            source: source.clone(),
            name: name.clone(),
            own_key: own_key.then(|| new.grant("clone --own-key")).transpose()?,
        },
        _ => return Err(not_this_family()),
    }))
}

/// Changes between versions: diff, export-diff, import-diff.
fn diff_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::ExportDiff { target, from, file } => {
            stream_or_file(file, Pipe::Out, |out| Request::ExportDiff {
                target: target.clone(),
                from: from.clone(),
                out,
            })?
        }
        Cmd::ImportDiff { file, disk, force } => {
            stream_or_file(file, Pipe::In, |path| Request::ImportDiff {
                path,
                disk: disk.clone(),
                force: *force,
            })?
        }
        Cmd::Diff {
            target,
            from,
            totals,
        } => datastore(Request::Diff {
            target: target.clone(),
            from: from.clone(),
            totals: *totals,
        }),
        _ => return Err(not_this_family()),
    })
}

/// Statistics, import and export.
fn data_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Stats {
            disk,
            reset,
            pause,
            resume,
            watch,
        } => Action::Datastore {
            request: Request::Stats {
                disk: disk.clone(),
                reset: *reset,
                recording: match (pause, resume) {
                    (true, _) => Some(false),
                    (_, true) => Some(true),
                    _ => None,
                },
            },
            watch: *watch,
        },
        Cmd::Import {
            path,
            name,
            provisioning,
            format,
            encrypt: _,
            key,
            key_label,
            base,
        } => datastore(Request::Import {
            path: absolute(path)?,
            name: name.clone(),
            provisioning: *provisioning,
            format: format.as_deref().map(ImageFormat::parse).transpose()?,
            encrypt: key.grant(key_label.as_ref())?,
            base: base.clone(),
        }),
        Cmd::Export {
            target,
            out,
            format,
            key,
            subformat,
            chain,
            adapter,
        } => datastore(Request::Export {
            target: target.clone(),
            out: absolute(out)?,
            subformat: Subformat::parse(subformat)?,
            chain: *chain,
            adapter: adapter.clone(),
            luks: crate::keys::export_key(format, key, *chain)?,
        }),
        _ => return Err(not_this_family()),
    })
}

/// A disk size in whole sectors: rounded up with a note, as qemu-img
/// rounds an image's size.
fn sectors(bytes: u64) -> Result<u64, Error> {
    let (up, note) = sectors_up(bytes).ok_or_else(|| {
        invalid(format!(
            "a disk of {bytes} bytes: give at least 512 (1 sector)"
        ))
    })?;
    if let Some(n) = note {
        eprintln!("{n}");
    }
    Ok(up)
}
