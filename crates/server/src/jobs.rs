//! Long operations of a running server as jobs: each runs in its own
//! thread, outlives the command that started it (a CLI that goes away, by
//! Ctrl-C or `--detach`, leaves it running), and can be listed, paused,
//! resumed and cancelled (`strata jobs`). The list outlives the server:
//! `jobs.json` keeps it across restarts (docs/FORMAT.md §14).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use strata_api::{JobAction, JobInfo, JobState, Request, Response};
use strata_engine::{Error, ErrorKind, WorkControl};

use crate::ops::{execute, Ctx, JobList, Mover};

/// Finished jobs kept for `strata jobs` (and in `jobs.json`), at most.
const FINISHED_KEPT: usize = 100;

/// The file in the datastore's (local) directory that keeps the jobs.
const FILE: &str = "jobs.json";

/// What `jobs.json` holds.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct JobsFile {
    /// Below the next job's id: ids are never reused.
    last_id: u64,
    /// Newest first.
    jobs: Vec<JobInfo>,
}

pub struct Job {
    pub id: u64,
    what: String,
    /// What it works on (the event log's target).
    target: String,
    /// Who started it (the event log's `job_started` and `job_finished`).
    actor: String,
    started_unix: u64,
    control: Arc<WorkControl>,
    /// Whether the operation obeys cancel (the others only pause).
    cancellable: bool,
    state: Mutex<JobStatus>,
    changed: Condvar,
}

struct JobStatus {
    done: u64,
    total: u64,
    finished_unix: Option<u64>,
    result: Option<Result<Response, Error>>,
    /// The answer as listed (`JobInfo::result`): the result's, unless it
    /// is too large to keep.
    kept: Option<Box<Response>>,
}

impl Job {
    pub fn info(&self) -> JobInfo {
        let st = self.state.lock();
        let state = match &st.result {
            None if self.control.is_cancelled() => JobState::Cancelling,
            None if self.control.is_paused() => JobState::Paused,
            None => JobState::Running,
            Some(Ok(_)) => JobState::Done,
            Some(Err(e)) if self.control.stopped_by(e).is_some() => JobState::Cancelled,
            Some(Err(_)) => JobState::Failed,
        };
        // A job that ended well did all of its work, whatever its last
        // progress report said (or if it made none).
        let percent = match state {
            JobState::Done => 100,
            _ => (st.done * 100).checked_div(st.total).unwrap_or(0),
        };
        JobInfo {
            id: self.id,
            what: self.what.clone(),
            target: self.target.clone(),
            state,
            done: st.done,
            total: st.total,
            percent,
            started_unix: self.started_unix,
            finished_unix: st.finished_unix,
            error: match &st.result {
                Some(Err(e)) => Some(e.to_string()),
                _ => None,
            },
            result: st.kept.clone(),
        }
    }

    /// Wait up to `timeout` for progress or the end; returns (done, total)
    /// and the result once finished.
    pub fn wait(
        &self,
        timeout: std::time::Duration,
    ) -> ((u64, u64), Option<Result<Response, Error>>) {
        let mut st = self.state.lock();
        if st.result.is_none() {
            self.changed.wait_for(&mut st, timeout);
        }
        ((st.done, st.total), st.result.clone())
    }

    /// Wait until the job has ended, or `until`; whether it ended.
    fn ends_by(&self, until: std::time::Instant) -> bool {
        loop {
            let now = std::time::Instant::now();
            if now >= until {
                return false;
            }
            if self.wait(until - now).1.is_some() {
                return true;
            }
        }
    }
}

/// Log how job `j` ended with `r`: done, cancelled (its error says what
/// it leaves) or failed.
fn log_end(j: &Job, r: &Result<Response, Error>) {
    let (id, what) = (j.id, &j.what);
    match r {
        Ok(_) => tracing::info!(event = "job", job = id, what = %what, state = "done",
            "job {id} ({what}) done"),
        Err(e) if j.control.stopped_by(e).is_some() => {
            tracing::info!(event = "job", job = id, what = %what, state = "cancelled",
                "job {id} ({what}) ended: {e}")
        }
        Err(e) => tracing::warn!(event = "job", job = id, what = %what, state = "failed",
            "job {id} ({what}) ended with an error: {e}"),
    }
}

/// Log `kind` (`job_started`, `job_finished`) of job `j` running `req`
/// in the event log in `dir`, with how it went.
fn job_event(
    dir: &std::path::Path,
    j: &Job,
    req: &Request,
    kind: &str,
    result: Result<(), &Error>,
) {
    let target = req.event_target();
    let detail = Some(format!("job {}: {}", j.id, j.what));
    crate::events::record(
        dir,
        &crate::events::Entry {
            kind,
            target: &target,
            actor: &j.actor,
            result,
            detail,
        },
    );
}

/// Whether answer `r` is small enough for a job to keep it.
fn small(r: &Response) -> bool {
    serde_json::to_vec(r).is_ok_and(|v| v.len() <= strata_api::job::RESULT_KEPT_BYTES)
}

/// What the error of a cancelled job starts with.
const STOPPED_BY_CANCEL: &str = "stopped by 'strata jobs cancel'";

/// What the error of a job the server's stop ended starts with.
pub const STOPPED_BY_SHUTDOWN: &str = "stopped: the server stops";

/// The server's jobs.
#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    list: Mutex<Vec<Arc<Job>>>,
    /// Jobs of the servers before this one (from `jobs.json`), newest
    /// first, trimmed with this server's.
    earlier: Mutex<Vec<JobInfo>>,
    /// Where `jobs.json` is (None: kept in memory only).
    dir: Option<PathBuf>,
    /// One writer of `jobs.json` at a time.
    saving: Mutex<()>,
    /// The server's placement of disks (moves run through it).
    mover: Option<Arc<dyn Mover + Send + Sync>>,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Jobs {
    /// The jobs of a server of the datastore in `dir` (its local
    /// directory): those of earlier servers from `jobs.json`, a job that
    /// was running when its server stopped listed as interrupted.
    pub fn open(dir: &Path, mover: Arc<dyn Mover + Send + Sync>) -> Jobs {
        let file = load(dir);
        Jobs {
            next: AtomicU64::new(file.last_id),
            earlier: Mutex::new(file.jobs),
            dir: Some(dir.to_path_buf()),
            mover: Some(mover),
            ..Default::default()
        }
    }

    /// Every job, newest first: this server's, then earlier servers'.
    fn infos(&self) -> Vec<JobInfo> {
        let mut all: Vec<JobInfo> = self.list.lock().iter().map(|j| j.info()).collect();
        all.extend(self.earlier.lock().iter().cloned());
        all.sort_by_key(|j| std::cmp::Reverse(j.id));
        all
    }

    /// Write `jobs.json` (all jobs as listed now); a failure is logged
    /// and the list kept in memory.
    fn save(&self) {
        let Some(dir) = &self.dir else {
            return;
        };
        let _one = self.saving.lock();
        let file = JobsFile {
            last_id: self.next.load(Ordering::Relaxed),
            jobs: self.infos(),
        };
        if let Err(e) = write_atomically(&dir.join(FILE), &file) {
            tracing::warn!("jobs: cannot write {}: {e}", dir.join(FILE).display());
        }
    }

    /// Run job `j` (`req`) in this thread, recording its progress and
    /// result.
    fn run(
        &self,
        j: &Job,
        req: &Request,
        ds: &dyn strata_datastore::Datastore,
        stats: Option<&strata_stats::StatsRegistry>,
    ) {
        let ctx = Ctx {
            ds,
            stats,
            jobs: Some(self),
            control: Some(j.control.clone()),
            mover: self.mover.as_deref().map(|m| m as &dyn Mover),
            clients: None,
            // Logged as the job's end, below.
            actor: None,
        };
        let mut progress = |done: u64, total: u64| {
            {
                let mut st = j.state.lock();
                st.done = done;
                st.total = total;
            }
            j.changed.notify_all();
            // Operations without pause points of their own wait here.
            if !j.cancellable {
                let _ = j.control.checkpoint();
            }
        };
        let r = execute(&ctx, req, &mut progress);
        log_end(j, &r);
        job_event(ds.dir(), j, req, "job_finished", r.as_ref().map(|_| ()));
        {
            let mut st = j.state.lock();
            if r.is_ok() {
                // All of it done: its total, also past the last report.
                st.total = st.total.max(st.done);
                st.done = st.total;
            }
            st.kept = r.as_ref().ok().filter(|r| small(r)).cloned().map(Box::new);
            st.result = Some(r);
            st.finished_unix = Some(now_unix());
        }
        j.changed.notify_all();
        self.save();
    }

    /// List `job`, forgetting the oldest finished ones past FINISHED_KEPT
    /// (earlier servers' first), and save the list.
    fn list_and_trim(&self, job: &Arc<Job>) {
        {
            let mut list = self.list.lock();
            list.push(job.clone());
            let finished = list
                .iter()
                .filter(|j| j.state.lock().result.is_some())
                .count();
            let mut earlier = self.earlier.lock();
            let room = FINISHED_KEPT.saturating_sub(finished);
            earlier.truncate(room);
            let mut drop_n = finished.saturating_sub(FINISHED_KEPT);
            list.retain(|j| {
                if drop_n > 0 && j.state.lock().result.is_some() {
                    drop_n -= 1;
                    false
                } else {
                    true
                }
            });
        }
        self.save();
    }

    /// Start `req`, asked by `actor`, as a job in its own thread.
    pub fn start(
        self: &Arc<Self>,
        req: Request,
        ds: crate::placement::Store,
        stats: Option<Arc<strata_stats::StatsRegistry>>,
        actor: &str,
    ) -> Arc<Job> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        // A move marks its disk before it is listed: once a client has
        // the job, commands that would change the disk are refused. A
        // refused mark is the job's result (it never runs).
        let refused = match (&req, &self.mover) {
            (Request::Move { .. }, Some(m)) => m.reserve_move(&req).err(),
            _ => None,
        };
        let job = Arc::new(Job {
            id,
            what: req.describe(),
            target: req.event_target(),
            actor: actor.to_string(),
            started_unix: now_unix(),
            control: Arc::new(WorkControl::default()),
            cancellable: matches!(
                req,
                Request::Convert { .. }
                    | Request::PunchZero { .. }
                    | Request::Defrag { .. }
                    | Request::DefragFreeSpace { .. }
                    | Request::DedupEstimate { .. }
                    | Request::Dedup { .. }
                    | Request::Compress { .. }
                    | Request::Import { .. }
                    | Request::Export { .. }
                    | Request::ExportDiff { .. }
                    | Request::Key(strata_api::KeyRequest::Rekey { deep: true, .. })
                    | Request::Move { .. }
                    | Request::CloneFull { .. }
            ),
            state: Mutex::new(JobStatus {
                done: 0,
                total: 0,
                finished_unix: refused.as_ref().map(|_| now_unix()),
                result: refused.clone().map(Err),
                kept: None,
            }),
            changed: Condvar::new(),
        });
        self.list_and_trim(&job);
        job_event(
            ds.dir(),
            &job,
            &req,
            "job_started",
            refused.as_ref().map_or(Ok(()), Err),
        );
        if let Some(e) = refused {
            tracing::warn!(event = "job", job = id, what = %job.what, state = "refused",
                "job {id} ({}) refused: {}", job.what, e);
            return job;
        }
        tracing::info!(event = "job", job = id, what = %job.what, state = "started",
            "job {id} ({}) started", job.what);
        let j = job.clone();
        let jobs = self.clone();
        std::thread::Builder::new()
            .name(format!("job-{id}"))
            .spawn(move || jobs.run(&j, &req, &*ds, stats.as_deref()))
            .expect("spawn job thread");
        job
    }

    /// Whether a job whose description starts with the word `verb`
    /// ("dedup", "compress") is running.
    pub fn running_verb(&self, verb: &str) -> bool {
        self.list.lock().iter().any(|j| {
            j.what.split_whitespace().next() == Some(verb) && j.state.lock().result.is_none()
        })
    }

    /// Stop job `id` at the end of its current step, its error starting
    /// with `why` (the server's own jobs at shutdown).
    pub fn stop(&self, id: u64, why: &str) {
        if let Some(j) = self.list.lock().iter().find(|j| j.id == id) {
            j.control.cancel_with(why);
        }
    }

    /// The server stops: every job still running is stopped at the end of
    /// its current step (the error of each starting with `why`) and waited
    /// for, up to `bound` in all; one that cannot be stopped part-way
    /// (import-diff, an eager-zeroed create) is paused there instead, and
    /// the next server lists it as interrupted. The jobs left running or
    /// paused when the bound passed, by description.
    pub fn stop_all(&self, why: &str, bound: std::time::Duration) -> Vec<String> {
        let running: Vec<Arc<Job>> = self
            .list
            .lock()
            .iter()
            .filter(|j| j.state.lock().result.is_none())
            .cloned()
            .collect();
        for j in &running {
            if j.cancellable {
                j.control.cancel_with(why);
            } else {
                j.control.pause();
            }
        }
        let until = std::time::Instant::now() + bound;
        let mut left = Vec::new();
        for j in running {
            if !j.cancellable || !j.ends_by(until) {
                left.push(format!("job {} ({})", j.id, j.what));
            }
        }
        // What the ended ones' threads may not have written yet.
        self.save();
        left
    }

    /// Take finished job `id` off the list (a background pass that found
    /// nothing to do: its result is in the server's log).
    pub fn forget(&self, id: u64) {
        self.list
            .lock()
            .retain(|j| j.id != id || j.state.lock().result.is_none());
        self.save();
    }
}

impl JobList for Jobs {
    fn list(&self) -> Vec<JobInfo> {
        self.infos()
    }

    /// Pause, resume or cancel job `id`.
    fn act(&self, id: u64, action: JobAction) -> Result<JobInfo, Error> {
        let job = self
            .list
            .lock()
            .iter()
            .find(|j| j.id == id)
            .cloned()
            .ok_or_else(|| match self.earlier.lock().iter().find(|j| j.id == id) {
                Some(j) => Error::new(
                    ErrorKind::Refused,
                    format!(
                        "job {id} ({}) ran under an earlier server and has ended",
                        j.what
                    ),
                ),
                None => Error::new(
                    ErrorKind::NotFound,
                    format!("no job {id} (see 'strata jobs')"),
                ),
            })?;
        if job.state.lock().result.is_some() {
            return Err(Error::new(
                ErrorKind::Refused,
                format!("job {id} has already ended"),
            ));
        }
        match action {
            JobAction::Pause => job.control.pause(),
            JobAction::Resume => job.control.resume(),
            JobAction::Cancel if !job.cancellable => {
                return Err(Error::new(
                    ErrorKind::Refused,
                    format!(
                        "job {id} ({}) cannot be cancelled part-way; pause it instead",
                        job.what
                    ),
                ))
            }
            JobAction::Cancel => job.control.cancel_with(STOPPED_BY_CANCEL),
        }
        Ok(job.info())
    }
}

/// `jobs.json` in `dir`: none (or an unreadable one, set aside with a
/// warning) is an empty list; jobs an earlier server was running when it
/// stopped are interrupted.
fn load(dir: &Path) -> JobsFile {
    let path = dir.join(FILE);
    let mut file: JobsFile = match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return JobsFile::default(),
        Err(e) => {
            tracing::warn!(
                "jobs: cannot read {}: {e}; earlier jobs not listed",
                path.display()
            );
            return JobsFile::default();
        }
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(f) => f,
            Err(e) => {
                let aside = dir.join(format!("{FILE}.bad"));
                let _ = std::fs::rename(&path, &aside);
                tracing::warn!(
                    "jobs: {} is unreadable ({e}); set aside as {}",
                    path.display(),
                    aside.display()
                );
                return JobsFile::default();
            }
        },
    };
    for j in &mut file.jobs {
        if matches!(
            j.state,
            JobState::Running | JobState::Paused | JobState::Cancelling
        ) {
            j.state = JobState::Interrupted;
            j.error = Some(
                "the server stopped while it ran; what it did stays, run it again for the rest"
                    .into(),
            );
        }
    }
    file.last_id = file.jobs.iter().map(|j| j.id).fold(file.last_id, u64::max);
    file
}

/// Write `value` as JSON to `path` so that a crash leaves the old file or
/// the new one: a temporary file beside it, synced, renamed over it.
fn write_atomically(path: &Path, value: &JobsFile) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(d) = path.parent() {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}
