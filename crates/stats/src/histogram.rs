//! Fixed-edge histograms with atomic counters.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// I/O length edges, in bytes.
pub const IO_LENGTH_EDGES: &[i64] = &[
    512, 1024, 2048, 4095, 4096, 8191, 8192, 16383, 16384, 32768, 49152, 65535, 65536, 81920,
    131072, 262144, 524288,
];

/// Latency edges, in microseconds.
pub const LATENCY_EDGES_US: &[i64] = &[1, 10, 100, 500, 1000, 5000, 15000, 30000, 50000, 100000];

/// Seek-distance edges, in 512-byte sectors (signed).
pub const SEEK_DISTANCE_EDGES: &[i64] = &[
    -500000, -100000, -50000, -10000, -5000, -1000, -500, -128, -64, -32, -16, -8, -6, -4, -2, -1,
    0, 1, 2, 4, 6, 8, 16, 32, 64, 128, 500, 1000, 5000, 10000, 50000, 100000, 500000,
];

/// Edges for the number of commands outstanding when a command arrives
/// (the arriving command included).
pub const OUTSTANDING_EDGES: &[i64] = &[1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64];

/// Interarrival-time edges, in microseconds.
pub const INTERARRIVAL_EDGES_US: &[i64] =
    &[1, 10, 100, 500, 1000, 5000, 15000, 30000, 50000, 100000];

/// The shape of one kind of histogram: its edges and units.
///
/// Values are recorded in `raw_unit`; edges are given in `unit`, and one
/// `unit` is `scale` raw units. Only the time histograms have a scale other
/// than 1: they record nanoseconds against edges in microseconds, so bucket
/// placement is exact ("≤ 1 µs" means ≤ 1000 ns) and the sum is kept to the
/// nanosecond.
#[derive(Debug)]
pub struct HistogramSpec {
    /// Unit of the edges (`"bytes"`, `"microseconds"`, `"sectors"`, `"commands"`).
    pub unit: &'static str,
    /// Unit of recorded values and of the sum.
    pub raw_unit: &'static str,
    /// Raw units per edge unit.
    pub scale: i64,
    /// Inclusive upper edges, strictly increasing; an overflow bucket follows.
    pub edges: &'static [i64],
    /// Whether recorded values may be negative (changes how the sum is read).
    pub signed: bool,
}

/// I/O length in bytes.
pub static IO_LENGTH: HistogramSpec = HistogramSpec {
    unit: "bytes",
    raw_unit: "bytes",
    scale: 1,
    edges: IO_LENGTH_EDGES,
    signed: false,
};

/// Latency: nanoseconds recorded against microsecond edges.
pub static LATENCY: HistogramSpec = HistogramSpec {
    unit: "microseconds",
    raw_unit: "nanoseconds",
    scale: 1000,
    edges: LATENCY_EDGES_US,
    signed: false,
};

/// Seek distance in sectors.
pub static SEEK_DISTANCE: HistogramSpec = HistogramSpec {
    unit: "sectors",
    raw_unit: "sectors",
    scale: 1,
    edges: SEEK_DISTANCE_EDGES,
    signed: true,
};

/// Outstanding commands at arrival.
pub static OUTSTANDING: HistogramSpec = HistogramSpec {
    unit: "commands",
    raw_unit: "commands",
    scale: 1,
    edges: OUTSTANDING_EDGES,
    signed: false,
};

/// Interarrival time: nanoseconds recorded against microsecond edges.
pub static INTERARRIVAL: HistogramSpec = HistogramSpec {
    unit: "microseconds",
    raw_unit: "nanoseconds",
    scale: 1000,
    edges: INTERARRIVAL_EDGES_US,
    signed: false,
};

impl HistogramSpec {
    /// Number of buckets, the overflow bucket included.
    pub fn buckets(&self) -> usize {
        self.edges.len() + 1
    }

    /// The bucket a raw value lands in: the first whose edge (in raw units)
    /// is ≥ the value, or the overflow bucket `edges.len()`.
    #[inline]
    pub fn bucket_index(&self, raw: i64) -> usize {
        let scale = self.scale;
        self.edges
            .partition_point(|&edge| edge.saturating_mul(scale) < raw)
    }

    /// The label of bucket `i`: `"<=EDGE"`, or `">LAST"` for the overflow.
    pub fn label(&self, i: usize) -> String {
        match self.edges.get(i) {
            Some(edge) => format!("<={edge}"),
            None => format!(">{}", self.edges[self.edges.len() - 1]),
        }
    }
}

/// A histogram with fixed edges: one relaxed atomic add for the bucket and
/// one for the sum per recorded value; no locks, no allocation after
/// construction.
///
/// The total count is not stored: it is the sum of the buckets, computed
/// when a snapshot is taken.
#[derive(Debug)]
pub struct Histogram {
    spec: &'static HistogramSpec,
    /// `SHARDS` rows of `stride` counters: the buckets, then the sum (two's
    /// complement, wrapping). Each thread records into its own row, so the
    /// I/O threads of a busy disk do not fight over the same cache lines;
    /// readers add the rows up.
    cells: Box<[AtomicU64]>,
    stride: usize,
}

/// Rows per histogram; threads beyond share rows round-robin.
const SHARDS: usize = 8;

/// This thread's row.
#[inline]
fn shard() -> usize {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static ROW: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
    }
    ROW.with(|r| *r)
}

impl Histogram {
    pub fn new(spec: &'static HistogramSpec) -> Self {
        // Rows start 128 bytes apart (16 counters) so neighbours rarely
        // share a cache line.
        let stride = (spec.buckets() + 1).div_ceil(16) * 16;
        Self {
            spec,
            cells: (0..stride * SHARDS).map(|_| AtomicU64::new(0)).collect(),
            stride,
        }
    }

    fn bucket_total(&self, i: usize) -> u64 {
        (0..SHARDS)
            .map(|r| self.cells[r * self.stride + i].load(Relaxed))
            .fold(0u64, u64::wrapping_add)
    }

    pub fn spec(&self) -> &'static HistogramSpec {
        self.spec
    }

    /// Record one value, in the spec's raw unit.
    #[inline]
    pub fn record(&self, raw: i64) {
        let i = self.spec.bucket_index(raw);
        let row = shard() * self.stride;
        self.cells[row + i].fetch_add(1, Relaxed);
        self.cells[row + self.spec.buckets()].fetch_add(raw as u64, Relaxed);
    }

    /// Zero every bucket and the sum (bucket by bucket, not atomically as a
    /// whole).
    pub fn reset(&self) {
        for c in self.cells.iter() {
            c.store(0, Relaxed);
        }
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let spec = self.spec;
        let buckets: Vec<BucketSnapshot> = (0..spec.buckets())
            .map(|i| BucketSnapshot {
                le: spec.edges.get(i).copied(),
                label: spec.label(i),
                count: self.bucket_total(i),
            })
            .collect();
        let raw_sum = self.bucket_total(spec.buckets());
        let sum = if spec.signed {
            raw_sum as i64 as i128
        } else {
            raw_sum as i128
        };
        HistogramSnapshot {
            unit: spec.unit.to_string(),
            sum_unit: spec.raw_unit.to_string(),
            sum_scale: spec.scale,
            count: buckets.iter().map(|b| b.count).sum(),
            sum,
            buckets,
        }
    }
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

/// A point-in-time copy of a [`Histogram`].
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
    /// An all-zero snapshot shaped like `spec`.
    pub fn empty(spec: &'static HistogramSpec) -> Self {
        Histogram::new(spec).snapshot()
    }

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
