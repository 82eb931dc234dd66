//! Runs a datastore [`Request`] the same way whether the CLI opened the
//! datastore itself or a running server does it for the CLI over the
//! control socket, answering the typed [`Response`].

use std::sync::Arc;

use strata_api::wire::Watch;
use strata_api::{AlarmEntry, ExportStats, JobAction, JobInfo, KeyRequest, Request, Response};
use strata_datastore::Capability;
use strata_datastore::Datastore as AnyDatastore;

pub mod keys;
pub mod schedules;
use strata_engine::{Error, ErrorKind, FullClone, SpaceWork, WorkControl};

/// What a request runs against: the datastore (either kind) and, inside a
/// server, the I/O statistics of its exports.
pub struct Ctx<'a> {
    pub ds: &'a dyn AnyDatastore,
    pub stats: Option<&'a strata_stats::StatsRegistry>,
    /// The server's jobs (None when the CLI runs the request itself).
    pub jobs: Option<&'a dyn JobList>,
    /// Pause and cancel for the job running this request.
    pub control: Option<Arc<WorkControl>>,
    /// Disks placed in other datastores and moves (inside a server:
    /// `placement`; None when the CLI runs the request itself).
    pub mover: Option<&'a dyn Mover>,
    /// Who has which disk open (inside a server).
    pub clients: Option<&'a crate::clients::Clients>,
    /// Who asks, for the event log (`events`): a change of state is
    /// logged with it in the datastore's directory. None: not logged (a
    /// job's run, which its job logs; a request routed to another
    /// datastore, which its home's log has).
    pub actor: Option<&'a str>,
}

impl<'a> Ctx<'a> {
    /// Background space work at `rate`, under this request's job control.
    pub(crate) fn work(&self, rate_bytes_per_sec: Option<u64>) -> SpaceWork {
        SpaceWork {
            rate_bytes_per_sec,
            control: self.control.clone(),
        }
    }

    /// This request's job control with `progress`, for work that reports
    /// and pauses as it goes.
    fn reporting<'p>(&self, progress: &'p mut dyn FnMut(u64, u64)) -> crate::copier::Work<'p> {
        crate::copier::Work {
            control: self.control.clone(),
            progress,
        }
    }

    /// A request on `ds` alone: no server around it (no statistics, jobs
    /// or placement).
    pub fn only(ds: &'a dyn AnyDatastore) -> Self {
        Ctx {
            ds,
            stats: None,
            jobs: None,
            control: None,
            mover: None,
            clients: None,
            actor: None,
        }
    }
}

/// Run `req` at the datastore in `dir`: through the server that holds it
/// when one answers on its control socket (it holds a local datastore's
/// lock; an object store's disks are written by it, so a disk's
/// owner-only changes are made by the process that writes it; a socket
/// file nobody answers is a stopped server's), else in this process, on
/// the datastore opened for this one request and closed after it.
pub fn at_dir(
    dir: &std::path::Path,
    opts: &strata_datastore::OpenOptions,
    detach: bool,
    req: &Request,
    watch: &mut dyn Watch,
) -> Result<Response, Error> {
    let sock = dir.join(strata_format::FILE_CONTROL);
    if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
        return strata_api::wire::request(&sock, req, detach, watch);
    }
    if let Request::Events { limit, target } = req {
        // Without opening the datastore: the log is read where opening
        // fails too.
        return crate::events::answer(dir, *limit, target.as_deref()).map(Response::Events);
    }
    let ds = strata_datastore::open(dir, opts)?;
    let actor = crate::events::own_actor();
    if let Some(what) = ds.recovered() {
        crate::events::recovery(ds.dir(), &actor, &what);
    }
    let ctx = Ctx {
        actor: Some(&actor),
        ..Ctx::only(&*ds)
    };
    let r = execute(&ctx, req, &mut |d, t| watch.progress(d, t));
    ds.close()?;
    r
}

/// A server's placement of disks in datastores other than its own, and
/// the moves between them (docs/MOVE.md), as requests see it.
pub trait Mover: Sync {
    /// Run a request that names a disk placed elsewhere (or one being
    /// moved) there; None: the request is the home datastore's.
    fn route(
        &self,
        req: &Request,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Option<Result<Response, Error>>;
    /// Mark the disk of a `move` as moving, before its job is listed
    /// (so that once a move is started, commands that would change the
    /// disk are refused); `run_move` ends the mark.
    fn reserve_move(&self, req: &Request) -> Result<(), Error>;
    /// Run a `move` whose disk `reserve_move` marked.
    fn run_move(
        &self,
        req: &Request,
        control: Option<Arc<WorkControl>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Response, Error>;
    /// Run a `clone --full` (its source and target where the server
    /// placed them; the clone served from where it was made).
    fn clone_full(
        &self,
        req: &Request,
        control: Option<Arc<WorkControl>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Response, Error>;
    /// Whether the server serves an export of this name from elsewhere.
    fn serves(&self, name: &str) -> bool;
    /// Forget the open export `name` (and its snapshots' when
    /// `with_snapshots`), which a request took away: its next client
    /// opens whatever then bears the name; clients still connected keep
    /// what they have.
    fn forget(&self, name: &str, with_snapshots: bool);
}

/// A server's jobs, as requests see them (the server's `jobs` module keeps
/// them; it runs requests through this module, so this one only knows the
/// trait).
pub trait JobList: Sync {
    fn list(&self) -> Vec<JobInfo>;
    fn act(&self, id: u64, action: JobAction) -> Result<JobInfo, Error>;
}

/// Run one request: routed where the server placed its disk, refused
/// where the kind cannot do it, else answered through the datastore
/// trait. Inside a server, the exports a request took away are forgotten
/// ([`gone_exports`]). With an actor, a change of state is logged with
/// how it ended (`events`), refused ones too.
pub fn execute(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    let r = execute_checked(ctx, req, progress);
    if let Some(actor) = ctx.actor {
        crate::events::request(ctx.ds.dir(), req, actor, r.as_ref().map(|_| ()));
    }
    r
}

/// [`execute`] but for its event.
fn execute_checked(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    interlocks(ctx, req)?;
    let mut r = execute_here(ctx, req, progress);
    if let Ok(resp) = &mut r {
        annotate(ctx, req, resp);
        if let Response::Renamed { from, to } = &*resp {
            follow_rename(ctx, from, to);
        }
    }
    if r.is_ok() && (ctx.stats.is_some() || ctx.mover.is_some()) {
        for (name, with_snapshots) in gone_exports(ctx.ds, req) {
            forget_export(ctx, &name, with_snapshots);
        }
    }
    r
}

/// What a request passes before it runs (docs/INTERLOCKS.md): linked
/// clones of what it would delete, then clients that have it open (so
/// that a request refused for its clones disconnects nobody).
fn interlocks(ctx: &Ctx<'_>, req: &Request) -> Result<(), Error> {
    crate::dependents::refuse(ctx.ds, req)?;
    let Some(c) = ctx.clients else {
        return Ok(());
    };
    // The disks behind a name: a group's members, or (`lock`) the disks
    // sharing an encrypted disk's keyring.
    let members = |g: &str| match req {
        Request::Key(KeyRequest::Lock { .. }) => ctx.ds.keyring_disks(g).unwrap_or_default(),
        _ => ctx.ds.group_info(g).map(|g| g.disks).unwrap_or_default(),
    };
    let frees = |d: &str| ctx.ds.disk_view(d, true).ok()?.info.exclusive_bytes;
    if let (Some(actor), Some(ended)) = (ctx.actor, c.forced_over(req, &members)) {
        crate::events::interlock(ctx.ds.dir(), req, actor, &ended);
    }
    c.interlock(req, &members, &frees)
}

/// What answers gain here: who has a disk open (`info`) or any disk
/// (`status`), and clones whose parent went (`info`, `list`).
fn annotate(ctx: &Ctx<'_>, req: &Request, resp: &mut Response) {
    match (resp, req) {
        (Response::Disk(v), Request::Info { name }) => {
            if let Some(c) = ctx.clients {
                v.clients = c.of_disk(name);
            }
            crate::dependents::mark_deleted_parents(ctx.ds, std::slice::from_mut(v));
        }
        (Response::Disks(v), _) => crate::dependents::mark_deleted_parents(ctx.ds, v),
        (Response::Datastore(v), _) => {
            if let Some(c) = ctx.clients {
                v.clients = c.list();
            }
        }
        _ => {}
    }
}

/// The exports a request that succeeded took away, each with whether its
/// snapshots (`NAME@SNAP`) went too: a removed disk (and its snapshots),
/// a deleted snapshot, a deleted group snapshot's member snapshots.
fn gone_exports(ds: &dyn AnyDatastore, req: &Request) -> Vec<(String, bool)> {
    match req {
        Request::Remove { name, .. } => vec![(name.clone(), true)],
        Request::SnapshotDelete { disk, snapshot, .. } => {
            vec![(format!("{disk}@{snapshot}"), false)]
        }
        // The members' snapshots of that name (the group is still there).
        Request::GroupSnapshotDelete { group, snapshot } => ds
            .group_info(group)
            .map(|g| g.disks)
            .unwrap_or_default()
            .into_iter()
            .map(|disk| (format!("{disk}@{snapshot}"), false))
            .collect(),
        _ => Vec::new(),
    }
}

/// What a rename of `from` (`DISK`, with its snapshots, or `DISK@SNAP`)
/// to `to` changes in the server: clients connected keep their device
/// and are listed under the new name, as are the export's statistics and
/// vhost-user-blk sockets; the old name's export slot goes, so its next
/// client opens the disk under its new name.
fn follow_rename(ctx: &Ctx<'_>, from: &str, to: &str) {
    let rename = |e: &str| -> Option<String> {
        if e == from {
            return Some(to.to_string());
        }
        let snap = e.strip_prefix(from)?.strip_prefix('@')?;
        (!from.contains('@')).then(|| format!("{to}@{snap}"))
    };
    if let Some(c) = ctx.clients {
        c.renamed(&rename);
    }
    if let Some(reg) = ctx.stats {
        reg.rename(&rename);
    }
    if let Some(m) = ctx.mover {
        m.forget(from, !from.contains('@'));
    }
}

/// Forget export `name` (and its snapshots' when `with_snapshots`): its
/// statistics leave the registry (the API, /metrics, the dashboard) and
/// its slot the server's table, so that whatever bears the name next (a
/// new disk, a new snapshot) starts at zero with a device of its own. A
/// client still connected to the old one keeps its device and records
/// into statistics nobody lists any more
/// ([`strata_stats::StatsRegistry::remove`]): never under the name again.
fn forget_export(ctx: &Ctx<'_>, name: &str, with_snapshots: bool) {
    if let Some(reg) = ctx.stats {
        if with_snapshots {
            reg.remove_disk(name);
        } else {
            reg.remove(name);
        }
    }
    if let Some(m) = ctx.mover {
        m.forget(name, with_snapshots);
    }
}

/// [`execute`], the forgetting of what went aside.
fn execute_here(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    if let Some(r) = ctx.mover.and_then(|m| m.route(req, progress)) {
        return r;
    }
    refuse_unsupported(ctx.ds, req)?;
    match req {
        Request::Move { .. }
        | Request::CloneFull { .. }
        | Request::Jobs
        | Request::JobControl { .. }
        | Request::Stats { .. }
        | Request::VhostAdd { .. }
        | Request::VhostRemove { .. }
        | Request::VhostList => server_request(ctx, req, progress),
        Request::Import { .. }
        | Request::Export { .. }
        | Request::ExportDiff { .. }
        | Request::ImportDiff { .. } => file_request(ctx, req, progress),
        Request::Extend { .. }
        | Request::Limit { .. }
        | Request::Grow { .. }
        | Request::AlarmSet { .. }
        | Request::AlarmList
        | Request::PunchZero { .. } => space_request(ctx, req, progress),
        Request::Events { limit, target } => {
            crate::events::answer(ctx.ds.dir(), *limit, target.as_deref()).map(Response::Events)
        }
        Request::ScheduleAdd { .. }
        | Request::ScheduleList
        | Request::ScheduleRemove { .. }
        | Request::ScheduleRun { .. } => crate::ops::schedules::request(ctx, req),
        Request::Key(k @ strata_api::KeyRequest::Rekey { deep: true, .. }) => {
            crate::ops::keys::deep(ctx, k, progress)
        }
        Request::Key(k) => crate::ops::keys::request(ctx, k),
        Request::Create {
            encrypt: Some(key),
            name,
            size_bytes,
            provisioning,
        } => {
            let spec = strata_datastore::EncryptedDisk {
                disk: name,
                size_bytes: *size_bytes,
                provisioning: *provisioning,
                key,
            };
            ctx.ds.create_encrypted(&spec, progress).map(Response::Disk)
        }
        _ => match common(ctx.ds, req, progress) {
            Some(r) => r,
            None => maintenance(ctx, req, progress),
        },
    }
}

/// What a family's function answers for a request of another family
/// (`execute` sends each request to its own).
fn not_answered(req: &Request) -> Error {
    Error::new(ErrorKind::Refused, format!("{req:?} is not answered here"))
}

/// What a server answers the same for every kind: moves, full clones, jobs and
/// statistics.
fn server_request(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    match req {
        Request::Move { .. } => match ctx.mover {
            Some(m) => m.run_move(req, ctx.control.clone(), progress),
            None => Err(Error::new(
                ErrorKind::Refused,
                "a move runs in the server that serves the disk: start 'strata serve' for \
                     this datastore (the disk may be idle; clients connect as usual)",
            )),
        },
        Request::CloneFull {
            source,
            name,
            provisioning,
            to,
            rate_bytes_per_sec,
        } => {
            if let Some(m) = ctx.mover {
                return m.clone_full(req, ctx.control.clone(), progress);
            }
            // No server around: a target elsewhere is opened here.
            let other = match to {
                Some(d) if !same_dir(d, ctx.ds.dir()) => Some(strata_datastore::open(
                    d,
                    &strata_datastore::OpenOptions::default(),
                )?),
                _ => None,
            };
            let c = FullClone {
                source,
                name,
                provisioning: *provisioning,
                work: ctx.work(*rate_bytes_per_sec),
            };
            let r = crate::cloning::run(ctx.ds, other.as_deref(), &c, progress);
            if let Some(o) = other {
                o.close()?;
            }
            Ok(Response::Disk(r?))
        }
        Request::Jobs => return Ok(Response::Jobs(jobs(ctx)?.list())),
        Request::JobControl { id, action } => {
            return Ok(Response::Jobs(vec![jobs(ctx)?.act(*id, *action)?]))
        }
        Request::Stats {
            disk,
            reset,
            recording,
        } => stats_request(ctx, disk.as_deref(), *reset, *recording),
        Request::VhostAdd { .. } | Request::VhostRemove { .. } | Request::VhostList => {
            match ctx.clients {
                Some(c) => c.vhost_request(req),
                None => Err(Error::new(
                    ErrorKind::Refused,
                    "vhost-user-blk exports are added to a running server: start 'strata \
                     serve' for this datastore",
                )),
            }
        }
        other => Err(not_answered(other)),
    }
}

/// `stats [DISK]`: the server's statistics, refused without a server; a
/// disk that does not exist is named so.
fn stats_request(
    ctx: &Ctx<'_>,
    disk: Option<&str>,
    reset: bool,
    recording: Option<bool>,
) -> Result<Response, Error> {
    let Some(reg) = ctx.stats else {
        return Err(Error::new(
            ErrorKind::Refused,
            "I/O statistics are kept by a running server: start 'strata serve' for this datastore",
        ));
    };
    if let Some(d) = disk {
        if !ctx.mover.is_some_and(|m| m.serves(d)) {
            ctx.ds.open(d)?; // a clear error for a name that does not exist
        }
    }
    Ok(stats(reg, disk, reset, recording))
}

/// Import of an image (VMDK, raw, qcow2, LUKS1) and export as VMDK or
/// LUKS1.
fn image_request(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    match req {
        Request::Import {
            path,
            name,
            provisioning,
            format,
            encrypt,
            base,
        } => {
            let what = crate::imports::Import {
                path,
                name,
                prov: *provisioning,
                format: *format,
                encrypt: encrypt.as_ref(),
                base: base.as_deref(),
                control: ctx.control.as_deref(),
            };
            Ok(Response::Import(crate::vmdk_ops::import(
                ctx.ds, what, progress,
            )?))
        }
        Request::Export {
            target,
            out,
            luks: Some(secret),
            ..
        } => {
            let r =
                crate::luks_ops::export(ctx.ds, target, out, secret, &mut ctx.reporting(progress))?;
            Ok(Response::Export(r))
        }
        Request::Export {
            target,
            out,
            subformat,
            chain,
            adapter,
            luks: None,
        } => {
            let how = crate::vmdk_ops::ExportFormat {
                subformat: *subformat,
                chain: *chain,
                adapter,
            };
            let r =
                crate::vmdk_ops::export(ctx.ds, target, out, &how, &mut ctx.reporting(progress))?;
            Ok(Response::Export(r))
        }
        other => Err(not_answered(other)),
    }
}

/// Import and export of images and diff streams.
fn file_request(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    match req {
        Request::Import { .. } | Request::Export { .. } => image_request(ctx, req, progress),
        Request::ExportDiff { target, from, out } => {
            let r = crate::diff_files::export(
                ctx.ds,
                target,
                from.as_deref(),
                out,
                &mut ctx.reporting(progress),
            )?;
            Ok(Response::ExportDiff(r))
        }
        Request::ImportDiff { path, disk, force } => {
            let r = crate::diff_files::import(
                ctx.ds,
                path,
                disk,
                *force,
                &mut ctx.reporting(progress),
            )?;
            Ok(Response::ImportDiff(r))
        }
        other => Err(not_answered(other)),
    }
}

/// Sizes, limits, capacity, alarms and zero reclaim.
fn space_request(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    match req {
        Request::Extend {
            name,
            size_bytes,
            by,
        } => {
            let size = match by {
                true => ctx.ds.disk_info(name)?.size_bytes.checked_add(*size_bytes),
                false => Some(*size_bytes),
            };
            let size = size.ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("'{name}' cannot grow that much"),
                )
            })?;
            Ok(Response::Disk(ctx.ds.extend(name, size)?))
        }
        Request::Limit { name, limits } => Ok(Response::Disk(ctx.ds.set_limits(name, *limits)?)),
        Request::Grow { capacity_bytes } => Ok(match capacity_bytes {
            Some(bytes) => Response::Capacity {
                info: ctx.ds.set_capacity(*bytes)?,
                changed: true,
            },
            None => Response::Capacity {
                info: ctx.ds.space()?,
                changed: false,
            },
        }),
        Request::AlarmSet { rule, keep_exec } => {
            let mut rule = rule.clone();
            if *keep_exec {
                rule.exec = ctx
                    .ds
                    .alarm_rules()?
                    .into_iter()
                    .find(|r| r.kind == rule.kind)
                    .and_then(|r| r.exec);
            } else if rule.exec.as_deref().is_some_and(|c| c.trim().is_empty()) {
                rule.exec = None;
            }
            ctx.ds.set_alarm(rule)?;
            alarms(ctx.ds)
        }
        Request::AlarmList => alarms(ctx.ds),
        Request::PunchZero {
            name,
            rate_bytes_per_sec,
        } => {
            let work = ctx.work(*rate_bytes_per_sec);
            Ok(Response::PunchZero(
                ctx.ds.punch_zero(name, &work, progress)?,
            ))
        }
        other => Err(not_answered(other)),
    }
}

/// The requests every kind answers through the datastore trait; None for
/// the ones only one kind answers.
fn common(
    ds: &dyn AnyDatastore,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Option<Result<Response, Error>> {
    Some(match req {
        Request::Status => ds.status().map(Response::Datastore),
        Request::List => ds.list().map(Response::Disks),
        Request::Info { name } => ds.disk_view(name, true).map(Response::Disk),
        Request::Create {
            name,
            size_bytes,
            provisioning,
            encrypt: None,
        } => ds
            .create(name, *size_bytes, *provisioning, progress)
            .map(Response::Disk),
        Request::Remove { name, .. } => ds
            .remove(name)
            .map(|()| Response::Removed { name: name.clone() }),
        Request::SnapshotCreate {
            disk,
            snapshot,
            description,
        } => ds
            .snapshot_create(disk, snapshot, description)
            .map(|snapshot| Response::SnapshotCreated {
                disk: disk.clone(),
                snapshot,
            }),
        Request::SnapshotList { disk } => ds.snapshots(disk).map(Response::Snapshots),
        Request::SnapshotRevert { disk, snapshot, .. } => ds
            .snapshot_revert(disk, snapshot)
            .and_then(|()| ds.disk_view(disk, false))
            .map(Response::Disk),
        Request::SnapshotDelete { disk, snapshot, .. } => {
            ds.snapshot_delete(disk, snapshot)
                .map(|()| Response::SnapshotDeleted {
                    disk: disk.clone(),
                    snapshot: snapshot.clone(),
                })
        }
        Request::CloneLinked {
            source,
            name,
            own_key: None,
        } => ds.clone_linked(source, name).map(Response::Disk),
        Request::CloneLinked {
            source,
            name,
            own_key: Some(key),
        } => ds.clone_own_key(source, name, key).map(Response::Disk),
        Request::Rename { name, to } => ds.rename(name, to).map(|_| Response::Renamed {
            from: name.clone(),
            to: to.clone(),
        }),
        Request::SnapshotRename { disk, snapshot, to } => ds
            .snapshot_rename(disk, snapshot, to)
            .map(|()| Response::Renamed {
                from: format!("{disk}@{snapshot}"),
                to: format!("{disk}@{to}"),
            }),
        Request::Diff {
            target,
            from,
            totals,
        } => crate::changes::diff(ds, target, from, *totals).map(Response::Diff),
        _ => return crate::groups::execute(ds, req),
    })
}

/// Maintenance, which one kind does and the other refuses with its
/// reason (the datastore trait answers from the capability table).
fn maintenance(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    if let Some(done) = space_work(ctx, req, progress) {
        return done;
    }
    let ds = ctx.ds;
    Ok(match req {
        Request::Check => match ds.check()? {
            strata_datastore::CheckReport::Local(r) => Response::Check(r),
            strata_datastore::CheckReport::ObjectStore(r) => Response::StoreCheck(r),
        },
        Request::Claim {
            name,
            handover,
            wait_seconds,
        } => {
            let wait = std::time::Duration::from_secs(wait_seconds.unwrap_or(60));
            Response::Claimed(ds.claim_disk(name, handover.then_some(wait))?)
        }
        Request::Release { name } => Response::Released(ds.release_disk(name)?),
        Request::Gc { dry_run } => Response::Gc(ds.collect_garbage(*dry_run)?),
        Request::Compact {
            name,
            below_pct,
            dry_run,
        } => Response::Compact(compact(ds, name, *below_pct, *dry_run)?),
        Request::VmdkShrink { .. } => {
            return Err(Error::new(
                ErrorKind::Refused,
                "vmdk_shrink is answered by the control socket of the server of the file",
            ))
        }
        other => {
            return Err(Error::new(
                ErrorKind::Refused,
                format!("a {} does not answer {other:?} here", ds.kind().noun()),
            ))
        }
    })
}

/// The paced, cancellable space work (convert, defrag, free-space
/// consolidation, the dedup estimate and pass, compress), each under the
/// job's pacing and control (`Ctx::work`); None for any other request.
fn space_work(
    ctx: &Ctx<'_>,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Option<Result<Response, Error>> {
    let ds = ctx.ds;
    Some(match req {
        Request::Convert {
            name,
            provisioning,
            rate_bytes_per_sec,
        } => ds
            .convert_disk(
                name,
                *provisioning,
                &ctx.work(*rate_bytes_per_sec),
                progress,
            )
            .map(Response::Disk),
        Request::Defrag {
            name,
            dry_run,
            rate_bytes_per_sec,
        } => ds
            .defrag_disk(name, *dry_run, &ctx.work(*rate_bytes_per_sec), progress)
            .map(Response::Defrag),
        Request::DefragFreeSpace { rate_bytes_per_sec } => ds
            .consolidate_free_space(&ctx.work(*rate_bytes_per_sec), progress)
            .map(Response::FreeSpace),
        Request::DedupEstimate {
            disks,
            rate_bytes_per_sec,
        } => ds
            .dedup_estimate(disks, &ctx.work(*rate_bytes_per_sec), progress)
            .map(Response::DedupEstimate),
        Request::Dedup {
            disks,
            rate_bytes_per_sec,
        } => ds
            .dedup(disks, &ctx.work(*rate_bytes_per_sec), progress)
            .map(Response::Dedup),
        Request::Compress {
            disks,
            codec,
            rate_bytes_per_sec,
        } => ds
            .compress(disks, *codec, &ctx.work(*rate_bytes_per_sec), progress)
            .map(Response::Compress),
        _ => return None,
    })
}

/// `compact DISK [--below PCT] [--dry-run]`: rewrite the live grains of
/// objects less than PCT % live (default 85).
fn compact(
    ds: &dyn AnyDatastore,
    name: &str,
    below_pct: Option<u32>,
    dry_run: bool,
) -> Result<strata_datastore::CompactReport, Error> {
    let below = below_pct.unwrap_or(85);
    if below == 0 || below > 100 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("--below is a percentage from 1 to 100, not {below}"),
        ));
    }
    let opts = strata_datastore::CompactOptions {
        below: f64::from(below) / 100.0,
        dry_run,
        ..Default::default()
    };
    ds.compact_disk(name, opts)
}

/// `stats`: the statistics of one export (or all, in name order), reset
/// after reading and recording switched when asked. The caller checked
/// that the export exists.
pub fn stats(
    reg: &strata_stats::StatsRegistry,
    disk: Option<&str>,
    reset: bool,
    recording: Option<bool>,
) -> Response {
    let snaps: Vec<(String, strata_stats::StatsSnapshot)> = match disk {
        Some(d) => {
            let stats = reg.get_or_create(d);
            let mut snap = stats.snapshot();
            if reset {
                stats.reset();
            }
            if let Some(on) = recording {
                stats.set_recording(on);
                snap.recording = on;
            }
            vec![(d.to_string(), snap)]
        }
        None => {
            let mut all = reg.snapshot_all();
            if reset {
                reg.reset_all();
            }
            if let Some(on) = recording {
                reg.set_recording_all(on);
                for (_, snap) in &mut all {
                    snap.recording = on;
                }
            }
            all
        }
    };
    Response::Stats(
        snaps
            .into_iter()
            .map(|(export, stats)| ExportStats { export, stats })
            .collect(),
    )
}

fn jobs<'a>(ctx: &Ctx<'a>) -> Result<&'a dyn JobList, Error> {
    ctx.jobs.ok_or_else(|| {
        Error::new(
            ErrorKind::Refused,
            "jobs run in a server: no 'strata serve' holds this datastore",
        )
    })
}

/// Every alarm as evaluated now, with its command.
fn alarms(ds: &dyn AnyDatastore) -> Result<Response, Error> {
    let rules = ds.alarm_rules()?;
    Ok(Response::Alarms(
        ds.space()?
            .alarms
            .into_iter()
            .map(|status| AlarmEntry {
                exec: rules
                    .iter()
                    .find(|r| r.kind == status.kind)
                    .and_then(|r| r.exec.clone()),
                status,
            })
            .collect(),
    ))
}

/// Whether two paths name one directory.
pub fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Refuse `req` if `ds`'s kind cannot do what it needs, from the one
/// table (`strata_datastore::capability`), with the reason.
pub fn refuse_unsupported(ds: &dyn AnyDatastore, req: &Request) -> Result<(), Error> {
    match needs(req) {
        Some(cap) => ds.supports(cap),
        None => Ok(()),
    }
}

/// What a request needs of its datastore beyond disks, snapshots and I/O.
fn needs(req: &Request) -> Option<Capability> {
    Some(match req {
        Request::Create { provisioning, .. } | Request::Import { provisioning, .. }
            if provisioning.is_thick() =>
        {
            Capability::Thick
        }
        Request::Convert { .. } => Capability::Convert,
        Request::Defrag { .. } | Request::DefragFreeSpace { .. } => Capability::Defrag,
        Request::DedupEstimate { .. } | Request::Dedup { .. } => Capability::Dedup,
        Request::Compress { .. } => Capability::Compress,
        Request::Claim { .. } | Request::Release { .. } => Capability::Claims,
        Request::Gc { .. } => Capability::Gc,
        Request::Compact { .. } => Capability::Compact,
        Request::GroupCreate { .. }
        | Request::GroupDelete { .. }
        | Request::GroupMember { .. }
        | Request::GroupSnapshotCreate { .. }
        | Request::GroupSnapshotDelete { .. }
        | Request::GroupSnapshotRevert { .. }
        | Request::GroupClone { .. } => Capability::Groups,
        _ => return None,
    })
}
