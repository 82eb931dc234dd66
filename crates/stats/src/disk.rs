//! Per-disk counters and histograms, and the hot-path recording API.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use quanta::Clock;

use strata_api::stats::{
    ArrivalHistograms, HistogramSnapshot, LatencyHistograms, Op, OpCounters, ReadWriteHistograms,
    StatsSnapshot, OP_COUNT,
};
use strata_block::SECTOR_BYTES;

use crate::histogram::{
    shard, Histogram, INTERARRIVAL, IO_LENGTH, LATENCY, OUTSTANDING, SEEK_DISTANCE,
};

/// "No previous command" marker for the seek and interarrival trackers.
const NONE: u64 = u64::MAX;

/// Index of the "every command" histogram in the `[read, write, all]`
/// triples (outstanding, interarrival); reads and writes use
/// `Op::index()`, 0 and 1.
const ALL: usize = 2;

/// How many recent reads and writes the closest-seek histogram looks back
/// over (vscsiStats' `seekDistanceClosest`: the closest of the last 16).
pub const CLOSEST_OF: usize = 16;

// `Arrivals::in_flight` packs four fields into one word, so that a command
// learns every level it needs from a single `fetch_add`: commands in
// flight (bits 0..20), reads in flight (20..40), writes in flight (40..60),
// and in the top 4 bits the arrival number of reads and writes modulo 16
// (their slot in the ring of recent ends; it only ever grows, wrapping).
// Each level stays far below its 2^20 limit: the NBD server admits at most
// 64 requests per connection and 128 connections.
const LEVEL_BITS: u32 = 20;
const LEVEL_MASK: u64 = (1 << LEVEL_BITS) - 1;
const SEQ_SHIFT: u32 = 3 * LEVEL_BITS;
// The arrival number's bits are exactly one lap of the ring.
const _: () = assert!(1 << (64 - SEQ_SHIFT) == CLOSEST_OF);

/// What a command of `op` adds to `in_flight` at arrival; it takes back
/// the same less the arrival number when it completes.
#[inline]
fn in_flight_unit(op: Op) -> u64 {
    match op {
        Op::Read => 1 | 1 << LEVEL_BITS,
        Op::Write => 1 | 1 << (2 * LEVEL_BITS),
        _ => 1,
    }
}

#[inline]
fn seq_unit(op: Op) -> u64 {
    match op {
        Op::Read | Op::Write => 1 << SEQ_SHIFT,
        _ => 0,
    }
}

/// The state every command of a disk updates, whichever thread runs it.
///
/// It sits alone on its own 128-byte blocks (two cache lines, the unit the
/// adjacent-line prefetcher moves): next to it, the read-mostly fields of
/// [`DiskStats`] (the histograms' pointers, the recording switch) would be
/// invalidated in every other core's cache by each command.
#[derive(Debug)]
#[repr(align(128))]
struct Arrivals {
    /// Levels in flight and the ring position, packed (see `LEVEL_BITS`).
    in_flight: AtomicU64,
    /// Last LBN (inclusive, in sectors) of the previous read or write.
    last_lbn: AtomicU64,
    /// Arrival of the previous command, in nanoseconds after `base`.
    last_arrival_ns: AtomicU64,
    /// Arrival of the previous read and of the previous write.
    last_arrival_rw_ns: [AtomicU64; 2],
    /// Last LBNs of the last [`CLOSEST_OF`] reads and writes.
    recent: RecentEnds,
}

/// A ring of last LBNs, on its own 128 bytes; slot `seq % 16` is written
/// by the read or write with arrival number `seq`. An empty slot holds
/// [`FAR`].
#[derive(Debug)]
#[repr(align(128))]
struct RecentEnds([AtomicU64; CLOSEST_OF]);

/// The empty-slot marker of [`RecentEnds`]: farther from every LBN (all
/// below 2^55) than any two LBNs are from each other, so an empty slot
/// never wins and needs no test of its own.
const FAR: u64 = 1 << 62;

impl RecentEnds {
    /// The distance from `lbn` to the nearest of the ends (`lbn - end`
    /// with the smallest magnitude; of `+d` and `-d`, `+d`), if any slot
    /// is set.
    ///
    /// Branch-free and shallow: each slot becomes a key
    /// `|d| << 1 | (d < 0)`, and the smallest key is found by a pairwise
    /// tree (depth 4) instead of a chain of 16 dependent minimums.
    #[inline]
    fn closest(&self, lbn: u64) -> Option<i64> {
        let mut keys = [0u64; CLOSEST_OF];
        for (key, slot) in keys.iter_mut().zip(&self.0) {
            // Both are below 2^63: the wrapping difference read as i64 is
            // exact and its magnitude shifted left by one still fits.
            let d = lbn.wrapping_sub(slot.load(Relaxed)) as i64;
            *key = (d.unsigned_abs() << 1) | u64::from(d < 0);
        }
        let mut width = CLOSEST_OF / 2;
        while width > 0 {
            for i in 0..width {
                keys[i] = keys[i].min(keys[i + width]);
            }
            width /= 2;
        }
        let best = keys[0];
        (best < FAR).then(|| {
            let magnitude = (best >> 1) as i64;
            if best & 1 == 1 {
                -magnitude
            } else {
                magnitude
            }
        })
    }

    fn clear(&self) {
        for slot in &self.0 {
            slot.store(FAR, Relaxed);
        }
    }
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
    /// When a write, unmap or write-zeroes last succeeded, ms since the
    /// Unix epoch (0: none yet); kept whether recording or not.
    modified_ms: AtomicU64,
    /// Indexed by `Op::Read` / `Op::Write`.
    io_length: [Histogram; 2],
    seek: [Histogram; 2],
    seek_closest: [Histogram; 2],
    latency: [Histogram; OP_COUNT],
    /// Read, write, and every command ([`ALL`]).
    outstanding: [Histogram; 3],
    interarrival: [Histogram; 3],
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
                last_lbn: AtomicU64::new(NONE),
                last_arrival_ns: AtomicU64::new(NONE),
                last_arrival_rw_ns: [AtomicU64::new(NONE), AtomicU64::new(NONE)],
                recent: RecentEnds(std::array::from_fn(|_| AtomicU64::new(FAR))),
            },
            errors: Default::default(),
            range_bytes: Default::default(),
            modified_ms: AtomicU64::new(0),
            io_length: std::array::from_fn(|_| Histogram::new(&IO_LENGTH)),
            seek: std::array::from_fn(|_| Histogram::new(&SEEK_DISTANCE)),
            seek_closest: std::array::from_fn(|_| Histogram::new(&SEEK_DISTANCE)),
            latency: std::array::from_fn(|_| Histogram::new(&LATENCY)),
            outstanding: std::array::from_fn(|_| Histogram::new(&OUTSTANDING)),
            interarrival: std::array::from_fn(|_| Histogram::new(&INTERARRIVAL)),
        }
    }

    /// Record the arrival of a command and return a guard that records its
    /// completion. `offset_bytes` and `len_bytes` describe the range for
    /// read, write, unmap and write_zeroes and are ignored for the others.
    ///
    /// Call [`Command::finish`] with the outcome; dropping the guard without
    /// it (a panic in the device) records the command as failed.
    #[inline]
    pub fn begin(&self, op: Op, offset_bytes: u64, len_bytes: u64) -> Command<&DiskStats> {
        let (row, start) = self.arrive(op, offset_bytes, len_bytes);
        Command {
            stats: self,
            op,
            row,
            start,
            finished: false,
        }
    }

    /// As [`DiskStats::begin`], with a guard that owns a reference to the
    /// statistics: for a command that completes on another thread, later
    /// (a read carried out through a ring).
    pub fn begin_owned(
        self: &Arc<Self>,
        op: Op,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Command<Arc<DiskStats>> {
        let (row, start) = self.arrive(op, offset_bytes, len_bytes);
        Command {
            stats: self.clone(),
            op,
            row,
            start,
            finished: false,
        }
    }

    /// Record an arrival; returns the histogram row and the raw clock.
    #[inline]
    fn arrive(&self, op: Op, offset_bytes: u64, len_bytes: u64) -> (usize, u64) {
        let start = self.clock.raw();
        let row = shard();
        let shared = &self.arrivals;
        let rw = matches!(op, Op::Read | Op::Write);

        // The updates of the shared block come first and back to back, so
        // its cache line is fetched once per arrival.
        let before = shared
            .in_flight
            .fetch_add(in_flight_unit(op) + seq_unit(op), Relaxed);
        let arrival = self.since_base(start);
        let previous = replace(&shared.last_arrival_ns, arrival);
        let mut previous_same = NONE;
        let mut seek = None;
        let mut closest = None;
        if rw {
            let i = op.index();
            previous_same = replace(&shared.last_arrival_rw_ns[i], arrival);
            let lbn = offset_bytes / SECTOR_BYTES;
            // The last sector the command touches (its first, if empty).
            let last = lbn + len_bytes.div_ceil(SECTOR_BYTES).max(1) - 1;
            let previous_last = replace(&shared.last_lbn, last);
            // Both are below 2^55, so the wrapping difference read as i64
            // is the exact signed distance.
            seek = (previous_last != NONE).then(|| lbn.wrapping_sub(previous_last) as i64);
            closest = shared.recent.closest(lbn);
            let slot = (before >> SEQ_SHIFT) as usize;
            shared.recent.0[slot].store(last, Relaxed);
        }

        let all = (before & LEVEL_MASK) + 1;
        self.outstanding[ALL].record_in(row, clamp(all));
        if previous != NONE {
            // Another thread may have swapped in a later arrival first; the
            // difference is then taken as 0 rather than negative.
            self.interarrival[ALL].record_in(row, clamp(arrival.saturating_sub(previous)));
        }
        match op {
            Op::Read | Op::Write => {
                let i = op.index();
                let level = ((before >> ((i as u32 + 1) * LEVEL_BITS)) & LEVEL_MASK) + 1;
                self.outstanding[i].record_in(row, clamp(level));
                if previous_same != NONE {
                    let gap = arrival.saturating_sub(previous_same);
                    self.interarrival[i].record_in(row, clamp(gap));
                }
                self.io_length[i].record_in(row, clamp(len_bytes));
                if let Some(distance) = seek {
                    self.seek[i].record_in(row, distance);
                }
                if let Some(distance) = closest {
                    self.seek_closest[i].record_in(row, distance);
                }
            }
            Op::Unmap | Op::WriteZeroes => {
                self.range_bytes[op.index()].fetch_add(len_bytes, Relaxed);
            }
            Op::Flush | Op::BlockStatus => {}
        }
        (row, start)
    }

    /// Nanoseconds from `base` to the raw reading `at`, below `NONE`.
    #[inline]
    fn since_base(&self, at: u64) -> u64 {
        self.clock.delta_as_nanos(self.base, at).min(NONE - 1)
    }

    /// Commands begun and not yet finished, over every connection.
    pub fn in_flight(&self) -> u64 {
        self.arrivals.in_flight.load(Relaxed) & LEVEL_MASK
    }

    /// Whether commands are being recorded (the default).
    #[inline]
    pub fn recording(&self) -> bool {
        self.recording.load(Relaxed)
    }

    /// A command that changes the disk succeeded now.
    pub fn note_change(&self) {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1);
        self.modified_ms.fetch_max(ms, Relaxed);
    }

    /// When the disk last changed through a device of these statistics
    /// (ms since the Unix epoch), if it has.
    pub fn modified_ms(&self) -> Option<u64> {
        match self.modified_ms.load(Relaxed) {
            0 => None,
            ms => Some(ms),
        }
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
            .chain(&self.seek_closest)
            .chain(&self.latency)
            .chain(&self.outstanding)
            .chain(&self.interarrival)
        {
            h.reset();
        }
        for c in self.errors.iter().chain(&self.range_bytes) {
            c.store(0, Relaxed);
        }
        let a = &self.arrivals;
        for t in [&a.last_lbn, &a.last_arrival_ns]
            .into_iter()
            .chain(&a.last_arrival_rw_ns)
        {
            t.store(NONE, Relaxed);
        }
        a.recent.clear();
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
        let pair = |h: &[Histogram; 2]| ReadWriteHistograms::new(h[0].snapshot(), h[1].snapshot());
        let seek = pair(&self.seek);
        let triple = |h: &[Histogram; 3]| ArrivalHistograms {
            read: h[0].snapshot(),
            write: h[1].snapshot(),
            all: h[ALL].snapshot(),
        };

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
            seek_distance_closest: pair(&self.seek_closest),
            latency: LatencyHistograms::from_ops(latency),
            outstanding: triple(&self.outstanding),
            interarrival: triple(&self.interarrival),
        }
    }
}

/// A command in progress; see [`DiskStats::begin`].
#[derive(Debug)]
#[must_use = "finish the command to record its latency and outcome"]
pub struct Command<S: Deref<Target = DiskStats>> {
    stats: S,
    op: Op,
    /// The histogram row of the thread that began the command.
    row: usize,
    /// Raw clock reading at arrival.
    start: u64,
    finished: bool,
}

impl<S: Deref<Target = DiskStats>> Command<S> {
    /// Record the latency (since `begin`) and, when `ok` is false, an error.
    #[inline]
    pub fn finish(mut self, ok: bool) {
        self.complete(ok);
    }

    #[inline]
    fn complete(&mut self, ok: bool) {
        self.finished = true;
        let i = self.op.index();
        let stats = &*self.stats;
        let ns = stats.clock.delta_as_nanos(self.start, stats.clock.raw());
        stats.latency[i].record_in(self.row, clamp(ns));
        if !ok {
            self.stats.errors[i].fetch_add(1, Relaxed);
        }
    }
}

impl<S: Deref<Target = DiskStats>> Drop for Command<S> {
    #[inline]
    fn drop(&mut self) {
        if !self.finished {
            self.complete(false);
        }
        self.stats
            .arrivals
            .in_flight
            .fetch_sub(in_flight_unit(self.op), Relaxed);
    }
}

/// Store `v` and return what was there, as a plain load and store rather
/// than a swap: a locked instruction per tracker cost about 5 ns a command.
/// Two commands arriving at the same instant may then both be measured
/// against the same predecessor (the race the crate docs accept).
#[inline]
fn replace(a: &AtomicU64, v: u64) -> u64 {
    let old = a.load(Relaxed);
    a.store(v, Relaxed);
    old
}

#[inline]
fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}
