//! An NBD server under hostile load: limits per server and per export,
//! clients that stall, send garbage or announce huge lengths, while a
//! real client (fio) keeps being served and the server's memory stays
//! bounded. (How fast that client stays is a bench case: `hostile`.)
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::http::{free_addr, metrics, sample};
use common::nbd::{greeted, opened, IHAVEOPT, OPT_EXPORT_NAME};
use common::*;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const REQUEST_MAGIC: u32 = 0x2560_9513;
const CMD_WRITE: u16 = 1;

fn refused(web: &str, cause: &str) -> f64 {
    sample(
        &metrics(web),
        &format!("strata_nbd_refused_total{{cause=\"{cause}\"}}"),
    )
}

/// `s` served on NBD over TCP and HTTP, each on a free loopback address,
/// with `extra` options: (NBD address, HTTP address, the server).
fn serve_tcp(s: &Store, extra: &[&str]) -> (String, String, Server) {
    let (addr, web) = (free_addr(), free_addr());
    let mut args = vec!["--nbd-tcp", &addr, "--http", &web];
    args.extend_from_slice(extra);
    let srv = s.serve_with(&args);
    (addr, web, srv)
}

fn nbdinfo(addr: &str) -> std::process::Output {
    run("nbdinfo", &[&format!("nbd://{addr}/d")])
}

/// `--handshake-timeout` closes a client that stalls in its handshake
/// after that long and counts it: a client stalled at the same time on a
/// server with the default (10 s) is still open then (an order, not a
/// time limit, so a loaded machine cannot fail it); 0 lets a handshake
/// take for ever.
#[test]
fn a_stalled_handshake_is_closed_after_the_handshake_timeout() {
    use std::io::Read;
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let (addr, web, srv) = serve_tcp(&s, &["--handshake-timeout", "1"]);
    let other = Store::new();
    other.ok(&["create", "d", "--size", "16M"]);
    let (default_addr, _, default_srv) = serve_tcp(&other, &[]);
    let mut waiting = greeted(&default_addr).expect("greeting");
    let mut stalled = greeted(&addr).expect("greeting");
    let t = Instant::now();
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest);
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "closed after {waited:?}, before its 1 s"
    );
    waiting.set_nonblocking(true).unwrap();
    let e = waiting
        .read(&mut [0u8; 1])
        .expect_err("the default timeout closed its client first");
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
    assert_eq!(refused(&web, "handshake_timeout"), 1.0);
    srv.stop();
    default_srv.stop();

    let (addr, web, _srv) = serve_tcp(&s, &["--handshake-timeout", "0"]);
    let mut patient = greeted(&addr).expect("greeting");
    patient
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut one = [0u8; 1];
    let e = patient
        .read(&mut one)
        .expect_err("the server closed a patient client");
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{e}"
    );
    assert_eq!(refused(&web, "handshake_timeout"), 0.0);
}

#[test]
fn an_export_open_on_its_limit_refuses_one_more_with_a_reason() {
    if !have("nbdinfo") || !have("qemu-img") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let (addr, web, _srv) = serve_tcp(&s, &["--max-export-connections", "2"]);
    let held: Vec<TcpStream> = (0..2)
        .map(|_| opened(&addr, "d").expect("a connection within the limit"))
        .collect();
    // QEMU prints the reason the server gave.
    let o = run("qemu-img", &["info", &format!("nbd://{addr}/d")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a third connection was let in");
    assert!(
        err.contains("export 'd' is open on 2 connections already"),
        "{err}"
    );
    assert!(opened(&addr, "d").is_none(), "EXPORT_NAME past the limit");
    assert_eq!(refused(&web, "export_full"), 2.0);
    drop(held);
    eventually("a place on the export", Duration::from_secs(10), || {
        nbdinfo(&addr).status.success()
    });
}

/// VmRSS of process `pid`, in bytes.
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

/// One hostile connection of kind `i % 4`, held open by the caller:
/// stalls after the greeting; sends garbage; announces a 4 GiB option;
/// opens the export and announces a 32 MiB WRITE whose payload never
/// comes.
fn hostile(addr: &str, i: usize) -> Option<TcpStream> {
    match i % 4 {
        0 => greeted(addr),
        1 => {
            let mut s = greeted(addr)?;
            let junk: Vec<u8> = (0..4096u32)
                .map(|k| k.wrapping_mul(2_654_435_761) as u8)
                .collect();
            let _ = s.write_all(&junk);
            Some(s)
        }
        2 => {
            let mut s = greeted(addr)?;
            let mut m = 3u32.to_be_bytes().to_vec();
            m.extend_from_slice(&IHAVEOPT.to_be_bytes());
            m.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
            m.extend_from_slice(&u32::MAX.to_be_bytes());
            let _ = s.write_all(&m);
            Some(s)
        }
        _ => {
            let mut s = opened(addr, "d")?;
            let mut h = REQUEST_MAGIC.to_be_bytes().to_vec();
            h.extend_from_slice(&0u16.to_be_bytes());
            h.extend_from_slice(&CMD_WRITE.to_be_bytes());
            h.extend_from_slice(&(i as u64).to_be_bytes());
            h.extend_from_slice(&0u64.to_be_bytes());
            h.extend_from_slice(&(32u32 << 20).to_be_bytes());
            let _ = s.write_all(&h);
            // A few bytes of it, then nothing.
            let _ = s.write_all(&[0xa5; 512]);
            Some(s)
        }
    }
}

/// 1,000 hostile connections while fio works on one good one: fio finishes
/// its run without an error, the server's memory grows by less than
/// 256 MiB (32 MiB WRITEs announced on the 15 connections the export
/// admits besides fio's would cost 480 MiB if buffers were committed
/// before the data came), every cause is counted, and new clients get in
/// while stalled handshakes hold every place and once the storm is over.
#[test]
fn hostile_connections_leave_a_good_client_served_and_memory_bounded() {
    if !have("fio") || !have("nbdinfo") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "256M"]);
    s.ok(&["create", "e", "--size", "1M"]);
    let (addr, web, srv) = serve_tcp(&s, &["--max-export-connections", "16"]);
    let pid = srv.pid();
    let fio = std::process::Command::new("fio")
        .args([
            "--name=good",
            "--ioengine=nbd",
            &format!("--uri=nbd://{addr}/d"),
            "--rw=randrw",
            "--bs=64k",
            "--iodepth=8",
            "--size=128M",
            "--time_based",
            "--runtime=20",
            "--output-format=json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let before = rss(pid);

    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut peak = before;
    let held = std::thread::scope(|sc| {
        let sampler = sc.spawn(|| {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss(pid));
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        });
        let storm: Vec<_> = (0..8)
            .map(|t| {
                let addr = addr.clone();
                sc.spawn(move || {
                    (0..125)
                        .filter_map(|k| hostile(&addr, t * 125 + k))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let held: Vec<_> = storm.into_iter().map(|h| h.join()).collect();
        // The stalled handshakes fill every place (250 of them for 128):
        // a new client still gets in, in the place of the one negotiating
        // longest (on disk e: d's limit is full of the storm's).
        let during = held.iter().all(Result::is_ok).then(|| {
            let t = Instant::now();
            let o = run("nbdinfo", &[&format!("nbd://{addr}/e")]);
            let took = t.elapsed();
            // Long enough for the stalled handshakes to time out (10 s).
            std::thread::sleep(Duration::from_secs(12));
            (o, took)
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        peak = peak.max(sampler.join().unwrap());
        let held: Vec<TcpStream> = held.into_iter().flat_map(Result::unwrap).collect();
        let (o, took) = during.unwrap();
        assert!(
            o.status.success(),
            "a new client during the storm: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        eprintln!("a new client got in during the storm in {took:?}");
        held
    });
    let out = fio.wait_with_output().unwrap();
    drop(held);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed during the storm: {report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // fio may print notes before its JSON.
    let json = &report[report.find('{').unwrap_or(0)..];
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {report}"));
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    let ios =
        job["read"]["total_ios"].as_u64().unwrap() + job["write"]["total_ios"].as_u64().unwrap();
    assert!(ios > 0, "fio did no I/O: {job}");
    eprintln!(
        "fio: {ios} I/Os in 20 s; server RSS {} MiB before, {} MiB at most during the storm",
        before >> 20,
        peak >> 20
    );
    assert!(
        peak < before + (256 << 20),
        "the server's memory grew from {} to {} MiB",
        before >> 20,
        peak >> 20
    );
    for cause in [
        "handshake_evicted",
        "protocol_error",
        "handshake_timeout",
        "export_full",
    ] {
        assert!(refused(&web, cause) > 0.0, "no refusal counted as {cause}");
    }
    let t = Instant::now();
    eventually(
        "a new client after the storm",
        Duration::from_secs(30),
        || nbdinfo(&addr).status.success(),
    );
    eprintln!("a new client got in {:?} after the storm", t.elapsed());
    srv.stop();
}
