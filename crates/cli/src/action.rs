//! The one place the command line becomes typed requests ([`Action`]),
//! one function per family of commands. Checks that need no datastore (a
//! subformat's name, `--type` on a linked clone, an alarm's thresholds)
//! happen here, so a remote server sees only requests that make sense.

use std::path::PathBuf;

use strata_api::request::absolute;
use strata_api::{
    AlarmRule, Error, ErrorKind, ImageFormat, IoLimits, JobAction, Provisioning, Request,
    Subformat, VmdkRequest,
};

use crate::args::{AlarmCmd, Cmd, JobCmd, SnapCmd, VmdkCmd};
use crate::serve_args::ServeArgs;
use strata_cli::output::Format;

/// The action of a command whose FILE may be `-`: a stream through
/// stdin or stdout (`main` makes the pipe and fills in its path), else a
/// datastore request naming the file (absolute).
fn stream_or_file<'a>(
    file: &str,
    pipe: Pipe,
    format: Format,
    request: impl FnOnce(PathBuf) -> Request,
) -> Result<Action<'a>, Error> {
    Ok(if file == "-" {
        Action::Stream {
            request: request(PathBuf::new()),
            format,
            pipe,
        }
    } else {
        Action::Datastore {
            request: request(absolute(std::path::Path::new(file))?),
            format,
            watch: false,
        }
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
    Shared {
        url: &'a str,
        attach: bool,
        format: Format,
    },
    /// `serve`
    Serve(&'a ServeArgs),
    /// `completions SHELL`
    Completions(clap_complete::Shell),
    /// `manpages DIR`
    Manpages(&'a std::path::Path),
    /// A datastore request, run here or by the server holding the datastore.
    Datastore {
        request: Request,
        format: Format,
        /// Run again every second until interrupted (`stats --watch`).
        watch: bool,
    },
    /// `export-diff ... -` / `import-diff - ...`: a datastore request whose
    /// stream is this process's stdout (`Out`) or stdin (`In`), through a
    /// pipe the request names.
    Stream {
        request: Request,
        format: Format,
        pipe: Pipe,
    },
    /// A command on VMDK files, run here.
    Vmdk {
        request: VmdkRequest,
        format: Format,
    },
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
            Cmd::Status(_)
            | Cmd::Grow { .. }
            | Cmd::Alarm(_)
            | Cmd::Check(_)
            | Cmd::Jobs { .. } => store_action(cmd),
            Cmd::List(_)
            | Cmd::Info { .. }
            | Cmd::Create { .. }
            | Cmd::Rm { .. }
            | Cmd::Extend { .. }
            | Cmd::Convert { .. } => disk_action(cmd),
            Cmd::Limit { .. } | Cmd::Punchzero { .. } => limit_action(cmd),
            Cmd::Move { .. } | Cmd::Defrag { .. } => layout_action(cmd),
            Cmd::Snapshot(_) | Cmd::Group(_) => snapshot_action(cmd),
            Cmd::Clone { .. } => clone_action(cmd),
            Cmd::ExportDiff { .. } | Cmd::ImportDiff { .. } | Cmd::Diff { .. } => diff_action(cmd),
            Cmd::Stats { .. } | Cmd::Import { .. } | Cmd::Export { .. } => data_action(cmd),
        }
    }
}

/// A datastore request, run here or by the server holding the datastore.
fn datastore<'a>(request: Request, format: Format) -> Action<'a> {
    Action::Datastore {
        request,
        format,
        watch: false,
    }
}

/// What a family's function answers for a command of another family
/// (`try_from` sends each command to its own).
fn not_this_family() -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        "this command has no action here",
    )
}

/// What runs here without a datastore: init and attach, serve, completions, man
/// pages.
fn local_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Init {
            capacity,
            object_store: None,
            json,
        } => {
            if json.json {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "--json goes with --object-store (a local init prints one line)",
                ));
            }
            Action::Init {
                capacity_bytes: capacity.unwrap_or(0),
            }
        }
        Cmd::Init {
            object_store: Some(url),
            json,
            ..
        } => Action::Shared {
            url,
            attach: false,
            format: json.into(),
        },
        Cmd::Attach { object_store, json } => Action::Shared {
            url: object_store,
            attach: true,
            format: json.into(),
        },
        Cmd::Serve(args) => Action::Serve(args),
        Cmd::Completions { shell } => Action::Completions(*shell),
        Cmd::Manpages { dir } => Action::Manpages(dir),
        _ => return Err(not_this_family()),
    })
}

/// `strata vmdk`: commands on VMDK files, run here.
fn vmdk_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Vmdk(v) => {
            let (request, json) = match v {
                VmdkCmd::Info { path, json } => (VmdkRequest::Info { path: path.clone() }, json),
                VmdkCmd::Check { path, repair, json } => (
                    VmdkRequest::Check {
                        path: path.clone(),
                        repair: *repair,
                    },
                    json,
                ),
                VmdkCmd::Shrink { path, rate, json } => (
                    VmdkRequest::Shrink {
                        path: path.clone(),
                        rate_bytes_per_sec: *rate,
                    },
                    json,
                ),
            };
            Action::Vmdk {
                request,
                format: json.into(),
            }
        }
        _ => return Err(not_this_family()),
    })
}

/// An object store's own commands: claim, release, gc, compact.
fn object_store_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Claim {
            name,
            handover,
            wait,
            json,
        } => datastore(
            Request::Claim {
                name: name.clone(),
                handover: *handover,
                wait_seconds: handover.then_some(*wait),
            },
            json.into(),
        ),
        Cmd::Release { name, json } => {
            datastore(Request::Release { name: name.clone() }, json.into())
        }
        Cmd::Gc { dry_run, json } => datastore(Request::Gc { dry_run: *dry_run }, json.into()),
        Cmd::Compact {
            name,
            below,
            dry_run,
            json,
        } => datastore(
            Request::Compact {
                name: name.clone(),
                below_pct: Some(*below),
                dry_run: *dry_run,
            },
            json.into(),
        ),
        _ => return Err(not_this_family()),
    })
}

/// The datastore as a whole: status, capacity, alarms, check, jobs.
fn store_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Status(json) => datastore(Request::Status, json.into()),
        Cmd::Grow { capacity, json } => datastore(
            Request::Grow {
                capacity_bytes: *capacity,
            },
            json.into(),
        ),
        Cmd::Alarm(AlarmCmd::Set {
            kind,
            warning,
            alarm,
            exec,
            json,
        }) => {
            let rule = AlarmRule {
                kind: *kind,
                warning_percent: *warning,
                alarm_percent: *alarm,
                exec: exec.clone(),
            };
            // Checked here too, so a mistake needs no datastore.
            rule.validate()?;
            datastore(
                Request::AlarmSet {
                    rule,
                    keep_exec: exec.is_none(),
                },
                json.into(),
            )
        }
        Cmd::Alarm(AlarmCmd::List(json)) => datastore(Request::AlarmList, json.into()),
        Cmd::Jobs { action, json } => datastore(
            match action {
                None => Request::Jobs,
                Some(JobCmd::Pause { id }) => Request::JobControl {
                    id: *id,
                    action: JobAction::Pause,
                },
                Some(JobCmd::Resume { id }) => Request::JobControl {
                    id: *id,
                    action: JobAction::Resume,
                },
                Some(JobCmd::Cancel { id }) => Request::JobControl {
                    id: *id,
                    action: JobAction::Cancel,
                },
            },
            json.into(),
        ),
        Cmd::Check(json) => datastore(Request::Check, json.into()),
        _ => return Err(not_this_family()),
    })
}

/// One disk: list, info, create, rm, extend, convert.
fn disk_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::List(json) => datastore(Request::List, json.into()),
        Cmd::Info { name, json } => datastore(Request::Info { name: name.clone() }, json.into()),
        Cmd::Create {
            name,
            size,
            provisioning,
            json,
        } => datastore(
            Request::Create {
                name: name.clone(),
                size_bytes: *size,
                provisioning: *provisioning,
            },
            json.into(),
        ),
        Cmd::Rm { name } => datastore(Request::Remove { name: name.clone() }, Format::Human),
        Cmd::Extend { name, size, json } => datastore(
            Request::Extend {
                name: name.clone(),
                size_bytes: *size,
            },
            json.into(),
        ),
        Cmd::Convert {
            name,
            provisioning,
            rate,
            json,
        } => datastore(
            Request::Convert {
                name: name.clone(),
                provisioning: *provisioning,
                rate_bytes_per_sec: *rate,
            },
            json.into(),
        ),
        _ => return Err(not_this_family()),
    })
}

/// A disk's I/O limits and zero reclaim.
fn limit_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Limit {
            name,
            iops,
            bps,
            burst,
            clear,
            json,
        } => {
            if !clear && iops.is_none() && bps.is_none() {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "give --iops N and/or --bps SIZE (and optionally --burst SECONDS), or --clear",
                ));
            }
            datastore(
                Request::Limit {
                    name: name.clone(),
                    limits: IoLimits {
                        iops: *iops,
                        bps: *bps,
                        burst_seconds: *burst,
                    },
                },
                json.into(),
            )
        }
        Cmd::Punchzero { name, rate, json } => datastore(
            Request::PunchZero {
                name: name.clone(),
                rate_bytes_per_sec: *rate,
            },
            json.into(),
        ),
        _ => return Err(not_this_family()),
    })
}

/// Where a disk lives and how it is laid out: move, defrag.
fn layout_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Move {
            name,
            to,
            provisioning,
            head_only,
            rate,
            json,
        } => datastore(
            Request::Move {
                name: name.clone(),
                to: absolute(to)?,
                head_only: *head_only,
                provisioning: *provisioning,
                rate_bytes_per_sec: *rate,
            },
            json.into(),
        ),
        Cmd::Defrag {
            name,
            free_space,
            dry_run,
            rate,
            json,
        } => datastore(
            match name {
                Some(name) if !*free_space => Request::Defrag {
                    name: name.clone(),
                    dry_run: *dry_run,
                    rate_bytes_per_sec: *rate,
                },
                _ => Request::DefragFreeSpace {
                    rate_bytes_per_sec: *rate,
                },
            },
            json.into(),
        ),
        _ => return Err(not_this_family()),
    })
}

/// Snapshots and groups.
fn snapshot_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Snapshot(SnapCmd::Create {
            disk,
            snapshot,
            description,
            json,
        }) => datastore(
            Request::SnapshotCreate {
                disk: disk.clone(),
                snapshot: snapshot.clone(),
                description: description.clone(),
            },
            json.into(),
        ),
        Cmd::Group(g) => {
            let (request, json) = g.request();
            datastore(request, if json { Format::Json } else { Format::Human })
        }
        Cmd::Snapshot(SnapCmd::List { disk, json }) => {
            datastore(Request::SnapshotList { disk: disk.clone() }, json.into())
        }
        Cmd::Snapshot(SnapCmd::Revert { disk, snapshot }) => datastore(
            Request::SnapshotRevert {
                disk: disk.clone(),
                snapshot: snapshot.clone(),
            },
            Format::Human,
        ),
        Cmd::Snapshot(SnapCmd::Delete { disk, snapshot }) => datastore(
            Request::SnapshotDelete {
                disk: disk.clone(),
                snapshot: snapshot.clone(),
            },
            Format::Human,
        ),
        _ => return Err(not_this_family()),
    })
}

/// Linked and full clones.
fn clone_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::Clone {
            source,
            name,
            full: true,
            provisioning,
            to,
            json,
        } => datastore(
            Request::CloneFull {
                source: source.clone(),
                name: name.clone(),
                provisioning: *provisioning,
                to: to.as_deref().map(absolute).transpose()?,
            },
            json.into(),
        ),
        Cmd::Clone {
            source,
            name,
            full: false,
            provisioning,
            json,
            ..
        } => {
            if *provisioning != Provisioning::Thin {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "--type applies to full clones only (a linked clone is thin); add --full",
                ));
            }
            datastore(
                Request::CloneLinked {
                    source: source.clone(),
                    name: name.clone(),
                },
                json.into(),
            )
        }
        _ => return Err(not_this_family()),
    })
}

/// Changes between versions: diff, export-diff, import-diff.
fn diff_action(cmd: &Cmd) -> Result<Action<'_>, Error> {
    Ok(match cmd {
        Cmd::ExportDiff {
            target,
            from,
            file,
            json,
        } => stream_or_file(file, Pipe::Out, json.into(), |out| Request::ExportDiff {
            target: target.clone(),
            from: from.clone(),
            out,
        })?,
        Cmd::ImportDiff {
            file,
            disk,
            force,
            json,
        } => stream_or_file(file, Pipe::In, json.into(), |path| Request::ImportDiff {
            path,
            disk: disk.clone(),
            force: *force,
        })?,
        Cmd::Diff {
            target,
            from,
            totals,
            json,
        } => datastore(
            Request::Diff {
                target: target.clone(),
                from: from.clone(),
                totals: *totals,
            },
            json.into(),
        ),
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
            json,
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
            format: json.into(),
            watch: *watch,
        },
        Cmd::Import {
            path,
            name,
            provisioning,
            format,
            json,
        } => datastore(
            Request::Import {
                path: absolute(path)?,
                name: name.clone(),
                provisioning: *provisioning,
                format: format.as_deref().map(ImageFormat::parse).transpose()?,
            },
            json.into(),
        ),
        Cmd::Export {
            target,
            out,
            subformat,
            chain,
            adapter,
            json,
        } => datastore(
            Request::Export {
                target: target.clone(),
                out: absolute(out)?,
                subformat: Subformat::parse(subformat)?,
                chain: *chain,
                adapter: adapter.clone(),
            },
            json.into(),
        ),
        _ => return Err(not_this_family()),
    })
}
