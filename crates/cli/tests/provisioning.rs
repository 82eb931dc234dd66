//! Thin provisioning managed (issue 9): online convert of a served disk
//! checked with qemu-img, reservations held on the host file system, zero
//! detection of literal zero writes, punchzero.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

fn du(path: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(path).unwrap() {
        let m = e.unwrap().metadata().unwrap();
        if m.is_file() {
            total += std::os::unix::fs::MetadataExt::blocks(&m) * 512;
        }
    }
    total
}

#[test]
fn online_convert_of_a_served_disk_keeps_its_bytes() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let srv = s.serve();
    let uri = s.uri("vm");
    // Data, literal zeros (stored: zero detection is for new writes, these
    // land on data), and holes.
    qemu_io_ok(RAW, &uri, &["write -P 0x5a 0 8M"]);
    qemu_io_ok(RAW, &uri, &["write -P 0x00 2M 2M"]);
    qemu_io_ok(RAW, &uri, &["write -P 0xc3 40M 4M"]);
    qemu_io_ok(RAW, &uri, &["write -P 0x11 63M 512k"]);
    let reference = s.dir.path().join("ref.raw");
    save(&uri, &reference);
    let same = || {
        run_ok(
            "qemu-img",
            &[
                "compare",
                "-f",
                "raw",
                "-F",
                "raw",
                reference.to_str().unwrap(),
                &uri,
            ],
        );
    };
    let data = s.json(&["info", "vm"])["allocated_bytes"].as_u64().unwrap();
    assert_eq!(data, 21 << 19, "the zeros over data released their grains");

    let i = s.json(&["convert", "vm", "--type", "eagerzeroedthick"]);
    assert_eq!(i["provisioning"], "eagerzeroedthick");
    assert_eq!(i["allocated_bytes"], 64u64 << 20);
    assert_eq!((i["nb"].as_u64(), i["tbz"].as_u64()), (Some(64), Some(0)));
    same();

    let i = s.json(&["convert", "vm", "--type", "thin"]);
    assert_eq!(i["provisioning"], "thin");
    assert_eq!(i["allocated_bytes"].as_u64().unwrap(), data);
    same();

    let i = s.json(&["convert", "vm", "--type", "zeroedthick"]);
    assert_eq!(i["provisioning"], "zeroedthick");
    assert_eq!(i["nb"], 64);
    assert_eq!(i["tbz"], 64 - 6 - 4 - 1);
    let st = s.json(&["status"]);
    assert_eq!(st["reserved_bytes"].as_u64().unwrap(), (64 << 20) - data);
    same();
    // The client keeps writing through all of it.
    qemu_io_ok(RAW, &uri, &["write -P 0x77 20M 1M"]);
    run_ok("qemu-io", &["-f", "raw", "-c", "read -P 0x77 20M 1M", &uri]);
    let c = s.json(&["check"]);
    assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
    let e = s.fails(&["punchzero", "vm"]);
    assert!(e.contains("thick disk keeps its blocks"), "{e}");
    srv.stop();
}

#[test]
fn thick_disks_occupy_their_space_on_the_host_and_thin_ones_nothing() {
    let s = Store::new();
    s.ok(&["create", "big", "--size", "1T"]);
    assert!(
        du(&s.path()) < 2 << 20,
        "1 TiB thin: {} bytes",
        du(&s.path())
    );
    s.ok(&["create", "zt", "--size", "1G", "--type", "zeroedthick"]);
    s.ok(&[
        "create",
        "ezt",
        "--size",
        "1G",
        "--type",
        "eagerzeroedthick",
    ]);
    let used = du(&s.path());
    assert!(
        used >= 2 << 30,
        "the datastore holds only {used} bytes on the host"
    );
    // Removing the zeroedthick disk gives its reservation back to the host
    // (beyond a step of slack).
    s.ok(&["rm", "zt"]);
    s.ok(&["convert", "ezt", "--type", "thin"]);
    let after = du(&s.path());
    assert!(
        after < used - (1 << 30),
        "removing the reservation left {after} bytes on the host"
    );
    assert_eq!(s.json(&["info", "ezt"])["allocated_bytes"], 0);
}

#[test]
fn literal_zero_writes_to_a_thin_disk_allocate_nothing() {
    if !have("qemu-io") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "t", "--size", "256M"]);
    let srv = s.serve();
    let uri = s.uri("t");
    // qemu-io's write -P 0 sends the zeros as data (not WRITE_ZEROES).
    qemu_io_ok(RAW, &uri, &["write -P 0 0 128M"]);
    let a = s.json(&["info", "t"])["allocated_bytes"].as_u64().unwrap();
    assert!(a < 1 << 20, "128 MiB of zeros allocated {a} bytes");
    qemu_io_ok(RAW, &uri, &["write -P 0xab 128M 32M"]);
    let a = s.json(&["info", "t"])["allocated_bytes"].as_u64().unwrap();
    assert_eq!(a, 32 << 20);
    qemu_io_ok(RAW, &uri, &["write -P 0 128M 32M"]);
    let a = s.json(&["info", "t"])["allocated_bytes"].as_u64().unwrap();
    assert_eq!(a, 0, "zeros over data free it");
    srv.stop();

    // With detection off the zeros are stored; punchzero gives them back.
    let srv = s.serve_with(&["--detect-zeroes", "off"]);
    qemu_io_ok(RAW, &uri, &["write -P 0 0 16M"]);
    let a = s.json(&["info", "t"])["allocated_bytes"].as_u64().unwrap();
    assert_eq!(a, 16 << 20);
    let r = s.json(&["punchzero", "t"]);
    assert_eq!(r["released_bytes"], 16u64 << 20);
    assert_eq!(r["allocated_bytes"], 0);
    srv.stop();
}

#[test]
fn a_zeroedthick_disk_keeps_its_space_when_another_file_fills_the_host() {
    if !have("qemu-io") {
        return;
    }
    // Where no tmpfs can be mounted, the same guarantee is still tested on
    // a simulated full host (crates/engine/tests/convert.rs).
    let Some(fs) = Tmpfs::mount("400M") else {
        return;
    };
    let s = Store {
        dir: tempfile::tempdir_in(fs.dir.path()).unwrap(),
    };
    s.ok(&["init"]);
    s.ok(&["create", "zt", "--size", "64M", "--type", "zeroedthick"]);
    s.ok(&["create", "thin", "--size", "64M"]);
    // Another file takes every byte left.
    let filler = fs.dir.path().join("filler");
    let o = run(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", filler.display()),
            "bs=1M",
            "count=1000",
        ],
    );
    assert!(!o.status.success(), "the filler should have hit ENOSPC");
    let srv = s.serve();
    // Every byte of the thick disk can still be written.
    qemu_io_ok(RAW, &s.uri("zt"), &["write -P 0x3c 0 64M"]);
    run_ok(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x3c 0 64M", &s.uri("zt")],
    );
    // A thin disk cannot take what the thick one holds: a clear ENOSPC.
    let o = run(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x11 0 16M", &s.uri("thin")],
    );
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("No space left"),
        "a thin write on a full host: {out}"
    );
    let st = s.json(&["status"]);
    assert!(st["fail_stop"].is_null(), "{st}");
    srv.stop();
    let c = s.json(&["check"]);
    assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
}

#[test]
fn long_operations_are_server_jobs_that_pause_resume_cancel_and_outlive_their_cli() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let srv = s.serve();
    assert!(s.json(&["jobs"]).as_array().unwrap().is_empty());

    // A paced convert, detached: the command returns with the job's id.
    let started = s.json(&[
        "convert",
        "vm",
        "--type",
        "eagerzeroedthick",
        "--rate",
        "8M",
        "--detach",
    ]);
    let id = started["id"].as_u64().unwrap();
    assert_eq!(started["what"], "convert vm to eagerzeroedthick");
    s.wait_job(id, "running", Duration::from_secs(60));
    let out = s.ok(&["jobs", "pause", &id.to_string()]);
    assert!(out.contains("paused"), "{out}");
    let a = s.wait_job(id, "paused", Duration::from_secs(60))["done"]
        .as_u64()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(600));
    let b = s.job(id)["done"].as_u64().unwrap();
    assert!(b <= a + (1 << 20), "a paused job went on: {a} -> {b}");
    s.ok(&["jobs", "resume", &id.to_string()]);
    s.wait_job(id, "running", Duration::from_secs(60));
    s.ok(&["jobs", "cancel", &id.to_string()]);
    let j = s.wait_job(id, "cancelled", Duration::from_secs(60));
    assert!(j["done"].as_u64().unwrap() < 64 << 20, "{j}");
    let e = j["error"].as_str().unwrap();
    assert!(e.contains("'vm' is zeroedthick now"), "{j}");
    // Cancelled part-way: a consistent zeroedthick disk; running it again finishes.
    assert_eq!(s.json(&["info", "vm"])["provisioning"], "zeroedthick");
    let e = s.fails(&["jobs", "cancel", &id.to_string()]);
    assert!(e.contains("already ended"), "{e}");

    // A CLI that goes away (kill -9) leaves its job running to the end.
    let mut cli = Command::new(strata())
        .arg("--datastore")
        .arg(s.path())
        .args([
            "convert",
            "vm",
            "--type",
            "eagerzeroedthick",
            "--rate",
            "32M",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let id2 = loop {
        let jobs = s.json(&["jobs"]);
        if let Some(j) = jobs.as_array().unwrap().iter().find(|j| j["id"] != id) {
            break j["id"].as_u64().unwrap();
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    cli.kill().unwrap();
    let _ = cli.wait();
    let j = s.wait_job(id2, "done", Duration::from_secs(60));
    assert_eq!(j["percent"], 100);
    let i = s.json(&["info", "vm"]);
    assert_eq!(i["provisioning"], "eagerzeroedthick");
    assert_eq!(i["tbz"], 0);
    let e = s.fails(&["jobs", "pause", "999"]);
    assert!(e.contains("no job 999"), "{e}");
    srv.stop();
    let e = s.fails(&["jobs"]);
    assert!(e.contains("jobs run in a server"), "{e}");
}

/// `serve` with its log (stderr) going to `log`.
fn serve_logging(s: &Store, log: &Path) -> Server {
    let _ = std::fs::remove_file(s.sock());
    let child = Command::new(strata())
        .arg("--datastore")
        .arg(s.path())
        .arg("serve")
        .arg("--nbd-unix")
        .arg(s.sock())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    wait_for(&s.sock());
    wait_for(&s.path().join("control.sock"));
    Server { child: Some(child) }
}

/// Pause job `id`, then cancel it: paused, it cannot end by itself before
/// the cancel; it ends cancelled. Returns its `jobs --json` entry.
fn pause_then_cancel(s: &Store, id: u64) -> serde_json::Value {
    s.ok(&["jobs", "pause", &id.to_string()]);
    s.wait_job(id, "paused", Duration::from_secs(60));
    s.ok(&["jobs", "cancel", &id.to_string()]);
    s.wait_job(id, "cancelled", Duration::from_secs(60))
}

/// The line of `jobs`' table for job `id`.
fn job_line(s: &Store, id: u64) -> String {
    let table = s.ok(&["jobs"]);
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id.to_string().as_str()))
        .unwrap_or_else(|| panic!("job {id} not in the table:\n{table}"))
        .to_string()
}

/// A cancelled job reads `cancelled` once, in its state: its error (in
/// `jobs`, `jobs --json` and the server's log) says who stopped it and
/// what stays, not "cancelled" again.
#[test]
fn a_cancelled_job_says_what_stays_without_repeating_cancelled() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let log = s.dir.path().join("serve.log");
    let srv = serve_logging(&s, &log);
    let started = s.json(&["punchzero", "vm", "--rate", "1M", "--detach"]);
    let id = started["id"].as_u64().unwrap();
    let j = pause_then_cancel(&s, id);
    let want =
        "stopped by 'strata jobs cancel'; what was done so far stays (run it again to finish)";
    assert_eq!(j["error"], want, "{j}");
    let line = job_line(&s, id);
    assert_eq!(line.matches("cancelled").count(), 1, "{line}");
    assert!(line.contains(want), "{line}");
    let logged = format!("job {id} (punchzero vm) ended: {want}");
    let mut text = String::new();
    eventually(
        "the job's end in the server's log",
        std::time::Duration::from_secs(30),
        || {
            text = std::fs::read_to_string(&log).unwrap();
            text.contains(&logged)
        },
    );
    let l = text.lines().find(|l| l.contains(&logged)).unwrap();
    assert!(l.contains("state=\"cancelled\""), "{l}");
    assert_eq!(
        l.matches("cancelled").count(),
        1,
        "only in the state field: {l}"
    );
    srv.stop();
}

/// Percent of `vm`'s blocks zeroed (or written), as `info` counts them.
fn zeroed_pct(s: &Store) -> u64 {
    let i = s.json(&["info", "vm"]);
    let (nb, tbz) = (i["nb"].as_u64().unwrap(), i["tbz"].as_u64().unwrap());
    (nb - tbz) * 100 / nb
}

/// A conversion stopped part-way (cancelled, in the foreground or
/// detached) says what the disk is now and how to finish: thin to
/// eagerzeroedthick leaves it zeroedthick with part of its blocks zeroed;
/// to thin leaves it thin with part of it scanned.
#[test]
fn a_cancelled_convert_says_what_the_disk_is_now() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let srv = s.serve();
    let again = "run 'strata convert vm --type eagerzeroedthick' again to finish";

    // In the foreground: the command's error says it.
    let cli = Command::new(strata())
        .arg("--datastore")
        .arg(s.path())
        .args([
            "convert",
            "vm",
            "--type",
            "eagerzeroedthick",
            "--rate",
            "2M",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut id = 0;
    eventually(
        "the convert's job",
        std::time::Duration::from_secs(30),
        || {
            let jobs = s.json(&["jobs"]);
            id = jobs[0]["id"].as_u64().unwrap_or(0);
            id != 0
        },
    );
    let j = pause_then_cancel(&s, id);
    let o = cli.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "{err}");
    assert_eq!(s.json(&["info", "vm"])["provisioning"], "zeroedthick");
    let pct = zeroed_pct(&s);
    assert!(pct < 100, "{pct}");
    let want = format!(
        "stopped by 'strata jobs cancel': 'vm' is zeroedthick now (its blocks reserved, \
         {pct} % of them zeroed); {again}"
    );
    assert!(err.contains(&want), "{err}");
    assert_eq!(j["error"], want.as_str(), "{j}");
    let line = job_line(&s, id);
    assert_eq!(line.matches("cancelled").count(), 1, "{line}");

    // Again, detached, from zeroedthick: it stays zeroedthick.
    let started = s.json(&[
        "convert",
        "vm",
        "--type",
        "eagerzeroedthick",
        "--rate",
        "2M",
        "--detach",
    ]);
    let j = pause_then_cancel(&s, started["id"].as_u64().unwrap());
    let want = format!(
        "stopped by 'strata jobs cancel': 'vm' stays zeroedthick (its blocks reserved, {} % \
         of them zeroed); {again}",
        zeroed_pct(&s)
    );
    assert_eq!(j["error"], want.as_str(), "{j}");
    // Run again, it finishes.
    let i = s.json(&["convert", "vm", "--type", "eagerzeroedthick"]);
    assert_eq!(
        (&i["provisioning"], &i["tbz"]),
        (&"eagerzeroedthick".into(), &0.into())
    );

    // To thin: the reservation goes first, then the scan for zero blocks.
    let started = s.json(&[
        "convert", "vm", "--type", "thin", "--rate", "2M", "--detach",
    ]);
    let j = pause_then_cancel(&s, started["id"].as_u64().unwrap());
    assert_eq!(s.json(&["info", "vm"])["provisioning"], "thin");
    let want = format!(
        "stopped by 'strata jobs cancel': 'vm' is thin now (no space reserved for it any more, {} % of \
         it scanned for zero blocks to release); run 'strata convert vm --type thin' again to \
         finish",
        j["percent"]
    );
    assert_eq!(j["error"], want.as_str(), "{j}");
    srv.stop();
}

/// The percentages of `job N: WHAT: P %` lines in `text`, in order.
fn progress_lines(text: &str, prefix: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix)?.split(" %").next()?.parse().ok())
        .collect()
}

#[test]
fn off_a_terminal_a_long_command_says_its_job_at_once_and_its_progress_now_and_then() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let _srv = s.serve();
    // stderr to a file (a cron log): no terminal. Paced to take ~4 s.
    let log = s.path().join("cron.log");
    let mut cli = Command::new(strata())
        .arg("--datastore")
        .arg(s.path())
        .args([
            "convert",
            "vm",
            "--type",
            "eagerzeroedthick",
            "--rate",
            "16M",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // The job's id is in the log while the job still runs.
    let mut seen = String::new();
    eventually(
        "the job line in the log",
        std::time::Duration::from_secs(30),
        || {
            seen = std::fs::read_to_string(&log).unwrap();
            seen.contains(": started (")
        },
    );
    let id: u64 = seen
        .strip_prefix("job ")
        .and_then(|r| r.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no job line first: {seen}"));
    assert!(
        seen.starts_with(&format!(
            "job {id}: convert vm to eagerzeroedthick: started ('strata jobs' shows it, \
             'strata jobs cancel {id}' stops it)"
        )),
        "{seen}"
    );
    assert_eq!(s.job(id)["state"], "running", "{seen}");
    assert!(cli.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    let p = progress_lines(
        &text,
        &format!("job {id}: convert vm to eagerzeroedthick: "),
    );
    // A line a tenth at most, rising, sizes named.
    assert!(p.len() >= 2 && p.len() <= 10, "{text}");
    assert!(p.windows(2).all(|w| w[0] < w[1]), "{text}");
    assert!(text.contains(" MiB of 64 MiB)"), "{text}");

    // --json: stderr stays for the answer's error alone.
    let o = s.cmd(&["--json", "convert", "vm", "--type", "thin"]);
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_full_clone_takes_a_rate_and_a_cancelled_one_leaves_no_disk() {
    if !have("qemu-io") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let _srv = s.serve();
    qemu_io_ok(&["-f", "raw"], &s.uri("vm"), &["write -P 7 0 32M"]);
    // 32 MiB at 4 MiB/s: ~8 s, long enough to cancel part-way.
    let started = s.json(&["clone", "vm", "c", "--full", "--rate", "4M", "--detach"]);
    let id = started["id"].as_u64().unwrap();
    s.wait_job(id, "running", Duration::from_secs(60));
    s.ok(&["jobs", "cancel", &id.to_string()]);
    let j = s.wait_job(id, "cancelled", Duration::from_secs(60));
    let e = j["error"].as_str().unwrap();
    assert!(
        e.starts_with("stopped by 'strata jobs cancel': no disk 'c' was made"),
        "{j}"
    );
    assert!(j["done"].as_u64().unwrap() < 32 << 20, "{j}");
    assert!(s.fails(&["info", "c"]).contains("no disk"));
    assert_eq!(s.disk_names(), ["vm"]);
    // --rate goes with --full only.
    let e = s.fails(&["clone", "vm@x", "c", "--rate", "4M"]);
    assert!(e.contains("--full"), "{e}");
    // Unhindered, the clone has the bytes.
    s.ok(&["clone", "vm", "c", "--full", "--rate", "1G"]);
    qemu_io_ok(&["-f", "raw"], &s.uri("c"), &["read -P 7 0 32M"]);
}

/// A server that is asked to stop (SIGTERM) stops the jobs clients
/// started at the end of a step before it closes the datastore: a paused
/// import gives up and removes its half-made disk, a compress keeps the
/// regions it packed; after a restart both read cancelled, saying so, the
/// datastore checks clean and the packed disk reads its bytes.
#[test]
fn a_stopping_server_stops_its_jobs_at_a_step_and_an_import_leaves_no_half_made_disk() {
    use std::os::unix::fs::FileExt;
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "32M"]);
    // 1 GiB with 4 KiB of data in every MiB: thousands of steps.
    let image = s.dir.path().join("sparse.raw");
    let f = std::fs::File::create(&image).unwrap();
    f.set_len(1 << 30).unwrap();
    for mib in 0..1024u64 {
        f.write_all_at(&[0x5a; 4096], mib << 20).unwrap();
    }
    let srv = s.serve();
    qemu_io_ok(&["-f", "raw"], &s.uri("vm"), &["write -P 7 0 32M"]);
    // 32 MiB at 1 MiB/s: still running when the server stops.
    let packing = s.json(&["compress", "vm", "--rate", "1M", "--detach"]);
    let packing = packing["id"].as_u64().unwrap();
    let import = s.json(&["import", image.to_str().unwrap(), "big", "--detach"]);
    let import = import["id"].as_u64().unwrap();
    s.ok(&["jobs", "pause", &import.to_string()]);
    s.wait_job(import, "paused", Duration::from_secs(60));
    s.wait_job(packing, "running", Duration::from_secs(60));
    srv.stop();

    let _srv = s.serve();
    for id in [import, packing] {
        let j = s.job(id);
        assert_eq!(j["state"], "cancelled", "{j}");
        let e = j["error"].as_str().unwrap();
        assert!(e.starts_with("stopped: the server stops"), "{j}");
    }
    let e = s.job(import)["error"].as_str().unwrap().to_string();
    assert!(e.contains("half-made disk 'big' was removed"), "{e}");
    assert_eq!(s.disk_names(), ["vm"]);
    assert!(s.ok(&["check"]).contains("clean"));
    qemu_io_ok(&["-f", "raw"], &s.uri("vm"), &["read -P 7 0 32M"]);
    // An import stops at 'strata jobs cancel' the same way.
    let again = s.json(&["import", image.to_str().unwrap(), "big", "--detach"]);
    let again = again["id"].as_u64().unwrap();
    s.ok(&["jobs", "cancel", &again.to_string()]);
    let j = s.wait_job(again, "cancelled", Duration::from_secs(60));
    assert!(
        j["error"]
            .as_str()
            .unwrap()
            .starts_with("stopped by 'strata jobs cancel'"),
        "{j}"
    );
    assert_eq!(s.disk_names(), ["vm"]);
}

/// An export is a job `strata jobs cancel` stops: one blocked opening a
/// pipe nobody reads yet takes the cancel, and once the pipe is read it
/// stops at its next step; the pipe is not its own and stays. A file it
/// made and could not finish (a full file system here) it removes.
#[test]
fn a_cancelled_export_diff_stops_and_removes_its_partial_stream() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    let _srv = s.serve();
    qemu_io_ok(&["-f", "raw"], &s.uri("vm"), &["write -P 7 0 8M"]);
    let out = s.dir.path().join("vm.diff");
    let made = Command::new("mkfifo").arg(&out).status().unwrap();
    assert!(made.success());
    let out_s = out.to_str().unwrap();
    let job = s.json(&["export-diff", "vm", out_s, "--detach"]);
    let id = job["id"].as_u64().unwrap().to_string();
    s.ok(&["jobs", "cancel", &id]);
    // Reading lets the export's open return; it ends at its next step.
    let read = std::fs::read(&out).unwrap();
    let j = s.wait_job(id.parse().unwrap(), "cancelled", Duration::from_secs(60));
    let e = j["error"].as_str().unwrap();
    assert!(
        e.starts_with("stopped by 'strata jobs cancel': export it again"),
        "{j}"
    );
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(&out).unwrap().file_type();
    assert!(t.is_fifo(), "the pipe stays: {t:?}");
    assert!(
        read.len() < 8 << 20,
        "the whole disk went out: {} bytes",
        read.len()
    );
    std::fs::remove_file(&out).unwrap();
    if let Some(fs) = Tmpfs::mount("2M") {
        let full = fs.dir.path().join("vm.diff");
        let e = s.fails(&["export-diff", "vm", full.to_str().unwrap()]);
        assert!(e.contains("No space left"), "{e}");
        assert!(
            !full.exists(),
            "the partial diff {} is still there",
            full.display()
        );
    }
    // Nothing in the way of running it again.
    s.ok(&["export-diff", "vm", out_s]);
    assert!(std::fs::metadata(&out).unwrap().len() > 8 << 20);
}

/// The jobs list outlives its server (jobs.json): finished jobs are
/// listed after a restart, newest first with their times and target, a
/// job that was running when the server was killed reads interrupted,
/// ids go on from the last, and an earlier server's job cannot be acted
/// on.
#[test]
fn jobs_are_kept_across_restarts_and_a_killed_servers_job_reads_interrupted() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let srv = s.serve();
    let done = s.json(&["punchzero", "vm"]);
    assert_eq!(done["disk"], "vm", "{done}");
    let first = s.json(&["jobs"])[0].clone();
    assert_eq!(first["state"], "done", "{first}");
    let slow = [
        "convert",
        "vm",
        "--type",
        "eagerzeroedthick",
        "--rate",
        "4M",
    ];
    let started = s.json(&[&slow[..], &["--detach"]].concat());
    let id = started["id"].as_u64().unwrap();
    assert!(id > first["id"].as_u64().unwrap());
    s.wait_job(id, "running", Duration::from_secs(60));
    srv.kill9();

    let srv = s.serve();
    let jobs = s.json(&["jobs"]);
    let j = jobs[0].clone();
    assert_eq!(j["id"], id, "newest first: {jobs}");
    assert_eq!(j["state"], "interrupted", "{j}");
    assert_eq!(j["target"], "vm", "{j}");
    assert!(
        j["error"]
            .as_str()
            .unwrap()
            .contains("stopped while it ran"),
        "{j}"
    );
    assert_eq!(jobs[1]["id"], first["id"]);
    assert!(jobs[1]["finished_unix"].as_u64().is_some(), "{jobs}");
    let e = s.fails(&["jobs", "cancel", &id.to_string()]);
    assert!(e.contains("earlier server"), "{e}");
    let table = s.ok(&["jobs"]);
    assert!(table.contains("interrupted"), "{table}");
    // A new job's id goes on from the last one's.
    // (vm is zeroedthick now: the convert's first step was done.)
    s.ok(&["create", "other", "--size", "8M"]);
    let again = s.json(&["punchzero", "other", "--detach"]);
    assert!(again["id"].as_u64().unwrap() > id, "{again}");
    s.wait_job(
        again["id"].as_u64().unwrap(),
        "done",
        Duration::from_secs(60),
    );
    srv.stop();
    let _srv = s.serve();
    assert_eq!(s.json(&["jobs"]).as_array().unwrap().len(), 3);
}
