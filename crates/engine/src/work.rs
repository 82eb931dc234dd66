//! Long operations (convert, punchzero) run in bounded regions; between
//! regions they pace themselves to a rate and obey their controller: a
//! paused operation waits, a cancelled one stops with an error, leaving
//! the consistent state each region ends in (FORMAT.md §7.3).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, ErrorKind, Result};

/// Pause, resume and cancel for a running operation, shared between the
/// operation and whoever controls it (a server's job list).
#[derive(Default)]
pub struct WorkControl {
    paused: Mutex<bool>,
    cv: Condvar,
    cancelled: AtomicBool,
    /// What the error of a cancelled operation starts with: who stopped
    /// it (None: [`STOPPED`]).
    why: Mutex<Option<String>>,
}

/// What a cancelled operation's error starts with when whoever cancelled
/// it did not say who they are.
pub const STOPPED: &str = "stopped on request";

impl WorkControl {
    pub fn pause(&self) {
        *self.paused.lock() = true;
    }

    pub fn resume(&self) {
        *self.paused.lock() = false;
        self.cv.notify_all();
    }

    /// Ask the operation to stop at the end of its current region.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// [`cancel`](Self::cancel), the operation's error starting with `why`
    /// ("stopped by 'strata jobs cancel'") rather than [`STOPPED`].
    pub fn cancel_with(&self, why: &str) {
        *self.why.lock() = Some(why.to_string());
        self.cancel();
    }

    /// What a cancelled operation's error starts with.
    fn why(&self) -> String {
        self.why
            .lock()
            .clone()
            .unwrap_or_else(|| STOPPED.to_string())
    }

    /// Whether `e` is how a cancelled operation stopped (its error starts
    /// with who stopped it, as `checkpoint`'s does): then that start,
    /// which an operation saying what it leaves behind puts first too.
    /// None: not cancelled, or `e` is a failure of its own.
    pub fn stopped_by(&self, e: &Error) -> Option<String> {
        let why = self.why();
        (self.is_cancelled() && e.kind == ErrorKind::Refused && e.message.starts_with(&why))
            .then_some(why)
    }

    /// `e`, when it is how this operation was cancelled, saying instead
    /// what the stop leaves: "{who stopped it}: {left}".
    pub fn stopped_leaving(&self, mut e: Error, left: &str) -> Error {
        if let Some(why) = self.stopped_by(&e) {
            e.message = format!("{why}: {left}");
        }
        e
    }

    pub fn is_paused(&self) -> bool {
        *self.paused.lock()
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Between regions: wait while paused; an error once cancelled.
    pub fn checkpoint(&self) -> Result<()> {
        let mut p = self.paused.lock();
        while *p && !self.is_cancelled() {
            self.cv.wait_for(&mut p, Duration::from_millis(500));
        }
        if self.is_cancelled() {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "{}; what was done so far stays (run it again to finish)",
                    self.why()
                ),
            ));
        }
        Ok(())
    }
}

/// Paces a long operation: after each region, waits while paused, stops
/// when cancelled, and sleeps as long as the work is ahead of its rate;
/// without a rate, rests three times the region's time while clients do
/// I/O (as the reclaimer does).
pub struct Pacer<'a> {
    rate: Option<u64>,
    control: Option<&'a WorkControl>,
    start: Instant,
    done: u64,
    /// End of the previous region (its successor's work starts there).
    last: Instant,
    /// Rest while clients are busy, in multiples of the region's time.
    busy_rest: u32,
}

/// Rest after a region while clients do I/O, in multiples of the region's
/// time: the operation then takes at most a quarter of the time.
const BUSY_REST: u32 = 3;
/// The same for layout work (defrag, free-space consolidation), which
/// copies data and so costs clients more per region: at most an eighth.
pub(crate) const LAYOUT_BUSY_REST: u32 = 7;
/// The same for re-sharing (`dedup`), whose 1 MiB regions read up to 16 MiB
/// (every named disk's grains there) against the clients' reads: at most
/// a sixteenth (`space` bench case: client 4k random reads 0.87-0.97x of
/// the pass paused with 7, 0.98-1.03x with 15).
pub(crate) const DEDUP_BUSY_REST: u32 = 15;

impl<'a> Pacer<'a> {
    pub fn new(rate: Option<u64>, control: Option<&'a WorkControl>) -> Self {
        Pacer {
            rate: rate.filter(|&r| r > 0),
            control,
            start: Instant::now(),
            done: 0,
            last: Instant::now(),
            busy_rest: BUSY_REST,
        }
    }

    /// Rest `factor` times each region's time while clients are busy.
    pub fn resting(mut self, factor: u32) -> Self {
        self.busy_rest = factor;
        self
    }

    /// After a region of `bytes`; `clients_busy`: client I/O is in flight.
    pub fn pace(&mut self, bytes: u64, clients_busy: bool) -> Result<()> {
        let took = self.last.elapsed();
        self.done += bytes;
        if let Some(c) = self.control {
            let t = Instant::now();
            c.checkpoint()?;
            // Time spent paused does not count against the rate.
            self.start += t.elapsed();
        }
        match self.rate {
            Some(r) => {
                let due = Duration::from_secs_f64(self.done as f64 / r as f64);
                if let Some(wait) = due.checked_sub(self.start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            // Clients first: rest while they are busy, else only let
            // other threads run.
            None if clients_busy => std::thread::sleep(took * self.busy_rest),
            None => std::thread::yield_now(),
        }
        self.last = Instant::now();
        Ok(())
    }
}
