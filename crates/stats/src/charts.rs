//! Performance over time, in bounded memory: every interval (10 s; see
//! [`interval_from_env`]) a [`Sampler`] thread takes each export's
//! counters and read/write latency histograms, subtracts the previous
//! ones, and keeps one [`ChartPoint`] per export and one for all of them
//! together (the datastore): the last hour at the interval
//! ([`HOUR_POINTS`]) and the last day at 30 intervals (5 min,
//! [`DAY_POINTS`], each the average of its 30 points). A latency
//! percentile is the upper edge of the bucket it falls in among the
//! interval's commands (as the dashboard's live figures), so it is of the
//! interval alone, not since the server started.
//!
//! Every minute (6 intervals) a copy of each export's whole statistics is
//! kept too, the last 6 of them: [`Charts::window`] subtracts the one
//! nearest the asked age from the statistics now, for histograms over the
//! last 5 minutes.
//!
//! An export whose statistics leave the registry (a removed disk) loses
//! its series at the next sample; one renamed keeps it under its new name.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;
use strata_api::stats::{
    ArrivalHistograms, HistogramSnapshot, LatencyHistograms, OpCounters, ReadWriteHistograms,
    StatsSnapshot,
};

use crate::disk::DiskStats;
use crate::registry::StatsRegistry;

/// Points of the hour's series (10 s each).
pub const HOUR_POINTS: usize = 360;
/// Points of the day's series (5 min each).
pub const DAY_POINTS: usize = 288;
/// Hour points averaged into one day point.
pub const PER_DAY_POINT: usize = 30;
/// Intervals between two kept copies of the whole statistics.
pub const BASELINE_EVERY: u64 = 6;
/// Copies kept (the oldest 5 to 6 minutes old).
pub const BASELINES: usize = 6;
/// The default interval between samples.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// The environment variable that shortens the interval, in milliseconds
/// (for tests: a chart gets points in seconds).
pub const INTERVAL_ENV: &str = "STRATA_CHART_INTERVAL_MS";

/// The interval: [`INTERVAL_ENV`] when set to a number of milliseconds
/// (at least 50), else [`DEFAULT_INTERVAL`].
pub fn interval_from_env() -> Duration {
    std::env::var(INTERVAL_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_INTERVAL, |ms| Duration::from_millis(ms.max(50)))
}

/// One point of a chart: rates over its interval, latency percentiles of
/// the commands completed in it (None: there were none), and space.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChartPoint {
    /// End of the interval, Unix seconds.
    pub t_unix: u64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bps: f64,
    pub write_bps: f64,
    pub read_p50_us: Option<u64>,
    pub read_p99_us: Option<u64>,
    pub write_p50_us: Option<u64>,
    pub write_p99_us: Option<u64>,
    /// The datastore's used bytes, or a disk's allocated bytes, where known
    /// without I/O.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
}

/// Which series of a chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// The last hour, one point per interval.
    Hour,
    /// The last day, one point per [`PER_DAY_POINT`] intervals.
    Day,
}

impl Range {
    pub fn parse(s: &str) -> Option<Range> {
        match s {
            "hour" => Some(Range::Hour),
            "day" => Some(Range::Day),
            _ => None,
        }
    }
}

/// The histogram bucket edge (µs) at or under which a fraction `q` of
/// `h`'s values lie; the last edge for the overflow bucket; None when
/// empty.
pub fn percentile(h: &HistogramSnapshot, q: f64) -> Option<u64> {
    if h.count == 0 {
        return None;
    }
    let want = (q * h.count as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    let mut last_edge = 0;
    for b in &h.buckets {
        if let Some(le) = b.le {
            last_edge = le;
        }
        seen += b.count;
        if seen >= want {
            return Some(b.le.unwrap_or(last_edge).max(0) as u64);
        }
    }
    Some(last_edge.max(0) as u64)
}

/// `now − then`, bucket by bucket (counts that went down, after a reset,
/// give 0).
pub fn histogram_delta(now: &HistogramSnapshot, then: &HistogramSnapshot) -> HistogramSnapshot {
    let mut d = now.clone();
    if now.buckets.len() != then.buckets.len() {
        return d;
    }
    for (b, t) in d.buckets.iter_mut().zip(&then.buckets) {
        b.count = b.count.saturating_sub(t.count);
    }
    d.count = d.buckets.iter().map(|b| b.count).sum();
    d.sum = now.sum.wrapping_sub(then.sum).max(0);
    d
}

fn counters_delta(now: &OpCounters, then: &OpCounters) -> OpCounters {
    OpCounters {
        commands: now.commands.saturating_sub(then.commands),
        bytes: now.bytes.saturating_sub(then.bytes),
        errors: now.errors.saturating_sub(then.errors),
    }
}

/// The statistics recorded between `then` and `now` (two snapshots of the
/// same disk); `now` itself when the disk was reset in between.
pub fn snapshot_delta(now: &StatsSnapshot, then: &StatsSnapshot) -> StatsSnapshot {
    if now.elapsed_ns < then.elapsed_ns {
        return now.clone();
    }
    let h = histogram_delta;
    let rw = |n: &ReadWriteHistograms, t: &ReadWriteHistograms| ReadWriteHistograms {
        read: h(&n.read, &t.read),
        write: h(&n.write, &t.write),
        all: h(&n.all, &t.all),
    };
    let arr = |n: &ArrivalHistograms, t: &ArrivalHistograms| ArrivalHistograms {
        read: h(&n.read, &t.read),
        write: h(&n.write, &t.write),
        all: h(&n.all, &t.all),
    };
    let (nl, tl) = (&now.latency, &then.latency);
    StatsSnapshot {
        elapsed_ns: now.elapsed_ns - then.elapsed_ns,
        recording: now.recording,
        in_flight: now.in_flight,
        read: counters_delta(&now.read, &then.read),
        write: counters_delta(&now.write, &then.write),
        flush: counters_delta(&now.flush, &then.flush),
        unmap: counters_delta(&now.unmap, &then.unmap),
        write_zeroes: counters_delta(&now.write_zeroes, &then.write_zeroes),
        block_status: counters_delta(&now.block_status, &then.block_status),
        errors: now.errors.saturating_sub(then.errors),
        io_length: rw(&now.io_length, &then.io_length),
        seek_distance: rw(&now.seek_distance, &then.seek_distance),
        seek_distance_closest: rw(&now.seek_distance_closest, &then.seek_distance_closest),
        latency: LatencyHistograms {
            read: h(&nl.read, &tl.read),
            write: h(&nl.write, &tl.write),
            flush: h(&nl.flush, &tl.flush),
            unmap: h(&nl.unmap, &tl.unmap),
            write_zeroes: h(&nl.write_zeroes, &tl.write_zeroes),
            block_status: h(&nl.block_status, &tl.block_status),
            all: h(&nl.all, &tl.all),
        },
        outstanding: arr(&now.outstanding, &then.outstanding),
        interarrival: arr(&now.interarrival, &then.interarrival),
    }
}

/// What one export did over one interval.
#[derive(Debug, Clone, Default)]
struct Delta {
    read: OpCounters,
    write: OpCounters,
    /// Read and write latency; None when nothing was recorded.
    latency: Option<[HistogramSnapshot; 2]>,
}

impl Delta {
    fn between(now: &StatsSnapshot, then: &StatsSnapshot) -> Delta {
        let reset = now.elapsed_ns < then.elapsed_ns;
        let pick = |n: &HistogramSnapshot, t: &HistogramSnapshot| {
            if reset {
                n.clone()
            } else {
                histogram_delta(n, t)
            }
        };
        let c = |n: &OpCounters, t: &OpCounters| {
            if reset {
                *n
            } else {
                counters_delta(n, t)
            }
        };
        Delta {
            read: c(&now.read, &then.read),
            write: c(&now.write, &then.write),
            latency: Some([
                pick(&now.latency.read, &then.latency.read),
                pick(&now.latency.write, &then.latency.write),
            ]),
        }
    }

    fn add(&mut self, o: &Delta) {
        for (mine, theirs) in [(&mut self.read, &o.read), (&mut self.write, &o.write)] {
            mine.commands += theirs.commands;
            mine.bytes += theirs.bytes;
            mine.errors += theirs.errors;
        }
        match (&mut self.latency, &o.latency) {
            (Some(m), Some(t)) => {
                m[0].absorb(&t[0]);
                m[1].absorb(&t[1]);
            }
            (None, Some(t)) => self.latency = Some(t.clone()),
            _ => {}
        }
    }

    fn point(&self, t_unix: u64, dt_s: f64, used_bytes: Option<u64>) -> ChartPoint {
        let per_s = |n: u64| if dt_s > 0.0 { n as f64 / dt_s } else { 0.0 };
        let lat = |i: usize, q: f64| self.latency.as_ref().and_then(|l| percentile(&l[i], q));
        ChartPoint {
            t_unix,
            read_iops: per_s(self.read.commands),
            write_iops: per_s(self.write.commands),
            read_bps: per_s(self.read.bytes),
            write_bps: per_s(self.write.bytes),
            read_p50_us: lat(0, 0.5),
            read_p99_us: lat(0, 0.99),
            write_p50_us: lat(1, 0.5),
            write_p99_us: lat(1, 0.99),
            used_bytes,
        }
    }
}

/// The average of `points` (a day point): rates averaged, latencies
/// weighted by their commands, the last space figure.
pub fn average(points: &[ChartPoint]) -> ChartPoint {
    let n = points.len().max(1) as f64;
    let mean = |f: fn(&ChartPoint) -> f64| points.iter().map(f).sum::<f64>() / n;
    let weighted = |lat: fn(&ChartPoint) -> Option<u64>, ops: fn(&ChartPoint) -> f64| {
        let (mut sum, mut weight) = (0.0, 0.0);
        for p in points {
            if let Some(v) = lat(p) {
                let w = ops(p).max(f64::MIN_POSITIVE);
                sum += v as f64 * w;
                weight += w;
            }
        }
        (weight > 0.0).then(|| (sum / weight).round() as u64)
    };
    ChartPoint {
        t_unix: points.last().map_or(0, |p| p.t_unix),
        read_iops: mean(|p| p.read_iops),
        write_iops: mean(|p| p.write_iops),
        read_bps: mean(|p| p.read_bps),
        write_bps: mean(|p| p.write_bps),
        read_p50_us: weighted(|p| p.read_p50_us, |p| p.read_iops),
        read_p99_us: weighted(|p| p.read_p99_us, |p| p.read_iops),
        write_p50_us: weighted(|p| p.write_p50_us, |p| p.write_iops),
        write_p99_us: weighted(|p| p.write_p99_us, |p| p.write_iops),
        used_bytes: points.iter().rev().find_map(|p| p.used_bytes),
    }
}

/// Push `v`, dropping the oldest beyond `cap`.
fn push_bounded<T>(ring: &mut VecDeque<T>, v: T, cap: usize) {
    if ring.len() == cap {
        ring.pop_front();
    }
    ring.push_back(v);
}

/// The two series of one export (or of the datastore).
#[derive(Debug, Default)]
struct Series {
    hour: VecDeque<ChartPoint>,
    day: VecDeque<ChartPoint>,
    /// Hour points not yet averaged into a day point.
    pending: Vec<ChartPoint>,
}

impl Series {
    fn push(&mut self, p: ChartPoint) {
        self.pending.push(p.clone());
        if self.pending.len() == PER_DAY_POINT {
            push_bounded(&mut self.day, average(&self.pending), DAY_POINTS);
            self.pending.clear();
        }
        push_bounded(&mut self.hour, p, HOUR_POINTS);
    }

    fn points(&self, range: Range) -> Vec<ChartPoint> {
        match range {
            Range::Hour => self.hour.iter().cloned().collect(),
            Range::Day => self.day.iter().cloned().collect(),
        }
    }
}

/// What is kept of one export.
#[derive(Debug)]
struct Export {
    /// Whose statistics these are (a disk removed and made again under the
    /// same name has new ones, and starts a new series).
    stats: Weak<DiskStats>,
    /// The statistics at the previous sample.
    previous: StatsSnapshot,
    series: Series,
    /// Copies of the whole statistics, every [`BASELINE_EVERY`] samples.
    baselines: VecDeque<(Instant, StatsSnapshot)>,
}

#[derive(Debug, Default)]
struct State {
    exports: BTreeMap<String, Export>,
    total: Series,
    samples: u64,
}

/// The charts of a server's exports and datastore.
#[derive(Debug)]
pub struct Charts {
    interval: Duration,
    state: Mutex<State>,
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Charts {
    pub fn new(interval: Duration) -> Charts {
        Charts {
            interval,
            state: Mutex::new(State::default()),
        }
    }

    /// The time between two points of `range`.
    pub fn interval(&self, range: Range) -> Duration {
        match range {
            Range::Hour => self.interval,
            Range::Day => self.interval * PER_DAY_POINT as u32,
        }
    }

    /// Take one sample of every export in `registry`, `dt_s` seconds after
    /// the last; `used` is the datastore's used bytes, `stored` an
    /// export's allocated bytes (each where known cheaply).
    pub fn sample(
        &self,
        registry: &StatsRegistry,
        dt_s: f64,
        used: Option<u64>,
        stored: &dyn Fn(&str) -> Option<u64>,
    ) {
        let t = now_unix();
        let now = Instant::now();
        let entries = registry.entries();
        let mut st = self.state.lock();
        let st = &mut *st;
        let mut old = std::mem::take(&mut st.exports);
        let keep_baseline = st.samples.is_multiple_of(BASELINE_EVERY);
        st.samples += 1;
        let mut total = Delta::default();
        for (name, stats) in entries {
            let snap = stats.snapshot();
            let mut e = take_export(&mut old, &name, &stats, &snap);
            let d = Delta::between(&snap, &e.previous);
            total.add(&d);
            e.series.push(d.point(t, dt_s, stored(&name)));
            if keep_baseline {
                push_bounded(&mut e.baselines, (now, snap.clone()), BASELINES);
            }
            e.previous = snap;
            st.exports.insert(name, e);
        }
        st.total.push(total.point(t, dt_s, used));
    }

    /// The points of `export` (None: the datastore), oldest first; None
    /// when the export has no series.
    pub fn points(&self, export: Option<&str>, range: Range) -> Option<Vec<ChartPoint>> {
        let st = self.state.lock();
        match export {
            None => Some(st.total.points(range)),
            Some(e) => st.exports.get(e).map(|x| x.series.points(range)),
        }
    }

    /// `export`'s statistics over about the last `window`: now less the
    /// kept copy whose age is nearest `window` (`elapsed_ns` says the span
    /// it covers). None when the export has no series yet.
    pub fn window(
        &self,
        export: &str,
        now: &StatsSnapshot,
        window: Duration,
    ) -> Option<StatsSnapshot> {
        let st = self.state.lock();
        let e = st.exports.get(export)?;
        let at = Instant::now();
        let (_, base) = e.baselines.iter().min_by_key(|(t, _)| {
            let age = at.saturating_duration_since(*t);
            age.abs_diff(window)
        })?;
        Some(snapshot_delta(now, base))
    }
}

/// The export kept under `name` for `stats`: the old one, or one renamed
/// (the same statistics under another name), or a new one whose previous
/// sample is `snap` (its first point is empty).
fn take_export(
    old: &mut BTreeMap<String, Export>,
    name: &str,
    stats: &Arc<DiskStats>,
    snap: &StatsSnapshot,
) -> Export {
    let mine = |e: &Export| std::ptr::eq(e.stats.as_ptr(), Arc::as_ptr(stats));
    if let Some(e) = old.remove(name) {
        if mine(&e) {
            return e;
        }
    }
    let renamed = old.iter().find(|(_, e)| mine(e)).map(|(n, _)| n.clone());
    if let Some(e) = renamed.and_then(|n| old.remove(&n)) {
        return e;
    }
    Export {
        stats: Arc::downgrade(stats),
        previous: snap.clone(),
        series: Series::default(),
        baselines: VecDeque::new(),
    }
}

/// The thread that samples every interval until stopped (or dropped).
pub struct Sampler {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the sampler asks of the datastore: its used bytes, an export's
/// allocated bytes.
pub struct Space {
    pub used: Box<dyn Fn() -> Option<u64> + Send>,
    pub stored: StoredFn,
}

/// An export's allocated bytes, where known cheaply.
pub type StoredFn = Box<dyn Fn(&str) -> Option<u64> + Send>;

impl Sampler {
    /// Sample `registry` into `charts` every interval.
    pub fn start(
        charts: Arc<Charts>,
        registry: Arc<StatsRegistry>,
        space: Space,
    ) -> std::io::Result<Sampler> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("charts".into())
            .spawn(move || {
                let mut last = Instant::now();
                loop {
                    {
                        let mut stopped = flag.0.lock();
                        if !*stopped {
                            flag.1.wait_for(&mut stopped, charts.interval);
                        }
                        if *stopped {
                            return;
                        }
                    }
                    let now = Instant::now();
                    let dt = now.duration_since(last).as_secs_f64();
                    last = now;
                    charts.sample(&registry, dt, (space.used)(), &*space.stored);
                }
            })?;
        Ok(Sampler {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").finish_non_exhaustive()
    }
}
