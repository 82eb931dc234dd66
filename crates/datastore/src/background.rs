//! What a server runs in the background for a datastore, by its kind
//! ([`crate::Datastore::start_background`]): a local datastore's
//! free-space policy, an object store's garbage collection. The alarm
//! watcher and the dedup passes of `--dedup-interval` (jobs of the
//! server) are the same for both kinds and stay with the server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_engine::WorkControl;

use crate::ObjectStoreDatastore;

/// What a server asks to run in the background
/// ([`crate::Datastore::start_background`]); a kind ignores what is not
/// its own.
#[derive(Clone, Default)]
pub struct Background {
    /// A local datastore's free-space policy: consolidate free space when
    /// the pool file on the host exceeds the used space by this many bytes
    /// and a quarter (None: never).
    pub free_space_threshold: Option<u64>,
    /// An object store's garbage collection this often (None: never).
    pub gc_interval: Option<Duration>,
    /// Cancels background work under way (at shutdown).
    pub control: Arc<WorkControl>,
}

/// The shortest gap between two background GC runs that compaction asks
/// for.
const GC_SOONEST: Duration = Duration::from_secs(5);

/// Garbage collection of an object store every `interval`
/// until `stop`, and after a compaction emptied objects.
pub(crate) fn spawn_gc(
    x: Arc<ObjectStoreDatastore>,
    stop: Arc<AtomicBool>,
    interval: Duration,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("gc".into())
        .spawn(move || {
            let mut last = Instant::now();
            let mut next = last + interval;
            while !stop.load(Ordering::Acquire) {
                // Sooner when a compaction emptied objects (FORMAT.md
                // §11.7a), but not more than once per GC_SOONEST.
                let wanted = last.elapsed() >= GC_SOONEST && x.shared().take_gc_wanted();
                if wanted || Instant::now() >= next {
                    last = Instant::now();
                    match x.gc(false) {
                        Ok(r) if r.deleted_segments > 0 => tracing::info!(
                            event = "gc",
                            deleted_segments = r.deleted_segments,
                            garbage_bytes = r.garbage_bytes,
                            "gc deleted {} segments ({})",
                            r.deleted_segments,
                            strata_api::units::human_exact(r.garbage_bytes)
                        ),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(event = "gc", "gc: {e}"),
                    }
                    next = Instant::now() + interval;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
        .expect("spawn gc thread")
}

/// The background free-space policy (`strata serve --free-space-policy auto`):
/// every 10 s, when the pool file on the host exceeds the used (and
/// reserved) space by more than `threshold` and a quarter of it, run a
/// free-space consolidation (FORMAT.md §10.4) with the default pacing,
/// which rests while clients do I/O. A run that leaves the excess over the
/// trigger (clients needed the room, or kept writing while free space lay
/// in short runs) doubles the wait before the next look, up to 10 minutes;
/// one that brings it under resets it. `control` cancels it at shutdown.
pub(crate) fn spawn_free_space_policy(
    ds: strata_engine::Datastore,
    stop: Arc<AtomicBool>,
    control: Arc<WorkControl>,
    threshold: u64,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("free-space".into())
        .spawn(move || {
            const LOOK: u32 = 100; // tenths of a second
            let (mut waited, mut wait) = (0u32, LOOK);
            // The pool's end alone is no reason: above the used grains it
            // holds blocks placement claimed, holes on the host.
            let over = || {
                let used = ds.info().used_bytes;
                ds.free_space_gap()
                    .is_ok_and(|(_, file_gap)| file_gap >= threshold + used / 4)
            };
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
                waited += 1;
                if waited < wait {
                    continue;
                }
                waited = 0;
                if !over() {
                    wait = LOOK;
                    continue;
                }
                let work = strata_engine::SpaceWork {
                    rate_bytes_per_sec: None,
                    control: Some(control.clone()),
                };
                match ds.consolidate_free_space(&work, &mut |_, _| {}) {
                    Ok(r) => tracing::info!(
                        event = "free_space",
                        "free space consolidated in the background: pool {} -> {} MiB, \
                         on the host {} -> {} MiB, {} MiB used",
                        r.pool_bytes_before >> 20,
                        r.pool_bytes_after >> 20,
                        r.pool_file_bytes_before >> 20,
                        r.pool_file_bytes_after >> 20,
                        r.used_bytes >> 20
                    ),
                    Err(e) if stop.load(Ordering::Acquire) => {
                        tracing::info!("background free-space consolidation stopped: {e}")
                    }
                    Err(e) => tracing::warn!("background free-space consolidation: {e}"),
                }
                wait = if over() {
                    (2 * wait).min(60 * LOOK)
                } else {
                    LOOK
                };
            }
        })
        .expect("spawn free-space policy")
}
