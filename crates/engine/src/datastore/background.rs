//! The background threads: the reclaimer (deleted snapshots and disks
//! given back in short steps beside client I/O) and the committer and
//! readier, woken by their kicks.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::Result;
use crate::store::{Kick, Store};

use super::{Datastore, RECLAIM_STEP_GRAINS};

/// How the background reclaimer shares the metadata lock with clients.
/// Idle, it takes full steps back to back. While clients do I/O it
/// takes short steps (about a leaf, well under a millisecond under the
/// lock) and rests three times as long as each step took, so reclaiming
/// holds the lock at most a quarter of the time and a client waits at most
/// one short step for it. Freed grains are committed (a commit with frees
/// drains the gate once) every `COMMIT_EVERY` grains of work, whatever the
/// step size, so the drains do not multiply when steps shrink.
#[derive(Default)]
struct ReclaimPace {
    /// Work done since the last commit (grains, as `Meta::reclaim` counts).
    since_commit: u64,
}

impl ReclaimPace {
    /// Work between commits of the freed grains.
    const COMMIT_EVERY: u64 = 64 * RECLAIM_STEP_GRAINS;
    /// A step while clients are busy: one leaf's grains.
    const BUSY_STEP: u64 = 512;
    /// Rest after a step while clients are busy, in multiples of the step.
    const BUSY_REST: u32 = 3;

    fn budget(&self, busy: bool) -> u64 {
        if busy {
            Self::BUSY_STEP
        } else {
            RECLAIM_STEP_GRAINS
        }
    }

    /// Count a step of `budget` (`worked`: there was something to reclaim)
    /// after which work remains (`more`); true when it is time to commit:
    /// every `COMMIT_EVERY`, and when the last orphan is gone.
    fn done(&mut self, budget: u64, worked: bool, more: bool) -> bool {
        if worked {
            self.since_commit += budget;
        }
        if self.since_commit >= Self::COMMIT_EVERY || (!more && self.since_commit > 0) {
            self.since_commit = 0;
            return true;
        }
        false
    }

    /// After a step that took `took`: rest while clients are busy, else
    /// only let other threads run.
    fn rest(&self, busy: bool, took: std::time::Duration) {
        if busy {
            std::thread::sleep((took * Self::BUSY_REST).max(std::time::Duration::from_micros(200)));
        } else {
            std::thread::yield_now();
        }
    }
}

impl Datastore {
    /// Give back up to about `budget` grains of deleted snapshots and disks
    /// (see `Meta::reclaim`). Returns whether work remains. Freed grains
    /// become allocatable at the next commit.
    pub fn reclaim(&self, budget: u64) -> Result<bool> {
        self.inner.reclaim(budget)
    }

    /// Reclaim in the background, a bounded step at a time, so deleting a
    /// snapshot returns at once and I/O never waits long behind the freeing.
    pub fn start_reclaimer(&self) {
        let mut slot = self.inner.reclaimer.lock();
        if slot.is_some() {
            return;
        }
        self.inner.reclaim_stop.store(false, Ordering::Release);
        let ds = self.clone();
        *slot = Some(
            std::thread::Builder::new()
                .name("reclaim".into())
                .spawn(move || {
                    let mut pace = ReclaimPace::default();
                    let mut clients = ds.inner.client_watch();
                    while !ds.inner.reclaim_stop.load(Ordering::Acquire) {
                        let busy = clients.busy();
                        let t0 = std::time::Instant::now();
                        let budget = pace.budget(busy);
                        let worked = ds.inner.meta.lock().orphans() > 0;
                        match ds.reclaim(budget) {
                            Ok(more) => {
                                if pace.done(budget, worked, more) {
                                    let _ = ds.inner.commit(false);
                                }
                                if more {
                                    pace.rest(busy, t0.elapsed());
                                } else {
                                    std::thread::sleep(std::time::Duration::from_millis(50));
                                }
                            }
                            Err(e) => {
                                tracing::error!("reclaiming stopped: {e}");
                                break;
                            }
                        }
                    }
                })
                .expect("spawn reclaimer"),
        );
    }

    /// Commit and checkpoint in the background when the log buffer or the
    /// dirty metadata passes its bound, so a client write does not wait for
    /// a data sync nobody asked for (a server calls this; without it, the
    /// writer that crosses the bound commits). Writers still wait past
    /// twice the bounds. The thread ends when the datastore is dropped.
    pub fn start_background_commits(&self) {
        self.start_kicked(&self.inner.background, "commit", 200, |store| {
            if let Err(e) = store.commit(false) {
                tracing::error!("background commit: {e}");
            }
        });
    }

    /// Start the thread that readies pool space ahead (once), woken by
    /// writes that grow the pool near the readied end.
    pub fn start_readier(&self) {
        self.start_kicked(&self.inner.readier, "ready", 1000, |store| {
            store.ready_space();
        });
    }

    /// Start (once) the thread `name` that runs `step` each time `kick`
    /// wakes it (looking every `poll_ms` whether the datastore is still
    /// there), while the datastore takes writes. It ends when the
    /// datastore is dropped.
    fn start_kicked(&self, kick: &Arc<Kick>, name: &str, poll_ms: u64, step: fn(&Store)) {
        if kick.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let kick = kick.clone();
        let store = Arc::downgrade(&self.inner);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                let kicked = kick.wait(std::time::Duration::from_millis(poll_ms));
                let Some(store) = store.upgrade() else { break };
                if kicked && store.check_writable().is_ok() {
                    step(&store);
                }
            })
            .unwrap_or_else(|e| panic!("spawn the {name} thread: {e}"));
    }

    pub(super) fn stop_reclaimer(&self) {
        self.inner.reclaim_stop.store(true, Ordering::Release);
        if let Some(h) = self.inner.reclaimer.lock().take() {
            let _ = h.join();
        }
    }
}
