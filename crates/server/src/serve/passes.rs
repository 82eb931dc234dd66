//! The server's background space passes, each as a job of the server
//! that often: listed with its progress by `strata jobs` and the
//! dashboard while it runs, its answer kept when it changed something (a
//! pass that found nothing is taken off the list, so that passes do not
//! push out the jobs people started; the server's log has every pass).
//!
//! - `--dedup-interval SECONDS`: the dedup pass over every disk
//!   (docs/FORMAT.md §17.2).
//! - `--compress-interval SECONDS`: the pack pass (§18.5) over the disks
//!   that are cold: no client of this server has changed them for
//!   `--compress-cold` (a disk not changed since the server started counts
//!   from the start). A busy disk is left raw: a write to a packed grain
//!   makes it raw again, so packing it would be work for nothing. A disk
//!   a pass has taken is not read again until a client changes it (what
//!   did not compress then would not now).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use strata_api::{PackCodec, Request, Response};

use crate::control::Handler;

/// A kind of background pass.
#[derive(Clone, Copy, Debug)]
pub(super) enum Pass {
    Dedup,
    /// Disks unchanged for `cold` are packed with `codec`.
    Compress {
        cold: Duration,
        codec: PackCodec,
    },
}

impl Pass {
    /// The serve option that asks for it.
    fn option(self) -> &'static str {
        match self {
            Pass::Dedup => "--dedup-interval",
            Pass::Compress { .. } => "--compress-interval",
        }
    }

    /// Who the event log says started a pass.
    fn actor(self) -> &'static str {
        match self {
            Pass::Dedup => "server (--dedup-interval)",
            Pass::Compress { .. } => "server (--compress-interval)",
        }
    }

    /// The first word of its jobs' descriptions ("dedup a b", "compress
    /// (every disk)"): one pass of a kind at a time, the user's or ours.
    fn verb(self) -> &'static str {
        match self {
            Pass::Dedup => "dedup",
            Pass::Compress { .. } => "compress",
        }
    }

    /// Its request over `disks` (none: every disk), paced as the command
    /// is.
    fn over(self, disks: Vec<String>) -> Request {
        match self {
            Pass::Dedup => Request::Dedup {
                disks,
                rate_bytes_per_sec: None,
            },
            Pass::Compress { codec, .. } => Request::Compress {
                disks,
                codec,
                rate_bytes_per_sec: None,
            },
        }
    }

    /// The request of a pass now; none: nothing to do now (no disk is
    /// cold and changed since `packed` says a pass took it).
    fn request(self, handler: &Handler, started_ms: u64, packed: &Packed) -> Option<Request> {
        match self {
            Pass::Dedup => Some(self.over(Vec::new())),
            Pass::Compress { cold, .. } => {
                let disks = cold_disks(handler, cold, started_ms, packed);
                (!disks.is_empty()).then(|| self.over(disks))
            }
        }
    }
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// When a compress pass of this server last took each disk (ms since the
/// epoch, at its start).
type Packed = HashMap<String, u64>;

/// The disks no client of this server has changed for `cold` (counted
/// from `started_ms` for a disk not changed since) nor since a pass took
/// them (`packed`), in the datastore's order.
fn cold_disks(handler: &Handler, cold: Duration, started_ms: u64, packed: &Packed) -> Vec<String> {
    let now = now_ms();
    let cold_ms = cold.as_millis() as u64;
    let disks = match handler.ds.list() {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("--compress-interval: listing the disks: {e}");
            return Vec::new();
        }
    };
    disks
        .into_iter()
        .map(|d| d.info.name)
        .filter(|name| {
            let modified = handler.stats.get(name).and_then(|s| s.modified_ms());
            let changed = modified.unwrap_or(0).max(started_ms);
            let taken = packed
                .get(name)
                .is_some_and(|&at| modified.unwrap_or(0) < at);
            now.saturating_sub(changed) >= cold_ms && !taken
        })
        .collect()
}

/// Run `pass` every `interval` (the first one interval after the start)
/// until `stop`; one that is still running at `stop` is stopped at the
/// end of its region and waited for. None, with a warning, where the
/// datastore's kind refuses the pass.
pub(super) fn spawn(
    handler: Arc<Handler>,
    pass: Pass,
    interval: Duration,
    stop: Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    if let Err(e) = crate::ops::refuse_unsupported(&*handler.ds, &pass.over(Vec::new())) {
        tracing::warn!("{}: {e}; no background passes", pass.option());
        return None;
    }
    let started_ms = now_ms();
    let thread = std::thread::Builder::new()
        .name(pass.option().trim_start_matches("--").into())
        .spawn(move || {
            let mut packed = Packed::new();
            let mut next = Instant::now() + interval;
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
                if Instant::now() < next {
                    continue;
                }
                // One pass at a time: a user's, or the last one, still runs.
                if !handler.jobs.running_verb(pass.verb()) {
                    let at = now_ms();
                    if let Some(r) = pass.request(&handler, started_ms, &packed) {
                        let disks = match &r {
                            Request::Compress { disks, .. } => disks.clone(),
                            _ => Vec::new(),
                        };
                        if run_one(&handler, pass, r, &stop) {
                            packed.extend(disks.into_iter().map(|d| (d, at)));
                        }
                    }
                }
                next = Instant::now() + interval;
            }
        })
        .expect("spawn a background pass's thread");
    Some(thread)
}

/// Start one pass as a job and wait for its end (or the server's stop,
/// which stops it); log what it did. Whether it ended with no region
/// left for later (none failed, none skipped).
fn run_one(handler: &Handler, pass: Pass, request: Request, stop: &AtomicBool) -> bool {
    let job = handler.start_job(request, pass.actor());
    let mut stopping = false;
    let result = loop {
        if let (_, Some(r)) = job.wait(Duration::from_millis(200)) {
            break r;
        }
        if stop.load(Ordering::Acquire) && !stopping {
            handler.jobs.stop(job.id, crate::jobs::STOPPED_BY_SHUTDOWN);
            stopping = true;
        }
    };
    let human = strata_api::units::human_exact;
    let (changed, whole) = match result {
        Ok(Response::Dedup(r)) => {
            tracing::info!(
                event = "dedup",
                job = job.id,
                freed_bytes = r.freed_bytes,
                read_bytes = r.read_bytes,
                "background dedup freed {} (compared {})",
                human(r.freed_bytes),
                human(r.read_bytes)
            );
            (
                r.freed_bytes > 0 || r.regions_skipped > 0,
                r.regions_skipped == 0,
            )
        }
        Ok(Response::Compress(r)) => {
            tracing::info!(
                event = "compress",
                job = job.id,
                disks = r.disks.join(" "),
                packed_bytes = r.packed_bytes,
                stream_bytes = r.stream_bytes,
                "background compress of {} packed {} into {} ({} read)",
                r.disks.join(" "),
                human(r.packed_bytes),
                human(r.stream_bytes),
                human(r.read_bytes)
            );
            (
                r.packed_bytes > 0 || r.regions_skipped > 0,
                r.regions_skipped == 0,
            )
        }
        Ok(_) => (true, true),
        Err(e) if stopping => {
            tracing::info!("background {} stopped: {e}", pass.verb());
            (true, false)
        }
        Err(e) => {
            tracing::warn!("background {}: {e}", pass.verb());
            (true, false)
        }
    };
    if !changed {
        handler.jobs.forget(job.id);
    }
    whole
}
