//! `strata limit`: per-disk IOPS and bandwidth limits, set while served,
//! kept across a restart, and obeyed by a real client (fio over NBD), on
//! both kinds of datastore. The limit lives under every transport: in the
//! engine's disk handle, or the object-store disk's.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

fn fio_json(uri: &str, rw: &str, bs: &str, secs: u32) -> serde_json::Value {
    let out = run_ok(
        "fio",
        &[
            "--name=l",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            "--iodepth=8",
            "--time_based",
            &format!("--runtime={secs}"),
            "--size=64M",
            "--output-format=json",
        ],
    );
    let j: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
    j["jobs"][0]["read"].clone()
}

#[test]
fn limits_hold_a_real_client_to_its_rate_and_survive_a_restart() {
    if !have("fio") {
        return;
    }
    each_kind(limits_on);
}

fn limits_on(kind: Kind) {
    let s = Store::of(kind);
    s.ok(&["create", "d", "--size", "64M"]);
    // Refusals first.
    let e = s.fails(&["limit", "d"]);
    assert!(e.contains("--iops"), "{e}");
    let e = s.fails(&["limit", "d", "--iops", "0"]);
    assert!(e.contains("would stop the disk"), "{e}");
    let e = s.fails(&["limit", "nope", "--iops", "10"]);
    assert!(e.contains("nope"), "{e}");

    let srv = s.serve();
    let info = s.json(&["limit", "d", "--iops", "200", "--burst", "1"]);
    assert_eq!(info["limits"]["iops"], 200, "{info}");
    // 4k reads at iodepth 8 for 3 s: at most the burst plus 3 s of rate.
    let r = fio_json(&s.uri("d"), "randread", "4k", 3);
    let ios = r["total_ios"].as_u64().unwrap();
    eprintln!("limited to 200 IOPS: {ios} reads in 3 s");
    assert!(
        ios > 0 && ios <= 200 * 4 + 50,
        "{ios} reads in 3 s under --iops 200"
    );

    // A byte rate instead: 4 MiB/s of 64k reads.
    s.ok(&["limit", "d", "--clear"]);
    assert!(s.json(&["info", "d"]).get("limits").is_none());
    s.ok(&["limit", "d", "--bps", "4M"]);
    let r = fio_json(&s.uri("d"), "read", "64k", 3);
    let bytes = r["io_bytes"].as_u64().unwrap();
    eprintln!("limited to 4 MiB/s: {bytes} bytes in 3 s");
    assert!(
        bytes <= (4 << 20) * 4 + (1 << 20),
        "{bytes} bytes in 3 s under --bps 4M"
    );

    // Kept with the disk.
    srv.stop();
    let info = s.json(&["info", "d"]);
    assert_eq!(info["limits"]["bps"], 4 << 20, "{info}");
    let human = s.ok(&["info", "d"]);
    assert!(
        human.contains("limits:") && human.contains("4 MiB/s, burst 1 s"),
        "{human}"
    );
}
