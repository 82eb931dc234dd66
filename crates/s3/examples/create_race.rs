//! Latency of create-only writes under contention: for each racer count,
//! `rounds` rounds in which that many threads create one fresh key at the
//! same instant (a barrier), as hosts racing to claim a disk do. Prints
//! one JSON object: per racer count, the winners' and the losers' latency
//! percentiles (ms), and any errors.
//!
//! `cargo run --release -p strata-s3 --features testing --example
//! create_race -- [ROUNDS] [RACERS...]`; with `AWS_ENDPOINT_URL` unset it
//! starts its own SeaweedFS (testing feature), else it uses that store and
//! `STRATA_RACE_URL` (default s3://strata-race/race).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::{Arc, Barrier};
use std::time::Instant;

use strata_s3::{Bytes, Put};

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    (sorted[i] * 10.0).round() / 10.0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(10);
    let racers: Vec<usize> = if args.len() > 1 {
        args[1..]
            .iter()
            .map(|s| s.parse().expect("racer count"))
            .collect()
    } else {
        vec![2, 8, 32]
    };
    let (_weed, store) =
        strata_s3::testing::example_store("STRATA_RACE_URL", "s3://strata-race/race");
    let mut report = Vec::new();
    for &n in &racers {
        let (mut won, mut lost, mut errors) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let key = format!("m/{n:03}-{round:04}-{:016x}", rand::random::<u64>());
            let gate = Arc::new(Barrier::new(n));
            let threads: Vec<_> = (0..n)
                .map(|i| {
                    let (s, key, gate) = (store.clone(), key.clone(), gate.clone());
                    std::thread::spawn(move || {
                        gate.wait();
                        let t = Instant::now();
                        let r = s.put_create(&key, Bytes::from(format!("racer {i}")));
                        (r, t.elapsed().as_secs_f64() * 1000.0)
                    })
                })
                .collect();
            let mut winners = 0;
            for t in threads {
                match t.join().unwrap() {
                    (Ok(Put::Created), ms) => {
                        winners += 1;
                        won.push(ms)
                    }
                    (Ok(Put::Exists), ms) => lost.push(ms),
                    (Err(e), ms) => errors.push(format!("{ms:.0} ms: {e}")),
                }
            }
            assert!(winners <= 1, "{winners} winners of {key}");
        }
        won.sort_by(f64::total_cmp);
        lost.sort_by(f64::total_cmp);
        let all: Vec<f64> = {
            let mut a = [won.clone(), lost.clone()].concat();
            a.sort_by(f64::total_cmp);
            a
        };
        report.push(format!(
            "{{\"racers\":{n},\"rounds\":{rounds},\"p50_ms\":{},\"p99_ms\":{},\"max_ms\":{},\
             \"winner_p50_ms\":{},\"winner_max_ms\":{},\"loser_p50_ms\":{},\"loser_p99_ms\":{},\"errors\":{}}}",
            pct(&all, 0.5),
            pct(&all, 0.99),
            pct(&all, 1.0),
            pct(&won, 0.5),
            pct(&won, 1.0),
            pct(&lost, 0.5),
            pct(&lost, 0.99),
            serde_json_list(&errors)
        ));
        eprintln!("{}", report.last().unwrap());
    }
    println!("[{}]", report.join(","));
}

fn serde_json_list(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("{:?}", s)).collect();
    format!("[{}]", items.join(","))
}
