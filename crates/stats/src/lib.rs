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
//!   search over at most 33 edges (a table lookup for outstanding I/Os).
//!   Time comes from the CPU's time-stamp counter through `quanta` (the
//!   monotonic clock where the TSC is not invariant). The only state every
//!   thread writes sits alone on two 128-byte blocks: one word packing the
//!   in-flight levels (all, reads, writes) and the position in the ring of
//!   recent ends, taken with one `fetch_add` at arrival; the last arrival
//!   (all, read, write) and last LBN; and the ring of the last 16 reads' and
//!   writes' last LBNs. A read or write costs about 60-110 ns on this
//!   project's (shared, busy) machine (`cargo run --release -p strata-stats
//!   --example record_cost`; docs/PERFORMANCE.md). Derived figures cost
//!   nothing per I/O:
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
//!   and [`render_json`] turn into output. The snapshot's types and [`Op`]
//!   are strata-api's (`strata_api::stats`: a `stats` answer carries
//!   them), re-exported here.
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
//! | seek distance | read, write, all (= read + write) | to the previous read or write, see below |
//! | closest seek distance | read, write, all (= read + write) | to the closest of the last 16 reads and writes |
//! | latency | every op, all (= every command) | arrival to completion |
//! | outstanding I/Os | read, write, all | in progress at arrival, the arriving one included: reads at a read, writes at a write, every command at any |
//! | interarrival time | read, write, all | since the previous arrival: of a read at a read, of a write at a write, of any command at any |
//!
//! For outstanding I/Os and interarrival time, `all` is a histogram of its
//! own (it counts flush, unmap, write_zeroes and block_status too), not the
//! sum of `read` and `write`, as in vscsiStats.
//!
//! Seek distance, as vscsiStats defines it: the first LBN of this command
//! minus the **last** LBN of the previous one, in 512-byte sectors
//! (`LBN(this) − (LBN(previous) + sectors(previous) − 1)`). Sequential
//! commands of any length give +1 (the `<=1` bucket: "one LBN between
//! successive commands"), re-reading the same 8-sector block gives −7, a
//! one-sector command repeated gives 0, and skipping one sector gives +2.
//! "Previous" is the previous read or write on the disk, over every
//! connection; unmap, write_zeroes, flush and block_status neither record a
//! seek nor move the position. The very first read or write after creation
//! or a reset has no previous command and records **no** seek: 1000
//! sequential writes give 999 seeks of +1.
//!
//! The closest seek distance (vscsiStats' `seekDistanceClosest`) is the same
//! difference taken to each of the last [`CLOSEST_OF`] (16) reads and
//! writes, keeping the one of smallest magnitude (of `+d` and `−d`, `+d`).
//! It shows locality that interleaved streams hide from the plain seek
//! distance: two sequential streams served alternately seek far each time,
//! yet each command is +1 from the closest.
//!
//! Races: the previous end and arrival times are plain load-then-store
//! trackers, and the ring of recent ends is read and then written, so two
//! commands arriving at the same instant may be measured against the same
//! predecessor, or miss each other in the ring. With concurrent commands
//! the order is whichever arrived first at the trackers, which may differ
//! from the order the device serves them. That is accepted. The first
//! command after a reset records no interarrival time (and the first read,
//! the first write, none among their kind); a racing arrival with an
//! earlier timestamp counts as 0.
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
//! - Seek distance (both), sectors ([`SEEK_DISTANCE_EDGES`]): ≤−500000, ≤−100000,
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
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

pub mod charts;
mod device;
mod disk;
mod histogram;
mod registry;
mod render;

#[cfg(test)]
mod tests;

pub use charts::{ChartPoint, Charts, Sampler};
pub use device::StatsDevice;
pub use disk::{Command, DiskStats, CLOSEST_OF};
pub use histogram::{
    Histogram, HistogramSpec, INTERARRIVAL, INTERARRIVAL_EDGES_US, IO_LENGTH, IO_LENGTH_EDGES,
    LATENCY, LATENCY_EDGES_US, OUTSTANDING, OUTSTANDING_EDGES, SEEK_DISTANCE, SEEK_DISTANCE_EDGES,
};
pub use registry::StatsRegistry;
pub use render::{
    escape_label_value, render_json, render_prometheus, render_text, Gauge, BAR_WIDTH,
};
pub use strata_api::stats::{
    ArrivalHistograms, BucketSnapshot, HistogramSnapshot, LatencyHistograms, Op, OpCounters,
    ReadWriteHistograms, StatsSnapshot, OP_COUNT,
};
