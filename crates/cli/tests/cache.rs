//! `serve --cache none`: the pool is read and written with O_DIRECT. Real
//! clients (qemu-img, qemu-io over NBD) write aligned and unaligned data,
//! read it back, and find it again after a kill -9 of a server that had
//! flushed; the pool's pages stay out of the host page cache, as they do not
//! under `--cache writeback`.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

use std::path::Path;

fn random_file(path: &Path, len: usize, seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut data = vec![0u8; len];
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(path, data).unwrap();
}

#[test]
fn cache_none_serves_real_clients_keeps_flushed_writes_and_bypasses_the_page_cache() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let s = Store::new();
    let e = s.fails(&["serve", "--nbd-unix", "/nonexistent/x", "--cache", "direct"]);
    assert!(e.contains("expected none or writeback"), "{e}");

    s.ok(&["create", "d", "--size", "32M"]);
    let pool = s.path().join("pool.data");
    let reference = s.path().join("ref.raw");
    random_file(&reference, 32 << 20, 5);

    // Reads by I/O threads here; through io_uring (the default) below.
    let srv = s.serve_with(&["--cache", "none", "--aio", "threads"]);
    let st = s.json(&["status"]);
    assert_eq!(st["cache_mode"], "none", "{st}");
    assert!(s.ok(&["status"]).contains("cache:        none"));
    evict(&pool);
    // 32 MiB of random data, then sub-grain writes at odd sectors.
    load_then_change(
        &s,
        &reference,
        &[
            "write -P 0xab 512 1536",
            "write -P 0xcd 8191 2",
            "write -z 65536 4096",
        ],
    );
    let cmp = |what: &str| assert_same(&reference, &s.uri("d"), what);
    cmp("served with --cache none");
    // Writes and reads of 32 MiB left (almost) nothing in the page cache:
    // only what passes through the refcount file and logs, which are not
    // pool.data. Allow a few pages for anything else that maps it.
    let direct = resident_pages(&pool);
    assert!(
        direct <= 16,
        "{direct} pages of pool.data in the page cache under --cache none"
    );

    // The flush was acknowledged: a kill -9 loses none of it.
    srv.kill9();
    let srv = s.serve_with(&["--cache", "none"]);
    cmp("after kill -9 and restart with --cache none");
    srv.stop();

    // The same datastore under writeback: reads fill the page cache, which
    // is what the assertion above tells apart.
    evict(&pool);
    let srv = s.serve();
    cmp("served with --cache writeback");
    let cached = resident_pages(&pool);
    eprintln!("pool.data pages cached: --cache none {direct}, writeback {cached}");
    assert!(cached > 4096, "only {cached} pages cached under writeback");
    assert_eq!(s.json(&["status"])["cache_mode"], "writeback");
    srv.stop();
    s.ok(&["check"]);
}

/// Copy `reference` onto the served disk `d`, then make the same `changes`
/// (qemu-io commands, then a flush) to both.
fn load_then_change(s: &Store, reference: &Path, changes: &[&str]) {
    let reference = reference.to_str().unwrap();
    raw_copy(reference, &s.uri("d"));
    for target in [s.uri("d"), reference.to_string()] {
        let mut args = vec!["-f", "raw"];
        for c in changes {
            args.extend(["-c", c]);
        }
        args.extend(["-c", "flush", &target]);
        run_ok("qemu-io", &args);
    }
}

/// `uri` reads exactly as the file `reference` (`what` names the check).
fn assert_same(reference: &Path, uri: &str, what: &str) {
    let o = raw_compare(reference.to_str().unwrap(), uri);
    assert!(
        o.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// How many rings of kind `aio` process `pid` has: io_uring
/// descriptors, or mapped native AIO contexts.
fn rings(pid: i32, aio: &str) -> usize {
    if aio == "native" {
        return std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("[aio]"))
            .count();
    }
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter(|f| {
            f.as_ref().is_ok_and(|f| {
                std::fs::read_link(f.path())
                    .is_ok_and(|l| l.to_string_lossy() == "anon_inode:[io_uring]")
            })
        })
        .count()
}

#[test]
fn cache_none_reads_through_io_uring_by_default_return_the_data_and_let_snapshots_through() {
    reads_through_io_uring("none", "io_uring");
}

/// The same through a Linux native AIO context per connection (`--aio
/// native`), which refuses to run without `--cache none`.
#[test]
fn cache_none_reads_through_native_aio_return_the_data_and_let_snapshots_through() {
    let s = Store::new();
    let e = s.fails(&["serve", "--nbd-unix", "/nonexistent/x", "--aio", "native"]);
    assert!(e.contains("--aio native needs --cache none"), "{e}");
    reads_through_io_uring("none", "native");
}

#[test]
fn writeback_reads_through_io_uring_by_default_return_the_data_and_let_snapshots_through() {
    reads_through_io_uring("writeback", "io_uring");
}

/// NBD reads go through each connection's io_uring under either cache
/// mode (`--aio io_uring`, the default): from the direct descriptor under
/// `none`, through the page cache under `writeback`; or (`aio` native)
/// through its native AIO context.
fn reads_through_io_uring(cache: &str, aio: &str) {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let s = Store::new();
    let e = s.fails(&["serve", "--nbd-unix", "/nonexistent/x", "--aio", "posix"]);
    assert!(e.contains("expected io_uring, native or threads"), "{e}");

    s.ok(&["create", "d", "--size", "32M"]);
    let reference = s.path().join("ref.raw");
    random_file(&reference, 32 << 20, 9);
    let srv = s.serve_with(&["--cache", cache, "--aio", aio]);
    // Holes inside reads, and a sub-grain change: the plan fills the
    // holes, the ring reads the rest.
    load_then_change(
        &s,
        &reference,
        &[
            "write -z 1M 64k",
            "write -z 8M 4k",
            "write -P 0x5a 12583936 512",
        ],
    );
    // A connection that stays open has a ring of the kind asked for (the
    // reads above went through one, not through a worker each).
    let before = rings(srv.pid(), aio);
    let mut held = std::process::Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-r",
            "-c",
            "read -P 0 1M 64k",
            "-c",
            "sleep 4000",
            &s.uri("d"),
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut now = before;
    for _ in 0..50 {
        now = rings(srv.pid(), aio);
        if now > before {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        now > before,
        "no {aio} ring on an open connection ({before} before it, {now} with it)"
    );
    // Snapshots take the I/O gate exclusively while reads hold it from the
    // ring: both go on (the ring never waits for the gate while its own
    // reads hold it), and every read returns the disk's data.
    std::thread::scope(|scope| {
        let snapper = scope.spawn(|| {
            for i in 0..20 {
                let name = format!("s{i}");
                s.ok(&["snapshot", "create", "d", &name]);
                if i % 2 == 0 {
                    s.ok(&["snapshot", "delete", "d", &name]);
                }
            }
        });
        let mut round = 0;
        while round < 3 || !snapper.is_finished() {
            round += 1;
            assert_same(&reference, &s.uri("d"), &format!("round {round}"));
        }
    });
    assert_same(&reference, &s.uri("d@s19"), "snapshot s19");
    let _ = held.kill();
    let _ = held.wait();
    srv.stop();
    s.ok(&["check"]);
}

/// Under `--cache none` an overwrite of a grain the disk holds alone is
/// written through the connection's io_uring, holding the gate and the
/// range's stripes until it is in. Snapshots taken (and deleted) while a
/// client rewrites a region block by block must each hold one moment of
/// it: every block written before the snapshot holds the round then
/// being written, every block after it the round before, none a later
/// one (a write let through in place onto a grain the snapshot shares
/// would show one).
#[test]
fn cache_none_overwrites_through_io_uring_keep_each_snapshot_one_moment() {
    overwrites_keep_each_snapshot_one_moment("io_uring");
}

/// The same with the writes in a native AIO context (`--aio native`).
#[test]
fn cache_none_overwrites_through_native_aio_keep_each_snapshot_one_moment() {
    overwrites_keep_each_snapshot_one_moment("native");
}

fn overwrites_keep_each_snapshot_one_moment(aio: &str) {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    const BLOCKS: usize = 256;
    const FIRST: u8 = 100;
    let s = Store::new();
    s.ok(&["create", "d", "--size", "2M"]);
    let srv = s.serve_with(&["--cache", "none", "--aio", aio]);
    let uri = s.uri("d");
    let region = format!("{}", BLOCKS * 4096);
    run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            &format!("write -P {FIRST} 0 {region}"),
            &uri,
        ],
    );
    let round = |r: u8| {
        let cmds: Vec<String> = (0..BLOCKS)
            .map(|b| format!("write -P {r} {} 4096", b * 4096))
            .collect();
        // Writeback: qemu-io's default (writethrough) sends every write
        // with FUA, which a worker serves (write, then commit).
        let mut args = vec!["-f", "raw", "-t", "writeback"];
        for c in &cmds {
            args.extend(["-c", c]);
        }
        args.push(&uri);
        run_ok("qemu-io", &args);
    };
    // The round being written (0: none yet), and for each snapshot the
    // rounds in progress when it was asked for and when it returned.
    let current = std::sync::atomic::AtomicU8::new(0);
    let mut seen = Vec::new();
    let mut last = 0u8;
    std::thread::scope(|scope| {
        use std::sync::atomic::Ordering::SeqCst;
        let snapper = scope.spawn(|| {
            let mut seen = Vec::new();
            while current.load(SeqCst) == 0 {
                std::thread::yield_now();
            }
            for i in 0..16 {
                let name = format!("s{i}");
                let before = current.load(SeqCst);
                s.ok(&["snapshot", "create", "d", &name]);
                seen.push((i, before, current.load(SeqCst)));
                if i % 2 == 0 {
                    s.ok(&["snapshot", "delete", "d", &name]);
                }
            }
            seen
        });
        // Two more rounds once the snapshots are done: each rewrites every
        // block the snapshots share with the disk.
        let mut after = 0;
        while after < 2 {
            assert!(last < FIRST - 1, "the snapshots took too long");
            if snapper.is_finished() {
                after += 1;
            }
            last += 1;
            current.store(last, SeqCst);
            round(last);
        }
        seen = snapper.join().unwrap();
    });
    // Round r writes r to every block in order; before round 1 all are FIRST.
    let round_of = |v: u8| if v == FIRST { 0 } else { v };
    let out = s.path().join("snap.raw");
    for &(i, before, after) in seen.iter().filter(|(i, _, _)| i % 2 == 1) {
        std::fs::File::create(&out)
            .unwrap()
            .set_len(2 << 20)
            .unwrap();
        raw_copy(&s.uri(&format!("d@s{i}")), out.to_str().unwrap());
        let data = std::fs::read(&out).unwrap();
        let mut rounds = Vec::with_capacity(BLOCKS);
        for (b, block) in data[..BLOCKS * 4096].chunks(4096).enumerate() {
            assert!(
                block.iter().all(|&x| x == block[0]),
                "s{i}: block {b} holds parts of two writes"
            );
            rounds.push(round_of(block[0]));
        }
        let (hi, lo) = (rounds[0], rounds[BLOCKS - 1]);
        // Taken during round `before` or later, and by round `after`.
        assert!(
            rounds.windows(2).all(|w| w[0] >= w[1])
                && hi - lo <= 1
                && hi <= after
                && lo + 1 >= before,
            "s{i}, taken in rounds {before}..={after}, is no moment of the rewrite: {rounds:?}"
        );
        assert!(
            data[BLOCKS * 4096..].iter().all(|&x| x == 0),
            "s{i}: past the region"
        );
    }
    let want: Vec<u8> = std::iter::repeat_n(last, BLOCKS * 4096)
        .chain(std::iter::repeat_n(0, (2 << 20) - BLOCKS * 4096))
        .collect();
    std::fs::write(&out, want).unwrap();
    assert_same(&out, &uri, "the disk after the last round");
    srv.stop();
    s.ok(&["check"]);
}

/// A client that keeps far more requests in flight than a connection
/// takes (64 requests, 64 MiB), one thread sending them all while another
/// reads the replies. Over a plain socket the connection's own thread is
/// its ring's only reaper: while the budget is full it must answer the
/// ring's requests rather than wait for room only it can make. Every
/// write, then every read, is answered, with the data written.
#[test]
fn cache_none_ring_answers_a_client_far_past_the_in_flight_budget() {
    for aio in ["io_uring", "native"] {
        past_the_budget(aio);
    }
}

/// The data of block `i` of `past_the_budget`.
fn budget_block(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i as usize * 31 + j / 4096) as u8)
        .collect()
}

fn past_the_budget(aio: &str) {
    use common::nbd::{Pipelined, CMD_READ, CMD_WRITE};
    const N: u64 = 300;
    const LEN: usize = 256 << 10;
    let s = Store::new();
    s.ok(&["create", "d", "--size", "128M"]);
    let srv = s.serve_with(&["--cache", "none", "--aio", aio]);
    for cmd in [CMD_WRITE, CMD_READ] {
        let mut c = Pipelined::open(&s.sock(), "d").unwrap();
        let mut tx = c.try_clone().unwrap();
        // Not joined on failure: a server that stopped answering leaves
        // it blocked, and the replies below time out (60 s) instead.
        let sender = std::thread::spawn(move || {
            for i in 0..N {
                let data = if cmd == CMD_WRITE {
                    budget_block(i, LEN)
                } else {
                    Vec::new()
                };
                tx.send(cmd, i, i * LEN as u64, LEN as u32, &data).unwrap();
            }
        });
        let mut buf = vec![0u8; if cmd == CMD_READ { LEN } else { 0 }];
        let mut seen = vec![false; N as usize];
        for _ in 0..N {
            let r = c
                .reply(&mut buf)
                .unwrap_or_else(|e| panic!("{aio}, command {cmd}: no reply: {e}"));
            assert_eq!(
                r.error, 0,
                "{aio}: request {} of command {cmd} failed",
                r.handle
            );
            if cmd == CMD_READ {
                assert!(
                    buf == budget_block(r.handle, LEN),
                    "{aio}: read {} returned other data",
                    r.handle
                );
            }
            seen[r.handle as usize] = true;
        }
        assert!(seen.iter().all(|&x| x), "{aio}: a request went unanswered");
        sender.join().unwrap();
    }
    srv.stop();
    s.ok(&["check"]);
}
