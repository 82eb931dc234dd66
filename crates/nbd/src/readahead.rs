//! Read-ahead along what a client was told it will read.
//!
//! A client that copies an export asks BLOCK_STATUS first and then reads
//! the ranges the answer marked: the dirty ones of a `qemu:dirty-bitmap:`
//! context (an incremental backup), the data of `base:allocation` (a full
//! copy). Those ranges lie scattered over the device, where the host's own
//! read-ahead, which follows file offsets, cannot see them: each read
//! would wait for the device alone. The server knows the client's plan,
//! so it keeps the ranges it announced and, as reads walk along them,
//! asks the device to prefetch the next window of them.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use strata_block::BlockDevice;

/// Most announced ranges kept; the oldest go first.
const RUNS_MAX: usize = 1 << 16;

/// The ranges one connection announced and how far read-ahead has gone.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Announced ranges `[start, end)` not yet passed by a read; ascending
    /// and disjoint.
    runs: VecDeque<(u64, u64)>,
    /// Read-ahead was asked up to here.
    ahead: u64,
    /// Bytes of announced ranges kept prefetched ahead of the reads.
    window: u64,
    /// The previous read fell on an announced range.
    followed: bool,
}

impl Plan {
    pub(crate) fn new(window: u64) -> Self {
        Plan {
            window,
            ..Plan::default()
        }
    }

    /// A BLOCK_STATUS reply from `offset` announced `runs` of `(length,
    /// read next)`. Ranges after those kept are added; a reply that goes
    /// back (a client starting over) replaces them.
    pub(crate) fn announced(&mut self, offset: u64, runs: impl IntoIterator<Item = (u64, bool)>) {
        if self.window == 0 {
            return;
        }
        let mut at = offset;
        let mut fresh: Vec<(u64, u64)> = Vec::new();
        for (len, wanted) in runs {
            let end = at.saturating_add(len);
            if wanted && end > at {
                match fresh.last_mut() {
                    Some(last) if last.1 == at => last.1 = end,
                    _ => fresh.push((at, end)),
                }
            }
            at = end;
        }
        let Some(&(first, _)) = fresh.first() else {
            return;
        };
        match self.runs.back_mut() {
            Some(last) if last.1 > first => {
                self.runs.clear();
                self.ahead = self.ahead.min(first);
            }
            _ => {}
        }
        for (s, e) in fresh {
            match self.runs.back_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => self.runs.push_back((s, e)),
            }
        }
        while self.runs.len() > RUNS_MAX {
            self.runs.pop_front();
        }
    }

    /// A READ of `[offset, offset + len)` arrived: the ranges after it to
    /// prefetch now, in order. Nothing unless this read and the one before
    /// fell on announced ranges (a client reading something else, such as
    /// a sequential run that crosses a dirty range, is not following the
    /// plan), and nothing while at least half the window ahead of it is
    /// already asked for, so hints go out in batches.
    pub(crate) fn on_read(&mut self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let end = offset.saturating_add(len);
        while self.runs.front().is_some_and(|r| r.1 <= offset) {
            self.runs.pop_front();
        }
        let hit = self.runs.front().is_some_and(|r| r.0 < end);
        let followed = std::mem::replace(&mut self.followed, hit);
        if self.window == 0 || !hit || !followed {
            return Vec::new();
        }
        // Announced bytes after the read that were already asked for.
        let from = self.ahead.max(end);
        let pending: u64 = self
            .runs
            .iter()
            .take_while(|r| r.0 < from)
            .map(|r| r.1.min(from).saturating_sub(r.0.max(end)))
            .sum();
        if pending >= self.window / 2 {
            return Vec::new();
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut budget = self.window - pending;
        for &(s, e) in &self.runs {
            if budget == 0 {
                break;
            }
            if e <= from {
                continue;
            }
            let s = s.max(from);
            let n = (e - s).min(budget);
            match out.last_mut() {
                Some(last) if last.0 + last.1 == s => last.1 += n,
                _ => out.push((s, n)),
            }
            budget -= n;
            self.ahead = s + n;
        }
        self.ahead = self.ahead.max(end);
        out
    }
}

/// Hints waiting for the prefetch thread; more are dropped.
const HINTS_QUEUED_MAX: usize = 64;

/// A thread that passes a connection's read-ahead hints to its device, so
/// a READ never waits for them: asking the host to read ahead costs
/// hundreds of microseconds a MiB (page allocation, building the I/O), as
/// much as the read itself from the page cache.
pub(crate) struct Prefetcher {
    tx: Option<SyncSender<(u64, u64)>>,
    thread: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// None if no thread can be started (read-ahead is then off).
    pub(crate) fn start(dev: Arc<dyn BlockDevice>) -> Option<Self> {
        let (tx, rx) = sync_channel::<(u64, u64)>(HINTS_QUEUED_MAX);
        let thread = thread::Builder::new()
            .name("nbd-readahead".into())
            .spawn(move || {
                for (offset, len) in rx {
                    dev.prefetch(offset, len);
                }
            });
        match thread {
            Ok(t) => Some(Prefetcher {
                tx: Some(tx),
                thread: Some(t),
            }),
            Err(e) => {
                tracing::warn!("NBD: no read-ahead thread: {e}");
                None
            }
        }
    }

    /// Queue a hint; dropped when the queue is full (the device is then
    /// behind anyway).
    pub(crate) fn hint(&self, offset: u64, len: u64) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send((offset, len));
        }
    }
}

impl Drop for Prefetcher {
    /// The thread ends with the hints queued; the connection's device is
    /// released only then.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    /// Dirty 1 MiB ranges at 10, 20, 30 ... MiB (every tenth MiB).
    fn scattered(n: u64) -> Plan {
        let mut p = Plan::new(4 * M);
        let runs = (0..n).flat_map(|_| [(9 * M, false), (M, true)]);
        p.announced(M, runs);
        p
    }

    #[test]
    fn reads_along_the_plan_ask_for_the_next_window() {
        let mut p = scattered(10);
        // The first read on the plan only marks that the client follows it.
        assert!(p.on_read(10 * M, M / 2).is_empty());
        assert_eq!(
            p.on_read(10 * M + M / 2, M / 2),
            [(20 * M, M), (30 * M, M), (40 * M, M), (50 * M, M)]
        );
        // Three, then two of four window bytes are still ahead: nothing new.
        assert!(p.on_read(20 * M, M).is_empty());
        assert!(p.on_read(30 * M, M).is_empty());
        // One: the window is topped up.
        assert_eq!(
            p.on_read(40 * M, M),
            [(60 * M, M), (70 * M, M), (80 * M, M)]
        );
        // A read off the plan asks nothing, and the next one on it neither.
        assert!(p.on_read(45 * M, 4096).is_empty());
        assert!(p.on_read(50 * M, M).is_empty());
    }

    #[test]
    fn the_window_counts_announced_bytes_only_and_stops_at_the_plan_end() {
        let mut p = scattered(3);
        p.on_read(10 * M, 4096);
        assert_eq!(
            p.on_read(10 * M + 4096, 4096),
            [(10 * M + 8192, M - 8192), (20 * M, M), (30 * M, M)]
        );
        assert!(p.on_read(30 * M, M).is_empty());
        assert!(p.on_read(40 * M, M).is_empty());
    }

    #[test]
    fn a_reply_that_goes_back_replaces_the_plan_and_a_later_one_extends_it() {
        let mut p = scattered(2);
        p.announced(40 * M, [(M, true)]);
        assert_eq!(
            p.runs,
            [(10 * M, 11 * M), (20 * M, 21 * M), (40 * M, 41 * M)]
        );
        p.on_read(10 * M, M / 2);
        p.on_read(10 * M + M / 2, M / 2);
        assert_eq!(p.ahead, 41 * M);
        p.announced(0, [(M, false), (M, true)]);
        assert_eq!(p.runs, [(M, 2 * M)]);
        assert!(p.on_read(M, M).is_empty());
        // Adjacent announced ranges merge.
        p.announced(2 * M, [(M, true)]);
        assert_eq!(p.runs, [(M, 3 * M)]);
    }

    #[test]
    fn a_window_of_zero_does_nothing() {
        let mut p = Plan::new(0);
        p.announced(0, [(M, true)]);
        assert!(p.on_read(0, M).is_empty());
    }
}
