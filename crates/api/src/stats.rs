//! I/O statistics as `stats` answers them (vscsiStats' histograms,
//! docs/OPERATIONS.md): a disk's counters and histograms as plain data.
//! strata-stats records them and renders them (text, JSON, Prometheus).

use serde::{Deserialize, Serialize};

/// The kinds of command strata-stats tells apart.
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

    /// Its place in [`Op::ALL`].
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Totals for one kind of command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCounters {
    /// Commands completed (failed ones included).
    pub commands: u64,
    /// Bytes requested by the commands begun (failed ones included); 0 for
    /// flush and block_status.
    pub bytes: u64,
    /// Commands that returned an error.
    pub errors: u64,
}

/// A histogram kept for reads and for writes, and their combination.
/// (Compare [`ArrivalHistograms`], whose `all` counts every command.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadWriteHistograms {
    pub read: HistogramSnapshot,
    pub write: HistogramSnapshot,
    /// `read` + `write`.
    pub all: HistogramSnapshot,
}

impl ReadWriteHistograms {
    /// `read` and `write`, with `all` their sum.
    pub fn new(read: HistogramSnapshot, write: HistogramSnapshot) -> Self {
        let mut all = read.clone();
        all.absorb(&write);
        Self { read, write, all }
    }

    /// The histogram of `op`, for read and write.
    pub fn get(&self, op: Op) -> Option<&HistogramSnapshot> {
        match op {
            Op::Read => Some(&self.read),
            Op::Write => Some(&self.write),
            _ => None,
        }
    }
}

/// A histogram of something measured at each command's arrival, kept as
/// vscsiStats keeps it: among reads only, among writes only, and among
/// every command. `all` is its own histogram, not `read + write`: it counts
/// flush, unmap, write_zeroes and block_status too, and an interarrival
/// time in `all` is measured to the previous command of any kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrivalHistograms {
    /// Measured at each read, among reads.
    pub read: HistogramSnapshot,
    /// Measured at each write, among writes.
    pub write: HistogramSnapshot,
    /// Measured at every command, among every command.
    pub all: HistogramSnapshot,
}

impl ArrivalHistograms {
    /// The histogram of `op`, for read and write.
    pub fn get(&self, op: Op) -> Option<&HistogramSnapshot> {
        match op {
            Op::Read => Some(&self.read),
            Op::Write => Some(&self.write),
            _ => None,
        }
    }
}

/// Latency histograms, one per [`Op`] and their combination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistograms {
    pub read: HistogramSnapshot,
    pub write: HistogramSnapshot,
    pub flush: HistogramSnapshot,
    pub unmap: HistogramSnapshot,
    pub write_zeroes: HistogramSnapshot,
    pub block_status: HistogramSnapshot,
    /// Every command of every op.
    pub all: HistogramSnapshot,
}

impl LatencyHistograms {
    /// From one snapshot per op, in [`Op::ALL`] order.
    pub fn from_ops(per_op: Vec<HistogramSnapshot>) -> Self {
        let mut all = per_op[0].clone();
        for h in &per_op[1..] {
            all.absorb(h);
        }
        let mut it = per_op.into_iter();
        let mut next = || it.next().expect("one latency histogram per op");
        Self {
            read: next(),
            write: next(),
            flush: next(),
            unmap: next(),
            write_zeroes: next(),
            block_status: next(),
            all,
        }
    }

    /// The latency histogram of `op`.
    pub fn get(&self, op: Op) -> &HistogramSnapshot {
        match op {
            Op::Read => &self.read,
            Op::Write => &self.write,
            Op::Flush => &self.flush,
            Op::Unmap => &self.unmap,
            Op::WriteZeroes => &self.write_zeroes,
            Op::BlockStatus => &self.block_status,
        }
    }
}

/// Everything a disk's statistics (strata-stats' `DiskStats`) hold, as
/// plain data. Serializes to the
/// JSON shape used by `--json` output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// Nanoseconds since the statistics were created or last reset.
    pub elapsed_ns: u64,
    /// Whether commands were being recorded (false: paused with
    /// `strata stats --pause`; the figures are those from before).
    #[serde(default = "recording_default")]
    pub recording: bool,
    /// Commands in progress when the snapshot was taken.
    pub in_flight: u64,
    pub read: OpCounters,
    pub write: OpCounters,
    pub flush: OpCounters,
    pub unmap: OpCounters,
    pub write_zeroes: OpCounters,
    pub block_status: OpCounters,
    /// Errors over every op.
    pub errors: u64,
    /// Request length in bytes.
    pub io_length: ReadWriteHistograms,
    /// Signed distance in sectors from the last sector of the previous
    /// read or write to the first sector of this one (sequential: +1).
    pub seek_distance: ReadWriteHistograms,
    /// The same distance to whichever of the last 16 reads and writes ends
    /// closest (smallest magnitude).
    pub seek_distance_closest: ReadWriteHistograms,
    /// Time from arrival to completion.
    pub latency: LatencyHistograms,
    /// Commands outstanding at arrival, the arriving one included: reads
    /// among reads, writes among writes, and every command.
    pub outstanding: ArrivalHistograms,
    /// Time since the previous arrival: of a read (for reads), of a write
    /// (for writes), of any command (all).
    pub interarrival: ArrivalHistograms,
}

impl StatsSnapshot {
    /// The counters of `op`.
    pub fn counters(&self, op: Op) -> &OpCounters {
        match op {
            Op::Read => &self.read,
            Op::Write => &self.write,
            Op::Flush => &self.flush,
            Op::Unmap => &self.unmap,
            Op::WriteZeroes => &self.write_zeroes,
            Op::BlockStatus => &self.block_status,
        }
    }

    /// Commands completed over every op.
    pub fn total_commands(&self) -> u64 {
        Op::ALL.iter().map(|&op| self.counters(op).commands).sum()
    }
}

fn recording_default() -> bool {
    true
}

/// One bucket of a [`HistogramSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketSnapshot {
    /// Inclusive upper edge in the histogram's `unit`; `None` for the
    /// overflow bucket.
    pub le: Option<i64>,
    /// `"<=EDGE"` or `">LAST_EDGE"`.
    pub label: String,
    /// Values in this bucket alone (not cumulative).
    pub count: u64,
}

/// A point-in-time copy of a histogram (strata-stats' `Histogram`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    /// Unit of the bucket edges.
    pub unit: String,
    /// Unit of `sum`.
    pub sum_unit: String,
    /// How many `sum_unit`s make one `unit` (1000 for the time histograms).
    pub sum_scale: i64,
    /// Total of all buckets.
    pub count: u64,
    /// Exact sum of recorded values in `sum_unit` (wraps after 2^64).
    pub sum: i128,
    /// Every bucket in edge order, the overflow bucket last.
    pub buckets: Vec<BucketSnapshot>,
}

impl HistogramSnapshot {
    /// Count of the bucket whose edge is `le` (`None`: the overflow bucket).
    pub fn bucket_count(&self, le: Option<i64>) -> Option<u64> {
        self.buckets.iter().find(|b| b.le == le).map(|b| b.count)
    }

    /// Mean of the recorded values in `unit`, if any were recorded.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.sum_scale as f64 / self.count as f64)
    }

    /// Add `other`'s buckets, count and sum to this one.
    ///
    /// # Panics
    /// If the two snapshots do not have the same edges.
    pub fn absorb(&mut self, other: &HistogramSnapshot) {
        assert_eq!(
            self.buckets.len(),
            other.buckets.len(),
            "histogram shapes differ"
        );
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            assert_eq!(mine.le, theirs.le, "histogram edges differ");
            mine.count += theirs.count;
        }
        self.count += other.count;
        self.sum += other.sum;
    }
}
