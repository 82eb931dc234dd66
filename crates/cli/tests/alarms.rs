//! Capacity and alarms through the `strata` binary: `grow`, `alarm set|list`,
//! `status`; a running server moves alarms ok → warning → alarm as data is
//! imported and disks are created, and back after `grow`, runs the alarms'
//! commands with their environment, and exports the alarm gauges the
//! example Prometheus rules use (checked with promtool).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

use std::path::Path;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A datastore made with `init --capacity CAP`.
fn store_with_capacity(cap: &str) -> Store {
    let s = Store {
        dir: tempfile::tempdir().unwrap(),
    };
    s.ok(&["init", "--capacity", cap]);
    s
}

fn alarm_state(status: &serde_json::Value, kind: &str) -> String {
    let a = status["alarms"]
        .as_array()
        .unwrap_or_else(|| panic!("no alarms in {status}"))
        .iter()
        .find(|a| a["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} alarm in {status}"));
    for k in ["state", "percent", "warning_percent", "alarm_percent"] {
        assert!(a.get(k).is_some(), "{kind} alarm lacks {k}: {a}");
    }
    a["state"].as_str().unwrap().to_string()
}

fn states(s: &Store) -> (String, String) {
    let st = s.json(&["status"]);
    (alarm_state(&st, "usage"), alarm_state(&st, "overcommit"))
}

/// A raw image of `mib` MiB of non-zero bytes.
fn raw_image(dir: &Path, name: &str, mib: u64, seed: u8) -> String {
    let p = dir.join(name);
    let data: Vec<u8> = (0..mib * MIB)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed | 1)
        .collect();
    std::fs::write(&p, data).unwrap();
    p.display().to_string()
}

/// Wait (up to a minute: a deadline, not a measurement) until the alarm
/// log holds a line starting `head` (kind, previous, new state, datastore);
/// returns the percent the command was given.
fn wait_for_line(log: &Path, head: &str) -> u64 {
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(pct) = text.lines().find_map(|l| l.strip_prefix(head)) {
            return pct.trim().parse().unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the alarm command never wrote '{head}...'; it wrote:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of an unlabelled or `kind`-labelled sample in Prometheus text.

#[test]
fn capacity_and_alarm_commands_offline() {
    let s = store_with_capacity("64M");
    let st = s.json(&["status"]);
    assert_eq!(st["capacity_bytes"], 64 * MIB);
    assert_eq!(st["capacity_follows_fs"], false);
    assert_eq!(st["used_percent"], 0);
    assert_eq!(states(&s), ("ok".into(), "ok".into()));
    let human = s.ok(&["status"]);
    assert!(human.contains("usage alarm:") && human.contains("overcommit alarm:"));
    assert!(!human.contains("follows the file system"), "{human}");

    // The defaults, then a change, listed.
    let list = s.json(&["alarm", "list"]);
    assert_eq!(list[0]["kind"], "usage");
    assert_eq!(list[0]["warning_percent"], 75);
    assert_eq!(list[0]["alarm_percent"], 85);
    assert_eq!(list[1]["kind"], "overcommit");
    assert_eq!(list[1]["warning_percent"], 100);
    assert_eq!(list[1]["alarm_percent"], 200);
    s.ok(&[
        "alarm",
        "set",
        "overcommit",
        "--warning",
        "50",
        "--alarm",
        "150",
        "--exec",
        "true",
    ]);
    s.ok(&["create", "a", "--size", "40M"]);
    assert_eq!(states(&s), ("ok".into(), "warning".into()));
    let human = s.ok(&["status"]);
    assert!(
        human
            .lines()
            .any(|l| l.starts_with("overcommit alarm:") && l.contains("WARNING")),
        "{human}"
    );
    // Without --exec the command stays; --exec '' removes it.
    s.ok(&[
        "alarm",
        "set",
        "overcommit",
        "--warning",
        "70",
        "--alarm",
        "150",
    ]);
    // 40 MiB of 64 is 62%: below 70.
    let list = s.json(&["alarm", "list"]);
    assert_eq!(list[1]["exec"], "true");
    assert_eq!(list[1]["percent"], 62);
    assert_eq!(list[1]["warning_percent"], 70);
    assert_eq!(list[1]["state"], "ok");
    s.ok(&[
        "alarm",
        "set",
        "overcommit",
        "--warning",
        "60",
        "--alarm",
        "150",
        "--exec",
        "",
    ]);
    assert_eq!(
        s.json(&["alarm", "list"])[1]["exec"],
        serde_json::Value::Null
    );
    assert!(s.ok(&["alarm", "list"]).contains("overcommit"));

    // Mistakes: one clear line each.
    for (args, needle) in [
        (
            vec!["alarm", "set", "usage", "--warning", "90", "--alarm", "80"],
            "warning must come first",
        ),
        (
            vec!["alarm", "set", "usage", "--warning", "0", "--alarm", "80"],
            "above 0%",
        ),
        (
            vec!["alarm", "set", "usage", "--warning", "90", "--alarm", "120"],
            "above 100%",
        ),
        (
            vec!["alarm", "set", "disk", "--warning", "1", "--alarm", "2"],
            "use usage or overcommit",
        ),
        (vec!["grow", "--capacity", "0"], "--capacity fs"),
        (vec!["grow", "--capacity", "lots"], "not a size"),
    ] {
        let err = s.fails(&args);
        assert!(err.contains(needle), "{args:?}: '{err}' lacks '{needle}'");
        assert!(err.lines().count() <= 3, "{args:?}: too chatty: {err}");
    }

    // grow without --capacity explains; with it, sets; below used, refuses.
    let out = s.ok(&["grow"]);
    assert!(
        out.contains("explicit") && out.contains("--capacity fs"),
        "{out}"
    );
    let img = raw_image(s.dir.path(), "img", 8, 1);
    s.ok(&["import", &img, "data"]);
    let e = s.fails(&["grow", "--capacity", "4M"]);
    assert!(
        e.contains("cannot set the capacity") && e.contains("used"),
        "{e}"
    );
    assert_eq!(s.json(&["status"])["capacity_bytes"], 64 * MIB);
    let g = s.json(&["grow", "--capacity", "128M"]);
    assert_eq!(g["capacity_bytes"], 128 * MIB);
    assert_eq!(s.json(&["status"])["capacity_bytes"], 128 * MIB);
    // Back to following the file system.
    assert!(s
        .ok(&["grow", "--capacity", "fs"])
        .contains("follows the file system"));
    let st = s.json(&["status"]);
    assert_eq!(st["capacity_follows_fs"], true);
    assert!(s
        .ok(&["status"])
        .contains("capacity follows the file system"));
    let out = s.ok(&["grow"]);
    assert!(out.contains("growing the file system grows it"), "{out}");
    s.ok(&["check"]);
}

#[test]
fn served_alarms_rise_with_usage_and_overcommit_fall_after_grow_and_run_commands() {
    let s = store_with_capacity("64M");
    let log = s.dir.path().join("alarms.log");
    let exec = format!(
        "echo \"$STRATA_ALARM_KIND $STRATA_ALARM_PREVIOUS $STRATA_ALARM_STATE \
         $STRATA_DATASTORE $STRATA_ALARM_PERCENT\" >> '{}'",
        log.display()
    );
    for (kind, w, a) in [("usage", "40", "70"), ("overcommit", "100", "200")] {
        s.ok(&[
            "alarm",
            "set",
            kind,
            "--warning",
            w,
            "--alarm",
            a,
            "--exec",
            &exec,
        ]);
    }
    let addr = common::http::free_addr();
    let srv = s.serve_with(&["--http", &addr]);
    let ds = s.path().display().to_string();
    let line = |kind: &str, from: &str, to: &str| format!("{kind} {from} {to} {ds} ");

    // 32 MiB of data in 64 MiB: usage 50% (warning); 32 MiB provisioned.
    let img = raw_image(s.dir.path(), "a.raw", 32, 3);
    s.ok(&["import", &img, "a"]);
    let st = s.json(&["status"]);
    let pct = st["used_percent"].as_u64().unwrap();
    assert!((50..70).contains(&pct), "{st}");
    assert_eq!(states(&s), ("warning".into(), "ok".into()));
    // Seen while the import ran: anywhere in the warning band.
    let seen = wait_for_line(&log, &line("usage", "ok", "warning"));
    assert!((40..70).contains(&seen), "{seen}");

    // 48 MiB: 75% (alarm).
    let img = raw_image(s.dir.path(), "b.raw", 16, 4);
    s.ok(&["import", &img, "b"]);
    let pct = s.json(&["status"])["used_percent"].as_u64().unwrap();
    assert!(pct >= 75, "{pct}");
    assert_eq!(states(&s), ("alarm".into(), "ok".into()));
    let seen = wait_for_line(&log, &line("usage", "warning", "alarm"));
    assert!((70..=pct).contains(&seen), "{seen}");

    // Over-allocation: 48 + 20 MiB = 106%, then + 70 MiB = 215%.
    s.ok(&["create", "t1", "--size", "20M"]);
    assert_eq!(states(&s).1, "warning");
    assert_eq!(
        wait_for_line(&log, &line("overcommit", "ok", "warning")),
        106
    );
    s.ok(&["create", "t2", "--size", "70M"]);
    assert_eq!(states(&s).1, "alarm");
    assert_eq!(
        wait_for_line(&log, &line("overcommit", "warning", "alarm")),
        215
    );

    // The gauges say the same, and name every metric the example rules use.
    let body = common::http::metrics(&addr);
    assert_eq!(
        common::http::sample(&body, "strata_alarm_state{kind=\"usage\"}"),
        2.0
    );
    assert_eq!(
        common::http::sample(&body, "strata_alarm_state{kind=\"overcommit\"}"),
        2.0
    );
    assert_eq!(
        common::http::sample(&body, "strata_alarm_warning_percent{kind=\"usage\"}"),
        40.0
    );
    assert_eq!(
        common::http::sample(&body, "strata_alarm_alarm_percent{kind=\"overcommit\"}"),
        200.0
    );
    assert_eq!(
        common::http::sample(&body, "strata_datastore_used_percent"),
        pct as f64
    );
    let rules_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/prometheus/strata-alerts.yml");
    let rules = std::fs::read_to_string(&rules_path).unwrap();
    let mut used = 0;
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("strata_") {
            used += 1;
            assert!(
                body.contains(&format!("\n{word}")),
                "the example rules use {word}, which /metrics lacks"
            );
        }
    }
    assert!(used >= 4);

    // grow below what is used and reserved: refused while served.
    let e = s.fails(&["grow", "--capacity", "32M"]);
    assert!(e.contains("used"), "{e}");
    // grow to 1 GiB: both back to ok, each command told so.
    s.ok(&["grow", "--capacity", "1G"]);
    assert_eq!(states(&s), ("ok".into(), "ok".into()));
    let st = s.json(&["status"]);
    let pct = st["used_percent"].as_u64().unwrap();
    assert_eq!(wait_for_line(&log, &line("usage", "alarm", "ok")), pct);
    assert_eq!(wait_for_line(&log, &line("overcommit", "alarm", "ok")), 13);
    let body = common::http::metrics(&addr);
    assert_eq!(
        common::http::sample(&body, "strata_alarm_state{kind=\"usage\"}"),
        0.0
    );

    // grow returned only once durable: kill -9 keeps it.
    srv.kill9();
    let st = s.json(&["status"]);
    assert_eq!(st["capacity_bytes"], 1u64 << 30);
    assert_eq!(states(&s), ("ok".into(), "ok".into()));
    s.ok(&["check"]);
    // Each change ran its command once.
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 6, "{text}");
}

/// Wait (up to a minute: a deadline, not a measurement) until the alarm
/// log has `n` lines; they.
fn wait_for_lines(log: &Path, n: usize) -> Vec<String> {
    let t = Instant::now();
    loop {
        let lines = log_lines(log);
        if lines.len() >= n {
            return lines;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the alarm command wrote {} lines, not {n}: {lines:?}",
            lines.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Long enough for a server's alarm watcher to have evaluated its alarms
/// a few times (it does at its start, then every second).
const WATCHED: Duration = Duration::from_secs(3);

#[test]
fn a_restarted_server_reports_only_what_changed_since_the_last_one_reported() {
    each_kind(a_restarted_server_reports_only_changes_on);
}

fn a_restarted_server_reports_only_changes_on(kind: Kind) {
    let s = Store::of(kind);
    s.ok(&["grow", "--capacity", "64M"]);
    let log = s.dir.path().join("alarms.log");
    let exec = format!(
        "echo \"$STRATA_ALARM_KIND $STRATA_ALARM_PREVIOUS $STRATA_ALARM_STATE\" >> '{}'",
        log.display()
    );
    s.ok(&[
        "alarm",
        "set",
        "overcommit",
        "--warning",
        "50",
        "--alarm",
        "100",
        "--exec",
        &exec,
    ]);
    // 80 MiB provisioned on 64: 125%, in alarm before any server ran.
    s.ok(&["create", "a", "--size", "80M"]);
    assert_eq!(states(&s).1, "alarm");

    // The first server reports it, once.
    let srv = s.serve();
    assert_eq!(wait_for_lines(&log, 1), ["overcommit ok alarm"]);
    std::thread::sleep(WATCHED);
    srv.stop();
    assert_eq!(log_lines(&log), ["overcommit ok alarm"]);

    // Nothing changed: the next server's watcher runs, says nothing until
    // the state changes while it serves, then reports that change.
    let srv = s.serve();
    std::thread::sleep(WATCHED);
    assert_eq!(
        log_lines(&log),
        ["overcommit ok alarm"],
        "a restart with nothing changed ran the command again"
    );
    s.ok(&["rm", "a"]);
    // (`alarm list` through the server also refreshes an object store's
    // figures, which the watcher otherwise takes up to 30 s old.)
    assert_eq!(s.json(&["alarm", "list"])[1]["state"], "ok");
    assert_eq!(
        wait_for_lines(&log, 2),
        ["overcommit ok alarm", "overcommit alarm ok"]
    );
    srv.stop();

    // Changed while no server ran (ok -> warning): reported once at the
    // start; then warning -> alarm, from the state last reported.
    s.ok(&["create", "b", "--size", "40M"]);
    let srv = s.serve();
    assert_eq!(wait_for_lines(&log, 3)[2], "overcommit ok warning");
    std::thread::sleep(WATCHED);
    srv.stop();
    s.ok(&["create", "c", "--size", "40M"]);
    let srv = s.serve();
    assert_eq!(wait_for_lines(&log, 4)[3], "overcommit warning alarm");
    std::thread::sleep(WATCHED);
    srv.stop();
    assert_eq!(
        log_lines(&log),
        [
            "overcommit ok alarm",
            "overcommit alarm ok",
            "overcommit ok warning",
            "overcommit warning alarm"
        ]
    );
    s.ok(&["check"]);
}

#[test]
fn example_alerting_rules_pass_promtool() {
    if !have("promtool") {
        return;
    }
    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/prometheus/strata-alerts.yml");
    let out = run_ok("promtool", &["check", "rules", rules.to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");
}
