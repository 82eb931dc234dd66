//! The dashboard in a real browser (headless Chromium driven over
//! WebDriver by chromedriver) and the JSON API it uses (docs/API.md),
//! against a running `strata serve --http`. Screenshots of each view go to
//! `target/tmp/artefacts/dashboard/` (or `$STRATA_ARTEFACTS/dashboard/`).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::http::{free_addr, free_port, http, request, wait_http};
use common::tls::{curl, Ca};
use common::{eventually, have, Store};
use serde_json::{json, Value};

fn api_get(addr: &str, path: &str) -> Value {
    let (st, body) = http(addr, "GET", &format!("/api/v1{path}"), &[], "");
    assert_eq!(st, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// A chromedriver and one headless Chromium session.
struct Browser {
    /// chromedriver, leader of a process group that holds Chromium too.
    driver: Child,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        Browser::start_trusting(None)
    }

    /// A browser that also trusts the CA certificate `ca` (in the NSS
    /// database of a home of its own, as a user would add it).
    fn start_trusting(ca: Option<&std::path::Path>) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let home = profile.path().join("home");
        let nssdb = home.join(".pki/nssdb");
        std::fs::create_dir_all(&nssdb).unwrap();
        if let Some(ca) = ca {
            let db = format!("sql:{}", nssdb.display());
            common::run_ok("certutil", &["-N", "-d", &db, "--empty-password"]);
            common::run_ok(
                "certutil",
                &[
                    "-A",
                    "-d",
                    &db,
                    "-n",
                    "strata-test-ca",
                    "-t",
                    "C,,",
                    "-i",
                    ca.to_str().unwrap(),
                ],
            );
        }
        let port = free_port();
        use std::os::unix::process::CommandExt as _;
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .env("HOME", &home)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let base = format!("127.0.0.1:{port}");
        let t = Instant::now();
        loop {
            if std::net::TcpStream::connect(&base).is_ok() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1280,1400",
                     format!("--user-data-dir={}", profile.path().join("profile").display())]
        }}}});
        let mut b = Browser {
            driver,
            base,
            session: String::new(),
            _profile: profile,
        };
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().expect("a session").to_string();
        b
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.try_call(method, path, body)
            .unwrap_or_else(|(st, out)| panic!("webdriver {method} {path}: {st} {out}"))
    }

    fn try_call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, (u16, String)> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let (st, out) = http(
            &self.base,
            method,
            path,
            &[("Content-Type", "application/json")],
            &body,
        );
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        if st != 200 {
            return Err((st, out));
        }
        Ok(v["value"].clone())
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    fn go(&self, url: &str) {
        self.call("POST", &self.s("/url"), Some(json!({ "url": url })));
    }

    fn js(&self, script: &str) -> Value {
        self.call(
            "POST",
            &self.s("/execute/sync"),
            Some(json!({"script": script, "args": []})),
        )
    }

    fn element(&self, css: &str) -> String {
        let v = self.call(
            "POST",
            &self.s("/element"),
            Some(json!({"using": "css selector", "value": css})),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .expect("an element")
            .to_string()
    }

    fn click(&self, css: &str) {
        let e = self.element(css);
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/click")),
            Some(json!({})),
        );
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css);
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/clear")),
            Some(json!({})),
        );
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/value")),
            Some(json!({ "text": text })),
        );
    }

    fn text(&self, css: &str) -> String {
        self.js(&format!(
            "const e = document.querySelector({}); return e ? e.textContent : null;",
            Value::String(css.into())
        ))
        .as_str()
        .unwrap_or("")
        .to_string()
    }

    /// Poll `cond` (JavaScript returning a boolean) until true.
    fn wait(&self, what: &str, cond: &str) {
        let t = Instant::now();
        loop {
            if self.js(&format!(
                "try {{ return !!({cond}); }} catch (e) {{ return false; }}"
            )) == json!(true)
            {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the page never showed {what} ({cond}); after {} updates it shows: {}",
                self.js("return document.body.dataset.updates || 'no'"),
                self.js("return document.body.innerText")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, name: &str) {
        let b64 = self.call("GET", &self.s("/screenshot"), None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let dir = std::env::var_os("STRATA_ARTEFACTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("artefacts"))
            .join("dashboard");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

impl Drop for Browser {
    /// Also while a failed assertion unwinds: nothing here may panic, and
    /// Chromium goes with its driver's process group.
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = request(&self.base, "DELETE", &self.s(""), &[], "");
        }
        // SAFETY: kill(2) of the process group this test started.
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// Two disks, a snapshot tree three levels deep and a linked clone, seen
/// in Chromium: names, sizes and the tree; live I/O and histograms that
/// change under fio without a reload; a snapshot taken from the page with
/// the token, refused without it; a confirmation that can say no.
#[test]
fn the_dashboard_shows_the_datastore_and_acts_with_the_token_only() {
    if !have("chromium") || !have("chromedriver") || !have("fio") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm1", "--size", "64M"]);
    s.ok(&["create", "vm2", "--size", "32M", "--type", "zeroedthick"]);
    for snap in ["base", "patched", "tested"] {
        s.ok(&[
            "snapshot",
            "create",
            "vm1",
            snap,
            "--description",
            &format!("{snap} state"),
        ]);
    }
    s.ok(&["clone", "vm1@patched", "lab"]);
    s.ok(&["group", "create", "pair", "vm2", "lab"]);
    let tok = s.dir.path().join("http.token");
    let addr = free_addr();
    let _srv = s.serve_with(&["--http", &addr, "--http-token", tok.to_str().unwrap()]);
    wait_http(&addr);
    let token = std::fs::read_to_string(&tok).unwrap().trim().to_string();

    let b = Browser::start();
    b.go(&format!("http://{addr}/#token={token}"));
    b.wait(
        "the disk table",
        "document.querySelector('#disks tr[data-disk=\"lab\"]')",
    );
    let row = |d: &str| b.text(&format!("#disks tr[data-disk=\"{d}\"]"));
    assert!(row("vm1").contains("64.0 MiB"), "{}", row("vm1"));
    assert!(row("vm2").contains("32.0 MiB") && row("vm2").contains("zeroedthick"));
    assert!(row("lab").contains("vm1@patched"), "{}", row("lab"));
    assert!(b.text("#gauges").contains("provisioned"));
    assert!(b.text("#alarms").contains("usage"));
    // The token left the address bar (and went nowhere else).
    assert_eq!(b.js("return location.hash"), json!("#/"));
    assert!(b.text("#lock").contains("unlocked"));
    b.wait("exclusive bytes", "document.querySelector('#disks tr[data-disk=\"vm1\"] td:nth-child(5)').textContent !== '-'");
    b.screenshot("overview");

    // A consistency group: its disks, and a group snapshot from the page.
    let group = || b.text("#groups tr[data-group=\"pair\"]");
    assert!(
        group().contains("vm2, lab") && group().contains("none"),
        "{}",
        group()
    );
    b.type_into("#groups tr[data-group=\"pair\"] input", "web-cut");
    b.click("#groups tr[data-group=\"pair\"] form button");
    b.wait(
        "the group snapshot",
        "document.querySelector('#groups li[data-group-snapshot=\"web-cut\"]')",
    );
    assert!(group().contains("crash"), "{}", group());
    b.js("document.querySelector('#groups').scrollIntoView()");
    b.screenshot("groups");
    // The event log's table: the page's own action, by its token, and
    // no cell's text wider than its cell.
    b.wait(
        "the group snapshot in the events",
        "document.querySelector('#events tbody').textContent.includes('group_snapshot')",
    );
    let events = b.text("#events");
    assert!(
        events.contains("pair@web-cut") && events.contains("api action-token from 127.0.0.1:"),
        "{events}"
    );
    assert_eq!(
        b.js("return Array.from(document.querySelectorAll('#events td')).filter((td) => td.scrollWidth > td.clientWidth + 1).length"),
        json!(0),
        "{events}"
    );
    b.js("document.querySelector('#events').scrollIntoView()");
    b.screenshot("events");
    for d in ["vm2", "lab"] {
        assert!(s.snapshot_names(d).contains(&"web-cut".to_string()));
    }

    // One disk: the tree, three levels deep, the live state under 'tested'.
    b.js("location.hash = '#/disk/vm1'; window.__sameLoad = 42;");
    b.wait(
        "the snapshot tree",
        "document.querySelector('#tree li[data-snapshot=\"tested\"]')",
    );
    assert_eq!(
        b.js("return !!document.querySelector('li[data-snapshot=\"base\"] > ul > li[data-snapshot=\"patched\"] > ul > li[data-snapshot=\"tested\"] > ul > #you-are-here')"),
        json!(true),
        "tree: {}",
        b.text("#tree")
    );
    assert!(b.text("#tree").contains("tested state"));

    // Live I/O: fio writes; IOPS and the histograms move without a reload.
    // No client has used vm1 yet: no histograms, and the page says so.
    b.wait(
        "the live I/O note",
        "document.querySelector('#live-note').textContent.includes('no client')",
    );
    let total = |b: &Browser| {
        b.js("const e = document.querySelector('#hist-io_length'); return e ? Number(e.dataset.total) : 0")
            .as_f64()
            .unwrap()
    };
    let before = total(&b);
    let mut fio = Command::new("fio")
        .args([
            "--name=dash",
            "--ioengine=nbd",
            &format!("--uri={}", s.uri("vm1")),
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--iodepth=4",
            "--time_based",
            "--runtime=6",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    b.wait(
        "write IOPS while fio runs",
        "parseFloat(document.querySelector('#iops-write b').textContent) > 0",
    );
    b.wait("more I/Os in the histograms", &format!(
        "document.querySelector('#hist-io_length') && Number(document.querySelector('#hist-io_length').dataset.total) > {before}"
    ));
    assert!(
        b.js("return document.querySelectorAll('#hist-io_length .bar.write').length > 0 && [...document.querySelectorAll('#hist-io_length .bar.write')].some(e => parseFloat(e.style.height) > 0)")
            == json!(true)
    );
    b.screenshot("disk-under-io");
    assert!(fio.wait().unwrap().success());
    assert!(total(&b) > before);
    assert_eq!(
        b.js("return window.__sameLoad"),
        json!(42),
        "the page reloaded"
    );

    // A snapshot from the page, with the token.
    b.type_into("#snap-name", "from-web");
    b.type_into("#snap-desc", "taken in the browser");
    b.click("#snap-create");
    b.wait(
        "the action's answer",
        "document.querySelector('#msg').textContent.includes('done')",
    );
    assert!(s.snapshot_names("vm1").contains(&"from-web".to_string()));
    b.wait(
        "the new snapshot in the tree",
        "document.querySelector('#tree li[data-snapshot=\"from-web\"]')",
    );

    // A destructive action asks first; 'cancel' leaves everything as it was.
    b.click("#tree li[data-snapshot=\"base\"] > .node button.revert");
    b.wait(
        "the confirmation",
        "document.querySelector('#confirm').open",
    );
    assert!(b.text("#confirm-text").contains("discarded"));
    b.screenshot("confirm");
    b.click("#confirm-cancel");
    b.wait(
        "the cancel",
        "document.querySelector('#msg').textContent.includes('cancelled')",
    );
    let info = s.json(&["info", "vm1"]);
    assert_eq!(info["current_snapshot"], "from-web", "{info}");

    // Without the token the same action is refused, by the server.
    b.click("#lock button");
    b.wait("the lock", "document.querySelector('#unlock')");
    b.type_into("#snap-name", "no-token");
    b.click("#snap-create");
    b.wait(
        "the refusal",
        "document.querySelector('#msg').textContent.includes('refused')",
    );
    assert!(b.text("#msg").contains("token"), "{}", b.text("#msg"));
    b.screenshot("refused-without-token");
    assert!(!s.snapshot_names("vm1").contains(&"no-token".to_string()));

    // Unlocked again with the token pasted in; a confirmed convert runs
    // as a job, which the overview lists with its progress.
    b.click("#unlock");
    b.wait(
        "the token dialog",
        "document.querySelector('#token-dialog').open",
    );
    b.type_into("#token-input", &token);
    b.click("#token-ok");
    b.wait(
        "the unlocked state",
        "document.querySelector('#lock').textContent.includes('unlocked')",
    );
    b.js("location.hash = '#/disk/vm2'");
    b.wait(
        "vm2's page",
        "document.querySelector('#disk-title').textContent === 'vm2'",
    );
    b.click("#convert-go");
    b.wait(
        "the confirmation",
        "document.querySelector('#confirm').open",
    );
    b.click("#confirm-ok");
    b.wait(
        "the job",
        "document.querySelector('#msg').textContent.includes('job')",
    );
    b.js("location.hash = '#/'");
    b.wait(
        "the finished job in the list",
        "[...document.querySelectorAll('#jobs tr[data-job]')].some(r => r.textContent.includes('convert vm2 to thin') && r.textContent.includes('done') && r.querySelector('progress').value === 100)",
    );
    b.screenshot("jobs");
    assert_eq!(s.json(&["info", "vm2"])["provisioning"], "thin");
}

/// Each read path answers what the CLI prints with --json; actions need
/// the token, from this origin; errors are JSON with the CLI's kinds.
#[test]
fn the_api_answers_as_the_cli_does_and_guards_its_actions() {
    let s = Store::new();
    s.ok(&["create", "d", "--size", "64M"]);
    s.ok(&["snapshot", "create", "d", "s1"]);
    s.ok(&["snapshot", "create", "d", "s2", "--description", "second"]);
    s.ok(&["clone", "d@s1", "c"]);
    s.ok(&["create", "e", "--size", "8M"]);
    s.ok(&["group", "create", "g", "c", "e"]);
    s.ok(&["group", "snapshot", "g", "gs1"]);
    let tok = s.dir.path().join("tok");
    let addr = free_addr();
    let srv = s.serve_with(&["--http", &addr, "--http-token", tok.to_str().unwrap()]);
    wait_http(&addr);
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&tok).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let token = std::fs::read_to_string(&tok).unwrap().trim().to_string();

    for (path, cli) in [
        ("/status", vec!["status"]),
        ("/disks", vec!["list"]),
        ("/disks/d", vec!["info", "d"]),
        ("/disks/c", vec!["info", "c"]),
        ("/disks/d/snapshots", vec!["snapshot", "list", "d"]),
        (
            "/disks/d/changes?from=s1&to=s2",
            vec!["diff", "d@s2", "--from", "s1"],
        ),
        (
            "/disks/c/changes?from=d%40s1",
            vec!["diff", "c", "--from", "d@s1"],
        ),
        ("/alarms", vec!["alarm", "list"]),
        ("/jobs", vec!["jobs"]),
        ("/groups", vec!["group", "list"]),
        ("/groups/g", vec!["group", "info", "g"]),
        (
            "/groups/g/snapshots",
            vec!["group", "snapshot", "list", "g"],
        ),
    ] {
        // Figures that move on their own (checkpoints) may differ between
        // two reads: equal once in a few tries.
        let same = (0..5).any(|_| api_get(&addr, path) == s.json(&cli));
        assert!(same, "{path}: {} vs {}", api_get(&addr, path), s.json(&cli));
    }
    let v = api_get(&addr, "");
    assert_eq!(v["api"], 1);
    assert_eq!(v["actions"], true);
    // Statistics exist once a client used an export.
    if have("qemu-io") {
        common::run_ok(
            "qemu-io",
            &["-f", "raw", "-r", "-c", "read 0 4k", &s.uri("d")],
        );
        let stats = api_get(&addr, "/stats");
        let cli = s.json(&["stats"]);
        assert_eq!(stats["d"]["read"], cli["d"]["read"], "{stats}");
        assert_eq!(stats["d"]["read"]["commands"], 1, "{stats}");
        assert_eq!(api_get(&addr, "/stats/d")["d"]["read"]["commands"], 1);
    }

    // Errors: JSON, with the CLI's kind and message.
    let (st, body) = http(&addr, "GET", "/api/v1/disks/d/changes", &[], "");
    assert_eq!(st, 400, "changes need ?from: {body}");
    let (st, body) = http(&addr, "GET", "/api/v1/disks/d/changes?from=gone", &[], "");
    assert_eq!(st, 404, "{body}");
    assert!(body.contains("take a full one"), "{body}");
    let (st, body) = http(&addr, "GET", "/api/v1/disks/nope", &[], "");
    assert_eq!(st, 404);
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["kind"], "not_found");
    let cli = s.fails(&["info", "nope"]);
    assert!(
        cli.contains(e["error"]["message"].as_str().unwrap()),
        "{cli} / {body}"
    );
    assert_eq!(http(&addr, "GET", "/api/v1/nothing", &[], "").0, 404);
    assert_eq!(http(&addr, "PUT", "/api/v1/status", &[], "").0, 405);
    assert_eq!(http(&addr, "GET", "/api/v1/disks/d/extend", &[], "").0, 405);

    let bearer = format!("Bearer {token}");
    let js = ("Content-Type", "application/json");
    let snap = |headers: &[(&str, &str)], name: &str| {
        http(
            &addr,
            "POST",
            "/api/v1/disks/d/snapshots",
            headers,
            &json!({ "name": name }).to_string(),
        )
    };
    // No token, a wrong one, another origin, a cross-site fetch, a form
    // post: refused, and nothing changed.
    assert_eq!(snap(&[js], "x1").0, 401);
    assert_eq!(
        snap(
            &[js, ("Authorization", "Bearer wrong-token-0123456789")],
            "x2"
        )
        .0,
        403
    );
    assert_eq!(
        snap(
            &[
                js,
                ("Authorization", &bearer),
                ("Origin", "http://evil.example")
            ],
            "x3"
        )
        .0,
        403
    );
    assert_eq!(
        snap(
            &[
                js,
                ("Authorization", &bearer),
                ("Sec-Fetch-Site", "cross-site")
            ],
            "x4"
        )
        .0,
        403
    );
    assert_eq!(
        snap(
            &[("Content-Type", "text/plain"), ("Authorization", &bearer)],
            "x5"
        )
        .0,
        415
    );
    // A name that resolves here is not enough (DNS rebinding).
    assert_eq!(
        http(
            &addr,
            "GET",
            "/api/v1/status",
            &[("Host", "evil.example:80")],
            ""
        )
        .0,
        421
    );
    assert_eq!(s.snapshot_names("d"), ["s1", "s2"]);

    // With the token: snapshot, clone, extend, delete, revert; each as the CLI.
    let (st, body) = snap(
        &[
            js,
            ("Authorization", &bearer),
            ("Origin", &format!("http://{addr}")),
        ],
        "s3",
    );
    assert_eq!(st, 201, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["name"], "s3");
    let act = |method: &str, path: &str, body: Value| {
        http(
            &addr,
            method,
            &format!("/api/v1{path}"),
            &[js, ("Authorization", &bearer)],
            &body.to_string(),
        )
    };
    assert_eq!(
        act(
            "POST",
            "/disks/d/clones",
            json!({"name": "c2", "snapshot": "s3"})
        )
        .0,
        201
    );
    assert_eq!(s.json(&["info", "c2"])["parent"], "d@s3");
    let (st, body) = act("POST", "/disks/d/extend", json!({"size": "128M"}));
    assert_eq!(st, 200, "{body}");
    assert_eq!(s.json(&["info", "d"])["size_bytes"], 128u64 << 20);
    let (st, body) = act("POST", "/disks/d/snapshots", json!({"name": "s3"}));
    assert_eq!(st, 409, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["kind"],
        "already_exists"
    );
    assert_eq!(
        act("POST", "/disks/d/snapshots/s2/revert", json!(null)).0,
        200
    );
    assert_eq!(s.json(&["info", "d"])["current_snapshot"], "s2");
    // Deleting a snapshot with a linked clone is refused, naming it
    // (docs/INTERLOCKS.md), unless forced (the clone keeps what it
    // shares, its parent shown as deleted).
    let (st, body) = act("DELETE", "/disks/d/snapshots/s3", json!(null));
    assert_eq!(st, 409, "{body}");
    assert!(body.contains("c2"), "{body}");
    let force = json!({"force": true});
    assert_eq!(act("DELETE", "/disks/d/snapshots/s3", force).0, 200);
    assert_eq!(s.snapshot_names("d"), ["s1", "s2"]);
    assert_eq!(s.json(&["info", "c2"])["parent"], "d@s3");
    assert_eq!(s.json(&["info", "c2"])["parent_deleted"], true);
    // A rename over HTTP; the clone's parent follows.
    let (st, body) = act("POST", "/disks/d/snapshots/s2/rename", json!({"to": "s4"}));
    assert_eq!(st, 200, "{body}");
    assert_eq!(s.snapshot_names("d"), ["s1", "s4"]);
    // Disks made, copied and removed over HTTP as with the CLI.
    let (st, body) = act("POST", "/disks", json!({"name": "web1", "size": "8M"}));
    assert_eq!(st, 201, "{body}");
    assert_eq!(s.json(&["info", "web1"])["size_bytes"], 8 << 20);
    let (st, body) = act(
        "POST",
        "/disks/web1/clones",
        json!({"name": "web2", "full": true}),
    );
    assert_eq!(st, 202, "a full clone is a job: {body}");
    eventually("the full clone", std::time::Duration::from_secs(30), || {
        s.cmd(&["info", "web2"]).status.success()
    });
    for d in ["web1", "web2"] {
        let (st, body) = act("DELETE", &format!("/disks/{d}"), json!(null));
        assert_eq!(st, 200, "{body}");
    }
    assert!(!s.disk_names().contains(&"web1".to_string()));
    // An image at a path the server reads, imported as a job.
    let img = s.dir.path().join("img.raw");
    std::fs::write(&img, vec![7u8; 1 << 20]).unwrap();
    let body = json!({"path": img.to_str().unwrap(), "name": "imp", "format": "raw"});
    let (st, body) = act("POST", "/imports", body);
    assert_eq!(st, 202, "an import is a job: {body}");
    eventually("the import", std::time::Duration::from_secs(30), || {
        s.cmd(&["info", "imp"]).status.success()
    });
    assert_eq!(s.json(&["info", "imp"])["size_bytes"], 1 << 20);
    // The same image again onto "imp" (`--base`): it shares everything.
    let used = s.json(&["status"])["used_bytes"].as_u64().unwrap();
    let body = json!({"path": img.to_str().unwrap(), "name": "imp2", "base": "imp"});
    let (st, body) = act("POST", "/imports", body);
    assert_eq!(st, 202, "an import is a job: {body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_u64()
        .unwrap();
    s.wait_job(id, "done", std::time::Duration::from_secs(30));
    assert_eq!(s.json(&["status"])["used_bytes"].as_u64().unwrap(), used);
    let (st, body) = act("POST", "/imports", json!({"path": "img.raw", "name": "x"}));
    assert_eq!(st, 400, "a relative path: {body}");
    assert_eq!(
        act("POST", "/disks/d/extend", json!({"size": "lots"})).0,
        400
    );
    // Group snapshots: taken (the group's hook only: none is named over
    // HTTP), reverted, deleted, each on every member.
    let (st, body) = act(
        "POST",
        "/groups/g/snapshots",
        json!({"name": "gs2", "quiesce_hook": "touch /tmp/pwned", "max_pause_ms": 5000}),
    );
    assert_eq!(st, 201, "{body}");
    let gs = serde_json::from_str::<Value>(&body).unwrap();
    assert_eq!(gs["members"].as_array().unwrap().len(), 2, "{gs}");
    assert!(gs["quiesce"].is_null(), "{gs}");
    assert_eq!(s.snapshot_names("e"), ["gs1", "gs2"]);
    assert_eq!(
        act("POST", "/groups/g/snapshots/gs1/revert", json!({})).0,
        200
    );
    assert_eq!(s.json(&["info", "e"])["current_snapshot"], "gs1");
    assert_eq!(act("DELETE", "/groups/g/snapshots/gs2", json!(null)).0, 200);
    assert_eq!(s.snapshot_names("e"), ["gs1"]);
    let (st, body) = act("DELETE", "/disks/e/snapshots/gs1", json!(null));
    assert_eq!(st, 409, "{body}");
    assert!(body.contains("group snapshot 'g@gs1'"), "{body}");
    let (st, body) = act("POST", "/disks/d/defrag", json!({}));
    assert_eq!(st, 202, "{body}");
    let job = serde_json::from_str::<Value>(&body).unwrap();
    assert!(job["what"].as_str().unwrap().contains("defrag d"), "{job}");
    // A body too large, and one that is not JSON.
    let big = format!("{{\"name\": \"{}\"}}", "a".repeat(70_000));
    assert_eq!(
        http(
            &addr,
            "POST",
            "/api/v1/disks/d/snapshots",
            &[js, ("Authorization", &bearer)],
            &big
        )
        .0,
        413
    );
    assert_eq!(
        http(
            &addr,
            "POST",
            "/api/v1/disks/d/snapshots",
            &[js, ("Authorization", &bearer)],
            "{nope"
        )
        .0,
        400
    );
    srv.stop();

    // A server without --http-token: reads only.
    let addr = free_addr();
    let _srv = s.serve_with(&["--http", &addr]);
    wait_http(&addr);
    assert_eq!(api_get(&addr, "")["actions"], false);
    let (st, body) = http(
        &addr,
        "POST",
        "/api/v1/disks/d/snapshots",
        &[js, ("Authorization", &bearer)],
        "{\"name\": \"s9\"}",
    );
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("--http-token"), "{body}");
    // The page itself is served with a strict content policy.
    let (st, page) = http(&addr, "GET", "/", &[], "");
    assert_eq!(st, 200);
    assert!(page.contains("/app.js"));
}

/// The API's actions on an object-store datastore, as on a local one:
/// snapshot, linked clone, extend, revert, delete, and a full clone as a
/// job; what the kind cannot do is refused with the table's reason; its
/// alarms read as the CLI's.
#[test]
fn the_api_acts_on_an_object_store_as_on_a_local_datastore() {
    if strata_s3::testing::shared().is_none() {
        return;
    }
    let s = Store::of(common::Kind::ObjectStore);
    s.ok(&["create", "d", "--size", "16M"]);
    let tok = s.dir.path().join("tok");
    let addr = free_addr();
    let _srv = s.serve_with(&["--http", &addr, "--http-token", tok.to_str().unwrap()]);
    wait_http(&addr);
    let token = std::fs::read_to_string(&tok).unwrap().trim().to_string();
    let bearer = format!("Bearer {token}");
    let act = |method: &str, path: &str, body: Value| {
        http(
            &addr,
            method,
            &format!("/api/v1{path}"),
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &bearer),
            ],
            &body.to_string(),
        )
    };
    let (st, body) = act("POST", "/disks/d/snapshots", json!({"name": "s1"}));
    assert_eq!(st, 201, "{body}");
    let (st, body) = act(
        "POST",
        "/disks/d/clones",
        json!({"name": "c", "snapshot": "s1"}),
    );
    assert_eq!(st, 201, "{body}");
    assert_eq!(s.json(&["info", "c"])["parent"], "d@s1");
    let (st, body) = act("POST", "/disks/d/extend", json!({"size": "32M"}));
    assert_eq!(st, 200, "{body}");
    assert_eq!(s.json(&["info", "d"])["size_bytes"], 32u64 << 20);
    let (st, body) = act("POST", "/disks/d/snapshots/s1/revert", json!(null));
    assert_eq!(st, 200, "{body}");
    assert_eq!(s.json(&["info", "d"])["size_bytes"], 16u64 << 20);
    let (st, body) = act("POST", "/disks/d/snapshots", json!({"name": "s2"}));
    assert_eq!(st, 201, "{body}");
    assert_eq!(act("DELETE", "/disks/d/snapshots/s2", json!(null)).0, 200);
    // What an object store cannot do, with the reason.
    let (st, body) = act(
        "POST",
        "/disks/d/convert",
        json!({"type": "eagerzeroedthick"}),
    );
    // Unsupported (docs/ERRORS.md): 501, whatever the disk's state.
    assert_eq!(st, 501, "{body}");
    assert!(body.contains("thin is all there is"), "{body}");
    let (st, body) = act("POST", "/disks/d/defrag", json!({}));
    assert_eq!(st, 501, "{body}");
    assert!(body.contains("lays them out itself"), "{body}");
    let same = (0..5).any(|_| api_get(&addr, "/alarms") == s.json(&["alarm", "list"]));
    assert!(
        same,
        "{} vs {}",
        api_get(&addr, "/alarms"),
        s.json(&["alarm", "list"])
    );
}

/// An object-store datastore (SeaweedFS): the API answers its `--json`
/// shapes, and the page shows its disks with owner and generation and its
/// snapshot tree (ids and milliseconds in that datastore's listing).
#[test]
fn the_dashboard_reads_an_object_store_datastore() {
    if strata_s3::testing::shared().is_none()
        || !have("qemu-io")
        || !have("chromium")
        || !have("chromedriver")
    {
        return;
    }
    let u = format!(
        "s3://strata-cli-test/dashboard-{:08x}",
        rand::random::<u32>()
    );
    let s = Store::empty();
    s.ok(&["init", "--object-store", &u]);
    s.ok(&["create", "vm", "--size", "16M"]);
    let addr = free_addr();
    let _srv = s.serve_with(&["--http", &addr]);
    wait_http(&addr);
    common::run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 0 1M",
            "-c",
            "flush",
            &s.uri("vm"),
        ],
    );
    s.ok(&["snapshot", "create", "vm", "first", "--description", "one"]);
    s.ok(&["snapshot", "create", "vm", "second"]);
    for (path, cli) in [
        ("/disks", vec!["list"]),
        ("/disks/vm", vec!["info", "vm"]),
        ("/disks/vm/snapshots", vec!["snapshot", "list", "vm"]),
        (
            "/disks/vm/changes?from=first&to=second",
            vec!["diff", "vm@second", "--from", "first"],
        ),
        (
            "/disks/vm/changes?from=first&totals=1",
            vec!["diff", "vm", "--from", "first", "--totals"],
        ),
    ] {
        let same = (0..5).any(|_| api_get(&addr, path) == s.json(&cli));
        assert!(same, "{path}: {} vs {}", api_get(&addr, path), s.json(&cli));
    }
    assert_eq!(api_get(&addr, "")["shared"], true);
    // I/O statistics of an object-store server, as `strata stats` says.
    let st = api_get(&addr, "/stats/vm");
    assert!(st["vm"]["write"]["commands"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(st["vm"]["write"], s.json(&["stats", "vm"])["vm"]["write"]);
    assert_eq!(api_get(&addr, "/disks/vm")["current_snapshot"], "second");

    let b = Browser::start();
    b.go(&format!("http://{addr}/"));
    b.wait(
        "the disk row",
        "document.querySelector('#disks tr[data-disk=\"vm\"]')",
    );
    let row = b.text("#disks tr[data-disk=\"vm\"]");
    assert!(row.contains("16.0 MiB"), "{row}");
    assert_eq!(
        b.js("return getComputedStyle(document.querySelector('#disks tr[data-disk=\"vm\"] td.shared-only')).display !== 'none'"),
        json!(true),
        "writer and generation are shown on an object store"
    );
    // The writer is this host's server (qemu-io's write claimed the disk).
    let w = api_get(&addr, "/disks/vm")["object_store"].clone();
    let writer = w["owner"]["name"].as_str().unwrap_or_else(|| panic!("{w}"));
    assert!(row.contains(writer), "{row} names {writer}");
    assert!(row.contains(&w["generation"].to_string()), "{row}: {w}");
    // No capacity set: said so, and no share of it drawn.
    assert!(b.text("#g-capacity").contains("none set"));
    assert_eq!(
        b.js("return document.querySelector('#g-used .meter span.used').style.width"),
        json!("0%")
    );
    assert!(b.text("#g-host").contains("in the store"));
    // This host's segment cache, as `strata status` says.
    b.wait("the cache gauge", "document.querySelector('#g-cache')");
    let cache = b.text("#g-cache");
    assert!(
        cache.contains("segment cache")
            && cache.contains("of 8.00 GiB")
            && cache.contains("segments;"),
        "{cache}"
    );
    b.screenshot("object-store-overview");
    b.js("location.hash = '#/disk/vm'");
    b.wait(
        "the tree",
        "document.querySelector('li[data-snapshot=\"first\"] > ul > li[data-snapshot=\"second\"] > ul > #you-are-here')",
    );
    assert!(b.text("#tree").contains("one"));
    b.screenshot("object-store-disk");
}

/// Beyond loopback the dashboard, API and metrics go over HTTPS with the
/// NBD credentials, and reads need a token as actions do: a read token
/// reads and cannot act. The page loads in Chromium trusting the test CA
/// (and no other way), and SIGHUP swaps the certificate.
#[test]
fn beyond_loopback_the_dashboard_is_https_and_reads_need_a_token() {
    if !["chromium", "chromedriver", "certutil", "openssl", "curl"]
        .iter()
        .all(|t| have(t))
    {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm1", "--size", "64M"]);
    let root = s.dir.path().join("pki");
    let ca = Ca::new(&root, "ca");
    let creds = ca.creds("server", Some("server"), "localhost");
    let creds_s = creds.to_str().unwrap();
    let cacert = ca.ca_dir().join("ca-cert.pem");
    let port = free_port();
    let any = format!("0.0.0.0:{port}");
    let sock = s.sock();
    let sock_s = sock.to_str().unwrap();

    // Refused at start: plain HTTP to the network, and no token for reads.
    let e = s.fails(&["serve", "--nbd-unix", sock_s, "--http", &any]);
    assert!(e.contains("HTTPS") && e.contains("--insecure"), "{e}");
    let e = s.fails(&[
        "serve",
        "--nbd-unix",
        sock_s,
        "--http",
        &any,
        "--tls-creds",
        creds_s,
    ]);
    assert!(e.contains("--http-read-token"), "{e}");

    let (rt, at) = (
        s.dir.path().join("read.token"),
        s.dir.path().join("act.token"),
    );
    let srv = s.serve_with(&[
        "--http",
        &any,
        "--tls-creds",
        creds_s,
        "--http-read-token",
        rt.to_str().unwrap(),
        "--http-token",
        at.to_str().unwrap(),
    ]);
    let read = std::fs::read_to_string(&rt).unwrap().trim().to_string();
    let act = std::fs::read_to_string(&at).unwrap().trim().to_string();
    let url = |p: &str| format!("https://localhost:{port}{p}");
    common::eventually("the HTTPS listener", Duration::from_secs(20), || {
        curl(&cacert, &url("/"), None, None).0 == 200
    });

    // Plain HTTP on the same port gets no answer.
    let plain = common::http::request(&format!("127.0.0.1:{port}"), "GET", "/api/v1", &[], "");
    assert!(
        plain.as_ref().map_or(true, |r| r.status == 0),
        "plain HTTP was answered: {:?}",
        plain.map(|r| r.head)
    );

    for path in ["/api/v1", "/api/v1/disks", "/metrics"] {
        let (st, body) = curl(&cacert, &url(path), None, None);
        assert_eq!(st, 401, "{path} without a token: {body}");
        assert_eq!(
            curl(&cacert, &url(path), Some("wrong-token-0123456789"), None).0,
            403
        );
        let (st, body) = curl(&cacert, &url(path), Some(&read), None);
        assert_eq!(st, 200, "{path} with the read token: {body}");
    }
    let (_, body) = curl(&cacert, &url("/api/v1"), Some(&read), None);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["granted"].as_str(), v["reads_need_token"].as_bool()),
        (Some("read"), Some(true))
    );
    let (_, m) = curl(&cacert, &url("/metrics"), Some(&read), None);
    assert!(m.contains("strata_datastore_capacity_bytes"), "{m}");

    // A read token cannot act; the action token can.
    let snap = url("/api/v1/disks/vm1/snapshots");
    let (st, body) = curl(&cacert, &snap, Some(&read), Some(r#"{"name":"by-reader"}"#));
    assert!(st == 403 && body.contains("reads only"), "{st} {body}");
    let (st, body) = curl(&cacert, &snap, Some(&act), Some(r#"{"name":"by-admin"}"#));
    assert_eq!(st, 201, "{body}");
    let names = s.snapshot_names("vm1");
    assert!(names.contains(&"by-admin".to_string()) && !names.contains(&"by-reader".to_string()));

    // Another CA's client does not trust this server.
    let other = Ca::new(&root, "other");
    assert_eq!(
        curl(&other.ca_dir().join("ca-cert.pem"), &url("/"), None, None).0,
        0
    );

    // The page in Chromium: first without a token (it asks for one), then
    // with the read token (the disks show, actions stay locked).
    let b = Browser::start_trusting(Some(&cacert));
    b.go(&url("/"));
    b.wait(
        "the token dialog",
        "document.querySelector('#token-dialog').open",
    );
    b.type_into("#token-input", &read);
    b.click("#token-ok");
    b.wait(
        "the disk table",
        "document.querySelector('#disks tr[data-disk=\"vm1\"]')",
    );
    assert!(b.text("#lock").contains("locked"), "{}", b.text("#lock"));
    assert!(!b.text("#lock").contains("unlocked"), "{}", b.text("#lock"));
    assert_eq!(b.js("return location.protocol"), json!("https:"));
    b.screenshot("https-read-token");
    drop(b);

    // SIGHUP: a certificate from another CA serves new connections.
    let renewed = other.creds("renewed", Some("server"), "localhost");
    for f in ["server-cert.pem", "server-key.pem"] {
        std::fs::copy(renewed.join(f), creds.join(f)).unwrap();
    }
    // SAFETY: kill(2) of the server this test started.
    unsafe { libc::kill(srv.pid(), libc::SIGHUP) };
    let other_ca = other.ca_dir().join("ca-cert.pem");
    common::eventually("the renewed certificate", Duration::from_secs(20), || {
        curl(&other_ca, &url("/api/v1"), Some(&read), None).0 == 200
    });
    assert_eq!(curl(&cacert, &url("/"), None, None).0, 0);
    srv.stop();
}

/// Text boxes of the visible view under `scopes` (CSS selectors) that
/// overlap another: each text node's line boxes (an SVG `<text>`'s box),
/// hidden ones left out; answers the overlapping pairs' texts.
const OVERLAPS_JS: &str = r#"
const scopes = arguments[0];
const boxes = [];
for (const sel of scopes) {
  for (const root of document.querySelectorAll(sel)) {
    if (!root.offsetParent && root.tagName !== 'svg') continue;
    const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      const el = n.parentElement;
      if (!n.textContent.trim() || el.closest('title')) continue;
      const cs = getComputedStyle(el);
      if (cs.visibility === 'hidden' || cs.display === 'none' || !el.getClientRects().length) continue;
      let rects;
      if (el instanceof SVGElement) rects = [el.getBoundingClientRect()];
      else { const r = document.createRange(); r.selectNodeContents(n); rects = [...r.getClientRects()]; }
      for (const r of rects) if (r.width > 0 && r.height > 0) boxes.push({ t: n.textContent.trim(), r });
    }
  }
}
const out = [];
for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
  const a = boxes[i].r, b = boxes[j].r;
  const ix = Math.min(a.right, b.right) - Math.max(a.left, b.left);
  const iy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
  if (ix > 0.5 && iy > 0.5) out.push(boxes[i].t + ' / ' + boxes[j].t);
}
return { boxes: boxes.length, overlaps: out };
"#;

impl Browser {
    fn set_width(&self, width: u32) {
        self.call(
            "POST",
            &self.s("/window/rect"),
            Some(json!({"width": width, "height": 1400})),
        );
    }

    /// Wait for the page's next update (a redraw at the current size).
    fn next_update(&self) {
        let n = self.js("return Number(document.body.dataset.updates || 0)");
        let n = n.as_f64().unwrap_or(0.0) + 3.0;
        self.wait(
            "three more updates",
            &format!("Number(document.body.dataset.updates) >= {n}"),
        );
    }

    /// No two text boxes under `scopes` overlap.
    fn assert_no_overlap(&self, scopes: &[&str], what: &str) {
        let v = self.call(
            "POST",
            &self.s("/execute/sync"),
            Some(json!({"script": OVERLAPS_JS, "args": [scopes]})),
        );
        assert!(
            v["boxes"].as_u64().unwrap() > 10,
            "{what}: too few text boxes: {v}"
        );
        assert_eq!(v["overlaps"], json!([]), "{what}: overlapping text");
    }
}

/// Performance charts drawn from a fio run (a fast sampling interval),
/// on the overview and on the disk's page, with no text over other text
/// at 800 and 1,400 px; the charts' API; no action form on a server
/// without an action token.
#[test]
fn the_dashboard_charts_performance_without_overlapping_text() {
    if !have("chromium") || !have("chromedriver") || !have("fio") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm1", "--size", "64M"]);
    s.ok(&[
        "schedule", "add", "hourly", "--target", "vm1", "--every", "1h", "--keep", "24",
    ]);
    let addr = free_addr();
    let _srv = common::Server::start_env(
        &s,
        &["--http", &addr],
        &[("STRATA_CHART_INTERVAL_MS", "200")],
    );
    wait_http(&addr);
    let fio = Command::new("fio")
        .args([
            "--name=charts",
            "--ioengine=nbd",
            &format!("--uri={}", s.uri("vm1")),
            "--rw=randrw",
            "--bs=4k",
            "--size=32M",
            "--iodepth=4",
            "--time_based",
            "--runtime=4",
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(fio.success());
    std::thread::sleep(Duration::from_millis(500));

    // The API: points at the interval, with rates, latencies and space.
    let c = api_get(&addr, "/charts?range=hour&export=vm1");
    assert_eq!(c["interval_s"], json!(0.2), "{c}");
    let pts = c["points"].as_array().unwrap();
    assert!(pts.len() > 10, "{c}");
    assert!(pts.iter().any(|p| p["write_iops"].as_f64().unwrap() > 0.0
        && p["read_iops"].as_f64().unwrap() > 0.0
        && p["write_p99_us"].as_u64().is_some()));
    assert!(
        pts.last().unwrap()["used_bytes"].as_u64().unwrap() > 0,
        "{c}"
    );
    let total = api_get(&addr, "/charts");
    assert!(total["points"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["write_bps"].as_f64().unwrap() > 0.0));
    assert!(
        total["points"][0]["used_bytes"].as_u64().is_some(),
        "{total}"
    );
    assert_eq!(
        api_get(&addr, "/charts?range=day")["interval_s"],
        json!(6.0)
    );
    let (st, _) = http(&addr, "GET", "/api/v1/charts?export=nope", &[], "");
    assert_eq!(st, 404);
    let (st, _) = http(&addr, "GET", "/api/v1/charts?range=week", &[], "");
    assert_eq!(st, 400);
    let w = api_get(&addr, "/stats/vm1?window=300");
    assert!(w["vm1"]["write"]["commands"].as_u64().unwrap() > 0, "{w}");
    assert!(
        w["vm1"]["latency"]["write"]["count"].as_u64().unwrap() > 0,
        "{w}"
    );

    let b = Browser::start();
    b.go(&format!("http://{addr}/"));
    let drawn = "document.querySelector('#chart-iops svg') && Number(document.querySelector('#chart-iops svg').dataset.points) > 10 && Number(document.querySelector('#chart-iops path[data-series=\"write_iops\"]').dataset.n) > 10 && Number(document.querySelector('#chart-latency path[data-series=\"write_p99_us\"]').dataset.n) > 3";
    b.wait("the datastore's charts", drawn);
    assert!(
        b.text("#chart-space").contains("iB"),
        "{}",
        b.text("#chart-space")
    );
    // The schedules, listed (issue 62 item 9).
    b.wait(
        "the schedules table",
        "document.querySelector('#schedules tr[data-schedule=\"hourly\"]')",
    );
    let row = b.text("#schedules tbody");
    assert!(
        row.contains("vm1") && row.contains("1 h") && row.contains("24"),
        "{row}"
    );
    // No action form on a read-only server: the new disk and import
    // forms hidden, not just disabled.
    assert!(b.text("#lock").contains("read-only"));
    assert_eq!(
        b.js("return [...document.querySelectorAll('#f-create, #f-import, .new-disk')].filter((e) => e.offsetParent).length"),
        json!(0),
        "a new-disk form on a read-only server"
    );
    for width in [800, 1400] {
        b.set_width(width);
        b.js("location.hash = '#/'");
        b.wait(
            "the overview",
            "!document.querySelector('#overview-view').hidden",
        );
        b.wait("the datastore's charts", drawn);
        b.next_update();
        b.assert_no_overlap(
            &["#perf-overview", "#gauges", "#schedules"],
            &format!("overview at {width} px"),
        );
        b.js("document.querySelector('#perf-overview').scrollIntoView()");
        b.screenshot(&format!("charts-overview-{width}"));
        b.js("location.hash = '#/disk/vm1'");
        b.wait("the disk's charts", &format!("!document.querySelector('#disk-view').hidden && document.querySelector('#perf-disk #chart-iops') && {drawn}"));
        b.wait("the histograms", "document.querySelector('#hist-latency')");
        assert_eq!(
            b.js("return [...document.querySelectorAll('form.action, #tree button')].filter((e) => e.offsetParent).length"),
            json!(0),
            "an action form on a read-only server"
        );
        assert_eq!(
            b.js("return [...document.querySelectorAll('#f-rename, #f-fullclone, #f-delete, #delete-refusal, #delete-force')].filter((e) => e.offsetParent).length"),
            json!(0),
            "a disk action on a read-only server"
        );
        // Who has it open and its jobs show without actions too.
        b.wait(
            "'Open by' and the jobs",
            "document.querySelector('#clients').offsetParent && document.querySelector('#disk-jobs').offsetParent && document.querySelector('#clients tbody').textContent === 'nobody'",
        );
        b.next_update();
        b.assert_no_overlap(
            &[
                "#perf-disk",
                "#histograms",
                "#live",
                "#clients",
                "#disk-jobs",
            ],
            &format!("disk page at {width} px"),
        );
        b.js("document.querySelector('#perf-disk').scrollIntoView()");
        b.screenshot(&format!("charts-disk-{width}"));
    }
    // The day's range and the last 5 minutes' histograms.
    b.click("#perf-disk button[data-range=\"day\"]");
    b.wait(
        "the day's chart",
        "document.querySelector('#perf-disk button.on').dataset.range === 'day'",
    );
    b.js("const s = document.querySelector('#hist-window'); s.value = '300'; s.dispatchEvent(new Event('change'));");
    b.wait(
        "the window's histograms",
        "document.querySelector('#histograms').dataset.source === 'window' && document.querySelector('#hist-latency')",
    );
}

/// The disk actions of the page (issue 62 item 7): a disk made with the
/// overview's form; on its page a snapshot, a linked and a full clone, a
/// rename; "Open by" naming a qemu-io that holds it, whose delete is
/// refused with the server's words until "Delete anyway"; the linked
/// clone then shows its parent deleted; the jobs of a disk on its page;
/// the new forms' text not overlapping at 800 and 1,400 px.
#[test]
fn the_dashboard_creates_renames_clones_and_deletes_disks() {
    if !have("chromium") || !have("chromedriver") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "seed", "--size", "16M"]);
    let tok = s.dir.path().join("http.token");
    let addr = free_addr();
    let _srv = s.serve_with(&["--http", &addr, "--http-token", tok.to_str().unwrap()]);
    wait_http(&addr);
    let token = std::fs::read_to_string(&tok).unwrap().trim().to_string();
    let b = Browser::start();
    b.go(&format!("http://{addr}/#token={token}"));
    b.wait(
        "the disk table",
        "document.querySelector('#disks tr[data-disk=\"seed\"]')",
    );
    assert!(b.text("#lock").contains("unlocked"));

    // A new disk through the overview's form.
    b.type_into("#create-name", "web");
    b.type_into("#create-size", "32M");
    b.click("#create-go");
    b.wait(
        "the new disk in the list",
        "document.querySelector('#disks tr[data-disk=\"web\"]')",
    );
    assert!(b.text("#disks tr[data-disk=\"web\"]").contains("32.0 MiB"));
    assert!(s.disk_names().contains(&"web".to_string()));
    for width in [800, 1400] {
        b.set_width(width);
        b.next_update();
        b.assert_no_overlap(
            &["#disks", ".new-disk"],
            &format!("the overview's forms at {width} px"),
        );
    }
    b.js("document.querySelector('.new-disk').scrollIntoView()");
    b.screenshot("new-disk-forms");

    // Its page: nobody has it open, no jobs yet.
    b.js("location.hash = '#/disk/web'");
    b.wait(
        "web's page",
        "document.querySelector('#disk-title').textContent === 'web' && document.querySelector('#clients tbody').textContent === 'nobody'",
    );
    assert!(
        b.text("#disk-jobs").contains("no jobs"),
        "{}",
        b.text("#disk-jobs")
    );

    // A snapshot and a linked clone of it (the existing forms), a full
    // clone (a job: listed on the clone's page and the overview).
    b.type_into("#snap-name", "s1");
    b.click("#snap-create");
    b.wait(
        "the snapshot",
        "document.querySelector('#tree li[data-snapshot=\"s1\"]') && document.querySelector('#clone-snap').value === 's1'",
    );
    b.type_into("#clone-name", "kid");
    b.click("#clone-create");
    b.wait(
        "the linked clone",
        "document.querySelector('#msg').textContent.includes('linked clone kid: done')",
    );
    b.type_into("#fullclone-name", "copy");
    b.click("#fullclone-go");
    b.wait(
        "the full clone's job",
        "document.querySelector('#msg').textContent.includes('job')",
    );
    eventually("the full clone", Duration::from_secs(60), || {
        s.disk_names().contains(&"copy".to_string())
    });

    // Rename through the form: the page follows the disk.
    b.type_into("#rename-to", "web2");
    b.click("#rename-go");
    b.wait(
        "the renamed disk's page",
        "document.querySelector('#disk-title').textContent === 'web2' && location.hash === '#/disk/web2'",
    );
    let names = s.disk_names();
    assert!(
        names.contains(&"web2".to_string()) && !names.contains(&"web".to_string()),
        "{names:?}"
    );
    // A snapshot renamed through its form (the clone's parent, s1, is left
    // as it is for what follows).
    b.type_into("#snap-name", "tmp");
    b.click("#snap-create");
    b.wait(
        "the second snapshot",
        "document.querySelector('#tree li[data-snapshot=\"tmp\"]') && [...document.querySelectorAll('#snaprename-snap option')].some((o) => o.value === 'tmp')",
    );
    b.js("document.querySelector('#snaprename-snap').value = 'tmp'");
    b.type_into("#snaprename-to", "kept");
    b.click("#snaprename-go");
    b.wait(
        "the renamed snapshot",
        "document.querySelector('#tree li[data-snapshot=\"kept\"]') && !document.querySelector('#tree li[data-snapshot=\"tmp\"]')",
    );

    for width in [800, 1400] {
        b.set_width(width);
        b.next_update();
        b.assert_no_overlap(
            &["#disk-view .columns", "#disk-facts"],
            &format!("the disk page's forms at {width} px"),
        );
    }
    b.screenshot("disk-actions");

    // A delete refused for the linked clone made from it, in the server's
    // words; "Delete anyway" removes it, and the clone keeps its parent,
    // marked deleted.
    b.click("#delete-go");
    b.wait(
        "the confirmation",
        "document.querySelector('#confirm').open",
    );
    assert!(b.text("#confirm-text").contains("web2"));
    b.click("#confirm-ok");
    b.wait(
        "the refusal",
        "!document.querySelector('#delete-refusal').hidden",
    );
    let why = b.text("#delete-refusal-text");
    assert!(
        why.contains("linked clones") && why.contains("kid (from web2@s1)"),
        "{why}"
    );
    b.screenshot("delete-refused");
    assert!(s.disk_names().contains(&"web2".to_string()));
    b.click("#delete-force");
    b.wait(
        "the overview without web2",
        "location.hash === '#/' && document.querySelector('#disks tr[data-disk=\"seed\"]') && !document.querySelector('#disks tr[data-disk=\"web2\"]')",
    );
    assert!(!s.disk_names().contains(&"web2".to_string()));
    b.js("location.hash = '#/disk/kid'");
    b.wait(
        "kid's parent, deleted",
        "document.querySelector('#disk-title').textContent === 'kid' && document.querySelector('#disk-facts').textContent.includes('(deleted)')",
    );
    assert!(
        b.text("#disk-facts").contains("web2@s1"),
        "{}",
        b.text("#disk-facts")
    );

    // The full clone's job on the clone's page, and on the overview.
    b.js("location.hash = '#/disk/copy'");
    b.wait(
        "the clone's job on its page",
        "document.querySelector('#disk-title').textContent === 'copy' && document.querySelector('#disk-jobs tr[data-job]') && document.querySelector('#disk-jobs tbody').textContent.includes('done')",
    );
    assert!(
        b.text("#disk-jobs").contains("clone"),
        "{}",
        b.text("#disk-jobs")
    );

    // Held open by qemu-io (when there is one): "Open by" names it, and
    // the delete is refused naming it, until "Delete anyway".
    if have("qemu-io") {
        let mut q = Command::new("qemu-io")
            .args(["-f", "raw", &s.uri("copy")])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let peer = format!("local pid {}", q.id());
        b.wait(
            "the client in 'Open by'",
            &format!("document.querySelector('#clients tbody').textContent.includes('{peer}')"),
        );
        let open_by = b.text("#clients");
        assert!(
            open_by.contains("nbd") && open_by.contains("read-write"),
            "{open_by}"
        );
        b.screenshot("disk-open-by");
        b.click("#delete-go");
        b.wait(
            "the confirmation",
            "document.querySelector('#confirm').open",
        );
        b.click("#confirm-ok");
        b.wait(
            "the refusal",
            "!document.querySelector('#delete-refusal').hidden",
        );
        let why = b.text("#delete-refusal-text");
        assert!(
            why.contains("'copy' is open") && why.contains(&peer) && why.contains("--force"),
            "{why}"
        );
        b.click("#delete-force");
        b.wait(
            "the overview without copy",
            "location.hash === '#/' && document.querySelector('#disks tr[data-disk=\"kid\"]') && !document.querySelector('#disks tr[data-disk=\"copy\"]')",
        );
        assert!(!s.disk_names().contains(&"copy".to_string()));
        let _ = q.kill();
        let _ = q.wait();
    }
    b.js("location.hash = '#/'");
    b.wait(
        "the clone's job in the jobs table",
        "[...document.querySelectorAll('#jobs tr[data-job]')].some(r => r.textContent.includes('clone --full web copy'))",
    );

    // A delete with nothing in the way: confirmed, and gone.
    b.js("location.hash = '#/disk/seed'");
    b.wait(
        "seed's page",
        "document.querySelector('#disk-title').textContent === 'seed'",
    );
    b.click("#delete-go");
    b.wait(
        "the confirmation",
        "document.querySelector('#confirm').open",
    );
    b.click("#confirm-ok");
    b.wait(
        "the overview without seed",
        "location.hash === '#/' && document.querySelector('#disks tr[data-disk=\"kid\"]') && !document.querySelector('#disks tr[data-disk=\"seed\"]')",
    );
    assert!(!s.disk_names().contains(&"seed".to_string()));
}

/// The overview's space: logical against used, the estimate's figures and
/// the pass's result, both started from the page as jobs (`POST
/// /api/v1/dedup`) and read off the jobs' kept answers; what the page
/// shows is what the CLI prints.
#[test]
fn the_dashboard_estimates_and_shares_equal_grains() {
    if !have("chromium") || !have("chromedriver") {
        return;
    }
    let s = Store::new();
    // Two copies of 4 MiB of incompressible bytes: one copy is shareable.
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("same.raw");
    std::fs::write(&img, common::noise(0x9e37_79b9_7f4a_7c15, 4 << 20)).unwrap();
    for d in ["a", "b"] {
        s.ok(&["import", img.to_str().unwrap(), d]);
    }
    let tok = s.dir.path().join("http.token");
    let addr = free_addr();
    let _srv = s.serve_with(&["--http", &addr, "--http-token", tok.to_str().unwrap()]);
    wait_http(&addr);
    let token = std::fs::read_to_string(&tok).unwrap().trim().to_string();

    // The API refuses what the CLI would, by name.
    let auth = format!("Bearer {token}");
    let post = |body: &str| {
        http(
            &addr,
            "POST",
            "/api/v1/dedup",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    let (st, body) = post(r#"{"disks": "a"}"#);
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("list of disk names"), "{body}");
    let (st, body) = post(r#"{"rate": "fast"}"#);
    assert_eq!(st, 400, "{body}");

    let b = Browser::start();
    b.go(&format!("http://{addr}/#token={token}"));
    b.wait(
        "the space line",
        "document.querySelector('#space-line') && document.querySelector('#estimate-go')",
    );
    let line = b.text("#space-line");
    assert!(line.contains("8.00 MiB of disks and snapshots"), "{line}");
    b.click("#estimate-go");
    b.wait("the estimate", "document.querySelector('#estimate')");
    let shown = b.text("#estimate");
    let e = s.json(&["dedup", "--estimate"]);
    assert_eq!(e["same_offset_bytes"], 4 << 20, "{e}");
    assert!(
        shown.contains("equal at the same offset4.00 MiB (50.0 % of stored)"),
        "{shown}"
    );
    b.screenshot("space-estimate");

    // The pass asks first, runs as a job, and its result shows.
    b.click("#dedup-go");
    b.wait(
        "the confirmation",
        "document.querySelector('#confirm').open",
    );
    b.click("#confirm-ok");
    b.wait("the pass's result", "document.querySelector('#dedup-last')");
    let last = b.text("#dedup-last");
    assert!(last.contains("freed 4.00 MiB"), "{last}");
    // The estimate shown is older than the pass, and says so.
    let caption = b.text("#estimate caption");
    assert!(caption.contains("before the pass"), "{caption}");
    let jobs = api_get(&addr, "/jobs");
    let pass = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["result"].get("dedup").is_some())
        .unwrap_or_else(|| panic!("no pass in {jobs}"));
    assert_eq!(pass["result"]["dedup"]["freed_bytes"], 4 << 20, "{pass}");
    assert_eq!(
        pass["result"]["dedup"]["disks"],
        json!(["a", "b"]),
        "{pass}"
    );
    b.wait(
        "the space line after the pass",
        "parseFloat(document.querySelector('#space-line').textContent.match(/\\(([0-9.]+)x/)[1]) > 1.9",
    );
    b.screenshot("space-after-pass");
    assert_eq!(s.json(&["dedup", "--estimate"])["same_offset_bytes"], 0);

    // Compression, from the same section: a disk of text packs, the
    // noise stays raw.
    let text = dir.path().join("text.raw");
    std::fs::write(
        &text,
        &b"the dashboard packs cold grains with LZ4. ".repeat(25_000)[..1 << 20],
    )
    .unwrap();
    s.ok(&["import", text.to_str().unwrap(), "t"]);
    b.click("#compress-go");
    b.wait(
        "the confirmation",
        "document.querySelector('#confirm').open",
    );
    b.click("#confirm-ok");
    b.wait(
        "the compress result",
        "document.querySelector('#compress-last')",
    );
    let last = b.text("#compress-last");
    assert!(
        last.contains("lz4): packed 1.00 MiB into ") && last.contains("4.00 MiB stayed raw"),
        "{last}"
    );
    // The disk table says what of each disk is packed: all of the
    // text, none of the noise.
    let packed = |d: &str| {
        format!(
            "document.querySelector('#disks tr[data-disk=\"{d}\"] td:nth-child(6)').textContent"
        )
    };
    b.wait(
        "the packed column",
        &format!("{} === '1.00 MiB'", packed("t")),
    );
    assert_eq!(b.js(&format!("return {}", packed("a"))), json!("0 B"));
    // An estimate now counts the packed grains and their streams.
    b.click("#estimate-go");
    b.wait(
        "the packed row",
        "/packed1.00 MiBof stored, in/.test(document.querySelector('#estimate').textContent)",
    );
    b.screenshot("space-after-compress");
    s.ok(&["check"]);
}
