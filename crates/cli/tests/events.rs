//! The event log (docs/FORMAT.md §13, docs/OPERATIONS.md "Event log")
//! through the `strata` binary: every change of state, run by the CLI
//! itself or by a server, is listed by `strata events` with who asked and
//! how it ended (failures too, reads never); jobs, forced interlocks,
//! server starts, stops and unclean stops are logged; the log survives
//! restarts; the HTTP API lists it and logs its token and peer. Rotation
//! is the server crate's unit test (`events::tests`).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::http::{free_addr, http, wait_http};
use common::*;

use serde_json::Value;

/// The log, oldest first (the command lists the newest first).
fn events(s: &Store) -> Vec<Value> {
    let mut v = s.json(&["events", "--limit", "10000"]);
    let mut all = std::mem::take(v.as_array_mut().expect("events is an array"));
    all.reverse();
    all
}

/// `(kind, target, result)` of each event, oldest first.
fn summary(events: &[Value]) -> Vec<(String, String, String)> {
    events
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (f("kind"), f("target"), f("result"))
        })
        .collect()
}

fn ev(kind: &str, target: &str, result: &str) -> (String, String, String) {
    (kind.into(), target.into(), result.into())
}

/// `serve` with `extra`, once its start is logged (the control socket
/// and HTTP answer a moment before: the server logs its start once every
/// listener is up).
fn serve_logged(s: &Store, extra: &[&str]) -> Server {
    let starts = |s: &Store| {
        events(s)
            .iter()
            .filter(|e| e["kind"] == "server_start")
            .count()
    };
    let before = starts(s);
    let srv = s.serve_with(extra);
    eventually(
        "the server's start in the log",
        std::time::Duration::from_secs(30),
        || starts(s) > before,
    );
    srv
}

/// What the CLI run by this test's user is logged as.
fn me() -> String {
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    let name = run_ok("id", &["-un"]);
    format!("cli uid {uid} ({})", name.trim())
}

/// Changes made by the CLI itself (no server) are logged in order, each
/// with its user and result, a failed one with its error; reads are not.
#[test]
fn every_change_is_logged_with_who_asked_and_how_it_ended() {
    each_kind(|kind| {
        let s = Store::of(kind);
        s.ok(&["create", "vm1", "--size", "16M"]);
        s.ok(&["list"]);
        s.ok(&["info", "vm1"]);
        s.ok(&["snapshot", "create", "vm1@s1"]);
        s.fails_with(3, &["rm", "nosuch"]);
        s.ok(&["clone", "vm1@s1", "c1"]);
        s.ok(&["extend", "c1", "--size", "+1M"]);
        s.ok(&["rm", "c1"]);
        let all = events(&s);
        assert_eq!(
            summary(&all),
            [
                ev("create", "vm1", "ok"),
                ev("snapshot", "vm1@s1", "ok"),
                ev("remove", "nosuch", "not_found"),
                ev("clone", "c1", "ok"),
                ev("extend", "c1", "ok"),
                ev("remove", "c1", "ok"),
            ],
            "{all:#?}"
        );
        let me = me();
        for (i, e) in all.iter().enumerate() {
            assert_eq!(e["actor"], me.as_str(), "{e}");
            assert_eq!(e["seq"], i as u64 + 1, "{e}");
            assert!(
                e["time_unix_ms"].as_u64().unwrap() > 1_700_000_000_000,
                "{e}"
            );
        }
        let failed = &all[2];
        assert!(
            failed["error"].as_str().unwrap().contains("nosuch"),
            "{failed}"
        );
        assert_eq!(all[3]["detail"], "from vm1@s1");

        // The same, for people, newest first; and one disk's only.
        let text = s.ok(&["events", "--limit", "2"]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains(" UTC  remove  c1  ") && lines[0].ends_with(&format!("{me}  ok")),
            "{text}"
        );
        let about: Vec<String> =
            summary(s.json(&["events", "--target", "vm1"]).as_array().unwrap())
                .into_iter()
                .map(|(k, t, _)| format!("{k} {t}"))
                .collect();
        assert_eq!(about, ["snapshot vm1@s1", "create vm1"]);
        let e = s.fails_with(2, &["events", "--limit", "0"]);
        assert!(e.contains("--limit"), "{e}");
    });
}

/// Through a server: the control socket's peer is the actor, a long
/// command logs its job's start and end, a forced interlock names the
/// client it cut off, the server's start and stop are logged, and the log
/// survives restarts; a kill -9 is found as a recovery at the next start.
#[test]
fn served_changes_are_logged_and_survive_a_restart() {
    let s = Store::new();
    let srv = serve_logged(&s, &[]);
    s.ok(&["create", "vm", "--size", "16M"]);
    s.ok(&["snapshot", "create", "vm", "s1"]);
    s.ok(&["convert", "vm", "--type", "zeroedthick"]);
    s.fails_with(3, &["snapshot", "delete", "vm@nosuch"]);
    s.ok(&["create", "gone", "--size", "4M"]);
    {
        // A client has `gone` open: rm is refused, then forced.
        let _client = common::nbd::Pipelined::open(&s.sock(), "gone").unwrap();
        eventually(
            "the client listed",
            std::time::Duration::from_secs(10),
            || {
                s.json(&["info", "gone"])["clients"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty())
            },
        );
        s.fails_with(6, &["rm", "gone"]);
        s.ok(&["rm", "gone", "--force"]);
    }
    let me = me();
    let served = events(&s);
    assert_eq!(
        summary(&served),
        [
            ev("server_start", "", "ok"),
            ev("create", "vm", "ok"),
            ev("snapshot", "vm@s1", "ok"),
            ev("job_started", "vm", "ok"),
            ev("job_finished", "vm", "ok"),
            ev("snapshot_delete", "vm@nosuch", "not_found"),
            ev("create", "gone", "ok"),
            ev("remove", "gone", "refused"),
            ev("interlock", "gone", "ok"),
            ev("remove", "gone", "ok"),
        ],
        "{served:#?}"
    );
    assert_eq!(served[0]["actor"], "server");
    for e in &served[1..] {
        assert_eq!(e["actor"], me.as_str(), "{e}");
    }
    let job = served[4]["detail"].as_str().unwrap();
    assert!(
        job.starts_with("job ") && job.contains("convert vm to zeroedthick"),
        "{job}"
    );
    let cut = served[8]["detail"].as_str().unwrap();
    assert!(cut.contains("over nbd from local pid"), "{cut}");

    // A clean stop, read offline, then through the next server.
    srv.stop();
    let stopped = events(&s);
    assert_eq!(stopped.len(), served.len() + 1);
    assert_eq!(stopped[..served.len()], served[..]);
    assert_eq!(
        summary(&stopped[served.len()..]),
        [ev("server_stop", "", "ok")]
    );
    let srv = serve_logged(&s, &[]);
    s.ok(&["snapshot", "create", "vm@s2"]);
    let again = events(&s);
    assert_eq!(again[..stopped.len()], stopped[..]);
    assert_eq!(
        summary(&again[stopped.len()..]),
        [ev("server_start", "", "ok"), ev("snapshot", "vm@s2", "ok")],
        "no recovery after a clean stop: {again:#?}"
    );

    // Killed: the next start says so.
    srv.kill9();
    let _srv = serve_logged(&s, &[]);
    let after = events(&s);
    assert_eq!(after[..again.len()], again[..]);
    assert_eq!(
        summary(&after[again.len()..]),
        [ev("recovery", "", "ok"), ev("server_start", "", "ok")],
        "{after:#?}"
    );
    let why = after[again.len()]["detail"].as_str().unwrap();
    assert!(why.contains("did not stop cleanly"), "{why}");
    // Numbered without a gap across the restarts.
    for (i, e) in after.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1, "{e}");
    }
}

/// The HTTP API lists the log (newest first, by target, limited), logs
/// its actions with the token and the peer, and the dashboard's logins,
/// a wrong token as refused.
#[test]
fn the_api_lists_the_log_and_logs_its_token_and_peer() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "16M"]);
    s.ok(&["create", "other", "--size", "16M"]);
    let tok = s.dir.path().join("http.token");
    let addr = free_addr();
    let _srv = serve_logged(
        &s,
        &["--http", &addr, "--http-token", tok.to_str().unwrap()],
    );
    wait_http(&addr);
    let token = std::fs::read_to_string(&tok).unwrap().trim().to_string();
    let bearer = format!("Bearer {token}");
    let auth = [
        ("Authorization", bearer.as_str()),
        ("Content-Type", "application/json"),
    ];
    let (st, body) = http(
        &addr,
        "POST",
        "/api/v1/disks/vm/snapshots",
        &auth,
        r#"{"name": "web"}"#,
    );
    assert_eq!(st, 201, "{body}");
    let (st, _) = http(
        &addr,
        "GET",
        "/api/v1?login=1",
        &[("Authorization", "Bearer wrong-token-0123456789")],
        "",
    );
    assert_eq!(st, 200);
    let (st, _) = http(&addr, "GET", "/api/v1?login=1", &auth[..1], "");
    assert_eq!(st, 200);

    let (st, body) = http(&addr, "GET", "/api/v1/events", &[], "");
    assert_eq!(st, 200, "{body}");
    let newest: Vec<Value> = serde_json::from_str(&body).unwrap();
    let kinds: Vec<&str> = newest.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "login",
            "login",
            "snapshot",
            "server_start",
            "create",
            "create"
        ],
        "{body}"
    );
    let api = "api action-token from 127.0.0.1:";
    assert!(
        newest[2]["actor"].as_str().unwrap().starts_with(api),
        "{body}"
    );
    assert_eq!(newest[2]["target"], "vm@web");
    assert!(
        newest[0]["actor"].as_str().unwrap().starts_with(api),
        "{body}"
    );
    assert_eq!(newest[0]["result"], "ok");
    assert_eq!(newest[0]["detail"], "granted actions");
    assert_eq!(newest[1]["result"], "refused");
    assert_eq!(newest[1]["error"], "wrong token");
    assert!(newest[1]["actor"]
        .as_str()
        .unwrap()
        .starts_with("api from 127.0.0.1:"));
    // What the CLI prints, through the same server.
    assert_eq!(
        s.json(&["events"]),
        serde_json::from_str::<Value>(&body).unwrap()
    );

    let (st, body) = http(&addr, "GET", "/api/v1/events?target=vm&limit=1", &[], "");
    assert_eq!(st, 200, "{body}");
    let one: Vec<Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(one.len(), 1, "{body}");
    assert_eq!(one[0]["target"], "vm@web");
    let (st, body) = http(&addr, "GET", "/api/v1/events?limit=x", &[], "");
    assert_eq!(st, 400, "{body}");
}
