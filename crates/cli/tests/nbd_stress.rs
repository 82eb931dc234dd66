//! Deep queues from clients nobody here wrote, in every cache and aio
//! mode, over every transport (Unix and TCP, plain and TLS): fio's NBD
//! engine submitting batches of 128, 256 and 1,024 reads and writes with
//! flushes (plain sockets: it takes no TLS), nbdcopy writing and reading
//! with 1,024 requests in flight, and a libnbd client (scripts/nbd_stress.py) that keeps up to
//! 1,024 reads, writes, flushes, trims, write-zeroes and block-status
//! queries of written and never-written data in flight and checks every
//! byte it reads. A connection that stops answering fails the run (the
//! script gives up after 20 s without a completion, fio is bounded by
//! [`run_within`]) with the server's thread stacks; then SIGTERM must
//! stop the server. Before issue 58's fix the default mode hung at 128.
//!
//! Each client runs `STRATA_STRESS_SECONDS` (default 1) per transport;
//! bench/soak.sh runs it for minutes.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::http::free_addr;
use common::tls::Ca;
use common::*;

use std::path::Path;
use std::time::Duration;

const SIZE_MIB: u64 = 64;
/// The libnbd client's queue depths, each for an equal share of its time.
const DEPTHS: &str = "1,8,64,65,128,256,1024";
/// fio's queue depths over the Unix socket (the other transports take
/// the deepest), each submitted as one batch.
const FIO_DEPTHS: [u32; 3] = [128, 256, 1024];

fn seconds() -> f64 {
    std::env::var("STRATA_STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

/// Debian's python3, which has libnbd's binding (nbdsh is its package's
/// command): a Python of one's own earlier on PATH would not.
const PYTHON: &str = "/usr/bin/python3";

fn have_all() -> bool {
    ["fio", "openssl", "nbdsh", "nbdcopy"]
        .iter()
        .all(|t| have(t))
}

/// How long one client run may take before it counts as hung: its time,
/// the script's own 20 s stall limit, and room for a slow machine.
fn limit() -> Duration {
    Duration::from_secs_f64(seconds() * 2.0 + 120.0)
}

fn fio(uri: &str, depth: u32) {
    let secs = format!("{}", (seconds() * 1000.0).max(200.0) as u64);
    let o = run_within(
        "fio",
        &[
            "--name=stress",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randrw",
            "--bs=4k",
            &format!("--iodepth={depth}"),
            &format!("--iodepth_batch_submit={depth}"),
            "--iodepth_batch_complete_min=1",
            "--fsync=64",
            &format!("--runtime={secs}ms"),
            "--time_based",
            "--output-format=terse",
        ],
        limit(),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "fio at depth {depth} on {uri}: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Terse v3: field 6 is the read KiB done, 47 the written KiB.
    let line = out.lines().find(|l| l.starts_with("3;")).expect("terse");
    let f: Vec<&str> = line.split(';').collect();
    let (read, written): (u64, u64) = (f[5].parse().unwrap(), f[46].parse().unwrap());
    assert!(
        read > 0 && written > 0,
        "fio at depth {depth} on {uri} moved nothing: {line}"
    );
}

/// nbdcopy from `from` to `to` over one connection with 1,024 requests
/// of 16 KiB in flight, reading every block (no extents).
fn nbdcopy(from: &str, to: &str) {
    let o = run_within(
        "nbdcopy",
        &[
            "--connections=1",
            "--requests=1024",
            "--request-size=16384",
            "--no-extents",
            "--flush",
            from,
            to,
        ],
        limit(),
    );
    assert!(
        o.status.success(),
        "nbdcopy {from} {to}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn libnbd(uri: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/nbd_stress.py");
    let size = (SIZE_MIB << 20).to_string();
    let secs = seconds().to_string();
    let o = run_within(PYTHON, &[script, uri, &size, &secs, DEPTHS], limit());
    assert!(
        o.status.success(),
        "libnbd stress on {uri}: {}{}\nthe servers' stacks:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        server_stacks()
    );
    eprintln!("{uri}: {}", String::from_utf8_lossy(&o.stdout).trim_end());
}

/// One server in `mode` on a Unix socket and a TCP port, TLS allowed on
/// both; every client on every transport; then a clean SIGTERM.
fn stress(mode: &[&str]) {
    if !have_all() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", &format!("{SIZE_MIB}M")]);
    let ca = Ca::new(s.dir.path(), "ca");
    let srv = ca.creds("srv", Some("server"), "localhost");
    // Clients only need the CA: the server does not ask for their
    // certificates.
    let cli = ca.creds("cli", None, "client");
    let addr = free_addr();
    let port = addr.rsplit(':').next().unwrap();
    let mut args = vec![
        "--nbd-tcp",
        &addr,
        "--tls-creds",
        srv.to_str().unwrap(),
        "--tls",
        "allow",
    ];
    args.extend_from_slice(mode);
    let server = s.serve_with(&args);
    let sock = s.sock();
    let uris = transports(&sock, port, &cli);
    let src = s.dir.path().join("src.img");
    let data: Vec<u8> = (0..16u32 << 20).map(|i| (i / 4096 * 7 + i) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    for (i, uri) in uris.iter().enumerate() {
        // fio's NBD engine takes no TLS URI (libnbd refuses it the
        // certificates' directory unless told otherwise).
        match i {
            0 => FIO_DEPTHS.iter().for_each(|&d| fio(uri, d)),
            1 => fio(uri, 1024),
            _ => {}
        }
        nbdcopy(src.to_str().unwrap(), uri);
        nbdcopy(uri, "null:");
        libnbd(uri);
    }
    server.stop();
}

/// The export over a Unix socket and TCP, plain then TLS (trusting the
/// CA in `creds`).
fn transports(sock: &Path, port: &str, creds: &Path) -> [String; 4] {
    let (sock, creds) = (sock.display(), creds.display());
    [
        format!("nbd+unix:///d?socket={sock}"),
        format!("nbd://127.0.0.1:{port}/d"),
        format!("nbds+unix:///d?socket={sock}&tls-certificates={creds}&tls-hostname=localhost"),
        format!("nbds://localhost:{port}/d?tls-certificates={creds}"),
    ]
}

#[test]
fn writeback_io_uring_the_default() {
    stress(&[]);
}

#[test]
fn writeback_threads() {
    stress(&["--aio", "threads"]);
}

#[test]
fn direct_io_uring() {
    stress(&["--cache", "none"]);
}

#[test]
fn direct_native_aio() {
    stress(&["--cache", "none", "--aio", "native"]);
}

#[test]
fn direct_threads() {
    stress(&["--cache", "none", "--aio", "threads"]);
}

/// SIGTERM stops a server whatever its clients do: one sends 256 READs
/// of 1 MiB and never reads a reply (every thread that answers it ends
/// up blocked in a send), one stops half-way through a WRITE's payload,
/// one stops half-way through its handshake. The server exits, cleanly,
/// within [`SHUTDOWN_BOUND`]; what was acknowledged before, flushed or
/// not, is there when it serves again.
#[test]
fn sigterm_stops_a_server_whose_clients_stop_reading_or_sending() {
    use common::nbd::{Pipelined, CMD_READ, CMD_WRITE};
    use std::io::Write;
    for mode in [&[][..], &["--cache", "none"], &["--aio", "threads"]] {
        let s = Store::new();
        s.ok(&["create", "d", "--size", "64M"]);
        let server = s.serve_with(mode);
        let mut good = Pipelined::open(&s.sock(), "d").unwrap();
        let flushed = vec![0x5au8; 1 << 20];
        let acked = vec![0xa5u8; 1 << 20];
        good.write_flush(&flushed, 0).unwrap();
        good.write_at(&acked, 8 << 20).unwrap();
        let mut deaf = Pipelined::open(&s.sock(), "d").unwrap();
        for i in 0..256u64 {
            deaf.send(CMD_READ, i, (i % 64) << 20, 1 << 20, &[])
                .unwrap();
        }
        let mut halting = Pipelined::open(&s.sock(), "d").unwrap();
        let mut header = Vec::new();
        header.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&CMD_WRITE.to_be_bytes());
        header.extend_from_slice(&7u64.to_be_bytes());
        header.extend_from_slice(&(16u64 << 20).to_be_bytes());
        header.extend_from_slice(&(1u32 << 20).to_be_bytes());
        halting.send_raw(&header).unwrap();
        halting.send_raw(&[0xee; 4096]).unwrap();
        let mut shy = std::os::unix::net::UnixStream::connect(s.sock()).unwrap();
        // Client flags (fixed newstyle, no zeroes), then half an option.
        shy.write_all(&3u32.to_be_bytes()).unwrap();
        shy.write_all(b"IHAVEOPT").unwrap();
        // The deaf client's replies have filled its socket: its
        // connection's threads are blocked sending.
        std::thread::sleep(Duration::from_millis(300));
        let pid = server.pid();
        let t = std::time::Instant::now();
        // SAFETY: kill(2) of the server this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let st = server.wait_exit(SHUTDOWN_BOUND);
        let took = t.elapsed();
        let st = st.unwrap_or_else(|| {
            panic!("{mode:?}: the server still ran {SHUTDOWN_BOUND:?} after SIGTERM")
        });
        assert!(st.success(), "{mode:?}: exit status {st}");
        eprintln!("{mode:?}: stopped {took:?} after SIGTERM");
        drop((deaf, halting, shy, good));
        let again = s.serve();
        let mut c = Pipelined::open(&s.sock(), "d").unwrap();
        let mut got = vec![0u8; 1 << 20];
        c.read_at(&mut got, 0).unwrap();
        assert!(got == flushed, "{mode:?}: the flushed write is lost");
        c.read_at(&mut got, 8 << 20).unwrap();
        assert!(got == acked, "{mode:?}: the acknowledged write is lost");
        c.read_at(&mut got, 16 << 20).unwrap();
        assert!(
            got.iter().all(|&b| b == 0),
            "{mode:?}: the half-sent write was applied"
        );
        drop(c);
        again.stop();
    }
}

/// How long after SIGTERM a server with stuck clients may still run: the
/// documented bound (twice the NBD shutdown grace of 5 s, then the
/// flush), with room for a slow machine.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(60);
