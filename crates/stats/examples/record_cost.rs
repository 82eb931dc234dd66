//! What recording one command costs: `DiskStats::begin` + `Command::finish`
//! for 4 KiB reads at random offsets (so seek distances land in random
//! buckets), on 1 and 2 threads recording into the same disk at once.
//!
//! `cargo run --release -p strata-stats --example record_cost [-- --json]`;
//! bench's `stats` case (bench/strata_bench/cases/stats.py) runs it and sets the result against the
//! server's CPU time per I/O.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;
use std::time::Instant;

use strata_stats::{DiskStats, Op};

fn ns_per_command(threads: u64, commands: u64) -> f64 {
    let stats = Arc::new(DiskStats::new());
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let stats = stats.clone();
            s.spawn(move || {
                let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for _ in 0..commands {
                    // xorshift: a random 4 KiB-aligned offset below 4 GiB.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let command = stats.begin(Op::Read, (x & 0xffff_f000) % (4 << 30), 4096);
                    command.finish(true);
                }
            });
        }
    });
    let ns = started.elapsed().as_nanos() as f64 / commands as f64;
    assert_eq!(stats.snapshot().read.commands, threads * commands);
    ns
}

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let commands = 2_000_000;
    ns_per_command(1, commands / 4); // warm up, calibrate the clock
    let one = ns_per_command(1, commands);
    let two = ns_per_command(2, commands);
    if json {
        println!(
            "{{\"ns_per_command_1_thread\": {one:.1}, \"ns_per_command_2_threads\": {two:.1}}}"
        );
    } else {
        println!("1 thread:  {one:.1} ns per command");
        println!("2 threads: {two:.1} ns per command (each thread, both recording into one disk)");
    }
}
