//! `strata serve --dedup-interval SECONDS`: the dedup pass over every disk
//! (docs/FORMAT.md §17.2) as a job of the server, that often: listed with
//! its progress by `strata jobs` and the dashboard while it runs, its
//! answer kept when it freed something (a pass that found nothing is
//! taken off the list, so that passes do not push out the jobs people
//! started; the server's log has every pass).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_api::{Request, Response};

use crate::control::Handler;

/// Who the event log says started a background pass.
const ACTOR: &str = "server (--dedup-interval)";

/// The request a pass runs: every disk, paced as the command is.
fn pass() -> Request {
    Request::Dedup {
        disks: Vec::new(),
        rate_bytes_per_sec: None,
    }
}

/// Run a pass every `interval` (the first one interval after the start)
/// until `stop`; one that is still running at `stop` is stopped at the
/// end of its region and waited for. None, with a warning, where the
/// datastore's kind refuses the pass.
pub(super) fn spawn(
    handler: Arc<Handler>,
    interval: Duration,
    stop: Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    if let Err(e) = crate::ops::refuse_unsupported(&*handler.ds, &pass()) {
        tracing::warn!("--dedup-interval: {e}; no background passes");
        return None;
    }
    let thread = std::thread::Builder::new()
        .name("dedup-interval".into())
        .spawn(move || {
            let what = pass().describe();
            let mut next = Instant::now() + interval;
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
                if Instant::now() < next {
                    continue;
                }
                // One pass at a time: a user's, or the last one, still runs.
                if !handler.jobs.running(&what) {
                    run_one(&handler, &stop);
                }
                next = Instant::now() + interval;
            }
        })
        .expect("spawn the dedup-interval thread");
    Some(thread)
}

/// Start one pass as a job and wait for its end (or the server's stop,
/// which stops it); log what it did.
fn run_one(handler: &Handler, stop: &AtomicBool) {
    let job = handler.start_job(pass(), ACTOR);
    let mut stopping = false;
    let result = loop {
        if let (_, Some(r)) = job.wait(Duration::from_millis(200)) {
            break r;
        }
        if stop.load(Ordering::Acquire) && !stopping {
            handler.jobs.stop(job.id, "stopped: the server stops");
            stopping = true;
        }
    };
    match result {
        Ok(Response::Dedup(r)) => {
            tracing::info!(
                event = "dedup",
                job = job.id,
                freed_bytes = r.freed_bytes,
                read_bytes = r.read_bytes,
                "background dedup freed {} (compared {})",
                strata_api::units::human_exact(r.freed_bytes),
                strata_api::units::human_exact(r.read_bytes)
            );
            if r.freed_bytes == 0 && r.regions_skipped == 0 {
                handler.jobs.forget(job.id);
            }
        }
        Ok(_) => {}
        Err(e) if stopping => tracing::info!("background dedup stopped: {e}"),
        Err(e) => tracing::warn!("background dedup: {e}"),
    }
}
