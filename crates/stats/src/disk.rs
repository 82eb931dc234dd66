//! Per-disk counters and histograms, and the hot-path recording API.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use quanta::Clock;

use serde::{Deserialize, Serialize};
use strata_block::SECTOR_BYTES;

use crate::histogram::{
    shard, Histogram, HistogramSnapshot, INTERARRIVAL, IO_LENGTH, LATENCY, OUTSTANDING,
    SEEK_DISTANCE,
};
use crate::snapshot::{LatencyHistograms, OpCounters, ReadWriteHistograms, StatsSnapshot};

/// The kinds of command a [`DiskStats`] tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Read,
    Write,
    Flush,
    Unmap,
    WriteZeroes,
    BlockStatus,
}

/// Number of [`Op`] variants.
pub const OP_COUNT: usize = 6;

impl Op {
    /// Every op, in the order they are reported.
    pub const ALL: [Op; OP_COUNT] = [
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Unmap,
        Op::WriteZeroes,
        Op::BlockStatus,
    ];

    /// The name used in JSON, text output and the Prometheus `op` label.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Unmap => "unmap",
            Op::WriteZeroes => "write_zeroes",
            Op::BlockStatus => "block_status",
        }
    }

    #[inline]
    fn index(self) -> usize {
        self as usize
    }
}

/// "No previous command" marker for the seek and interarrival trackers.
const NONE: u64 = u64::MAX;

/// The state every command of a disk updates, whichever thread runs it.
///
/// It sits alone on its own 128-byte block (two cache lines, the unit the
/// adjacent-line prefetcher moves): next to it, the read-mostly fields of
/// [`DiskStats`] (the histograms' pointers, the recording switch) would be
/// invalidated in every other core's cache by each command.
#[derive(Debug)]
#[repr(align(128))]
struct Arrivals {
    in_flight: AtomicU64,
    /// End LBN (exclusive, in sectors) of the previous read or write.
    last_end_lbn: AtomicU64,
    /// Arrival of the previous command, in nanoseconds after `base`.
    last_arrival_ns: AtomicU64,
}

/// The process's clock for statistics: the CPU's time-stamp counter where
/// it is invariant (a read costs a third of `Instant::now` here), else the
/// monotonic clock. Calibrated once per process.
fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(Clock::new)
}

/// Statistics of one disk (export), shared by every connection serving it.
///
/// Recording touches only relaxed atomics. See the crate docs for what each
/// histogram holds.
#[derive(Debug)]
pub struct DiskStats {
    clock: &'static Clock,
    /// Origin of the statistics' nanosecond timeline, in raw clock ticks.
    base: u64,
    /// Nanoseconds after `base` of the last reset (0: never reset).
    reset_at_ns: AtomicU64,
    /// Whether [`StatsDevice`](crate::StatsDevice)s record (see
    /// [`DiskStats::set_recording`]).
    recording: AtomicBool,
    arrivals: Arrivals,
    errors: [AtomicU64; OP_COUNT],
    /// Bytes for the ops without a length histogram (unmap, write_zeroes).
    range_bytes: [AtomicU64; OP_COUNT],
    /// Indexed by `Op::Read` / `Op::Write`.
    io_length: [Histogram; 2],
    seek: [Histogram; 2],
    latency: [Histogram; OP_COUNT],
    outstanding: Histogram,
    interarrival: Histogram,
}

impl Default for DiskStats {
    fn default() -> Self {
        Self::new()
    }
}

impl DiskStats {
    pub fn new() -> Self {
        let clock = clock();
        Self {
            clock,
            base: clock.raw(),
            reset_at_ns: AtomicU64::new(0),
            recording: AtomicBool::new(true),
            arrivals: Arrivals {
                in_flight: AtomicU64::new(0),
                last_end_lbn: AtomicU64::new(NONE),
                last_arrival_ns: AtomicU64::new(NONE),
            },
            errors: Default::default(),
            range_bytes: Default::default(),
            io_length: [Histogram::new(&IO_LENGTH), Histogram::new(&IO_LENGTH)],
            seek: [
                Histogram::new(&SEEK_DISTANCE),
                Histogram::new(&SEEK_DISTANCE),
            ],
            latency: std::array::from_fn(|_| Histogram::new(&LATENCY)),
            outstanding: Histogram::new(&OUTSTANDING),
            interarrival: Histogram::new(&INTERARRIVAL),
        }
    }

    /// Record the arrival of a command and return a guard that records its
    /// completion. `offset_bytes` and `len_bytes` describe the range for
    /// read, write, unmap and write_zeroes and are ignored for the others.
    ///
    /// Call [`Command::finish`] with the outcome; dropping the guard without
    /// it (a panic in the device) records the command as failed.
    #[inline]
    pub fn begin(&self, op: Op, offset_bytes: u64, len_bytes: u64) -> Command<'_> {
        let start = self.clock.raw();
        let row = shard();
        let shared = &self.arrivals;

        // The three updates of the shared block come first and back to
        // back, so the cache line is fetched once per arrival.
        let outstanding = shared.in_flight.fetch_add(1, Relaxed) + 1;
        let arrival = self.since_base(start);
        let previous = shared.last_arrival_ns.swap(arrival, Relaxed);
        let seek = match op {
            Op::Read | Op::Write => {
                let lbn = offset_bytes / SECTOR_BYTES;
                let end = lbn + len_bytes.div_ceil(SECTOR_BYTES);
                let previous_end = shared.last_end_lbn.swap(end, Relaxed);
                // Both are below 2^55, so the wrapping difference read as
                // i64 is the exact signed distance.
                (previous_end != NONE).then(|| lbn.wrapping_sub(previous_end) as i64)
            }
            _ => None,
        };

        self.outstanding.record_in(row, clamp(outstanding));
        if previous != NONE {
            // Another thread may have swapped in a later arrival first; the
            // difference is then taken as 0 rather than negative.
            self.interarrival
                .record_in(row, clamp(arrival.saturating_sub(previous)));
        }
        match op {
            Op::Read | Op::Write => {
                let i = op.index();
                self.io_length[i].record_in(row, clamp(len_bytes));
                if let Some(distance) = seek {
                    self.seek[i].record_in(row, distance);
                }
            }
            Op::Unmap | Op::WriteZeroes => {
                self.range_bytes[op.index()].fetch_add(len_bytes, Relaxed);
            }
            Op::Flush | Op::BlockStatus => {}
        }

        Command {
            stats: self,
            op,
            row,
            start,
            finished: false,
        }
    }

    /// Nanoseconds from `base` to the raw reading `at`, below `NONE`.
    #[inline]
    fn since_base(&self, at: u64) -> u64 {
        self.clock.delta_as_nanos(self.base, at).min(NONE - 1)
    }

    /// Commands begun and not yet finished, over every connection.
    pub fn in_flight(&self) -> u64 {
        self.arrivals.in_flight.load(Relaxed)
    }

    /// Whether commands are being recorded (the default).
    #[inline]
    pub fn recording(&self) -> bool {
        self.recording.load(Relaxed)
    }

    /// Pause (`false`) or resume (`true`) recording, like vscsiStats' stop
    /// and start. While paused, a [`StatsDevice`](crate::StatsDevice) only
    /// forwards: commands arriving then are not counted at all, not even as
    /// in flight, and what was recorded before stays readable. Commands in
    /// progress when the switch flips finish the way they began. Resuming
    /// does not reset; the first command after it measures its seek and
    /// interarrival time against the last one recorded before the pause.
    pub fn set_recording(&self, on: bool) {
        self.recording.store(on, Relaxed);
    }

    /// Zero every counter and histogram and forget the previous command (so
    /// the next one records no seek distance and no interarrival time).
    ///
    /// Not atomic as a whole: a command completing during the reset may be
    /// half counted. The in-flight count is a level, not a counter, and is
    /// left alone so that commands running across the reset still balance.
    pub fn reset(&self) {
        for h in self
            .io_length
            .iter()
            .chain(&self.seek)
            .chain(&self.latency)
            .chain([&self.outstanding, &self.interarrival])
        {
            h.reset();
        }
        for c in self.errors.iter().chain(&self.range_bytes) {
            c.store(0, Relaxed);
        }
        self.arrivals.last_end_lbn.store(NONE, Relaxed);
        self.arrivals.last_arrival_ns.store(NONE, Relaxed);
        self.reset_at_ns
            .store(self.since_base(self.clock.raw()), Relaxed);
    }

    /// Copy every counter and histogram. Each value is read atomically, the
    /// whole is not: a snapshot taken under load may be off by the commands
    /// in progress (e.g. a bucket count one ahead of the sum).
    pub fn snapshot(&self) -> StatsSnapshot {
        let now = self.since_base(self.clock.raw());
        let latency: Vec<HistogramSnapshot> = self.latency.iter().map(|h| h.snapshot()).collect();
        let io_length =
            ReadWriteHistograms::new(self.io_length[0].snapshot(), self.io_length[1].snapshot());
        let seek = ReadWriteHistograms::new(self.seek[0].snapshot(), self.seek[1].snapshot());

        let counters = |op: Op| {
            let i = op.index();
            let bytes = match op {
                Op::Read | Op::Write => io_length.get(op).map_or(0, |h| h.sum as u64),
                _ => self.range_bytes[i].load(Relaxed),
            };
            OpCounters {
                commands: latency[i].count,
                bytes,
                errors: self.errors[i].load(Relaxed),
            }
        };

        StatsSnapshot {
            elapsed_ns: now.saturating_sub(self.reset_at_ns.load(Relaxed)),
            recording: self.recording(),
            in_flight: self.in_flight(),
            read: counters(Op::Read),
            write: counters(Op::Write),
            flush: counters(Op::Flush),
            unmap: counters(Op::Unmap),
            write_zeroes: counters(Op::WriteZeroes),
            block_status: counters(Op::BlockStatus),
            errors: self.errors.iter().map(|e| e.load(Relaxed)).sum(),
            io_length,
            seek_distance: seek,
            latency: LatencyHistograms::from_ops(latency),
            outstanding: self.outstanding.snapshot(),
            interarrival: self.interarrival.snapshot(),
        }
    }
}

/// A command in progress; see [`DiskStats::begin`].
#[derive(Debug)]
#[must_use = "finish the command to record its latency and outcome"]
pub struct Command<'a> {
    stats: &'a DiskStats,
    op: Op,
    /// The histogram row of the thread that began the command.
    row: usize,
    /// Raw clock reading at arrival.
    start: u64,
    finished: bool,
}

impl Command<'_> {
    /// Record the latency (since `begin`) and, when `ok` is false, an error.
    #[inline]
    pub fn finish(mut self, ok: bool) {
        self.complete(ok);
    }

    #[inline]
    fn complete(&mut self, ok: bool) {
        self.finished = true;
        let i = self.op.index();
        let stats = self.stats;
        let ns = stats.clock.delta_as_nanos(self.start, stats.clock.raw());
        stats.latency[i].record_in(self.row, clamp(ns));
        if !ok {
            self.stats.errors[i].fetch_add(1, Relaxed);
        }
    }
}

impl Drop for Command<'_> {
    #[inline]
    fn drop(&mut self) {
        if !self.finished {
            self.complete(false);
        }
        self.stats.arrivals.in_flight.fetch_sub(1, Relaxed);
    }
}

#[inline]
fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}
