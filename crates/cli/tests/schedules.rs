//! Scheduled snapshots through the `strata` binary (docs/OPERATIONS.md,
//! "Scheduled snapshots"): a served disk snapshotted every second with
//! `--keep 2` gets its snapshots on time and loses the oldest, never a
//! user's snapshot nor one a linked clone came from; a group target; `ls
//! --json`; a schedule survives a restart and an overdue one runs once;
//! `rm` stops it; bad arguments are refused.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

use std::time::Duration;

/// A generous bound: runs every second must have happened within it.
const LIMIT: Duration = Duration::from_secs(60);

/// The events by `actor` of `kind`, oldest first.
fn events_by(s: &Store, kind: &str, actor: &str) -> Vec<serde_json::Value> {
    let mut v: Vec<_> = s
        .json(&["events", "--limit", "10000"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind && e["actor"] == actor)
        .cloned()
        .collect();
    v.reverse();
    v
}

/// Names of the form a schedule with `prefix` gives.
fn owned(names: &[String], prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = names
        .iter()
        .filter(|n| {
            n.strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|r| r.len() == 15 && r.as_bytes()[8] == b'-')
        })
        .cloned()
        .collect();
    v.sort();
    v
}

fn schedule(s: &Store, name: &str) -> serde_json::Value {
    s.json(&["schedule", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no schedule {name} listed"))
        .clone()
}

#[test]
fn a_fast_schedule_takes_and_expires_snapshots_on_time() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "16M"]);
    // A user's snapshots, one even starting with the schedule's prefix.
    s.ok(&["snapshot", "create", "vm@base"]);
    s.ok(&["snapshot", "create", "vm@fast-mine"]);
    let srv = s.serve();
    let out = s.ok(&[
        "schedule", "add", "fast", "--target", "vm", "--every", "1s", "--keep", "2",
    ]);
    assert!(!out.contains("no server"), "{out}");
    // Runs on time: 5 within a generous bound.
    eventually("five scheduled snapshots", LIMIT, || {
        events_by(&s, "snapshot", "schedule fast").len() >= 5
    });
    let taken = events_by(&s, "snapshot", "schedule fast");
    assert!(taken.iter().all(|e| e["result"] == "ok"), "{taken:?}");
    // About a second apart (bounds generous: not a measurement).
    let t: Vec<u64> = taken
        .iter()
        .map(|e| e["time_unix_ms"].as_u64().unwrap())
        .collect();
    let span = t[4] - t[0];
    assert!(
        (2_500..=30_000).contains(&span),
        "5 runs over {span} ms: {t:?}"
    );
    // The oldest expired: two of the schedule's left, the user's kept.
    eventually("two kept", LIMIT, || {
        owned(&s.snapshot_names("vm"), "fast").len() == 2
    });
    let names = s.snapshot_names("vm");
    assert!(names.contains(&"base".to_string()), "{names:?}");
    assert!(names.contains(&"fast-mine".to_string()), "{names:?}");
    // A run logs its deletion after the deletion is done, so the list
    // can show the third gone before the log has it (a fresh-clone run
    // read two of three): wait for the log too.
    eventually("three deletions logged", LIMIT, || {
        events_by(&s, "snapshot_delete", "schedule fast").len() >= 3
    });
    let deleted = events_by(&s, "snapshot_delete", "schedule fast");
    let first = taken[0]["target"].as_str().unwrap();
    assert!(
        deleted.iter().any(|e| e["target"] == first),
        "oldest {first} not deleted"
    );

    // ls --json: last and next run.
    let j = schedule(&s, "fast");
    assert_eq!(j["last_result"], "ok", "{j}");
    assert_eq!(j["target"], "vm");
    assert_eq!(j["kind"], "disk");
    let (last, next) = (
        j["last_run_unix_ms"].as_u64().unwrap(),
        j["next_run_unix_ms"].as_u64().unwrap(),
    );
    assert!(
        next > last && next - last <= 2_000,
        "last {last} next {next}"
    );
    let human = s.ok(&["schedule", "ls"]);
    assert!(
        human.contains("last run:") && human.contains("next run:"),
        "{human}"
    );

    // A snapshot a linked clone came from is kept, with a warning.
    let oldest = owned(&s.snapshot_names("vm"), "fast")[0].clone();
    s.ok(&["clone", &format!("vm@{oldest}"), "c1"]);
    eventually("the cloned snapshot reported kept", LIMIT, || {
        schedule(&s, "fast")["kept"]
            .as_array()
            .is_some_and(|k| k.iter().any(|n| n == oldest.as_str()))
    });
    assert!(s.snapshot_names("vm").contains(&oldest));
    let refused = events_by(&s, "snapshot_delete", "schedule fast");
    assert!(
        refused
            .iter()
            .any(|e| e["target"] == format!("vm@{oldest}") && e["result"] != "ok"),
        "{refused:?}"
    );

    // rm stops it.
    s.ok(&["schedule", "rm", "fast"]);
    let before = events_by(&s, "snapshot", "schedule fast").len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(events_by(&s, "snapshot", "schedule fast").len(), before);
    assert_eq!(s.json(&["schedule", "ls"]), serde_json::json!([]));
    srv.stop();
}

#[test]
fn a_group_schedule_takes_group_snapshots() {
    let s = Store::new();
    s.ok(&["create", "a", "--size", "8M"]);
    s.ok(&["create", "b", "--size", "8M"]);
    s.ok(&["group", "create", "app", "a", "b"]);
    let srv = s.serve();
    s.ok(&[
        "schedule", "add", "g", "--target", "app", "--every", "1s", "--keep", "1",
    ]);
    eventually("three group snapshots", LIMIT, || {
        events_by(&s, "group_snapshot", "schedule g").len() >= 3
    });
    eventually("one kept", LIMIT, || {
        s.json(&["group", "snapshot", "list", "app"])
            .as_array()
            .unwrap()
            .len()
            == 1
    });
    let snaps = s.json(&["group", "snapshot", "list", "app"]);
    let name = snaps[0]["name"].as_str().unwrap();
    assert!(name.starts_with("g-"), "{snaps}");
    assert_eq!(
        owned(&s.snapshot_names("a"), "g"),
        owned(&s.snapshot_names("b"), "g")
    );
    assert_eq!(schedule(&s, "g")["kind"], "group");
    s.ok(&["schedule", "rm", "g"]);
    srv.stop();
}

/// `--at` for a schedule whose next run is about half a period from now:
/// with `--every 1d`, twelve hours on; with `--every 1h`, thirty minutes
/// on (the minute of the hour). Periods are whole hours and days of the
/// clock, so a schedule at a fixed time would be due again whenever the
/// test's few seconds straddled one (one run in some 1,200 failed so, at
/// 23:00:00).
fn half_a_period_on(every: &str) -> (String, u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (h, m) = match every {
        "1d" => ((now / 3600 + 12) % 24, 0),
        "1h" => (0, (now / 60 + 30) % 60),
        _ => unreachable!("{every}"),
    };
    (format!("{h:02}:{m:02}"), h * 3600 + m * 60)
}

#[test]
fn schedules_survive_a_restart_and_an_overdue_one_runs_once() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    let (nightly_at, nightly_s) = half_a_period_on("1d");
    let (hourly_at, _) = half_a_period_on("1h");
    // Offline: only the file changes, and the output says so.
    let out = s.ok(&[
        "schedule",
        "add",
        "nightly",
        "--target",
        "vm",
        "--every",
        "1d",
        "--at",
        &nightly_at,
    ]);
    assert!(out.contains("no server runs this datastore"), "{out}");
    s.ok(&[
        "schedule", "add", "hourly", "--target", "vm", "--every", "1h", "--at", &hourly_at,
    ]);
    // Hourly made five hours ago: five runs missed, one is made.
    let p = s.path().join("schedules.json");
    let mut f: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    let now = f["schedules"][1]["created_unix_ms"].as_u64().unwrap();
    f["schedules"][1]["created_unix_ms"] = (now - 5 * 3_600_000).into();
    std::fs::write(&p, serde_json::to_vec(&f).unwrap()).unwrap();
    let srv = s.serve();
    eventually("the overdue run", LIMIT, || {
        !schedule(&s, "hourly")["last_run_unix_ms"].is_null()
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        owned(&s.snapshot_names("vm"), "hourly").len(),
        1,
        "one run, not five"
    );
    let j = schedule(&s, "hourly");
    assert!(j["next_run_unix_ms"].as_u64().unwrap() > j["last_run_unix_ms"].as_u64().unwrap());
    assert!(schedule(&s, "nightly")["last_run_unix_ms"].is_null());
    assert!(!s.ok(&["schedule", "ls"]).contains("no server"));
    srv.stop();
    let srv = s.serve();
    let names: Vec<_> = s
        .json(&["schedule", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["nightly", "hourly"]);
    assert_eq!(schedule(&s, "nightly")["at_s"], nightly_s);
    // Not due again after the restart.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(owned(&s.snapshot_names("vm"), "hourly").len(), 1);
    // run: now, through the server.
    let r = s.json(&["schedule", "run", "nightly"]);
    assert_eq!(r[0]["last_result"], "ok", "{r}");
    assert_eq!(owned(&s.snapshot_names("vm"), "nightly").len(), 1);
    srv.stop();
}

#[test]
fn bad_schedules_are_refused_clearly() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    let e = s.fails(&["schedule", "add", "x", "--target", "nope", "--every", "1h"]);
    assert!(e.contains("no disk or group 'nope'"), "{e}");
    let e = s.fails(&["schedule", "add", "x", "--target", "vm", "--every", "0"]);
    assert!(e.contains("above zero"), "{e}");
    let e = s.fails(&[
        "schedule", "add", "x", "--target", "vm", "--every", "1h", "--keep", "0",
    ]);
    assert!(e.contains("--keep 0"), "{e}");
    let e = s.fails(&[
        "schedule",
        "add",
        "x",
        "--target",
        "vm",
        "--every",
        "1h",
        "--quiesce",
    ]);
    assert!(e.contains("must be a group"), "{e}");
    let e = s.fails(&[
        "schedule", "add", "x", "--target", "vm", "--every", "1h", "--at", "25:00",
    ]);
    assert!(e.contains("HH:MM"), "{e}");
    s.ok(&["schedule", "add", "x", "--target", "vm", "--every", "1h"]);
    let e = s.fails(&["schedule", "add", "x", "--target", "vm", "--every", "2h"]);
    assert!(e.contains("exists already"), "{e}");
    let e = s.fails(&["schedule", "rm", "y"]);
    assert!(e.contains("no schedule 'y'"), "{e}");
    let e = s.fails(&["--json", "schedule", "run", "y"]);
    let j: serde_json::Value = serde_json::from_str(e.trim()).unwrap_or_else(|_| panic!("{e}"));
    assert!(j.to_string().contains("no schedule"), "{j}");
}

/// The dashboard's API lists the schedules as `schedule ls --json` does.
#[test]
fn the_api_lists_the_schedules() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    // Not due while the two are read.
    let (at, _) = half_a_period_on("1d");
    s.ok(&[
        "schedule", "add", "daily", "--target", "vm", "--every", "1d", "--at", &at,
    ]);
    let addr = common::http::free_addr();
    let _srv = s.serve_with(&["--http", &addr]);
    common::http::wait_http(&addr);
    let (st, body) = common::http::http(&addr, "GET", "/api/v1/schedules", &[], "");
    assert_eq!(st, 200, "{body}");
    let api: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(api, s.json(&["schedule", "ls"]), "{body}");
}
