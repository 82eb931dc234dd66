//! Three hosts, one lost (issue 27): three servers, each with its own
//! directory and its own network namespace (a veth link to this test's
//! namespace; the store reached through a proxy on the link's far end),
//! serve 30 disks of one object-store datastore to fio over NBD/TCP. One
//! host is killed under load; the other two `claim` its disks and serve
//! them; everything fio flushed verifies on the new writers; the killed
//! host comes back fenced (its writes fail naming the writer), and GC and
//! check are clean. A second, smaller test claims a killed host's disk
//! from a host with no server running (issue 58 item 6): the claim holds,
//! and the killed host, restarted, is refused. Without network namespaces
//! (not root, no `ip`) the hosts share loopback and the tests say so.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::Store as Host;
use common::{qemu_io, RAW};
use strata_s3::testing::{self, FaultProxy};

const DISKS: usize = 30;
const PER_HOST: usize = DISKS / 3;

/// A network namespace with a veth link to ours: `outer` here, `inner`
/// there. Deleted (with its link) on drop.
struct Ns {
    name: String,
    outer: String,
    inner: String,
}

impl Ns {
    fn make(net: u8, k: usize) -> Option<Ns> {
        // Unique per test of this process (each has its own `net`).
        let tag = format!("{:x}{net}{k}", std::process::id() & 0xffff);
        let ns = Ns {
            name: format!("strata-t3-{tag}"),
            outer: format!("10.{net}.{k}.1"),
            inner: format!("10.{net}.{k}.2"),
        };
        let (a, b) = (format!("s3a{tag}"), format!("s3b{tag}"));
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), ns.name.clone()],
            vec![
                "link".into(),
                "add".into(),
                a.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                b.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                b.clone(),
                "netns".into(),
                ns.name.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{}/24", ns.outer),
                "dev".into(),
                a.clone(),
            ],
            vec!["link".into(), "set".into(), a, "up".into()],
            ns.exec_args(&["ip", "addr", "add", &format!("{}/24", ns.inner), "dev", &b]),
            ns.exec_args(&["ip", "link", "set", &b, "up"]),
            ns.exec_args(&["ip", "link", "set", "lo", "up"]),
        ];
        for s in steps {
            let o = Command::new("ip").args(&s).output().ok()?;
            if !o.status.success() {
                eprintln!(
                    "no network namespaces here (ip {}: {}): the hosts share loopback",
                    s.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                return None;
            }
        }
        Some(ns)
    }

    /// `ip netns exec NAME` + `cmd`, as arguments of `ip`.
    fn exec_args(&self, cmd: &[&str]) -> Vec<String> {
        ["netns", "exec", &self.name]
            .iter()
            .chain(cmd)
            .map(|s| s.to_string())
            .collect()
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// One host: its directory, where its server listens and reaches the
/// store, and its server once started.
struct Node {
    dir: Host,
    ns: Option<Ns>,
    /// `ip:port` of its NBD listener.
    nbd: String,
    /// The store's endpoint as seen from its namespace.
    endpoint: String,
    server: Option<Child>,
    /// Where its server's stderr goes (None: this test's stderr).
    log: Option<std::path::PathBuf>,
}

impl Node {
    fn strata(&self, args: &[&str]) -> std::process::Output {
        Command::new(common::strata())
            .arg("--datastore")
            .arg(self.dir.path())
            .args(args)
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.strata(args);
        assert!(
            o.status.success(),
            "strata {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// [`Self::ok`] with `--json`, parsed.
    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    /// The host identity its directory gives it.
    fn host(&self) -> serde_json::Value {
        self.json(&["status"])["object_store"]["me"]["host"].clone()
    }

    fn start(&mut self) {
        let _ = std::fs::remove_file(self.dir.path().join("control.sock"));
        let strata = common::strata();
        let dir = self.dir.path();
        let serve = [
            strata,
            "--datastore",
            dir.to_str().unwrap(),
            "serve",
            "--nbd-tcp",
            &self.nbd,
            // Each host's address is in a namespace of this test.
            "--insecure",
            "--gc-interval",
            "0",
            // Compaction only on request, as this test has always run.
            "--compact-policy",
            "off",
        ];
        let mut cmd = match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(ns.exec_args(&serve));
                c
            }
            None => {
                let mut c = Command::new(serve[0]);
                c.args(&serve[1..]);
                c
            }
        };
        // `ip netns exec` execs the server: the child's pid is the server's.
        let stderr = match &self.log {
            Some(p) => Stdio::from(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(p)
                    .unwrap(),
            ),
            None => Stdio::inherit(),
        };
        let child = cmd
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        self.server = Some(child);
        common::wait_for(&self.dir.path().join("control.sock"));
        let t = std::time::Instant::now();
        while std::net::TcpStream::connect(&self.nbd).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{} never listened",
                self.nbd
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill9(&mut self) {
        let mut c = self.server.take().unwrap();
        c.kill().unwrap();
        let _ = c.wait();
    }

    fn uri(&self, disk: &str) -> String {
        format!("nbd://{}/{disk}", self.nbd)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn name(i: usize) -> String {
    format!("d{i:02}")
}

/// fio over NBD, one job per (disk, host) in `jobs` (names kept across
/// runs: a verify replays the writes of the run with the same jobs), on
/// the first (`second`: last) 4 MiB of each 8 MiB disk.
/// (job, URI) of each disk in `disks`, served by host `owners(i)`.
fn jobs(
    nodes: &[Node],
    owners: impl Fn(usize) -> usize,
    disks: std::ops::Range<usize>,
) -> Vec<(String, String)> {
    disks
        .map(|i| (name(i), nodes[owners(i)].uri(&name(i))))
        .collect()
}

/// fio with this file's settings (4 KiB blocks, 8 deep, 4 MiB a disk,
/// fatal verification, one seed) and `extra`, one job per disk.
fn fio_ok(what: &str, jobs: &[(String, String)], extra: &[&str]) {
    let args = [
        &[
            "--bs=4k",
            "--iodepth=8",
            "--size=4M",
            "--verify_fatal=1",
            "--randseed=2718",
            "--group_reporting",
        ][..],
        extra,
    ]
    .concat();
    common::fio_ok(what, jobs, &args);
}

/// Three hosts of one new datastore (the first `init`s it, the others
/// `attach`), each in a network namespace of its own when it can be made
/// (addresses `10.NET.K.*`, `NET` from `net` to `net + 49`), no server
/// started; and the proxies their store traffic goes through.
fn hosts(shared: &testing::Shared, net: u8) -> (Vec<Node>, Vec<FaultProxy>) {
    let upstream = shared.endpoint.trim_start_matches("http://").to_string();
    let url = format!(
        "s3://strata-cli-test/three-hosts-{:08x}",
        rand::random::<u32>()
    );
    let net = net + rand::random::<u8>() % 50;
    let mut proxies = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();
    for k in 1..=3 {
        let ns = Ns::make(net, k);
        let (nbd, endpoint) = match &ns {
            Some(ns) => {
                let p = FaultProxy::start_on(&ns.outer, &upstream);
                let e = p.endpoint.clone();
                proxies.push(p);
                (format!("{}:10809", ns.inner), e)
            }
            None => {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port();
                (format!("127.0.0.1:{port}"), shared.endpoint.clone())
            }
        };
        nodes.push(Node {
            dir: Host::empty(),
            ns,
            nbd,
            endpoint,
            server: None,
            log: None,
        });
    }
    nodes[0].ok(&["init", "--object-store", &url]);
    for n in &nodes[1..] {
        n.ok(&["attach", "--object-store", &url]);
    }
    (nodes, proxies)
}

#[test]
fn three_hosts_serve_thirty_disks_one_is_lost_and_the_others_take_its_disks() {
    let Some(shared) = testing::shared() else {
        return;
    };
    if !common::have("fio") || !common::have("qemu-io") {
        return;
    }
    let (mut nodes, proxies) = hosts(shared, 100);
    for i in 0..DISKS {
        nodes[0].ok(&["create", &name(i), "--size", "8M"]);
    }
    for n in nodes.iter_mut() {
        n.start();
    }
    let home = |i: usize| i / PER_HOST;

    // Flushed data: host k writes (and so claims) its ten disks' first
    // 4 MiB with verify headers, then fsyncs.
    for k in 0..3 {
        fio_ok(
            "the first writes",
            &jobs(&nodes, home, k * PER_HOST..(k + 1) * PER_HOST),
            &["--rw=randwrite", "--do_verify=0", "--end_fsync=1"],
        );
    }
    for i in 0..DISKS {
        let j = nodes[0].json(&["info", &name(i)]);
        assert_eq!(
            j["object_store"]["owner"]["host"],
            nodes[home(i)].host(),
            "{} is written by its host",
            name(i)
        );
    }

    // Load on every host (the last 4 MiB, a FLUSH every 16 writes); the
    // third host is killed under it.
    let load: Vec<_> = (0..3)
        .map(|k| {
            let mut args: Vec<String> = [
                "--ioengine=nbd",
                "--bs=4k",
                "--iodepth=8",
                "--offset=4M",
                "--size=4M",
                "--rw=randwrite",
                "--fsync=16",
                "--time_based",
                "--runtime=12",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            for i in k * PER_HOST..(k + 1) * PER_HOST {
                args.push(format!("--name={}", name(i)));
                args.push(format!("--uri={}", nodes[k].uri(&name(i))));
            }
            Command::new("fio")
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(4));
    nodes[2].kill9();
    let mut results: Vec<_> = load
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let lost = results.pop().unwrap();
    assert!(
        !lost.status.success(),
        "the killed host's clients saw errors"
    );
    for (k, r) in results.iter().enumerate() {
        assert!(
            r.status.success(),
            "host {k} kept serving: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }

    // The survivors claim the lost host's disks, half each, and serve
    // them: everything fio flushed there is there.
    let after = |i: usize| match home(i) {
        2 if i < 2 * PER_HOST + PER_HOST / 2 => 0,
        2 => 1,
        h => h,
    };
    for i in 2 * PER_HOST..DISKS {
        let out = nodes[after(i)].ok(&["claim", &name(i)]);
        assert!(out.contains(&name(i)), "{out}");
    }
    fio_ok(
        "flushed writes of the lost host, read on the others",
        &jobs(&nodes, after, 2 * PER_HOST..DISKS),
        &["--rw=randwrite", "--verify_only"],
    );
    for k in 0..2 {
        fio_ok(
            "flushed writes of the survivors",
            &jobs(&nodes, after, k * PER_HOST..(k + 1) * PER_HOST),
            &["--rw=randwrite", "--verify_only"],
        );
    }
    // And they write them: new data, read back and verified.
    fio_ok(
        "new writes on the new writers",
        &jobs(&nodes, after, 2 * PER_HOST..DISKS),
        &[
            "--rw=randwrite",
            "--offset=4M",
            "--do_verify=1",
            "--end_fsync=1",
        ],
    );

    // The lost host comes back: fenced. Its clients read what the new
    // writers wrote, and their writes fail naming the writer; nothing of
    // its old generation is named by a manifest.
    nodes[2].start();
    let c = &nodes[2];
    let d = name(2 * PER_HOST);
    let (_, text) = qemu_io(RAW, &c.uri(&d), &["write -P 0x77 0 4k", "flush"]);
    assert!(
        text.contains("failed"),
        "a write through the host that came back must fail: {text}"
    );
    let info = c.json(&["info", &d]);
    assert_eq!(
        info["object_store"]["owner"]["host"],
        nodes[0].host(),
        "{d} stays with the host that claimed it: {info}"
    );
    fio_ok(
        "the host that came back reads the new writer's data",
        &[(name(2 * PER_HOST), c.uri(&d))],
        &["--rw=randwrite", "--verify_only"],
    );
    let chk = nodes[0].ok(&["check"]);
    assert!(chk.contains("no problems found"), "{chk}");
    // The lost host's uploads of its old generation are garbage now.
    let g = nodes[0].json(&["gc"]);
    assert!(g["claim"].is_string(), "{g}");
    let chk = nodes[1].ok(&["check"]);
    assert!(chk.contains("no problems found"), "{chk}");
    // (Job for job as written: a verify replays its run's offsets.)
    for k in 0..3 {
        fio_ok(
            "every disk after GC",
            &jobs(&nodes, after, k * PER_HOST..(k + 1) * PER_HOST),
            &["--rw=randwrite", "--verify_only"],
        );
    }
    drop(nodes);
    drop(proxies);
}

/// Issue 58 item 6: `strata claim` on a host with no server running makes
/// that host the writer, as the manifest records it, and the old writer,
/// killed and restarted, is refused (naming the new one) instead of
/// taking the disk back with its first write.
#[test]
fn a_claim_without_a_server_holds_against_the_writer_that_comes_back() {
    let Some(shared) = testing::shared() else {
        return;
    };
    if !common::have("qemu-io") {
        return;
    }
    let (mut nodes, proxies) = hosts(shared, 150);
    let logs = tempfile::tempdir().unwrap();
    let a_log = logs.path().join("a.log");
    nodes[0].log = Some(a_log.clone());
    nodes[0].ok(&["create", "d", "--size", "8M"]);

    // Host A writes the disk (and so claims it), flushes, and dies.
    nodes[0].start();
    let (ok, text) = qemu_io(RAW, &nodes[0].uri("d"), &["write -P 0x5a 0 1M", "flush"]);
    assert!(ok, "A's first write: {text}");
    let a_gen = nodes[2].json(&["info", "d"])["object_store"]["generation"].clone();
    nodes[0].kill9();

    // Host B claims it with no server running there.
    let b = nodes[1].host();
    let claimed = nodes[1].json(&["claim", "d"]);
    let gen = claimed["object_store"]["generation"].as_u64().unwrap();
    assert!(gen > a_gen.as_u64().unwrap(), "{claimed} after {a_gen}");
    assert_eq!(claimed["object_store"]["owner"]["host"], b, "{claimed}");
    for (who, n) in [("B", &nodes[1]), ("C", &nodes[2])] {
        let info = n.json(&["info", "d"]);
        let w = &info["object_store"];
        assert_eq!(w["owner"]["host"], b, "{who} sees B as the writer: {info}");
        assert_eq!(w["generation"], gen, "{who} sees B's generation: {info}");
        assert_eq!(w["owner"]["pid"], 0, "the host's claim, no process: {info}");
    }
    // A command on B without a server takes the disk over for its change
    // and gives it back to B, not to the next host's first write.
    nodes[1].ok(&["snapshot", "create", "d", "claimed"]);
    let info = nodes[2].json(&["info", "d"]);
    let w = &info["object_store"];
    assert_eq!(w["owner"]["host"], b, "still B's after a command: {info}");
    assert_eq!(w["owner"]["pid"], 0, "{info}");
    let gen = w["generation"].as_u64().unwrap();

    // A comes back: its writes fail, and it says who has the disk.
    nodes[0].start();
    let (ok, text) = qemu_io(RAW, &nodes[0].uri("d"), &["write -P 0x77 0 4k", "flush"]);
    assert!(
        !ok,
        "a write through the host that came back must fail: {text}"
    );
    let o = nodes[0].strata(&["snapshot", "create", "d", "s"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "A may not change B's disk: {err}");
    let b_host = b.as_str().unwrap();
    assert!(
        err.contains(b_host) && err.contains(&format!("generation {gen}")),
        "A's refusal names B ({b_host}) and generation {gen}: {err}"
    );
    let log = std::fs::read_to_string(&a_log).unwrap();
    assert!(
        log.contains(b_host),
        "A's server says why its write failed, naming B: {log}"
    );
    for (who, n) in [("A", &nodes[0]), ("C", &nodes[2])] {
        let info = n.json(&["info", "d"]);
        let w = &info["object_store"];
        assert_eq!(w["owner"]["host"], b, "{who} still sees B: {info}");
        assert_eq!(w["generation"], gen, "{who}: nothing moved: {info}");
    }

    // B serves the disk: what A flushed is there, and B writes it.
    nodes[1].start();
    let (ok, text) = qemu_io(
        RAW,
        &nodes[1].uri("d"),
        &["read -P 0x5a 0 1M", "write -P 0x33 1M 64k", "flush"],
    );
    assert!(ok, "B reads A's data and writes: {text}");
    let info = nodes[2].json(&["info", "d"]);
    assert_eq!(info["object_store"]["owner"]["host"], b, "{info}");
    // C reads the same through its own server (reading claims nothing).
    nodes[2].start();
    let (ok, text) = qemu_io(
        RAW,
        &nodes[2].uri("d"),
        &["read -P 0x5a 0 1M", "read -P 0x33 1M 64k"],
    );
    assert!(ok, "C reads what A and B flushed: {text}");
    drop(nodes);
    drop(proxies);
}
