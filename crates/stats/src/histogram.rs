//! Fixed-edge histograms with atomic counters.

use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use parking_lot::Mutex;
use strata_api::stats::{BucketSnapshot, HistogramSnapshot};

/// I/O length edges, in bytes.
pub const IO_LENGTH_EDGES: &[i64] = &[
    512, 1024, 2048, 4095, 4096, 8191, 8192, 16383, 16384, 32768, 49152, 65535, 65536, 81920,
    131072, 262144, 524288,
];

/// Latency edges, in microseconds.
pub const LATENCY_EDGES_US: &[i64] = &[1, 10, 100, 500, 1000, 5000, 15000, 30000, 50000, 100000];

/// Seek-distance edges, in 512-byte sectors (signed), for the distance
/// vscsiStats measures: the first LBN of a command minus the last LBN of
/// the previous read or write (or, for the closest-seek histogram, of the
/// nearest of the last 16). Sequential I/O of any request size lands in
/// `<=1`; `<=0` holds a repeat of a one-sector command and small overlaps.
pub const SEEK_DISTANCE_EDGES: &[i64] = &[
    -500000, -100000, -50000, -10000, -5000, -1000, -500, -128, -64, -32, -16, -8, -6, -4, -2, -1,
    0, 1, 2, 4, 6, 8, 16, 32, 64, 128, 500, 1000, 5000, 10000, 50000, 100000, 500000,
];

/// Edges for the number of commands outstanding when a command arrives
/// (the arriving command included; reads among reads, writes among writes,
/// or every command).
pub const OUTSTANDING_EDGES: &[i64] = &[1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64];

/// Interarrival-time edges, in microseconds (time since the previous read,
/// write, or command of any kind).
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

    /// An all-zero snapshot shaped like this spec.
    pub fn empty_snapshot(&'static self) -> HistogramSnapshot {
        Histogram::new(self).snapshot()
    }

    /// The bucket a raw value lands in: the first whose edge (in raw units)
    /// is ≥ the value, or the overflow bucket `edges.len()`.
    /// ([`Histogram`] does the same search over edges scaled once.)
    #[inline]
    pub fn bucket_index(&self, raw: i64) -> usize {
        let scale = self.scale;
        edges_below(self.edges.len(), raw, |i| {
            self.edges[i].saturating_mul(scale)
        })
    }

    /// The label of bucket `i`: `"<=EDGE"`, or `">LAST"` for the overflow.
    pub fn label(&self, i: usize) -> String {
        match self.edges.get(i) {
            Some(edge) => format!("<={edge}"),
            None => format!(">{}", self.edges[self.edges.len() - 1]),
        }
    }
}

/// How many of `len` strictly increasing edges (`edge(i)`, in raw units)
/// are below `raw`: the index of its bucket. A lower-bound search whose
/// steps compile to conditional moves, so random values (seek distances)
/// cost no branch mispredictions. `len` is at least 1.
#[inline]
fn edges_below(len: usize, raw: i64, edge: impl Fn(usize) -> i64) -> usize {
    let mut base = 0;
    let mut size = len;
    while size > 1 {
        let half = size / 2;
        if edge(base + half) < raw {
            base += half;
        }
        size -= half;
    }
    // edge(base) is the last edge below `raw`, or the first edge.
    base + usize::from(edge(base) < raw)
}

/// A histogram with fixed edges; recording a value is two counter updates
/// in the recording thread's own row, with no lock, no allocation and, for
/// threads that own their row, no atomic read-modify-write.
///
/// The total count is not stored: it is the sum of the buckets, computed
/// when a snapshot is taken.
#[derive(Debug)]
pub struct Histogram {
    spec: &'static HistogramSpec,
    /// [`ROWS`] rows of `stride` counters: the buckets, then the sum (two's
    /// complement, wrapping). Each thread records into its row (see
    /// [`shard`]); readers add the rows up. Counters only ever grow
    /// (wrapping): a reset moves the baseline instead.
    cells: Box<[AtomicU64]>,
    stride: usize,
    /// The spec's edges in raw units, so placing a value needs no scaling.
    raw_edges: Box<[i64]>,
    /// For a histogram of small counts (the last edge at most
    /// [`TABLE_MAX`], e.g. outstanding I/Os): the bucket of every value
    /// `0..=TABLE_MAX`, so placing one is a single load. Empty otherwise.
    table: Box<[u8]>,
    /// Per-bucket totals (and the sum) at the last reset, subtracted from
    /// every snapshot.
    baseline: Mutex<Vec<u64>>,
}

/// Largest value a bucket table holds (see `Histogram::table`).
const TABLE_MAX: i64 = 128;

/// Rows per histogram. Rows `0..SHARED_ROW` are each owned by one thread at
/// a time, which updates them with a plain load and store; threads that
/// find no free row share the last one, with atomic adds.
const ROWS: usize = 16;
const SHARED_ROW: usize = ROWS - 1;

/// Which rows a live thread owns.
static ROW_OWNED: [AtomicBool; SHARED_ROW] = [const { AtomicBool::new(false) }; SHARED_ROW];

/// A thread's claim on a row, given back when the thread exits.
struct RowClaim(usize);

impl RowClaim {
    fn take() -> Self {
        let row = ROW_OWNED
            .iter()
            .position(|owned| {
                // Acquire: the previous owner's updates (released when it
                // exited) happen before this thread's first one.
                owned
                    .compare_exchange(false, true, Acquire, Relaxed)
                    .is_ok()
            })
            .unwrap_or(SHARED_ROW);
        Self(row)
    }
}

impl Drop for RowClaim {
    fn drop(&mut self) {
        if let Some(owned) = ROW_OWNED.get(self.0) {
            owned.store(false, Release);
        }
    }
}

/// This thread's row of every histogram; [`DiskStats::begin`] looks it up
/// once per command.
///
/// [`DiskStats::begin`]: crate::DiskStats::begin
#[inline]
pub(crate) fn shard() -> usize {
    thread_local! {
        static ROW: RowClaim = RowClaim::take();
    }
    // A thread being torn down after its claim is gone records into the
    // shared row.
    ROW.try_with(|r| r.0).unwrap_or(SHARED_ROW)
}

/// Add `n` to a counter of row `row`.
#[inline]
fn bump(cell: &AtomicU64, row: usize, n: u64) {
    if row == SHARED_ROW {
        cell.fetch_add(n, Relaxed);
    } else {
        // Only this thread writes the row: no update can be lost, and
        // readers see either value, each whole.
        cell.store(cell.load(Relaxed).wrapping_add(n), Relaxed);
    }
}

impl Histogram {
    pub fn new(spec: &'static HistogramSpec) -> Self {
        // Rows start 128 bytes apart (16 counters) so neighbours rarely
        // share a cache line.
        let stride = (spec.buckets() + 1).div_ceil(16) * 16;
        Self {
            spec,
            cells: (0..stride * ROWS).map(|_| AtomicU64::new(0)).collect(),
            stride,
            table: Self::table(spec),
            raw_edges: spec
                .edges
                .iter()
                .map(|e| e.saturating_mul(spec.scale))
                .collect(),
            baseline: Mutex::new(vec![0; spec.buckets() + 1]),
        }
    }

    /// Bucket `i` (or the sum, `i == buckets`) added over the rows, since
    /// the histogram was created.
    fn total(&self, i: usize) -> u64 {
        (0..ROWS)
            .map(|r| self.cells[r * self.stride + i].load(Relaxed))
            .fold(0u64, u64::wrapping_add)
    }

    pub fn spec(&self) -> &'static HistogramSpec {
        self.spec
    }

    /// Record one value, in the spec's raw unit.
    #[inline]
    pub fn record(&self, raw: i64) {
        self.record_in(shard(), raw);
    }

    /// Record one value into row `row`, which must be the calling thread's
    /// ([`shard`]).
    #[inline(always)]
    pub(crate) fn record_in(&self, row: usize, raw: i64) {
        let i = self.bucket(raw);
        let base = row * self.stride;
        bump(&self.cells[base + i], row, 1);
        bump(&self.cells[base + self.spec.buckets()], row, raw as u64);
    }

    /// [`HistogramSpec::bucket_index`] through the table or over the
    /// pre-scaled edges.
    #[inline]
    fn bucket(&self, raw: i64) -> usize {
        if !self.table.is_empty() {
            // Values past the table are past the last edge too.
            let i = raw.clamp(0, TABLE_MAX) as usize;
            return self.table[i] as usize;
        }
        edges_below(self.raw_edges.len(), raw, |i| self.raw_edges[i])
    }

    fn table(spec: &HistogramSpec) -> Box<[u8]> {
        let small = spec.scale == 1
            && spec.edges.first().is_some_and(|&e| e >= 0)
            && spec.edges.last().is_some_and(|&e| e < TABLE_MAX);
        if !small {
            return Box::new([]);
        }
        (0..=TABLE_MAX)
            .map(|v| spec.bucket_index(v) as u8)
            .collect()
    }

    /// Zero every bucket and the sum, as snapshots see them. The counters
    /// are not written (their owners update them without atomics); the
    /// current totals become the baseline that snapshots subtract. A value
    /// recorded while the reset runs may land on either side of it.
    pub fn reset(&self) {
        let mut baseline = self.baseline.lock();
        for (i, b) in baseline.iter_mut().enumerate() {
            *b = self.total(i);
        }
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let spec = self.spec;
        let baseline = self.baseline.lock();
        let since_reset = |i: usize| self.total(i).wrapping_sub(baseline[i]);
        let buckets: Vec<BucketSnapshot> = (0..spec.buckets())
            .map(|i| BucketSnapshot {
                le: spec.edges.get(i).copied(),
                label: spec.label(i),
                count: since_reset(i),
            })
            .collect();
        let raw_sum = since_reset(spec.buckets());
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
