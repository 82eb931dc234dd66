//! Every bucket edge lands where specified.

use crate::{
    Histogram, HistogramSpec, INTERARRIVAL, INTERARRIVAL_EDGES_US, IO_LENGTH, IO_LENGTH_EDGES,
    LATENCY, LATENCY_EDGES_US, OUTSTANDING, OUTSTANDING_EDGES, SEEK_DISTANCE, SEEK_DISTANCE_EDGES,
};

/// The edges as the specification lists them, written out again so a typo
/// in the constants shows up.
#[test]
fn edge_constants_are_exactly_the_specified_lists() {
    assert_eq!(
        IO_LENGTH_EDGES,
        &[
            512, 1024, 2048, 4095, 4096, 8191, 8192, 16383, 16384, 32768, 49152, 65535, 65536,
            81920, 131072, 262144, 524288
        ]
    );
    assert_eq!(
        LATENCY_EDGES_US,
        &[1, 10, 100, 500, 1000, 5000, 15000, 30000, 50000, 100000]
    );
    assert_eq!(INTERARRIVAL_EDGES_US, LATENCY_EDGES_US);
    assert_eq!(
        SEEK_DISTANCE_EDGES,
        &[
            -500000, -100000, -50000, -10000, -5000, -1000, -500, -128, -64, -32, -16, -8, -6, -4,
            -2, -1, 0, 1, 2, 4, 6, 8, 16, 32, 64, 128, 500, 1000, 5000, 10000, 50000, 100000,
            500000
        ]
    );
    assert_eq!(OUTSTANDING_EDGES, &[1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64]);
}

/// For each edge: the edge itself goes into its bucket; edge + 1 (in the
/// edge unit, and one raw unit above for the time histograms) goes into the
/// next, the overflow bucket after the last edge.
fn assert_edges_land(spec: &'static HistogramSpec) {
    for (i, &edge) in spec.edges.iter().enumerate() {
        let raw = edge * spec.scale;
        assert_eq!(spec.bucket_index(raw), i, "edge {edge} of {}", spec.unit);
        assert_eq!(
            spec.bucket_index(raw + 1),
            i + 1,
            "raw {raw}+1 of {}",
            spec.unit
        );
        assert_eq!(
            spec.bucket_index(raw + spec.scale),
            i + 1,
            "edge {edge}+1 of {}",
            spec.unit
        );
    }

    // The same through a Histogram and its snapshot: recording every edge
    // and every edge + 1 puts one value in the first bucket, two in each
    // middle one and one in the overflow bucket.
    let h = Histogram::new(spec);
    for &edge in spec.edges {
        h.record(edge * spec.scale);
        h.record((edge + 1) * spec.scale);
    }
    let snap = h.snapshot();
    assert_eq!(snap.buckets.len(), spec.edges.len() + 1);
    assert_eq!(snap.count, 2 * spec.edges.len() as u64);
    for (i, b) in snap.buckets.iter().enumerate() {
        let expected = if i == 0 || i == spec.edges.len() {
            1
        } else {
            2
        };
        assert_eq!(b.count, expected, "bucket {} of {}", b.label, spec.unit);
        assert_eq!(b.le, spec.edges.get(i).copied());
    }
    let expected_sum: i128 = spec
        .edges
        .iter()
        .map(|&e| (2 * e + 1) as i128 * spec.scale as i128)
        .sum();
    assert_eq!(snap.sum, expected_sum);
}

#[test]
fn io_length_edges_hold_the_edge_and_pass_edge_plus_one_on() {
    assert_edges_land(&IO_LENGTH);
    assert_eq!(IO_LENGTH.bucket_index(0), 0);
    assert_eq!(IO_LENGTH.bucket_index(4095), 3);
    assert_eq!(IO_LENGTH.bucket_index(4096), 4);
    assert_eq!(IO_LENGTH.bucket_index(524289), 17);
    assert_eq!(IO_LENGTH.bucket_index(i64::MAX), 17);
}

#[test]
fn latency_edges_hold_the_edge_and_pass_edge_plus_one_on() {
    assert_edges_land(&LATENCY);
    // Nanoseconds against microsecond edges.
    assert_eq!(LATENCY.bucket_index(0), 0);
    assert_eq!(LATENCY.bucket_index(1000), 0);
    assert_eq!(LATENCY.bucket_index(1001), 1);
    assert_eq!(LATENCY.bucket_index(100_000_000), 9);
    assert_eq!(LATENCY.bucket_index(100_000_001), 10);
}

#[test]
fn interarrival_edges_hold_the_edge_and_pass_edge_plus_one_on() {
    assert_edges_land(&INTERARRIVAL);
}

#[test]
fn outstanding_edges_hold_the_edge_and_pass_edge_plus_one_on() {
    assert_edges_land(&OUTSTANDING);
    assert_eq!(OUTSTANDING.bucket_index(3), 2);
    assert_eq!(OUTSTANDING.bucket_index(65), 11);
}

#[test]
fn small_count_histograms_place_every_value_as_the_edge_search_does() {
    // Outstanding I/Os go through a lookup table up to 128; the rest,
    // negatives and huge values included, must land as the search says.
    let values = (-3..=300).chain([i64::MIN, -1 << 40, 1 << 40, i64::MAX]);
    for v in values {
        let h = Histogram::new(&OUTSTANDING);
        h.record(v);
        let at = h.snapshot().buckets.iter().position(|b| b.count == 1);
        assert_eq!(at, Some(OUTSTANDING.bucket_index(v)), "value {v}");
    }
}

#[test]
fn seek_edges_hold_the_edge_and_pass_edge_plus_one_on_negative_ones_too() {
    assert_edges_land(&SEEK_DISTANCE);
    let bucket_of = |v: i64| SEEK_DISTANCE.label(SEEK_DISTANCE.bucket_index(v));
    assert_eq!(bucket_of(i64::MIN), "<=-500000");
    assert_eq!(bucket_of(-500_000), "<=-500000");
    assert_eq!(bucket_of(-499_999), "<=-100000");
    assert_eq!(bucket_of(-129), "<=-128");
    assert_eq!(bucket_of(-128), "<=-128");
    assert_eq!(bucket_of(-127), "<=-64");
    assert_eq!(bucket_of(-2), "<=-2");
    assert_eq!(bucket_of(-1), "<=-1");
    assert_eq!(bucket_of(0), "<=0");
    assert_eq!(bucket_of(1), "<=1");
    assert_eq!(bucket_of(3), "<=4");
    assert_eq!(bucket_of(500_000), "<=500000");
    assert_eq!(bucket_of(500_001), ">500000");
    assert_eq!(bucket_of(i64::MAX), ">500000");
}

/// The definition the seek edges are read with (vscsiStats): the first LBN
/// of a command minus the last LBN of the previous one. Sequential
/// commands of any length are one LBN apart.
#[test]
fn sequential_commands_of_any_length_land_in_the_plus_1_bucket() {
    for sectors in [1u64, 8, 16, 128, 2048] {
        let stats = crate::DiskStats::new();
        for i in 0..100u64 {
            let c = stats.begin(crate::Op::Read, i * sectors * 512, sectors * 512);
            c.finish(true);
        }
        let seek = stats.snapshot().seek_distance.read;
        assert_eq!(seek.bucket_count(Some(1)), Some(99), "{sectors} sectors");
        assert_eq!(SEEK_DISTANCE.label(SEEK_DISTANCE.bucket_index(1)), "<=1");
    }
}

#[test]
fn labels_name_the_edge_or_the_overflow() {
    let len = Histogram::new(&IO_LENGTH).snapshot();
    assert_eq!(len.buckets[0].label, "<=512");
    assert_eq!(len.buckets[4].label, "<=4096");
    assert_eq!(len.buckets[17].label, ">524288");
    assert_eq!(len.buckets[17].le, None);
    let seek = Histogram::new(&SEEK_DISTANCE).snapshot();
    assert_eq!(seek.buckets[0].label, "<=-500000");
    assert_eq!(seek.buckets[33].label, ">500000");
    let lat = Histogram::new(&LATENCY).snapshot();
    assert_eq!(lat.unit, "microseconds");
    assert_eq!(lat.sum_unit, "nanoseconds");
    assert_eq!(lat.sum_scale, 1000);
    assert_eq!(lat.buckets[0].le, Some(1));
}

#[test]
fn negative_seek_sums_are_kept_signed() {
    let h = Histogram::new(&SEEK_DISTANCE);
    h.record(-10);
    h.record(-5);
    h.record(3);
    let s = h.snapshot();
    assert_eq!(s.sum, -12);
    assert_eq!(s.count, 3);
    assert_eq!(s.mean(), Some(-4.0));
}

#[test]
fn threads_beyond_the_owned_rows_share_one_without_losing_updates() {
    // Far more threads than rows, all recording at once: most of them share
    // the last row, where only atomic adds keep every update.
    let h = std::sync::Arc::new(Histogram::new(&IO_LENGTH));
    let threads = 48u64;
    let each = 50_000u64;
    let start = std::sync::Arc::new(std::sync::Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (h, start) = (h.clone(), start.clone());
            std::thread::spawn(move || {
                // Claim a row (or the shared one) before anyone finishes
                // and gives one back.
                h.record(4096);
                start.wait();
                for _ in 1..each {
                    h.record(4096);
                }
            })
        })
        .collect();
    for t in handles {
        t.join().unwrap();
    }
    let s = h.snapshot();
    assert_eq!(s.bucket_count(Some(4096)), Some(threads * each));
    assert_eq!(s.sum, (threads * each * 4096) as i128);
}
