//! Per-disk I/O statistics through the real server: a known fio workload
//! gives the expected vscsiStats histograms, and /metrics parses as
//! Prometheus text with a real parser.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

fn bucket(h: &serde_json::Value, le: i64) -> u64 {
    h["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["le"] == le)
        .unwrap_or_else(|| panic!("no bucket <= {le} in {h}"))["count"]
        .as_u64()
        .unwrap()
}

#[test]
fn sequential_4k_writes_fill_the_expected_buckets_and_metrics_parse() {
    if !have("fio") {
        return;
    }
    each_kind(sequential_4k_writes_fill_the_expected_buckets_on);
}

fn sequential_4k_writes_fill_the_expected_buckets_on(kind: Kind) {
    let s = Store::of(kind);
    s.ok(&["create", "disk", "--size", "64M"]);
    if kind == Kind::Local {
        s.ok(&["create", "idle", "--size", "1M", "--type", "zeroedthick"]);
    }
    // Without a server there are no statistics, and the CLI says why.
    assert!(s.fails(&["stats", "disk"]).contains("running server"));
    let addr = common::http::free_addr();
    let srv = s.serve_with(&["--http", &addr]);

    // 1000 sequential 4 KiB writes, one at a time so their order is exact.
    let uri = format!("--uri={}", s.uri("disk"));
    run_ok(
        "fio",
        &[
            "--name=seq",
            "--ioengine=nbd",
            &uri,
            "--rw=write",
            "--bs=4k",
            "--size=4000k",
            "--iodepth=1",
        ],
    );
    let v = s.json(&["stats", "disk"]);
    let d = &v["disk"];
    assert_eq!(d["write"]["commands"], 1000, "{d}");
    assert_eq!(d["write"]["bytes"], 4096000);
    assert_eq!(bucket(&d["io_length"]["write"], 4096), 1000);
    assert_eq!(bucket(&d["io_length"]["write"], 4095), 0);
    assert_eq!(d["io_length"]["read"]["count"], 0);
    // Every write after the first starts one LBN after the last LBN of the
    // one before: the vscsiStats "<=1" bucket, not "<=0".
    assert_eq!(bucket(&d["seek_distance"]["write"], 1), 999, "{d}");
    assert_eq!(bucket(&d["seek_distance"]["write"], 0), 0);
    assert_eq!(d["seek_distance"]["write"]["count"], 999);
    assert_eq!(bucket(&d["seek_distance_closest"]["write"], 1), 999);
    assert_eq!(d["seek_distance_closest"]["all"]["count"], 999);
    assert_eq!(d["latency"]["write"]["count"], 1000);
    // Outstanding and interarrival, split as vscsiStats splits them.
    for (op, n) in [("write", 1000), ("all", 1000), ("read", 0)] {
        assert_eq!(d["outstanding"][op]["count"], n, "outstanding {op}");
        assert_eq!(bucket(&d["outstanding"][op], 1), n, "outstanding {op}");
    }
    assert_eq!(d["interarrival"]["write"]["count"], 999);
    assert_eq!(d["interarrival"]["read"]["count"], 0);

    // `n` random 4 KiB reads over the first 4000 KiB.
    let reads = |n: u32, iodepth: u32| {
        run_ok(
            "fio",
            &[
                "--name=rr",
                "--ioengine=nbd",
                &uri,
                "--rw=randread",
                "--bs=4k",
                "--size=4000k",
                &format!("--iodepth={iodepth}"),
                &format!("--number_ios={n}"),
            ],
        )
    };

    // Random 4 KiB reads land in the read histograms, with seeks both ways.
    reads(200, 1);
    let d = s.json(&["stats", "disk", "--reset"])["disk"].clone();
    assert_eq!(bucket(&d["io_length"]["read"], 4096), 200);
    let seeks = d["seek_distance"]["read"]["buckets"].as_array().unwrap();
    let neg: u64 = seeks
        .iter()
        .filter(|b| b["le"].as_i64().is_some_and(|le| le < 0))
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    let pos: u64 = seeks
        .iter()
        .filter(|b| b["le"].as_i64().is_none_or(|le| le > 0))
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert!(
        neg > 20 && pos > 20,
        "random reads seek both ways: {neg} back, {pos} forward"
    );
    // --reset zeroed them.
    assert_eq!(s.json(&["stats", "disk"])["disk"]["read"]["commands"], 0);
    assert!(s
        .fails(&["stats", "ghost"])
        .contains("no disk named 'ghost'"));
    let text = s.ok(&["stats"]);
    assert!(
        text.contains("=== disk") && text.contains("Seek distance"),
        "{text}"
    );

    // Prometheus text, read by a real parser.
    let common::http::Reply { head, body, .. } = common::http::get(&addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("metrics parse");
    let sample = |name: &str, label: Option<(&str, &str)>| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no sample {name} {label:?}"));
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("{name} is not a plain value"),
        }
    };
    assert_eq!(
        sample("strata_disk_commands_total", Some(("disk", "disk"))) as u64,
        0,
        "read counter after reset"
    );
    if kind == Kind::Local {
        // The datastore's own gauges (an object store's are its disks'
        // upload and writer figures: tests/objstore.rs).
        assert_eq!(
            sample("strata_datastore_provisioned_bytes", None) as u64,
            (64 << 20) + (1 << 20)
        );
        assert_eq!(
            sample("strata_datastore_reserved_bytes", None) as u64,
            1 << 20
        );
        assert_eq!(
            sample("strata_disk_size_bytes", Some(("disk", "idle"))) as u64,
            1 << 20
        );
        assert!(sample("strata_datastore_capacity_bytes", None) > 0.0);
    }
    for family in [
        "strata_disk_latency_seconds",
        "strata_disk_seek_distance_closest_sectors",
    ] {
        let hist = scrape.samples.iter().find(|s| s.metric == family);
        assert!(hist.is_some(), "{family} histogram family missing");
    }
    for op in ["read", "write", "all"] {
        for family in [
            "strata_disk_outstanding_ios",
            "strata_disk_interarrival_seconds",
        ] {
            assert!(
                scrape
                    .samples
                    .iter()
                    .any(|s| s.metric == family && s.labels.get("op") == Some(op)),
                "{family} op={op} missing"
            );
        }
    }
    assert_eq!(
        sample("strata_disk_stats_recording", Some(("disk", "disk"))),
        1.0
    );
    let head = common::http::get(&addr, "/nope").head;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");

    // --pause: fio's reads are served and not counted; --resume counts again.
    let paused = s.json(&["stats", "disk", "--pause"]);
    assert_eq!(paused["disk"]["recording"], false, "{paused}");
    reads(300, 4);
    let d = s.json(&["stats", "disk"])["disk"].clone();
    assert_eq!(d["recording"], false);
    assert_eq!(d["read"]["commands"], 0, "{d}");
    assert!(s.ok(&["stats", "disk"]).contains("Recording is paused"));
    let body = common::http::metrics(&addr);
    assert!(
        body.lines()
            .any(|l| l == "strata_disk_stats_recording{disk=\"disk\"} 0"),
        "{body}"
    );
    assert!(s
        .fails(&["stats", "disk", "--pause", "--resume"])
        .contains("cannot be used with"));
    s.ok(&["stats", "--resume"]);
    reads(300, 4);
    let d = s.json(&["stats", "disk"])["disk"].clone();
    assert_eq!(d["recording"], true);
    assert_eq!(d["read"]["commands"], 300, "{d}");
    assert_eq!(bucket(&d["io_length"]["read"], 4096), 300);

    // Plain 1 MiB reads of a half-written disk (libnbd negotiates
    // structured replies): each is one read, and the server asks no block
    // status of its own, whether the read finds data or a hole.
    s.ok(&["create", "half", "--size", "16M"]);
    let half = format!("--uri={}", s.uri("half"));
    let fio_1m = |rw: &str| {
        run_ok(
            "fio",
            &[
                "--name=half",
                "--ioengine=nbd",
                &half,
                &format!("--rw={rw}"),
                "--bs=1M",
                "--iodepth=1",
                if rw == "write" {
                    "--size=8M"
                } else {
                    "--size=16M"
                },
            ],
        )
    };
    fio_1m("write");
    s.ok(&["stats", "half", "--reset"]);
    fio_1m("read");
    let h = s.json(&["stats", "half"])["half"].clone();
    assert_eq!(h["read"]["commands"], 16, "{h}");
    assert_eq!(h["read"]["bytes"], 16 << 20);
    assert_eq!(h["block_status"]["commands"], 0, "{h}");
    assert_eq!(h["io_length"]["read"]["count"], 16);
    assert_eq!(bucket(&h["seek_distance"]["read"], 1), 15);

    srv.stop();
}

/// The export names `names` lists (the CLI's and the API's `stats` are one
/// document, keyed by export).
fn stat_names(v: &serde_json::Value) -> Vec<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

/// The `disk` labels /metrics names.
fn metric_disks(addr: &str) -> Vec<String> {
    let mut out: Vec<String> = common::http::metrics(addr)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once("disk=\"")?.1.split_once('"').map(|(d, _)| d))
        .map(String::from)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn a_removed_disk_leaves_no_statistics_and_a_new_one_of_its_name_starts_at_zero() {
    each_kind(a_removed_disk_leaves_no_statistics_on);
}

fn a_removed_disk_leaves_no_statistics_on(kind: Kind) {
    let s = Store::of(kind);
    s.ok(&["create", "vm", "--size", "4M"]);
    s.ok(&["create", "other", "--size", "4M"]);
    let addr = common::http::free_addr();
    let srv = s.serve_with(&["--http", &addr]);
    let mut vm = nbd::Pipelined::open(&s.sock(), "vm").unwrap();
    vm.write_at(&[1u8; 65536], 0).unwrap();
    s.ok(&["snapshot", "create", "vm", "s1"]);
    let mut snap = nbd::Pipelined::open(&s.sock(), "vm@s1").unwrap();
    snap.read_at(&mut [0u8; 4096], 0).unwrap();
    drop(snap);
    nbd::Pipelined::open(&s.sock(), "other")
        .unwrap()
        .read_at(&mut [0u8; 4096], 0)
        .unwrap();
    let all = ["other", "vm", "vm@s1"];
    assert_eq!(stat_names(&s.json(&["stats"])), all);
    let api = |path: &str| {
        let (status, body) = common::http::http(&addr, "GET", path, &[], "");
        (
            status,
            serde_json::from_str::<serde_json::Value>(&body).ok(),
        )
    };
    assert_eq!(stat_names(&api("/api/v1/stats").1.unwrap()), all);
    assert_eq!(metric_disks(&addr), all);

    // Removed while a client has it open: refused, then forced (the
    // clients of `vm` and `vm@s1` are disconnected).
    assert!(s.fails(&["rm", "vm"]).contains("pass --force"));
    s.ok(&["rm", "vm", "--force"]);
    let gone = |when: &str| {
        assert_eq!(stat_names(&s.json(&["stats"])), ["other"], "stats {when}");
        let all = api("/api/v1/stats").1.unwrap();
        assert_eq!(stat_names(&all), ["other"], "/api/v1/stats {when}");
        assert_eq!(metric_disks(&addr), ["other"], "/metrics {when}");
        assert!(s.fails(&["stats", "vm"]).contains("no disk named 'vm'"));
        assert_eq!(api("/api/v1/stats/vm").0, 404, "/api/v1/stats/vm {when}");
    };
    gone("after rm");
    // The old client's I/O (whatever the removed disk answers it) does not
    // bring the statistics back under the old name.
    let _ = vm.write_at(&[2u8; 4096], 0);
    let _ = vm.read_at(&mut [0u8; 4096], 0);
    gone("after the removed disk's client did I/O");

    // A new disk of the same name starts at zero, and only its own I/O
    // counts, not the old client's.
    s.ok(&["create", "vm", "--size", "4M"]);
    let zero = |v: &serde_json::Value, what: &str| {
        let d = &v["vm"];
        for op in ["read", "write", "flush"] {
            assert_eq!(d[op]["commands"], 0, "{what}: {op} {d}");
        }
        assert_eq!(d["latency"]["all"]["count"], 0, "{what}: {d}");
    };
    zero(&s.json(&["stats", "vm"]), "stats vm after create");
    zero(&api("/api/v1/stats/vm").1.unwrap(), "/api/v1/stats/vm");
    let _ = vm.write_at(&[3u8; 4096], 0);
    zero(&s.json(&["stats", "vm"]), "after the old client's write");
    // A new client reaches the new disk.
    let mut new = nbd::Pipelined::open(&s.sock(), "vm").unwrap();
    let mut buf = [9u8; 65536];
    new.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "the new disk reads as zeros");
    new.write_at(&[4u8; 4096], 0).unwrap();
    drop(vm);
    let d = s.json(&["stats", "vm"])["vm"].clone();
    assert_eq!(d["write"]["commands"], 1, "{d}");
    assert_eq!(d["read"]["commands"], 1, "{d}");
    let body = common::http::metrics(&addr);
    assert!(
        body.lines()
            .any(|l| l == "strata_disk_commands_total{disk=\"vm\",op=\"write\"} 1"),
        "{body}"
    );
    drop(new);

    // A deleted snapshot's export goes too, even with a client on it (forced);
    // a new snapshot of its name is read afresh, from the new snapshot.
    s.ok(&["snapshot", "create", "vm", "s2"]);
    let mut old = nbd::Pipelined::open(&s.sock(), "vm@s2").unwrap();
    old.read_at(&mut [0u8; 4096], 0).unwrap();
    assert_eq!(stat_names(&s.json(&["stats"])), ["other", "vm", "vm@s2"]);
    s.ok(&["snapshot", "delete", "vm", "s2", "--force"]);
    assert_eq!(stat_names(&s.json(&["stats"])), ["other", "vm"]);
    assert_eq!(metric_disks(&addr), ["other", "vm"]);
    let _ = old.read_at(&mut [0u8; 4096], 0);
    assert_eq!(stat_names(&s.json(&["stats"])), ["other", "vm"]);
    let mut new = nbd::Pipelined::open(&s.sock(), "vm").unwrap();
    new.write_at(&[5u8; 4096], 0).unwrap();
    drop(new);
    s.ok(&["snapshot", "create", "vm", "s2"]);
    let mut again = nbd::Pipelined::open(&s.sock(), "vm@s2").unwrap();
    let mut buf = [0u8; 4096];
    again.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [5u8; 4096], "the new vm@s2 reads the new snapshot");
    let d = s.json(&["stats", "vm@s2"])["vm@s2"].clone();
    assert_eq!(d["read"]["commands"], 1, "{d}");
    drop((old, again));
    srv.stop();
}
