//! What the object store itself can do, measured the way strata uses it
//! (FORMAT.md §11, issue 27): the ceiling every object-store figure of the
//! `multihost` bench case is held against.
//!
//! Prints one JSON object:
//! - `put_mib_s`: plain PUTs of `SEGMENT` bytes (a segment), `DEPTH` in
//!   flight, for `SECONDS` seconds;
//! - `get_mib_s`: GETs of those objects, `DEPTH` in flight (what a cold
//!   start's background fetches can reach);
//! - `create_256k_ms` / `create_16k_ms`: latency percentiles of one
//!   create-only PUT of 256 KiB (a FLUSH of 64 random 4 KiB writes) and of
//!   16 KiB (a manifest), one at a time, each to a fresh key;
//! - `list_ms`: latency of a LIST of a prefix holding one object;
//! - `range_4k_qd16`: ranged GETs of 4 KiB at random offsets of those
//!   segments, 16 in flight (what a cache miss costs when a client keeps
//!   16 reads in flight, as the bench's fio does): per second, and each
//!   one's latency.
//!
//! `cargo run --release -p strata-s3 --features testing --example
//! store_ceiling -- [SECONDS] [DEPTH] [SEGMENT_MIB]`; with
//! `AWS_ENDPOINT_URL` unset it starts its own SeaweedFS, else it uses that
//! store and `STRATA_CEILING_URL` (default s3://strata-ceiling/c).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use strata_s3::{Bytes, Put};

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    (sorted[i] * 100.0).round() / 100.0
}

fn percentiles(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "{{\"n\":{},\"p50\":{},\"p90\":{},\"p99\":{},\"max\":{}}}",
        v.len(),
        pct(&v, 0.5),
        pct(&v, 0.9),
        pct(&v, 0.99),
        pct(&v, 1.0)
    )
}

fn body(len: usize) -> Bytes {
    // Not compressible, not all alike: a store that dedups or compresses
    // must not look faster than it is for segments.
    let mut v = vec![0u8; len];
    let mut x: u64 = rand::random::<u64>() | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    Bytes::from(v)
}

/// Run `op(i)` from `depth` threads until `seconds` pass; the number of
/// operations done and the time they took.
fn pipelined(depth: usize, seconds: f64, op: impl Fn(usize) + Sync) -> (usize, f64) {
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    let until = Duration::from_secs_f64(seconds);
    std::thread::scope(|s| {
        for _ in 0..depth {
            s.spawn(|| {
                while t0.elapsed() < until {
                    op(next.fetch_add(1, Ordering::Relaxed));
                }
            });
        }
    });
    (next.load(Ordering::Relaxed), t0.elapsed().as_secs_f64())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let depth: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let seg_mib: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let (_weed, store) =
        strata_s3::testing::example_store("STRATA_CEILING_URL", "s3://strata-ceiling/c");
    let run = format!("{:08x}", rand::random::<u32>());

    // Segment-sized PUTs, DEPTH in flight.
    let seg = body(seg_mib << 20);
    let (puts, put_s) = pipelined(depth, seconds, |i| {
        store
            .put(&format!("{run}/s/{i:08}"), seg.clone())
            .expect("segment PUT");
    });
    let put_mib_s = (puts * seg_mib) as f64 / put_s;

    // GETs of the objects just written, DEPTH in flight.
    let (gets, get_s) = pipelined(depth, seconds, |i| {
        let got = store.get(&format!("{run}/s/{:08}", i % puts)).expect("GET");
        assert_eq!(got.len(), seg.len());
    });
    let get_mib_s = (gets * seg_mib) as f64 / get_s;

    // One create-only PUT at a time.
    let creates = |len: usize, n: usize| {
        let b = body(len);
        let mut ms = Vec::with_capacity(n);
        for i in 0..n {
            let t = Instant::now();
            let r = store.put_create(&format!("{run}/m{len}/{i:016x}"), b.clone());
            assert!(matches!(r, Ok(Put::Created)), "create-only PUT: {r:?}");
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        ms
    };
    let n = ((seconds * 100.0) as usize).clamp(50, 1000);
    let c256 = creates(256 << 10, n);
    let c16 = creates(16 << 10, n);
    let mut list = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let l = store.list(
            &format!("{run}/m16384/"),
            Some(&format!("{run}/m16384/{:016x}", n - 2)),
        );
        assert_eq!(l.expect("LIST").len(), 1);
        list.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    // 4 KiB ranged GETs at random grain offsets, 16 in flight.
    let lat = std::sync::Mutex::new(Vec::new());
    let (ranges, range_s) = pipelined(16, seconds, |i| {
        let at = 4096 * (rand::random::<u64>() % ((seg_mib as u64) << 8));
        let t = Instant::now();
        let got = store
            .get_range(&format!("{run}/s/{:08}", i % puts), at..at + 4096)
            .expect("ranged GET");
        assert_eq!(got.len(), 4096);
        lat.lock().unwrap().push(t.elapsed().as_secs_f64() * 1000.0);
    });
    let range_iops = ranges as f64 / range_s;
    for i in 0..puts {
        let _ = store.delete(&format!("{run}/s/{i:08}"));
    }
    println!(
        "{{\"depth\":{depth},\"segment_mib\":{seg_mib},\"put_mib_s\":{:.1},\"get_mib_s\":{:.1},\
         \"create_256k_ms\":{},\"create_16k_ms\":{},\"list_ms\":{},\
         \"range_4k_qd16\":{{\"iops\":{:.0},\"ms\":{}}}}}",
        put_mib_s,
        get_mib_s,
        percentiles(c256),
        percentiles(c16),
        percentiles(list),
        range_iops,
        percentiles(lat.into_inner().unwrap())
    );
}
