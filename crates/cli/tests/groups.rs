//! Consistency groups (docs/BACKUP.md) through the command line and real
//! transports: a group snapshot cuts every member at one instant (a
//! writer's dependent writes across NBD, FUSE and vhost-user-blk never
//! show out of order in one, while plain snapshots taken 10 ms apart do),
//! kill -9 leaves all of a group snapshot or none, the quiesce hook's
//! contract, and the rules.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use crate::vfront;

use common::nbd::Pipelined;
use common::*;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const BLOCK: usize = 4096;
/// Blocks each chain cycles through on each disk.
const SLOTS: u64 = 32;
const CHAINS: u64 = 3;
const MAGIC: u32 = 0x5347_5250;

// ------------------------------------------------------------ a small NBD client

/// Just enough NBD (the tests' pipelined client, one request at a time):
/// the writer waits for each reply, as a guest waits for a completion
/// before a dependent write.
struct Nbd(Pipelined);

impl Nbd {
    fn connect(sock: &Path, export: &str) -> Nbd {
        let c = Pipelined::open(sock, export).unwrap_or_else(|e| {
            // What was there: the socket file, and who listens where.
            let out = |cmd: &str, args: &[&str]| {
                std::process::Command::new(cmd)
                    .args(args)
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
            };
            let dir = sock.parent().unwrap().to_str().unwrap();
            panic!(
                "open {export} on {}: {e}\n{}\n{}",
                sock.display(),
                out("ls", &["-la", "--time-style=full-iso", dir]),
                out("ss", &["-xlp"])
                    .lines()
                    .filter(|l| l.contains(dir))
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        });
        Nbd(c)
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.0
            .write_at(data, offset)
            .unwrap_or_else(|e| panic!("NBD write at {offset}: {e}"));
    }

    fn read(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.0
            .read_at(&mut v, offset)
            .unwrap_or_else(|e| panic!("NBD read at {offset}: {e}"));
        v
    }
}

// ------------------------------------------------------------ the writer

/// Block `seq` of `chain`: a header and a fill derived from both, so a
/// torn or misplaced block shows.
fn block(chain: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..12].copy_from_slice(&chain.to_le_bytes());
    b[12..20].copy_from_slice(&seq.to_le_bytes());
    let mut x = chain.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq;
    for c in b[20..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    b
}

fn slot_offset(chain: u64, seq: u64) -> u64 {
    (chain * SLOTS + seq % SLOTS) * BLOCK as u64
}

/// Where the three members are written: disk `a` over NBD, `b` through
/// its FUSE file (opened with FOPEN_DIRECT_IO: a write returns when the
/// server has it), `c` over vhost-user-blk.
struct Transports {
    sock: PathBuf,
    fuse_b: PathBuf,
    vhost: Arc<Mutex<vfront::Guest>>,
}

/// `CHAINS` threads; chain c writes seq n to a, waits, to b, waits, to c,
/// waits, then n+1. Stops when `stop` is set; returns the rounds done.
fn start_writers(
    t: &Transports,
    stop: Arc<AtomicBool>,
    first_seq: u64,
) -> Vec<std::thread::JoinHandle<u64>> {
    (0..CHAINS)
        .map(|chain| {
            let mut nbd = Nbd::connect(&t.sock, "a");
            let fuse = OpenOptions::new().write(true).open(&t.fuse_b).unwrap();
            let vhost = t.vhost.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seq = first_seq;
                while !stop.load(Ordering::Relaxed) {
                    let b = block(chain, seq);
                    let off = slot_offset(chain, seq);
                    nbd.write(off, &b);
                    fuse.write_all_at(&b, off).unwrap();
                    vhost_write(&mut vhost.lock().unwrap(), chain, off, &b);
                    seq += 1;
                }
                seq
            })
        })
        .collect()
}

fn vhost_write(g: &mut vfront::Guest, chain: u64, off: u64, data: &[u8]) {
    let base = vfront::DATA_BASE + chain * 0x10000;
    let (hdr, buf, status) = (base, base + 0x1000, base + 0x3000);
    g.write(hdr, &vfront::header(vfront::T_OUT, off / 512));
    g.write(buf, data);
    g.write(status, &[0xff]);
    let head = g.submit(
        0,
        &[
            (hdr, 16, 0),
            (buf, data.len() as u32, 0),
            (status, 1, vfront::F_WRITE),
        ],
    );
    let (id, _) = g.wait_used(0);
    assert_eq!(id, head);
    assert_eq!(g.read(status, 1)[0], 0, "vhost-user write failed");
}

/// The newest seq of `chain` in a disk's image `export`, after checking
/// that every block is whole and in its slot and that the `SLOTS` seqs
/// up to the newest are all there (no acknowledged write missing).
fn newest(sock: &Path, export: &str, chain: u64, first_seq: u64) -> Result<u64, String> {
    let mut nbd = Nbd::connect(sock, export);
    let bytes = nbd.read(chain * SLOTS * BLOCK as u64, (SLOTS as usize) * BLOCK);
    let mut seqs = Vec::new();
    for (i, b) in bytes.chunks(BLOCK).enumerate() {
        if b.iter().all(|&x| x == 0) {
            seqs.push(None);
            continue;
        }
        let seq = u64::from_le_bytes(b[12..20].try_into().unwrap());
        if b != block(chain, seq).as_slice() || seq % SLOTS != i as u64 {
            return Err(format!(
                "{export}: chain {chain} slot {i}: torn or misplaced block"
            ));
        }
        seqs.push(Some(seq));
    }
    let max = seqs.iter().flatten().copied().max().unwrap_or(0);
    for seq in max.saturating_sub(SLOTS - 1).max(first_seq)..=max {
        if seqs[(seq % SLOTS) as usize] != Some(seq) && max > 0 {
            return Err(format!(
                "{export}: chain {chain}: seq {seq} missing below the newest ({max})"
            ));
        }
    }
    Ok(max)
}

/// Whether the three members' images (`DISK@SNAP` for each snapshot
/// name) hold a state the writer passed through: per chain a >= b >= c
/// >= a - 1.
fn consistent(sock: &Path, snaps: [&str; 3], first_seq: u64) -> Result<(), String> {
    for chain in 0..CHAINS {
        let a = newest(sock, &format!("a@{}", snaps[0]), chain, first_seq)?;
        let b = newest(sock, &format!("b@{}", snaps[1]), chain, first_seq)?;
        let c = newest(sock, &format!("c@{}", snaps[2]), chain, first_seq)?;
        if !(a >= b && b >= c && c + 1 >= a) {
            return Err(format!(
                "chain {chain}: a={a} b={b} c={c} is no state the writer passed through"
            ));
        }
    }
    Ok(())
}

/// Lazily unmounts a FUSE mount on drop, so that a failed test (its
/// server killed) leaves no stale mount behind. Declared before the
/// server, it drops after it.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let mounted = std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(self.0.to_str().unwrap_or("")));
        if mounted {
            let _ = run("umount", &["-l", self.0.to_str().unwrap()]);
        }
    }
}

#[test]
fn group_snapshots_cut_nbd_fuse_and_vhost_writes_at_one_instant() {
    if !have_fuse() {
        return;
    }
    each_kind(cut_under_a_writer);
}

fn cut_under_a_writer(kind: Kind) {
    let s = Store::of(kind);
    for d in ["a", "b", "c"] {
        s.ok(&["create", d, "--size", "16M"]);
    }
    s.ok(&["group", "create", "g", "a", "b", "c"]);
    let mnt = s.dir.path().join("mnt");
    let vsock = s.dir.path().join("c.vhost");
    let _unmount = Unmount(mnt.clone());
    let srv = s.serve_with(&[
        "--fuse",
        mnt.to_str().unwrap(),
        "--vhost-user-blk",
        &format!("c={}", vsock.display()),
    ]);
    eventually("the FUSE file appears", Duration::from_secs(30), || {
        mnt.join("b").exists()
    });
    let t = Transports {
        sock: s.sock(),
        fuse_b: mnt.join("b"),
        vhost: Arc::new(Mutex::new(vfront::Guest::connect(&vsock, 1, 0))),
    };

    // 200 group snapshots under the writer.
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&t, stop.clone(), 1);
    let mut pauses = Vec::new();
    for i in 0..200 {
        let r = s.json(&["group", "snapshot", "g", &format!("g{i}")]);
        assert_eq!(r["members"].as_array().unwrap().len(), 3);
        assert_eq!(r["consistency"], "crash");
        pauses.push(r["pause_us"].as_u64().unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let next: u64 = writers
        .into_iter()
        .map(|w| w.join().unwrap())
        .max()
        .unwrap();
    assert!(next > 200, "the writer barely ran ({next} rounds)");
    for i in 0..200 {
        let n = format!("g{i}");
        if let Err(e) = consistent(&s.sock(), [&n, &n, &n], 1) {
            panic!("group snapshot {n}: {e}");
        }
    }
    pauses.sort_unstable();
    eprintln!(
        "200 group snapshots under {next} rounds of writes: I/O held p50 {} us, max {} us",
        pauses[100], pauses[199]
    );

    // The control: the same writer, plain snapshots of the three disks
    // 10 ms apart. They must catch it between dependent writes (else this
    // test could not tell a cut from three snapshots).
    let stop = Arc::new(AtomicBool::new(false));
    let first = next + 1;
    let writers = start_writers(&t, stop.clone(), first);
    let mut broken = None;
    for i in 0..200 {
        let n = format!("p{i}");
        for d in ["a", "b", "c"] {
            s.ok(&["snapshot", "create", d, &n]);
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Err(e) = consistent(&s.sock(), [&n, &n, &n], first) {
            broken = Some((i, e));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let (tries, why) = broken.expect("plain snapshots 10 ms apart never split a dependent write");
    eprintln!(
        "plain snapshots split the writer after {} tries: {why}",
        tries + 1
    );
    drop(t);
    srv.stop();
    if kind == Kind::Local {
        assert!(s.ok(&["check"]).contains("clean"));
    }
}

/// Per snapshot name: how many of `members` have it, and whether group
/// `g` lists it.
fn presence(s: &Store, members: &[String]) -> std::collections::HashMap<String, (usize, bool)> {
    let mut seen: std::collections::HashMap<String, (usize, bool)> = Default::default();
    for d in members {
        for n in names(&s.json(&["snapshot", "list", d])) {
            seen.entry(n).or_default().0 += 1;
        }
    }
    for n in names(&s.json(&["group", "snapshot", "list", "g"])) {
        seen.entry(n).or_default().1 = true;
    }
    seen
}

#[test]
fn kill_9_during_group_snapshots_leaves_each_whole_or_absent() {
    let s = Store::new();
    let members: Vec<String> = (0..24).map(|i| format!("m{i:02}")).collect();
    for d in &members {
        s.ok(&["create", d, "--size", "8M"]);
    }
    let mut args = vec!["group", "create", "g"];
    args.extend(members.iter().map(String::as_str));
    s.ok(&args);
    let mut asked = Vec::new();
    for round in 0..8u64 {
        let srv = s.serve();
        // Writes keep the log busy while the snapshots commit.
        let mut nbd = Nbd::connect(&s.sock(), "m00");
        nbd.write(round * 4096, &block(0, round + 1));
        let ds = s.path();
        let killed = Arc::new(AtomicBool::new(false));
        let k2 = killed.clone();
        let taker = std::thread::spawn(move || {
            let mut names = Vec::new();
            while !k2.load(Ordering::SeqCst) {
                let n = format!("r{round}-{}", names.len());
                std::process::Command::new(strata())
                    .arg("--datastore")
                    .arg(&ds)
                    .args(["group", "snapshot", "g", &n])
                    .output()
                    .unwrap();
                names.push(n);
            }
            names
        });
        std::thread::sleep(Duration::from_millis(150 + round * 37));
        srv.kill9();
        killed.store(true, Ordering::SeqCst);
        asked.extend(taker.join().unwrap());
        let c = s.ok(&["check"]);
        assert!(c.contains("clean"), "{c}");
    }
    // Offline: every group snapshot asked for is whole or absent.
    let seen = presence(&s, &members);
    let (mut whole, mut absent) = (0, 0);
    for n in &asked {
        match seen.get(n).copied().unwrap_or_default() {
            (k, true) if k == members.len() => whole += 1,
            (0, false) => absent += 1,
            (k, listed) => panic!(
                "{n}: {k} of {} members, group lists it: {listed}",
                members.len()
            ),
        }
    }
    eprintln!("after 8 kills: {whole} group snapshots whole, {absent} absent, none partial");
    assert!(whole > 8, "too few group snapshots were taken to tell");
}

// ------------------------------------------------------------ the hook

/// A hook that logs each call (phase, environment) to `log` and then
/// does what `STRATA_TEST_HOOK_<PHASE>` in its file says.
fn hook_script(dir: &Path, name: &str, quiesce: &str) -> (PathBuf, PathBuf) {
    let log = dir.join("hook.log");
    let path = dir.join(format!("{name}.sh"));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n\
             echo \"$1 $STRATA_HOOK_PHASE group=$STRATA_GROUP snap=$STRATA_SNAPSHOT \
             disks=$STRATA_DISKS\" >> {log}\n\
             if [ \"$1\" = quiesce ]; then {quiesce}; fi\n\
             exit 0\n",
            log = log.display()
        ),
    )
    .unwrap();
    let mut p = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o755);
    std::fs::set_permissions(&path, p).unwrap();
    (path, log)
}

#[test]
fn the_quiesce_hook_runs_around_the_cut_and_unquiesce_always_follows() {
    let s = Store::new();
    for d in ["x", "y"] {
        s.ok(&["create", d, "--size", "4M"]);
    }
    let work = s.dir.path();
    let (ok_hook, log) = hook_script(work, "ok", "true");
    s.ok(&[
        "group",
        "create",
        "g",
        "x",
        "y",
        "--quiesce-hook",
        ok_hook.to_str().unwrap(),
    ]);
    let srv = s.serve();

    // Success: quiesce, cut, unquiesce; application-consistent.
    let r = s.json(&["group", "snapshot", "g", "s1"]);
    assert_eq!(r["consistency"], "application");
    assert_eq!(r["quiesce"]["result"], "ok");
    assert_eq!(r["unquiesce"]["result"], "ok");
    assert_eq!(
        log_lines(&log),
        [
            "quiesce quiesce group=g snap=s1 disks=x y",
            "unquiesce unquiesce group=g snap=s1 disks=x y"
        ]
    );
    std::fs::remove_file(&log).unwrap();

    // exit 22: nothing created, unquiesce once, the error says why.
    let (fail_hook, _) = hook_script(work, "fail", "echo frozen-db-says-no >&2; exit 22");
    let e = s.fails(&[
        "group",
        "snapshot",
        "g",
        "s2",
        "--quiesce-hook",
        fail_hook.to_str().unwrap(),
    ]);
    assert!(
        e.contains("exit status: 22") && e.contains("frozen-db-says-no"),
        "{e}"
    );
    assert!(e.contains("nothing was created"), "{e}");
    assert_eq!(log_lines(&log).len(), 2, "{:?}", log_lines(&log));
    assert!(log_lines(&log)[1].starts_with("unquiesce"));
    assert_eq!(presence_of(&s, "s2"), 0);
    std::fs::remove_file(&log).unwrap();

    // Past the timeout: killed, nothing created, unquiesce runs, I/O goes on.
    let (slow_hook, _) = hook_script(work, "slow", "sleep 30");
    let t0 = Instant::now();
    let e = s.fails(&[
        "group",
        "snapshot",
        "g",
        "s3",
        "--quiesce-hook",
        slow_hook.to_str().unwrap(),
        "--timeout",
        "1",
    ]);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the hook was not killed"
    );
    assert!(e.contains("did not finish 'quiesce' within 1 s"), "{e}");
    assert_eq!(log_lines(&log).len(), 2);
    assert_eq!(presence_of(&s, "s3"), 0);
    Nbd::connect(&s.sock(), "x").write(0, &block(0, 1));
    std::fs::remove_file(&log).unwrap();

    // --ignore-quiesce-error: taken, crash-consistent, the failure kept.
    let r = s.json(&[
        "group",
        "snapshot",
        "g",
        "s4",
        "--quiesce-hook",
        fail_hook.to_str().unwrap(),
        "--ignore-quiesce-error",
    ]);
    assert_eq!(r["consistency"], "crash");
    assert_eq!(r["quiesce"]["result"], "failed");
    assert_eq!(presence_of(&s, "s4"), 2);
    let listed = s.json(&["group", "snapshot", "list", "g"]);
    assert_eq!(listed[1]["quiesce"]["result"], "failed", "{listed}");
    std::fs::remove_file(&log).unwrap();

    // --no-quiesce skips the group's hook.
    let r = s.json(&["group", "snapshot", "g", "s5", "--no-quiesce"]);
    assert_eq!(r["consistency"], "crash");
    assert!(r["quiesce"].is_null());
    assert!(log_lines(&log).is_empty());

    // The server dies while the hook holds the guest frozen: the next
    // server runs unquiesce at start.
    let ds = s.path();
    let slow = slow_hook.clone();
    let taker = std::thread::spawn(move || {
        std::process::Command::new(strata())
            .arg("--datastore")
            .arg(&ds)
            .args([
                "group",
                "snapshot",
                "g",
                "s6",
                "--quiesce-hook",
                slow.to_str().unwrap(),
            ])
            .output()
            .unwrap()
    });
    eventually("the hook's quiesce runs", Duration::from_secs(30), || {
        !log_lines(&log).is_empty()
    });
    assert!(s.path().join("quiesce-pending.g.json").exists());
    srv.kill9();
    assert!(!taker.join().unwrap().status.success());
    assert_eq!(log_lines(&log).len(), 1, "only quiesce so far");
    let srv = s.serve();
    eventually(
        "the restarted server runs unquiesce",
        Duration::from_secs(30),
        || log_lines(&log).len() == 2,
    );
    assert!(log_lines(&log)[1].starts_with("unquiesce unquiesce group=g snap=s6"));
    assert!(!s.path().join("quiesce-pending.g.json").exists());
    assert_eq!(presence_of(&s, "s6"), 0);
    srv.stop();
}

/// How many of the group's members have snapshot `name`.
fn presence_of(s: &Store, name: &str) -> usize {
    ["x", "y"]
        .iter()
        .filter(|d| {
            s.json(&["snapshot", "list", d])
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == name)
        })
        .count()
}

// ------------------------------------------------------------ the rules

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap().to_string())
        .collect()
}

/// `group snapshot` reads `list`, `delete` and `help` as commands of its
/// own: a group so named could never be snapshotted, and `group snapshot
/// app list` once took a snapshot called "list". Both are refused, by
/// either kind of datastore, naming the command meant.
#[test]
fn names_that_are_group_snapshot_commands_are_refused() {
    each_kind(|kind| {
        let s = Store::of(kind);
        s.ok(&["create", "vm", "--size", "8M"]);
        for word in ["list", "ls", "delete", "rm", "help"] {
            let e = s.fails_with(2, &["group", "create", word, "vm"]);
            assert!(
                e.contains(&format!("'{word}' cannot name a group")),
                "{kind:?}: {e}"
            );
        }
        assert!(s.json(&["group", "list"]).as_array().unwrap().is_empty());
        s.ok(&["group", "create", "app", "vm"]);
        let e = s.fails_with(2, &["group", "snapshot", "app", "list"]);
        assert!(
            e.contains("'strata group snapshot list GROUP'"),
            "{kind:?}: {e}"
        );
        s.ok(&["group", "snapshot", "app", "s1"]);
        let e = s.fails_with(2, &["group", "clone", "app@s1", "delete"]);
        assert!(e.contains("'delete' cannot name a group"), "{kind:?}: {e}");
        let snaps = s.json(&["group", "snapshot", "list", "app"]);
        assert_eq!(snaps.as_array().unwrap().len(), 1, "{kind:?}: {snaps}");
        // ls and rm, as for disks and snapshots.
        assert_eq!(s.json(&["group", "snapshot", "ls", "app"]), snaps);
        s.ok(&["group", "snapshot", "rm", "app@s1"]);
        let snaps = s.json(&["group", "snapshot", "ls", "app"]);
        assert!(snaps.as_array().unwrap().is_empty(), "{kind:?}: {snaps}");
    });
}

#[test]
fn group_rules_membership_revert_clone_and_space() {
    each_kind(group_rules);
}

fn group_rules(kind: Kind) {
    let s = Store::of(kind);
    for d in ["vm1-os", "vm1-data", "spare"] {
        s.ok(&["create", d, "--size", "8M"]);
    }
    let e = s.fails(&["group", "create", "vm1", "vm1-os", "nope"]);
    assert!(e.contains("no disk named 'nope'"), "{e}");
    let many: Vec<String> = (0..101).map(|i| format!("d{i}")).collect();
    let mut args = vec!["group", "create", "big"];
    args.extend(many.iter().map(String::as_str));
    let e = s.fails(&args);
    assert!(e.contains("1 to 100 disks, not 101"), "{e}");
    s.ok(&["group", "create", "vm1", "vm1-os", "vm1-data"]);
    let e = s.fails(&["group", "create", "other", "vm1-os"]);
    assert!(e.contains("is in group 'vm1' already"), "{e}");
    let info = s.json(&["group", "info", "vm1"]);
    assert_eq!(info["disks"], serde_json::json!(["vm1-os", "vm1-data"]));

    // Data, a group snapshot, more data.
    let srv = s.serve();
    Nbd::connect(&s.sock(), "vm1-os").write(0, &block(1, 1));
    Nbd::connect(&s.sock(), "vm1-data").write(0, &block(2, 1));
    s.ok(&["group", "snapshot", "vm1", "s1"]);
    Nbd::connect(&s.sock(), "vm1-os").write(0, &block(1, 2));
    Nbd::connect(&s.sock(), "vm1-data").write(4096, &block(2, 2));

    // All or nothing on names.
    s.ok(&["snapshot", "create", "vm1-data", "s2"]);
    let e = s.fails(&["group", "snapshot", "vm1", "s2"]);
    assert!(
        e.contains("disk 'vm1-data' already has a snapshot named 's2'"),
        "{e}"
    );
    assert!(!names(&s.json(&["snapshot", "list", "vm1-os"])).contains(&"s2".into()));
    s.ok(&["snapshot", "delete", "vm1-data", "s2"]);

    // Member snapshots: listed with their group, not deleted alone; the
    // disk is not removed while it is a member.
    let snaps = s.json(&["snapshot", "list", "vm1-os"]);
    assert_eq!(snaps[0]["group"], "vm1", "{snaps}");
    let e = s.fails(&["snapshot", "delete", "vm1-os", "s1"]);
    assert!(e.contains("member of group snapshot 'vm1@s1'"), "{e}");
    let e = s.fails(&["rm", "vm1-os"]);
    assert!(e.contains("is in group 'vm1'"), "{e}");
    // A group lives in one datastore: its members do not move out.
    let other = s.dir.path().join("other");
    run_ok(strata(), &["--datastore", other.to_str().unwrap(), "init"]);
    let e = s.fails(&["move", "vm1-os", "--to", other.to_str().unwrap()]);
    assert!(e.contains("is in group 'vm1'"), "{e}");

    // Space: what the group snapshot alone holds is what each member's
    // holds (they share nothing with each other): vm1-os's overwritten
    // block and each member's map nodes that the live disk rewrote.
    let gs = s.json(&["group", "snapshot", "list", "vm1"]);
    if kind == Kind::Local {
        let excl = |i: usize| gs[0]["members"][i]["exclusive_bytes"].as_u64().unwrap();
        assert_eq!(
            gs[0]["exclusive_bytes"].as_u64().unwrap(),
            excl(0) + excl(1),
            "{gs}"
        );
        assert_eq!(excl(0), excl(1) + 4096, "{gs}");
    }
    assert_eq!(gs[0]["members"].as_array().unwrap().len(), 2, "{gs}");

    // A group clone: linked clones named after the new group.
    let c = s.json(&[
        "group",
        "clone",
        "vm1@s1",
        "vm2",
        "--rename",
        "vm1-data=vm2-db",
    ]);
    assert_eq!(c["disks"], serde_json::json!(["vm2-os", "vm2-db"]));
    for (clone, member) in [("vm2-os", "vm1-os@s1"), ("vm2-db", "vm1-data@s1")] {
        let d = s.json(&["diff", clone, "--from", member, "--totals"]);
        assert_eq!(d["data_bytes"], 0, "{clone} shares {member}: {d}");
        assert_eq!(d["zero_bytes"], 0, "{clone} shares {member}: {d}");
    }
    assert_eq!(s.json(&["info", "vm2-os"])["parent"], "vm1-os@s1");

    // Revert puts both members back; after a membership change it is refused.
    s.ok(&["group", "revert", "vm1", "s1"]);
    assert_eq!(
        Nbd::connect(&s.sock(), "vm1-os").read(0, BLOCK),
        block(1, 1)
    );
    assert_eq!(
        Nbd::connect(&s.sock(), "vm1-data").read(4096, BLOCK),
        vec![0u8; BLOCK]
    );
    s.ok(&["group", "add", "vm1", "spare"]);
    let e = s.fails(&["group", "revert", "vm1", "s1"]);
    assert!(e.contains("added: [spare]"), "{e}");
    s.ok(&["group", "remove", "vm1", "spare"]);
    s.ok(&["group", "revert", "vm1", "s1"]);

    // Deleting the group snapshot deletes every member's; then the group goes.
    let e = s.fails(&["group", "rm", "vm1"]);
    assert!(e.contains("delete them first"), "{e}");
    s.ok(&["group", "snapshot", "delete", "vm1", "s1"]);
    assert!(s
        .json(&["snapshot", "list", "vm1-os"])
        .as_array()
        .unwrap()
        .is_empty());
    assert!(s
        .json(&["snapshot", "list", "vm1-data"])
        .as_array()
        .unwrap()
        .is_empty());
    s.ok(&["group", "snapshot", "vm1", "s9"]);
    s.ok(&["group", "remove", "vm1", "vm1-data"]);
    let e = s.fails(&["move", "vm1-data", "--to", other.to_str().unwrap()]);
    assert!(e.contains("of group snapshot 'vm1@s9'"), "{e}");
    s.ok(&["group", "snapshot", "delete", "vm1", "s9"]);
    s.ok(&["group", "rm", "vm1"]);
    assert_eq!(names(&s.json(&["group", "list"])), ["vm2"]);
    srv.stop();
    if kind == Kind::Local {
        assert!(s.ok(&["check"]).contains("clean"));
    }
}

/// A directory attached to the object store of `s` (another host).
fn attach(s: &Store) -> Store {
    let url = s.json(&["status"])["object_store"]["url"]
        .as_str()
        .unwrap()
        .to_string();
    let b = Store::empty();
    b.ok(&["attach", "--object-store", &url]);
    b
}

#[test]
fn on_an_object_store_one_host_writes_every_member_and_the_group_object_commits() {
    if strata_s3::testing::shared().is_none() {
        return;
    }
    let a = Store::of(Kind::ObjectStore);
    for d in ["d1", "d2"] {
        a.ok(&["create", d, "--size", "8M"]);
    }
    a.ok(&["group", "create", "g", "d1", "d2"]);
    let b = attach(&a);
    assert_eq!(names(&b.json(&["group", "list"])), ["g"]);

    // Host B writes d2: A's group snapshot is refused, naming B.
    let sb = b.serve();
    Nbd::connect(&b.sock(), "d2").write(0, &block(2, 1));
    let sa = a.serve();
    Nbd::connect(&a.sock(), "d1").write(0, &block(1, 1));
    let e = a.fails(&["group", "snapshot", "g", "s1"]);
    assert!(
        e.contains("one writer for every member") && e.contains("d2"),
        "{e}"
    );
    assert!(e.contains("strata claim d2"), "{e}");
    assert!(a
        .json(&["group", "snapshot", "list", "g"])
        .as_array()
        .unwrap()
        .is_empty());
    sb.stop();
    // A claims d2 and cuts both.
    a.ok(&["claim", "d2"]);
    let r = a.json(&["group", "snapshot", "g", "s1"]);
    assert_eq!(r["members"].as_array().unwrap().len(), 2, "{r}");

    // (A crash between the members' records and the group object:
    // crates/datastore/tests/crash.rs.)
    let r = a.json(&["group", "snapshot", "g", "s2"]);
    assert_eq!(r["members"].as_array().unwrap().len(), 2, "{r}");
    // Host B sees the group snapshot, and its members, as A made them.
    let listed = b.json(&["group", "snapshot", "list", "g"]);
    assert_eq!(names(&listed), ["s1", "s2"]);
    let snaps = b.json(&["snapshot", "list", "d2"]);
    assert_eq!(snaps[1]["group"], "g", "{snaps}");
    let e = b.fails(&["snapshot", "delete", "d2", "s2"]);
    assert!(e.contains("member of group snapshot 'g@s2'"), "{e}");
    sa.stop();
}

// ------------------------------------------------------------ a file system, frozen

/// Loop devices and mounts a test made, undone even when it fails.
#[derive(Default)]
struct Mounts(Vec<PathBuf>, Vec<String>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for m in self.0.iter().rev() {
            let _ = run("umount", &["-l", m.to_str().unwrap()]);
        }
        for d in &self.1 {
            let _ = run("losetup", &["-d", d]);
        }
    }
}

impl Mounts {
    /// A loop device over `file`, mounted at `at` (`opts` for mount -o).
    fn mount(&mut self, file: &Path, at: &Path, opts: &str, mkfs: bool) {
        let dev = run_ok("losetup", &["-f", "--show", file.to_str().unwrap()]);
        let dev = dev.trim().to_string();
        self.1.push(dev.clone());
        if mkfs {
            run_ok("mkfs.ext4", &["-q", "-F", &dev]);
        }
        std::fs::create_dir_all(at).unwrap();
        run_ok("mount", &["-o", opts, &dev, at.to_str().unwrap()]);
        self.0.push(at.to_path_buf());
    }
}

fn loop_devices_usable() -> bool {
    let ok = run("losetup", &["-f"]).status.success() && have("mkfs.ext4") && have("fsfreeze");
    if !ok {
        eprintln!("skipping: no loop device (or mkfs.ext4, fsfreeze) here");
    }
    ok
}

#[test]
fn a_file_written_without_sync_is_in_a_group_snapshot_taken_with_the_fsfreeze_hook() {
    if !have_fuse() || !loop_devices_usable() {
        return;
    }
    // The case Kubernetes' group-snapshot conformance test makes (echo
    // into a file, no sync, snapshot, restore, read): only a freeze gets
    // the page cache's data into the disks before the cut.
    let s = Store::new();
    s.ok(&["create", "data", "--size", "64M"]);
    s.ok(&["create", "log", "--size", "16M"]);
    let work = s.dir.path();
    let (fuse, fs) = (work.join("fuse"), work.join("fs"));
    let hook = format!(
        "{} {}",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts/quiesce-hooks/host-fsfreeze")
            .canonicalize()
            .unwrap()
            .display(),
        fs.display()
    );
    s.ok(&[
        "group",
        "create",
        "app",
        "data",
        "log",
        "--quiesce-hook",
        &hook,
    ]);
    let srv = s.serve_with(&["--fuse", fuse.to_str().unwrap()]);
    eventually("the FUSE file appears", Duration::from_secs(30), || {
        fuse.join("data").exists()
    });
    let mut m = Mounts::default();
    m.mount(&fuse.join("data"), &fs, "rw", true);
    std::fs::write(fs.join("f"), b"written, never synced\n").unwrap();

    let r = s.json(&["group", "snapshot", "app", "s1"]);
    assert_eq!(r["consistency"], "application", "{r}");
    assert_eq!(r["quiesce"]["result"], "ok", "{r}");
    assert_eq!(r["unquiesce"]["result"], "ok", "{r}");
    // Thawed: the file system takes writes again.
    std::fs::write(fs.join("after"), b"x").unwrap();

    // Restore: a clone of data@s1, mounted read-only, holds the file
    // (a frozen ext4 needs no journal replay).
    s.ok(&["clone", "data@s1", "restored"]);
    eventually("the clone's FUSE file", Duration::from_secs(30), || {
        fuse.join("restored").exists()
    });
    m.mount(&fuse.join("restored"), &work.join("restored"), "ro", false);
    assert_eq!(
        std::fs::read(work.join("restored/f")).unwrap(),
        b"written, never synced\n"
    );
    drop(m);
    srv.stop();
}
