//! The charts: bounded rings, day points averaged from hour points,
//! percentiles of histogram deltas, series that follow the registry.

use std::time::Duration;

use strata_api::stats::{HistogramSnapshot, Op};

use crate::charts::{
    average, histogram_delta, percentile, snapshot_delta, ChartPoint, Charts, Range, DAY_POINTS,
    HOUR_POINTS, PER_DAY_POINT,
};
use crate::{DiskStats, StatsRegistry};

/// An empty latency histogram with `counts` in its first buckets.
fn latency_with(counts: &[u64]) -> HistogramSnapshot {
    let mut h = DiskStats::new().snapshot().latency.read;
    for (b, &c) in h.buckets.iter_mut().zip(counts) {
        b.count = c;
    }
    h.count = counts.iter().sum();
    h
}

fn writes(stats: &DiskStats, n: u64) {
    for i in 0..n {
        stats.begin(Op::Write, i * 4096, 4096).finish(true);
    }
}

fn none(_: &str) -> Option<u64> {
    None
}

#[test]
fn percentiles_are_of_the_delta_not_of_the_total() {
    // Edges (µs): 1, 10, 100, 500, ...
    let before = latency_with(&[1000, 0, 0]);
    let after = latency_with(&[1000, 10, 90]);
    let d = histogram_delta(&after, &before);
    assert_eq!(d.count, 100);
    assert_eq!(percentile(&d, 0.5), Some(100));
    assert_eq!(percentile(&d, 0.05), Some(10));
    // Since the start, the same p50 would be 1 µs.
    assert_eq!(percentile(&after, 0.5), Some(1));
    assert_eq!(percentile(&latency_with(&[]), 0.5), None);
    // Counts that went down (a reset) give nothing negative.
    assert_eq!(histogram_delta(&before, &after).buckets[1].count, 0);
}

#[test]
fn rings_are_bounded_and_day_points_average_thirty() {
    let reg = StatsRegistry::new();
    let stats = reg.get_or_create("d");
    let charts = Charts::new(Duration::from_secs(10));
    let samples = HOUR_POINTS + 2 * PER_DAY_POINT + 5;
    for i in 0..samples {
        writes(&stats, if i % 2 == 0 { 20 } else { 0 });
        charts.sample(&reg, 10.0, Some(i as u64), &none);
    }
    let hour = charts.points(Some("d"), Range::Hour).unwrap();
    assert_eq!(hour.len(), HOUR_POINTS);
    let day = charts.points(Some("d"), Range::Day).unwrap();
    assert_eq!(day.len(), samples / PER_DAY_POINT);
    // 20 writes every other 10 s: 1 write/s on average, 2 in half the points.
    assert!((day[1].write_iops - 1.0).abs() < 1e-9, "{:?}", day[1]);
    assert!(hour.iter().any(|p| (p.write_iops - 2.0).abs() < 1e-9));
    assert!((day[1].write_bps - 4096.0).abs() < 1e-6);
    let total = charts.points(None, Range::Hour).unwrap();
    assert_eq!(total.last().unwrap().used_bytes, Some(samples as u64 - 1));
    assert_eq!(charts.interval(Range::Day), Duration::from_secs(300));
    // A day's worth and more stays within its bound.
    let many = Charts::new(Duration::from_secs(10));
    for _ in 0..(DAY_POINTS + 3) * PER_DAY_POINT {
        many.sample(&reg, 10.0, None, &none);
    }
    assert_eq!(many.points(None, Range::Day).unwrap().len(), DAY_POINTS);
}

#[test]
fn averages_weigh_latency_by_commands() {
    let p = |iops: f64, p50: Option<u64>, used: Option<u64>| ChartPoint {
        read_iops: iops,
        read_p50_us: p50,
        used_bytes: used,
        ..ChartPoint::default()
    };
    let a = average(&[
        p(3.0, Some(100), Some(5)),
        p(1.0, Some(500), None),
        p(0.0, None, None),
    ]);
    assert!((a.read_iops - 4.0 / 3.0).abs() < 1e-9);
    assert_eq!(a.read_p50_us, Some(200));
    assert_eq!(a.write_p50_us, None);
    assert_eq!(a.used_bytes, Some(5));
}

#[test]
fn series_follow_the_registry() {
    let reg = StatsRegistry::new();
    let charts = Charts::new(Duration::from_secs(10));
    let stats = reg.get_or_create("vm");
    charts.sample(&reg, 10.0, None, &|n: &str| (n == "vm").then_some(4096));
    writes(&stats, 50);
    charts.sample(&reg, 10.0, None, &|n: &str| (n == "vm").then_some(8192));
    let pts = charts.points(Some("vm"), Range::Hour).unwrap();
    assert_eq!(pts.len(), 2);
    assert_eq!(pts[1].write_iops, 5.0);
    assert_eq!(pts[1].used_bytes, Some(8192));
    assert_eq!(charts.points(None, Range::Hour).unwrap()[1].write_iops, 5.0);
    // Renamed: the series goes with it.
    reg.rename(&|n: &str| (n == "vm").then(|| "web".to_string()));
    charts.sample(&reg, 10.0, None, &none);
    assert!(charts.points(Some("vm"), Range::Hour).is_none());
    assert_eq!(charts.points(Some("web"), Range::Hour).unwrap().len(), 3);
    // Removed, then made again under the name: a new, empty series.
    reg.remove_disk("web");
    charts.sample(&reg, 10.0, None, &none);
    assert!(charts.points(Some("web"), Range::Hour).is_none());
    let again = reg.get_or_create("web");
    writes(&again, 7);
    charts.sample(&reg, 10.0, None, &none);
    let pts = charts.points(Some("web"), Range::Hour).unwrap();
    assert_eq!(pts.len(), 1);
    assert_eq!(pts[0].write_iops, 0.0, "its first sample is its baseline");
}

#[test]
fn a_window_is_now_less_an_earlier_copy() {
    let reg = StatsRegistry::new();
    let charts = Charts::new(Duration::from_secs(10));
    let stats = reg.get_or_create("vm");
    writes(&stats, 30);
    charts.sample(&reg, 10.0, None, &none);
    writes(&stats, 12);
    let now = stats.snapshot();
    let w = charts.window("vm", &now, Duration::from_secs(300)).unwrap();
    assert_eq!(w.write.commands, 12);
    assert_eq!(w.latency.write.count, 12);
    assert_eq!(w.io_length.write.count, 12);
    assert_eq!(now.write.commands, 42);
    assert!(charts
        .window("other", &now, Duration::from_secs(300))
        .is_none());
    // After a reset, the statistics since it.
    stats.reset();
    writes(&stats, 2);
    let d = snapshot_delta(&stats.snapshot(), &now);
    assert_eq!(d.write.commands, 2);
}
