//! Scheduled snapshots (docs/OPERATIONS.md, "Scheduled snapshots"): the
//! schedules kept in the datastore's `schedules.json` (docs/FORMAT.md
//! §15), the `schedule` requests, and the server's thread that runs them.
//!
//! A run takes its snapshot and deletes the schedule's surplus ones
//! through [`ops::execute`] with the actor `schedule NAME`, the path a
//! CLI's request takes: interlocks, routing and the event log apply.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use strata_api::schedule::{ScheduleInfo, ScheduleSpec, TargetKind};
use strata_api::{Request, Response};
use strata_engine::{Error, ErrorKind};

use super::{self as ops, Ctx};

/// The file, in the datastore's directory (for an object store: this
/// host's local directory).
pub const FILE: &str = "schedules.json";
/// Its format's version; a file of a higher one is refused, not rewritten.
const VERSION: u32 = 1;
/// The runner wakes at least this often to notice a stop.
const TICK: Duration = Duration::from_millis(250);

/// Read-modify-write of the file within this process.
static FILE_LOCK: Mutex<()> = Mutex::new(());
/// One run at a time (the runner and `schedule run`).
static RUN_LOCK: Mutex<()> = Mutex::new(());
/// Bumped at every change of the schedules: the runner waits on it.
static WAKE: (Mutex<u64>, Condvar) = (Mutex::new(0), Condvar::new());

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    schedules: Vec<ScheduleInfo>,
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn io_err(p: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("{what} {}: {e}", p.display()))
}

/// The schedules in `dir` (none without a file).
fn load(dir: &Path) -> Result<Vec<ScheduleInfo>, Error> {
    let p = path(dir);
    let body = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(&p, "cannot read", e)),
    };
    let f: File = serde_json::from_slice(&body).map_err(|e| {
        Error::new(
            ErrorKind::Corrupt,
            format!("{} is not a schedules file: {e}", p.display()),
        )
    })?;
    if f.version > VERSION {
        return Err(Error::new(
            ErrorKind::Refused,
            format!(
                "{} is of version {}, newer than this build reads ({VERSION})",
                p.display(),
                f.version
            ),
        ));
    }
    Ok(f.schedules)
}

/// Write the schedules whole: a temporary file, fsync, rename over the
/// file, fsync of the directory (a crash leaves the old file or the new).
fn save(dir: &Path, schedules: Vec<ScheduleInfo>) -> Result<(), Error> {
    let p = path(dir);
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut schedules = schedules;
    for s in &mut schedules {
        s.next_run_unix_ms = None;
    }
    let f = File {
        version: VERSION,
        schedules,
    };
    let body = serde_json::to_vec_pretty(&f).expect("serialisable");
    let write = || -> std::io::Result<()> {
        let mut out = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut out, &body)?;
        out.sync_all()?;
        std::fs::rename(&tmp, &p)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| io_err(&p, "cannot write", e))?;
    let (gen, cv) = &WAKE;
    *gen.lock() += 1;
    cv.notify_all();
    Ok(())
}

/// Change the schedules in `dir` with `f`, under the file lock.
fn update<T>(
    dir: &Path,
    f: impl FnOnce(&mut Vec<ScheduleInfo>) -> Result<T, Error>,
) -> Result<T, Error> {
    let _g = FILE_LOCK.lock();
    let mut all = load(dir)?;
    let r = f(&mut all)?;
    save(dir, all)?;
    Ok(r)
}

/// The `schedule` requests.
pub fn request(ctx: &Ctx<'_>, req: &Request) -> Result<Response, Error> {
    let dir = ctx.ds.dir();
    let one = match req {
        Request::ScheduleAdd { schedule } => add(ctx, schedule.clone())?,
        Request::ScheduleRun { name } => run(ctx, name)?,
        Request::ScheduleRemove { name } => {
            // After a run in progress: once `rm` answers, the schedule
            // takes and deletes nothing more (a run that had loaded it
            // went on, and its snapshot came after the answer).
            let _one = RUN_LOCK.lock();
            update(dir, |all| {
                let before = all.len();
                all.retain(|s| s.spec.name != *name);
                match all.len() < before {
                    true => Ok(()),
                    false => Err(no_schedule(name)),
                }
            })?;
            return Ok(Response::ScheduleRemoved { name: name.clone() });
        }
        Request::ScheduleList => {
            let mut all = load(dir)?;
            all.iter_mut().for_each(with_next);
            return Ok(answer(ctx, all));
        }
        other => {
            return Err(Error::new(
                ErrorKind::Refused,
                format!("{other:?} is not a schedule request"),
            ))
        }
    };
    Ok(answer(ctx, vec![one]))
}

fn answer(ctx: &Ctx<'_>, schedules: Vec<ScheduleInfo>) -> Response {
    Response::Schedules {
        schedules,
        // Only a server has jobs.
        served: ctx.jobs.is_some(),
    }
}

fn with_next(s: &mut ScheduleInfo) {
    s.next_run_unix_ms = Some(s.next_run());
}

fn no_schedule(name: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("no schedule '{name}' (see 'strata schedule ls')"),
    )
}

/// `schedule add`: checked, its target resolved to a disk or a group.
fn add(ctx: &Ctx<'_>, mut spec: ScheduleSpec) -> Result<ScheduleInfo, Error> {
    strata_engine::catalog::check_name("schedule", &spec.name)?;
    if let Some(p) = &spec.prefix {
        strata_engine::catalog::check_name("snapshot prefix", p)?;
    }
    let invalid = |m: String| Error::new(ErrorKind::InvalidArgument, m);
    if spec.every_s == 0 {
        return Err(invalid("--every must be above zero".into()));
    }
    if spec.keep == Some(0) {
        return Err(invalid(
            "--keep 0 would delete every snapshot it takes: keep at least 1 (or leave --keep out to keep all)".into(),
        ));
    }
    let group = ctx.ds.group_info(&spec.target).is_ok();
    let disk = ctx.ds.disk_info(&spec.target).is_ok();
    spec.kind = Some(match (disk, group) {
        (true, false) => TargetKind::Disk,
        (false, true) => TargetKind::Group,
        (true, true) => {
            return Err(invalid(format!(
                "'{}' names both a disk and a group: rename one",
                spec.target
            )))
        }
        (false, false) => {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("no disk or group '{}' to schedule", spec.target),
            ))
        }
    });
    if spec.quiesce && spec.kind == Some(TargetKind::Disk) {
        return Err(invalid(
            "--quiesce runs a group's quiesce hook: the target must be a group".into(),
        ));
    }
    let mut info = ScheduleInfo {
        spec,
        created_unix_ms: now_ms(),
        last_run_unix_ms: None,
        last_result: None,
        last_snapshot: None,
        kept: Vec::new(),
        next_run_unix_ms: None,
    };
    update(ctx.ds.dir(), |all| {
        if all.iter().any(|s| s.spec.name == info.spec.name) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "a schedule '{}' exists already (remove it first: 'strata schedule rm {}')",
                    info.spec.name, info.spec.name
                ),
            ));
        }
        all.push(info.clone());
        Ok(())
    })?;
    with_next(&mut info);
    Ok(info)
}

/// `PREFIX-YYYYMMDD-HHMMSS` (UTC) for a run at `ms`.
fn snapshot_name(prefix: &str, ms: u64) -> String {
    let d: String = strata_api::units::utc(ms)
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    format!("{prefix}-{}-{}", &d[..8], &d[8..14])
}

/// One run of schedule `name` now: its snapshot, then the expiry of its
/// surplus ones; recorded in the file (and the run's error returned).
pub fn run(ctx: &Ctx<'_>, name: &str) -> Result<ScheduleInfo, Error> {
    let _one = RUN_LOCK.lock();
    let dir = ctx.ds.dir();
    let spec = load(dir)?
        .into_iter()
        .find(|s| s.spec.name == name)
        .ok_or_else(|| no_schedule(name))?
        .spec;
    let actor = format!("schedule {name}");
    let sctx = Ctx {
        ds: ctx.ds,
        stats: ctx.stats,
        jobs: ctx.jobs,
        control: None,
        mover: ctx.mover,
        clients: ctx.clients,
        actor: Some(&actor),
    };
    let started = now_ms();
    let snap = snapshot_name(spec.prefix(), started);
    let taken = take(&sctx, &spec, &snap);
    let kept = match &taken {
        Ok(()) => expire(&sctx, &spec),
        Err(_) => Vec::new(),
    };
    let result = match &taken {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    match &taken {
        Ok(()) => tracing::info!(event = "schedule", schedule = name, snapshot = %snap,
            kept = kept.len(), "schedule {name}: took {}@{snap}", spec.target),
        Err(e) => tracing::warn!(event = "schedule", schedule = name, snapshot = %snap,
            "schedule {name}: no snapshot of {}: {e}", spec.target),
    }
    let mut info = update(dir, |all| {
        // Removed meanwhile: nothing to record.
        let Some(s) = all.iter_mut().find(|s| s.spec.name == name) else {
            return Err(no_schedule(name));
        };
        s.last_run_unix_ms = Some(started);
        s.last_result = Some(result);
        s.last_snapshot = taken.is_ok().then(|| snap.clone());
        s.kept = kept;
        Ok(s.clone())
    })?;
    with_next(&mut info);
    taken.map(|()| info)
}

/// Take the run's snapshot of a disk or a group.
fn take(ctx: &Ctx<'_>, spec: &ScheduleSpec, snap: &str) -> Result<(), Error> {
    let req = match spec.kind {
        Some(TargetKind::Group) => Request::GroupSnapshotCreate {
            group: spec.target.clone(),
            snapshot: snap.to_string(),
            description: format!("schedule {}", spec.name),
            quiesce_hook: None,
            no_quiesce: !spec.quiesce,
            ignore_quiesce_error: false,
            timeout_s: None,
            max_pause_ms: None,
        },
        _ => Request::SnapshotCreate {
            disk: spec.target.clone(),
            snapshot: snap.to_string(),
            description: format!("schedule {}", spec.name),
        },
    };
    ops::execute(ctx, &req, &mut |_, _| {}).map(|_| ())
}

/// Delete this schedule's snapshots beyond `keep`, oldest first: only
/// names of its form (never a user's snapshot); one the interlocks refuse
/// (a linked clone came from it, a client has it open) is kept, with a
/// warning. The names kept that way.
fn expire(ctx: &Ctx<'_>, spec: &ScheduleSpec) -> Vec<String> {
    let Some(keep) = spec.keep else {
        return Vec::new();
    };
    let group = spec.kind == Some(TargetKind::Group);
    let t = spec.target.clone();
    let listed = match group {
        true => ops::execute(
            ctx,
            &Request::GroupSnapshotList { group: t.clone() },
            &mut |_, _| {},
        ),
        false => ops::execute(
            ctx,
            &Request::SnapshotList { disk: t.clone() },
            &mut |_, _| {},
        ),
    };
    let mut names: Vec<String> = match listed {
        Ok(Response::GroupSnapshots(v)) => v.into_iter().map(|s| s.name).collect(),
        Ok(Response::Snapshots(v)) => v
            .into_iter()
            .filter(|s| s.group.is_none())
            .map(|s| s.name)
            .collect(),
        _ => return Vec::new(),
    };
    names.retain(|n| spec.owns(n));
    // The timestamp sorts as the name does.
    names.sort();
    let surplus = names.len().saturating_sub(keep as usize);
    let mut kept = Vec::new();
    for snap in names.into_iter().take(surplus) {
        let req = match group {
            true => Request::GroupSnapshotDelete {
                group: t.clone(),
                snapshot: snap.clone(),
            },
            false => Request::SnapshotDelete {
                disk: t.clone(),
                snapshot: snap.clone(),
                force: false,
            },
        };
        if let Err(e) = ops::execute(ctx, &req, &mut |_, _| {}) {
            tracing::warn!(event = "schedule", schedule = %spec.name,
                "schedule {}: kept {t}@{snap} beyond --keep {keep}: {e}", spec.name);
            kept.push(snap);
        }
    }
    kept
}

/// The schedules due now, and when the next one is due after them.
fn due(dir: &Path, now: u64) -> Result<(Vec<String>, Option<u64>), Error> {
    let all = load(dir)?;
    let due = all.iter().filter(|s| s.next_run() <= now);
    let next = all
        .iter()
        .map(ScheduleInfo::next_run)
        .filter(|&t| t > now)
        .min();
    Ok((due.map(|s| s.spec.name.clone()).collect(), next))
}

/// The server's runner: wakes when a schedule is due (or the schedules
/// change), runs what is due (an overdue one once, however many periods
/// it missed), until `stop`.
pub fn spawn(with_ctx: WithCtx, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("schedules".into())
        .spawn(move || {
            let mut failing = false;
            while !stop.load(Ordering::Acquire) {
                let seen = *WAKE.0.lock();
                let mut next = None;
                with_ctx(&mut |ctx: &Ctx<'_>| {
                    next = match due(ctx.ds.dir(), now_ms()) {
                        Ok((names, next)) => {
                            failing = false;
                            for name in names.iter().take_while(|_| !stop.load(Ordering::Acquire)) {
                                // Recorded in the file and logged by `run`.
                                let _ = run(ctx, name);
                            }
                            next.filter(|_| names.is_empty())
                        }
                        Err(e) => {
                            if !failing {
                                tracing::warn!(event = "schedule", "schedules not run: {e}");
                            }
                            failing = true;
                            None
                        }
                    };
                });
                wait(seen, next);
            }
        })
        .expect("spawn the schedules thread")
}

/// Runs a function with the server's request context (its handler's, as
/// requests from the control socket get, without an actor): how the
/// runner reaches the server without depending on its modules.
pub type WithCtx = Arc<dyn Fn(&mut dyn FnMut(&Ctx<'_>)) + Send + Sync>;

/// Sleep until `next` (ms since the epoch), a change of the schedules
/// after generation `seen`, or a tick, whichever is first.
fn wait(seen: u64, next: Option<u64>) {
    let (gen, cv) = &WAKE;
    let mut g = gen.lock();
    if *g != seen {
        return;
    }
    let left = next.map_or(TICK, |t| Duration::from_millis(t.saturating_sub(now_ms())));
    cv.wait_for(&mut g, left.min(TICK));
}
