//! A vhost-user-blk load generator for benchmarks: the test frontend
//! (tests/common) keeps `--iodepth` requests in flight on each of one or
//! more queues of any vhost-user-blk backend (strata's,
//! qemu-storage-daemon's) and prints one JSON line: operations, IOPS,
//! MiB/s. It waits for completions the way a guest does (the call
//! eventfds, EVENT_IDX asking for every completion), so the backend's
//! notification path is part of what is measured. One thread drives
//! every queue, as one vCPU would.
//!
//! vhost_bench SOCKET RW BS IODEPTH SECONDS [flush] [queues=N]
//!   RW: randread | randwrite | read | write
//!   IODEPTH: requests in flight per queue
//!   flush: end with a FLUSH, counted in the time and the rates (a
//!   durable figure, like fio's end_fsync)
//!   queues=N: drive N queues (default 1); the backend must offer them
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!(
            "usage: vhost_bench SOCKET randread|randwrite|read|write BS IODEPTH SECONDS [flush] [queues=N]"
        );
        std::process::exit(2);
    };
    if a.len() < 6 {
        usage();
    }
    let mut flush_at_end = false;
    let mut nq: u16 = 1;
    for extra in &a[6..] {
        match extra.as_str() {
            "flush" => flush_at_end = true,
            q if q.starts_with("queues=") => {
                nq = q["queues=".len()..].parse().unwrap_or_else(|_| usage());
            }
            _ => usage(),
        }
    }
    let sock = std::path::Path::new(&a[1]);
    let rw = a[2].as_str();
    let bs: u64 = a[3].parse().expect("BS in bytes");
    let depth: u16 = a[4].parse().expect("IODEPTH");
    let secs: f64 = a[5].parse().expect("SECONDS");
    let write = rw.ends_with("write");
    let random = rw.starts_with("rand");
    assert!(bs >= 512 && bs.is_multiple_of(512), "BS: a multiple of 512");
    assert!(
        depth >= 1 && u32::from(depth) * 3 <= u32::from(QSIZE),
        "IODEPTH: 1 to {}",
        QSIZE / 3
    );
    assert!(nq >= 1, "queues: at least 1");
    let slots = u64::from(depth) * u64::from(nq);
    assert!(
        DATA_BASE + 0x10000 + slots * bs <= MEM_BYTES as u64 && slots * 32 <= 0x10000,
        "BS x IODEPTH x queues too large"
    );

    let mut g = Guest::connect(sock, nq, 0);
    let cap = g.capacity_sectors() * 512;
    let blocks = cap / bs;
    assert!(blocks > 0, "disk smaller than one block");
    // Per slot (queue q, request s of it): header and status in the first
    // 64 KiB, data after.
    let slot = |q: usize, s: u16| q as u64 * u64::from(depth) + u64::from(s);
    let hdr = |q: usize, s: u16| DATA_BASE + slot(q, s) * 32;
    let st = |q: usize, s: u16| DATA_BASE + slot(q, s) * 32 + 16;
    let buf = |q: usize, s: u16| DATA_BASE + 0x10000 + slot(q, s) * bs;
    let queues: Vec<usize> = (0..nq as usize).collect();
    if write {
        for &q in &queues {
            for s in 0..depth {
                g.write(buf(q, s), &pattern(slot(q, s) * bs, bs as usize, 11));
            }
        }
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut seq = 0u64;
    let mut next_block = |seed: &mut u64| {
        if random {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed % blocks
        } else {
            let b = seq % blocks;
            seq += 1;
            b
        }
    };
    let ty = if write { T_OUT } else { T_IN };
    let data_flags = if write { 0 } else { F_WRITE };
    let mut submit = |g: &mut Guest, q: usize, s: u16, seed: &mut u64| {
        let sector = next_block(seed) * bs / 512;
        g.write(hdr(q, s), &header(ty, sector));
        let at = s * 3;
        g.submit_raw(
            q,
            at,
            &[
                (hdr(q, s), 16, F_NEXT, at + 1),
                (buf(q, s), bs as u32, data_flags | F_NEXT, at + 2),
                (st(q, s), 1, F_WRITE, 0),
            ],
            at,
        );
    };
    for &q in &queues {
        for s in 0..depth {
            submit(&mut g, q, s, &mut seed);
        }
    }
    let t0 = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    let mut ops = 0u64;
    let mut errors = 0u64;
    loop {
        let (q, (head, _)) = g.wait_used_any(&queues);
        let s = head / 3;
        if g.read(st(q, s), 1)[0] != 0 {
            errors += 1;
        }
        ops += 1;
        if t0.elapsed() >= limit {
            break;
        }
        submit(&mut g, q, s, &mut seed);
    }
    // Drain what is still in flight.
    for _ in 1..slots {
        let (q, (head, _)) = g.wait_used_any(&queues);
        if g.read(st(q, head / 3), 1)[0] != 0 {
            errors += 1;
        }
    }
    if flush_at_end {
        // Every write has completed: a FLUSH now makes them all durable.
        g.write(hdr(0, 0), &header(T_FLUSH, 0));
        g.submit_raw(
            0,
            0,
            &[(hdr(0, 0), 16, F_NEXT, 1), (st(0, 0), 1, F_WRITE, 0)],
            0,
        );
        let _ = g.wait_used(0);
        if g.read(st(0, 0), 1)[0] != 0 {
            errors += 1;
        }
    }
    let el = t0.elapsed().as_secs_f64();
    println!(
        "{{\"ops\": {ops}, \"seconds\": {el:.3}, \"iops\": {:.0}, \"mib_s\": {:.1}, \"errors\": {errors}, \"queues\": {nq}}}",
        ops as f64 / el,
        ops as f64 * bs as f64 / el / 1048576.0
    );
}
