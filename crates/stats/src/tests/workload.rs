//! Known workloads through a StatsDevice give known statistics.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;

use strata_block::{BlockDevice, ErrorKind, ZeroOptions};

use super::{sequential_writes, stats_over_mem, MemDisk};
use crate::{DiskStats, HistogramSnapshot, Op, StatsDevice};

fn nonzero_buckets(h: &HistogramSnapshot) -> BTreeMap<String, u64> {
    h.buckets
        .iter()
        .filter(|b| b.count > 0)
        .map(|b| (b.label.clone(), b.count))
        .collect()
}

#[test]
fn sequential_4k_writes_fill_the_4096_bucket_and_seek_plus_1_after_the_first() {
    let (stats, dev) = stats_over_mem(8 << 20);
    sequential_writes(&dev);
    let s = stats.snapshot();

    assert_eq!(s.write.commands, 1000);
    assert_eq!(s.write.bytes, 4_096_000);
    assert_eq!(s.write.errors, 0);
    assert_eq!(s.read.commands, 0);
    assert_eq!(s.errors, 0);
    assert_eq!(s.in_flight, 0);

    let len = &s.io_length.write;
    assert_eq!(
        nonzero_buckets(len),
        BTreeMap::from([("<=4096".into(), 1000)])
    );
    assert_eq!(len.bucket_count(Some(4096)), Some(1000));
    assert_eq!(len.count, 1000);
    assert_eq!(len.sum, 4_096_000);
    assert_eq!(s.io_length.all, s.io_length.write);
    assert_eq!(s.io_length.read.count, 0);

    // The first write has no predecessor and records no seek; each later
    // one starts one LBN after the last LBN of the one before (vscsiStats:
    // "one LBN between successive commands").
    let seek = &s.seek_distance.write;
    assert_eq!(nonzero_buckets(seek), BTreeMap::from([("<=1".into(), 999)]));
    assert_eq!(seek.sum, 999);
    assert_eq!(s.seek_distance.all, s.seek_distance.write);
    // The closest of the last 16 is the previous write.
    assert_eq!(s.seek_distance_closest, s.seek_distance);

    assert_eq!(s.latency.write.count, 1000);
    assert_eq!(s.latency.all.count, 1000);
    assert_eq!(s.latency.read.count, 0);
    assert!(s.latency.write.sum > 0, "latency sum is kept in ns");

    // One connection, one command at a time.
    assert_eq!(
        nonzero_buckets(&s.outstanding.all),
        BTreeMap::from([("<=1".into(), 1000)])
    );
    assert_eq!(s.outstanding.all.sum, 1000);
    assert_eq!(s.outstanding.write, s.outstanding.all);
    assert_eq!(s.outstanding.read.count, 0);
    assert_eq!(s.interarrival.all.count, 999);
    assert_eq!(s.interarrival.write.count, 999);
    assert_eq!(s.interarrival.read.count, 0);
}

#[test]
fn descending_512b_reads_give_negative_seeks_in_the_right_buckets() {
    let (stats, dev) = stats_over_mem(16 << 20);
    // Each read is one sector (first LBN = last LBN) and starts `step`
    // sectors below the previous one, so its seek distance is -step; a
    // step of 0 reads the same sector again, distance 0.
    let steps_and_buckets: [(u64, &str); 6] = [
        (0, "<=0"),
        (1, "<=-1"),
        (6, "<=-6"),
        (8, "<=-8"),
        (200, "<=-128"),
        (1000, "<=-1000"),
    ];
    let mut sector = 32_000u64;
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let mut expected_sum = 0i128;
    let mut buf = [0u8; 512];
    dev.read_at(&mut buf, sector * 512).unwrap();
    for i in 0..99 {
        let (step, bucket) = steps_and_buckets[i % steps_and_buckets.len()];
        sector -= step;
        dev.read_at(&mut buf, sector * 512).unwrap();
        *expected.entry(bucket.to_string()).or_default() += 1;
        expected_sum -= step as i128;
    }
    let s = stats.snapshot();

    assert_eq!(s.read.commands, 100);
    assert_eq!(s.read.bytes, 100 * 512);
    assert_eq!(
        nonzero_buckets(&s.io_length.read),
        BTreeMap::from([("<=512".into(), 100)])
    );
    assert_eq!(expected["<=0"], 17);
    assert_eq!(expected["<=-1000"], 16);
    assert_eq!(nonzero_buckets(&s.seek_distance.read), expected);
    assert_eq!(s.seek_distance.read.count, 99);
    assert_eq!(s.seek_distance.read.sum, expected_sum);
    assert_eq!(s.seek_distance.write.count, 0);
    assert_eq!(s.seek_distance.all, s.seek_distance.read);
}

#[test]
fn connections_sharing_one_disk_continue_one_seek_chain() {
    let stats = Arc::new(DiskStats::new());
    let disk: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(1 << 20));
    let a = StatsDevice::new(Arc::clone(&disk), Arc::clone(&stats));
    let b = StatsDevice::new(Arc::clone(&disk), Arc::clone(&stats));

    a.write_at(&[1; 4096], 0, false).unwrap(); // sectors 0..=7, no seek
    b.write_at(&[2; 4096], 4096, false).unwrap(); // 8..=15: seek +1
    let mut buf = [0u8; 1024];
    a.read_at(&mut buf, 4096 + 4096 + 512).unwrap(); // 17..=18: seek +2
    b.read_at(&mut buf, 0).unwrap(); // 0..=1 after 18: seek -18

    let s = stats.snapshot();
    assert_eq!(s.write.commands, 2);
    assert_eq!(s.read.commands, 2);
    assert_eq!(
        nonzero_buckets(&s.seek_distance.write),
        BTreeMap::from([("<=1".into(), 1)])
    );
    assert_eq!(
        nonzero_buckets(&s.seek_distance.read),
        BTreeMap::from([("<=2".into(), 1), ("<=-16".into(), 1)])
    );
    assert_eq!(s.seek_distance.all.count, 3);
    assert_eq!(s.seek_distance.all.sum, -15);
    // The last read is closest to the first write's last LBN, 7: -7.
    assert_eq!(
        nonzero_buckets(&s.seek_distance_closest.read),
        BTreeMap::from([("<=2".into(), 1), ("<=-6".into(), 1)])
    );
    assert_eq!(s.interarrival.all.count, 3);
    // Per kind: the second write after the first, the second read after
    // the first.
    assert_eq!(s.interarrival.write.count, 1);
    assert_eq!(s.interarrival.read.count, 1);
    // The data went through to the shared disk.
    let mut check = [0u8; 4096];
    disk.read_at(&mut check, 4096).unwrap();
    assert_eq!(check, [2; 4096]);
}

#[test]
fn other_commands_are_counted_and_do_not_move_the_seek_position() {
    let (stats, dev) = stats_over_mem(1 << 20);
    dev.write_at(&[7; 4096], 0, true).unwrap(); // ends at sector 8
    dev.unmap(65536, 8192).unwrap();
    dev.write_zeroes(131072, 4096, ZeroOptions::default())
        .unwrap();
    dev.flush().unwrap();
    let extents = dev.block_status(0, 4096).unwrap();
    assert_eq!(extents.len(), 1);
    dev.write_at(&[7; 4096], 4096, false).unwrap(); // starts at 8: seek +1

    let s = stats.snapshot();
    assert_eq!(s.write.commands, 2);
    assert_eq!(s.write.bytes, 8192);
    assert_eq!(s.unmap.commands, 1);
    assert_eq!(s.unmap.bytes, 8192);
    assert_eq!(s.write_zeroes.commands, 1);
    assert_eq!(s.write_zeroes.bytes, 4096);
    assert_eq!(s.flush.commands, 1);
    assert_eq!(s.flush.bytes, 0);
    assert_eq!(s.block_status.commands, 1);
    assert_eq!(s.block_status.bytes, 0);
    assert_eq!(s.total_commands(), 6);
    assert_eq!(
        nonzero_buckets(&s.seek_distance.write),
        BTreeMap::from([("<=1".into(), 1)])
    );
    // Lengths are kept for reads and writes only.
    assert_eq!(s.io_length.all.count, 2);
    // Latency, outstanding and interarrival see every command.
    for op in Op::ALL {
        let expected = if op == Op::Write {
            2
        } else {
            u64::from(op != Op::Read)
        };
        assert_eq!(s.latency.get(op).count, expected, "{}", op.name());
        assert_eq!(s.counters(op).commands, expected, "{}", op.name());
    }
    assert_eq!(s.latency.all.count, 6);
    assert_eq!(s.outstanding.all.count, 6);
    assert_eq!(s.interarrival.all.count, 5);
    // Among writes: two arrivals, one interval.
    assert_eq!(s.outstanding.write.count, 2);
    assert_eq!(s.interarrival.write.count, 1);
}

#[test]
fn errors_are_counted_per_op_and_the_command_still_recorded() {
    let (stats, dev) = stats_over_mem(1 << 20);
    let mut buf = [0u8; 4096];
    let err = dev.read_at(&mut buf, 1 << 20).unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutOfRange);
    let fast = ZeroOptions {
        fast_only: true,
        ..ZeroOptions::default()
    };
    let err = dev.write_zeroes(0, 4096, fast).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unsupported);
    dev.read_at(&mut buf, 0).unwrap();

    let s = stats.snapshot();
    assert_eq!(s.read.commands, 2);
    assert_eq!(s.read.errors, 1);
    assert_eq!(s.read.bytes, 8192);
    assert_eq!(s.write_zeroes.commands, 1);
    assert_eq!(s.write_zeroes.errors, 1);
    assert_eq!(s.errors, 2);
    assert_eq!(s.io_length.read.count, 2);
}

#[test]
fn a_panicking_device_leaves_an_error_and_no_command_in_flight() {
    let stats = Arc::new(DiskStats::new());
    let dev = StatsDevice::new(
        Arc::new(MemDisk::new(4096).panicking_on_read()),
        Arc::clone(&stats),
    );
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut buf = [0u8; 512];
        dev.read_at(&mut buf, 0)
    }));
    assert!(result.is_err());
    let s = stats.snapshot();
    assert_eq!(s.read.commands, 1);
    assert_eq!(s.read.errors, 1);
    assert_eq!(s.in_flight, 0);
    assert_eq!(stats.in_flight(), 0);
}

#[test]
fn concurrent_commands_show_up_as_outstanding() {
    let stats = Arc::new(DiskStats::new());
    // Each read waits inside the device until both are in flight.
    let disk: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(1 << 20).with_read_barrier(2));
    let handles: Vec<_> = (0..2u64)
        .map(|i| {
            let dev = StatsDevice::new(Arc::clone(&disk), Arc::clone(&stats));
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                dev.read_at(&mut buf, i * 65536).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = stats.snapshot();
    assert_eq!(
        nonzero_buckets(&s.outstanding.all),
        BTreeMap::from([("<=1".into(), 1), ("<=2".into(), 1)])
    );
    assert_eq!(s.outstanding.all.sum, 3);
    assert_eq!(s.outstanding.read, s.outstanding.all);
    assert_eq!(s.read.commands, 2);
    assert_eq!(s.in_flight, 0);
    assert_eq!(s.seek_distance.read.count, 1);
}

#[test]
fn reset_zeroes_everything_and_forgets_the_previous_command() {
    let (stats, dev) = stats_over_mem(8 << 20);
    sequential_writes(&dev);
    let mut buf = [0u8; 4096];
    dev.read_at(&mut buf, 1 << 20).unwrap();
    dev.read_at(&mut buf, 8 << 20).unwrap_err();
    dev.unmap(0, 4096).unwrap();
    dev.write_zeroes(0, 4096, ZeroOptions::default()).unwrap();
    dev.flush().unwrap();
    dev.block_status(0, 4096).unwrap();
    assert!(stats.snapshot().total_commands() > 1000);

    stats.reset();
    let mut after = stats.snapshot();
    let mut fresh = DiskStats::new().snapshot();
    after.elapsed_ns = 0;
    fresh.elapsed_ns = 0;
    assert_eq!(after, fresh);
    assert_eq!(after.total_commands(), 0);
    assert_eq!(after.errors, 0);
    for h in [
        &after.latency.all,
        &after.io_length.all,
        &after.seek_distance.all,
        &after.seek_distance_closest.all,
        &after.outstanding.all,
        &after.interarrival.all,
    ] {
        assert_eq!(h.count, 0);
        assert_eq!(h.sum, 0);
        assert!(h.buckets.iter().all(|b| b.count == 0));
    }

    // The first command after a reset has no predecessor.
    dev.write_at(&buf, 4096, false).unwrap();
    let s = stats.snapshot();
    assert_eq!(s.write.commands, 1);
    assert_eq!(s.seek_distance.all.count, 0);
    assert_eq!(s.seek_distance_closest.all.count, 0);
    assert_eq!(s.interarrival.all.count, 0);
    assert_eq!(s.interarrival.write.count, 0);
}

#[test]
fn a_command_running_across_a_reset_still_balances_in_flight() {
    let stats = DiskStats::new();
    let command = stats.begin(Op::Read, 0, 4096);
    assert_eq!(stats.in_flight(), 1);
    stats.reset();
    assert_eq!(stats.in_flight(), 1);
    command.finish(true);
    assert_eq!(stats.in_flight(), 0);
    assert_eq!(stats.snapshot().read.commands, 1);
}

#[test]
fn the_wrapper_forwards_data_and_device_properties() {
    let (_stats, dev) = stats_over_mem(1 << 20);
    assert_eq!(dev.size_bytes(), 1 << 20);
    assert!(!dev.read_only());
    assert_eq!(dev.preferred_block_bytes(), 512);
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    dev.write_at(&data, 512 * 3, false).unwrap();
    let mut back = vec![0u8; 8192];
    dev.read_at(&mut back, 512 * 3).unwrap();
    assert_eq!(back, data);
    dev.unmap(512 * 3, 512).unwrap();
    dev.read_at(&mut back, 512 * 3).unwrap();
    assert!(back[..512].iter().all(|&b| b == 0));
    assert_eq!(back[512..], data[512..]);
}

#[test]
fn paused_statistics_forward_without_recording_and_resume_where_they_left_off() {
    let (stats, dev) = stats_over_mem(1 << 20);
    let buf = [7u8; 4096];
    dev.write_at(&buf, 0, false).unwrap();
    stats.set_recording(false);
    assert!(!stats.recording());
    // Paused: the commands still reach the device, and nothing is counted.
    dev.write_at(&buf, 65536, false).unwrap();
    let mut back = [0u8; 4096];
    dev.read_at(&mut back, 65536).unwrap();
    assert_eq!(back, buf);
    dev.flush().unwrap();
    let s = stats.snapshot();
    assert!(!s.recording);
    assert_eq!(s.total_commands(), 1);
    assert_eq!(s.in_flight, 0);

    stats.set_recording(true);
    dev.write_at(&buf, 4096, false).unwrap();
    let s = stats.snapshot();
    assert!(s.recording);
    assert_eq!(s.write.commands, 2);
    assert_eq!(s.read.commands, 0);
    assert_eq!(s.flush.commands, 0);
    // Measured against the last recorded write, whose last LBN was 7.
    assert_eq!(
        nonzero_buckets(&s.seek_distance.write),
        BTreeMap::from([("<=1".into(), 1)])
    );
    assert!(crate::render_text(&s).contains("in flight"));
}

#[test]
fn a_command_begun_before_a_pause_still_balances_in_flight() {
    let stats = DiskStats::new();
    let command = stats.begin(Op::Write, 0, 4096);
    stats.set_recording(false);
    command.finish(true);
    let s = stats.snapshot();
    assert_eq!(s.in_flight, 0);
    assert_eq!(s.write.commands, 1);
    assert!(crate::render_text(&s).contains("Recording is paused"));
}

#[test]
fn more_threads_than_rows_and_threads_that_come_and_go_lose_no_count() {
    // 40 live threads: 15 own a row each, the rest share the last one.
    let stats = Arc::new(DiskStats::new());
    let disk: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(1 << 20));
    let per_thread = 2000u64;
    let live: Vec<_> = (0..40u64)
        .map(|t| {
            let dev = StatsDevice::new(Arc::clone(&disk), Arc::clone(&stats));
            thread::spawn(move || {
                let mut buf = [0u8; 512];
                for i in 0..per_thread {
                    dev.read_at(&mut buf, ((t * per_thread + i) % 2048) * 512)
                        .unwrap();
                }
            })
        })
        .collect();
    for h in live {
        h.join().unwrap();
    }
    // Then 30 threads one after another: each takes a row a previous
    // thread gave back and goes on from its counts.
    for _ in 0..30 {
        let dev = StatsDevice::new(Arc::clone(&disk), Arc::clone(&stats));
        thread::spawn(move || {
            let buf = [1u8; 1024];
            for i in 0..100u64 {
                dev.write_at(&buf, i * 1024, false).unwrap();
            }
        })
        .join()
        .unwrap();
    }
    let s = stats.snapshot();
    assert_eq!(s.read.commands, 40 * per_thread);
    assert_eq!(s.read.bytes, 40 * per_thread * 512);
    assert_eq!(
        s.io_length.read.bucket_count(Some(512)),
        Some(40 * per_thread)
    );
    assert_eq!(s.write.commands, 3000);
    assert_eq!(s.io_length.write.bucket_count(Some(1024)), Some(3000));
    assert_eq!(s.io_length.write.sum, 3000 * 1024);
    assert_eq!(s.outstanding.all.count, 40 * per_thread + 3000);
    assert_eq!(s.outstanding.read.count, 40 * per_thread);
    assert_eq!(s.outstanding.write.count, 3000);
    assert_eq!(
        s.seek_distance_closest.all.count,
        40 * per_thread + 3000 - 1
    );
    assert_eq!(s.in_flight, 0);

    // A reset is a new baseline; counting goes on from zero.
    stats.reset();
    let dev = StatsDevice::new(Arc::clone(&disk), Arc::clone(&stats));
    dev.write_at(&[0u8; 4096], 0, false).unwrap();
    let s = stats.snapshot();
    assert_eq!(s.write.commands, 1);
    assert_eq!(s.io_length.write.sum, 4096);
    assert_eq!(s.read.commands, 0);
    assert_eq!(s.outstanding.all.count, 1);
}

#[test]
fn outstanding_reads_and_writes_are_counted_among_their_own_kind() {
    let stats = DiskStats::new();
    let r1 = stats.begin(Op::Read, 0, 4096);
    let w1 = stats.begin(Op::Write, 4096, 4096);
    let f = stats.begin(Op::Flush, 0, 0);
    let r2 = stats.begin(Op::Read, 8192, 4096);
    assert_eq!(stats.in_flight(), 4);
    let w2 = stats.begin(Op::Write, 0, 512);
    for c in [r1, w1, f, r2, w2] {
        c.finish(true);
    }
    assert_eq!(stats.in_flight(), 0);
    let s = stats.snapshot();
    // At arrival, the arriving one included: all 1, 2, 3, 4, 5; reads 1,
    // 2; writes 1, 2.
    assert_eq!(s.outstanding.all.sum, 15);
    assert_eq!(
        nonzero_buckets(&s.outstanding.read),
        BTreeMap::from([("<=1".into(), 1), ("<=2".into(), 1)])
    );
    assert_eq!(s.outstanding.write, s.outstanding.read);
    // Levels are balanced after completion: the next read is alone again.
    stats.begin(Op::Read, 0, 512).finish(true);
    let s = stats.snapshot();
    assert_eq!(s.outstanding.read.bucket_count(Some(1)), Some(2));
    assert_eq!(s.outstanding.all.bucket_count(Some(1)), Some(2));
}

#[test]
fn closest_seek_looks_back_over_the_last_16_reads_and_writes_only() {
    let stats = DiskStats::new();
    let one = |op, sector: u64, sectors: u64| {
        stats.begin(op, sector * 512, sectors * 512).finish(true);
    };
    // Two interleaved sequential streams of 8-sector commands, far apart:
    // each command is far from the previous one, but one LBN after the
    // end of the one before the previous.
    for i in 0..10u64 {
        one(Op::Read, i * 8, 8);
        one(Op::Write, 1_000_000 + i * 8, 8);
    }
    let s = stats.snapshot();
    // Successive seeks alternate between about -10^6 and +10^6.
    assert_eq!(s.seek_distance.all.count, 19);
    assert_eq!(s.seek_distance.all.bucket_count(Some(1)), Some(0));
    // The closest: the first write has only the first read behind it;
    // every later command finds its own stream's previous command.
    assert_eq!(s.seek_distance_closest.read.bucket_count(Some(1)), Some(9));
    assert_eq!(s.seek_distance_closest.write.bucket_count(Some(1)), Some(9));
    assert_eq!(s.seek_distance_closest.write.bucket_count(None), Some(1));
    // Flushes, unmaps and block status neither enter the ring nor push a
    // read or write out of it.
    for _ in 0..40 {
        stats.begin(Op::Flush, 0, 0).finish(true);
        stats.begin(Op::Unmap, 5_000_000 * 512, 512).finish(true);
    }
    one(Op::Read, 80, 8);
    let s = stats.snapshot();
    assert_eq!(s.seek_distance_closest.read.bucket_count(Some(1)), Some(10));
    // 16 commands later, the sector 87 stream is out of reach.
    for i in 0..16u64 {
        one(Op::Write, 3_000_000 + i * 8, 8);
    }
    one(Op::Read, 88, 8);
    let s = stats.snapshot();
    assert_eq!(s.seek_distance_closest.read.bucket_count(Some(1)), Some(10));
    assert_eq!(
        s.seek_distance_closest.read.bucket_count(Some(-500000)),
        Some(1)
    );
    // Equal distances both ways: the forward one counts.
    let stats = DiskStats::new();
    stats.begin(Op::Read, 0, 512).finish(true); // last LBN 0
    stats.begin(Op::Read, 20 * 512, 512).finish(true); // last LBN 20
    stats.begin(Op::Read, 10 * 512, 512).finish(true); // +10 or -10
    let closest = stats.snapshot().seek_distance_closest.read;
    assert_eq!(closest.sum, 20 + 10);
}
