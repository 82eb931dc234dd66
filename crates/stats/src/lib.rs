//! Per-disk I/O statistics in the style of VMware's vscsiStats, cheap
//! enough to leave on.
//!
//! # Design
//!
//! - [`DiskStats`] holds the counters and histograms of one disk (export).
//!   Every connection serving the disk wraps the disk's device in its own
//!   [`StatsDevice`], all sharing one `Arc<DiskStats>`, so the statistics
//!   are per disk, not per connection.
//! - [`StatsDevice`] is a [`strata_block::BlockDevice`] that forwards each
//!   call and records it: [`DiskStats::begin`] at arrival (outstanding
//!   count, interarrival time, length, seek distance), [`Command::finish`]
//!   at completion (latency, error). Latency is measured with
//!   [`std::time::Instant`] around the inner call. `size_bytes`,
//!   `read_only` and `preferred_block_bytes` are forwarded unrecorded.
//! - The hot path uses relaxed atomics only: no lock, no allocation. A
//!   [`Histogram`] keeps one row of bucket counters and a sum per thread
//!   (16 rows; a thread owns one for its life and updates it with a plain
//!   load and store, and threads beyond 15 share the last row with atomic
//!   adds). Readers add the rows up; a reset records the totals as a
//!   baseline that snapshots subtract, so it never writes a counter an
//!   owner is updating. The bucket is found by a branch-free lower-bound
//!   search over at most 33 edges. Time comes from the CPU's time-stamp
//!   counter through `quanta` (the monotonic clock where the TSC is not
//!   invariant). The only state every thread writes (in-flight count, last
//!   arrival, last end LBN) sits alone on a 128-byte block, updated back to
//!   back at arrival. A read or write costs about 60 ns on this project's
//!   machine (`cargo run --release -p strata-stats --example
//!   record_cost`). Derived figures cost nothing per I/O:
//!   a histogram's total count is the sum of its buckets, an op's command
//!   count is the count of its latency histogram, read and write bytes are
//!   the sums of their length histograms, and the combined ("all")
//!   histograms are added up when a snapshot is taken.
//! - Recording can be paused and resumed at run time
//!   ([`DiskStats::set_recording`], `strata stats --pause/--resume`, like
//!   vscsiStats' stop and start); paused, a [`StatsDevice`] loads one flag
//!   and forwards.
//! - [`StatsRegistry`] maps disk names to their `Arc<DiskStats>`; its lock
//!   is taken when a connection looks its disk up, never per I/O.
//! - [`DiskStats::snapshot`] copies everything into a [`StatsSnapshot`]
//!   (serde, for `--json`), which [`render_text`], [`render_prometheus`]
//!   and [`render_json`] turn into output.
//!
//! # What is recorded
//!
//! Commands are read, write, flush, unmap, write_zeroes and block_status
//! ([`Op`]). For each: commands completed, bytes (read, write, unmap,
//! write_zeroes: the requested length) and errors. Failed commands are
//! recorded like the others (length, seek, latency) and also counted as
//! errors.
//!
//! | histogram | kept for | value |
//! |---|---|---|
//! | I/O length | read, write, all (= read + write) | request length in bytes |
//! | seek distance | read, write, all (= read + write) | see below |
//! | latency | every op, all (= every command) | arrival to completion |
//! | outstanding I/Os | all commands | commands in progress at arrival, the arriving one included |
//! | interarrival time | all commands | time since the previous command arrived |
//!
//! Seek distance is `LBN(this) − (LBN(previous) + sectors(previous))` in
//! 512-byte sectors, so purely sequential I/O gives 0, re-reading the same
//! sector gives −1 and skipping one sector gives +1. "Previous" is the
//! previous read or write on the disk, over every connection; unmap,
//! write_zeroes, flush and block_status neither record a seek nor move the
//! position. The very first read or write after creation or a reset has no
//! previous command and records **no** seek: 1000 sequential writes give
//! 999 seeks of 0. The previous end is kept in one `AtomicU64` swapped by
//! each command, so every command is measured against exactly one
//! predecessor; with concurrent commands that predecessor is whichever
//! swapped just before, which may differ from the order the device serves
//! them. That race is accepted. Interarrival time has the same rules (first
//! command after a reset records none; a racing arrival with an earlier
//! timestamp counts as 0).
//!
//! # Bucket edges
//!
//! A bucket holds the values `v` with `previous edge < v ≤ edge`; the first
//! bucket holds everything `≤` its edge (negative seeks included), and a
//! final overflow bucket holds everything `>` the last edge.
//!
//! - I/O length, bytes ([`IO_LENGTH_EDGES`]): ≤512, ≤1024, ≤2048, ≤4095,
//!   ≤4096, ≤8191, ≤8192, ≤16383, ≤16384, ≤32768, ≤49152, ≤65535, ≤65536,
//!   ≤81920, ≤131072, ≤262144, ≤524288, >524288.
//! - Latency, µs ([`LATENCY_EDGES_US`]): ≤1, ≤10, ≤100, ≤500, ≤1000,
//!   ≤5000, ≤15000, ≤30000, ≤50000, ≤100000, >100000.
//! - Seek distance, sectors ([`SEEK_DISTANCE_EDGES`]): ≤−500000, ≤−100000,
//!   ≤−50000, ≤−10000, ≤−5000, ≤−1000, ≤−500, ≤−128, ≤−64, ≤−32, ≤−16, ≤−8,
//!   ≤−6, ≤−4, ≤−2, ≤−1, ≤0, ≤1, ≤2, ≤4, ≤6, ≤8, ≤16, ≤32, ≤64, ≤128, ≤500,
//!   ≤1000, ≤5000, ≤10000, ≤50000, ≤100000, ≤500000, >500000.
//! - Outstanding I/Os ([`OUTSTANDING_EDGES`]): ≤1, ≤2, ≤4, ≤8, ≤12, ≤16,
//!   ≤20, ≤24, ≤28, ≤32, ≤64, >64.
//! - Interarrival time, µs ([`INTERARRIVAL_EDGES_US`]): ≤1, ≤10, ≤100,
//!   ≤500, ≤1000, ≤5000, ≤15000, ≤30000, ≤50000, ≤100000, >100000.
//!
//! The two time histograms record nanoseconds against those microsecond
//! edges (≤1 µs means ≤1000 ns), so placement is exact and their sums are
//! kept to the nanosecond; a snapshot gives edges in µs and the sum in ns
//! (`sum_unit`, `sum_scale`). Sums are exact integers (wrapping after 2^64).
//!
//! # Consistency
//!
//! Each counter is read and written atomically; the set is not. A snapshot
//! under load may be off by the commands in progress, and
//! [`DiskStats::reset`] takes its baseline counter after counter, so a
//! command completing during a reset may be half counted. The in-flight level is
//! not reset, so commands running across a reset still balance.

mod device;
mod disk;
mod histogram;
mod registry;
mod render;
mod snapshot;

#[cfg(test)]
mod tests;

pub use device::StatsDevice;
pub use disk::{Command, DiskStats, Op, OP_COUNT};
pub use histogram::{
    BucketSnapshot, Histogram, HistogramSnapshot, HistogramSpec, INTERARRIVAL,
    INTERARRIVAL_EDGES_US, IO_LENGTH, IO_LENGTH_EDGES, LATENCY, LATENCY_EDGES_US, OUTSTANDING,
    OUTSTANDING_EDGES, SEEK_DISTANCE, SEEK_DISTANCE_EDGES,
};
pub use registry::StatsRegistry;
pub use render::{
    escape_label_value, render_json, render_prometheus, render_text, Gauge, BAR_WIDTH,
};
pub use snapshot::{LatencyHistograms, OpCounters, ReadWriteHistograms, StatsSnapshot};
