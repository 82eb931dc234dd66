//! Helpers for tests that drive the real `strata` binary and real clients.
#![allow(dead_code)]

pub mod http;
pub mod nbd;
pub mod tls;
pub mod vmdk;

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn strata() -> &'static str {
    env!("CARGO_BIN_EXE_strata")
}

/// Whether an external tool is there. Under `make test`
/// (STRATA_REQUIRE_TOOLS=1) a missing tool fails the test instead.
pub fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("STRATA_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("{tool} is required (run scripts/install-deps.sh)");
        }
        eprintln!("skipping: {tool} not installed");
    }
    ok
}

/// Whether FUSE can be mounted here (skips, or fails under
/// STRATA_REQUIRE_TOOLS=1, like `have`).
pub fn have_fuse() -> bool {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok();
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let why = if !dev {
        Some("/dev/fuse cannot be opened (load the fuse module, or give the container the device)")
    } else if !root && !have("fusermount3") {
        Some("fusermount3 is needed to mount as non-root (package fuse3)")
    } else {
        None
    };
    if let Some(why) = why {
        if std::env::var("STRATA_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("FUSE is required: {why}");
        }
        eprintln!("skipping: {why}");
        return false;
    }
    true
}

pub struct Store {
    pub dir: tempfile::TempDir,
}

/// The two kinds of datastore a test can run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Local,
    /// A directory attached to an object store on the test process's
    /// SeaweedFS.
    ObjectStore,
}

/// Run `case` once per kind of datastore, naming the kind if it fails.
/// The object-store run is skipped (with a message) when SeaweedFS is
/// missing and tools are optional.
pub fn each_kind(case: impl Fn(Kind)) {
    for kind in [Kind::Local, Kind::ObjectStore] {
        if kind == Kind::ObjectStore && strata_s3::testing::shared().is_none() {
            continue;
        }
        eprintln!("--- on a {kind:?} datastore");
        case(kind);
    }
}

impl Store {
    pub fn new() -> Store {
        let s = Store::empty();
        s.ok(&["init"]);
        s
    }

    /// A new, empty datastore of `kind` (see [`each_kind`]).
    pub fn of(kind: Kind) -> Store {
        match kind {
            Kind::Local => Store::new(),
            Kind::ObjectStore => {
                strata_s3::testing::shared().expect("SeaweedFS");
                let s = Store::empty();
                let url = format!("s3://strata-cli-test/{:016x}", rand::random::<u64>());
                s.ok(&["init", "--object-store", &url]);
                s
            }
        }
    }
    /// A place for a datastore, with nothing in it yet.
    pub fn empty() -> Store {
        Store {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("ds")
    }
    pub fn cmd(&self, args: &[&str]) -> Output {
        Command::new(strata())
            .arg("--datastore")
            .arg(self.path())
            .args(args)
            .output()
            .unwrap()
    }
    /// Run and require success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd(args);
        assert!(
            o.status.success(),
            "strata {args:?} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }
    /// Run and require failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.cmd(args);
        assert!(!o.status.success(), "strata {args:?} should have failed");
        String::from_utf8(o.stderr).unwrap()
    }
    /// Run and require exit status `code` (docs/ERRORS.md: one per kind
    /// of failure); returns stderr.
    pub fn fails_with(&self, code: i32, args: &[&str]) -> String {
        let o = self.cmd(args);
        let err = String::from_utf8(o.stderr).unwrap();
        assert_eq!(o.status.code(), Some(code), "strata {args:?}: {err}");
        err
    }
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_str(&self.ok(&a)).unwrap()
    }
    /// How many jobs started by `actor` (a server's background passes:
    /// "server (--dedup-interval)") the event log says have ended.
    pub fn jobs_finished_by(&self, actor: &str) -> usize {
        self.ok(&["events", "--limit", "1000"])
            .lines()
            .filter(|l| l.contains("job_finished") && l.contains(actor))
            .count()
    }
    /// Job `id` as `strata jobs --json` lists it.
    pub fn job(&self, id: u64) -> serde_json::Value {
        let jobs = self.json(&["jobs"]);
        jobs.as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("job {id} not listed: {jobs}"))
    }
    /// Job `id` once it is in `state`, polled every 50 ms for at most
    /// `within`.
    pub fn wait_job(&self, id: u64, state: &str, within: Duration) -> serde_json::Value {
        let t = Instant::now();
        loop {
            let j = self.job(id);
            if j["state"] == state {
                return j;
            }
            assert!(t.elapsed() < within, "job {id} never became {state}: {j}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    /// The names `list` gives, in its order.
    pub fn disk_names(&self) -> Vec<String> {
        self.json(&["list"])
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// The names of `disk`'s snapshots, as `snapshot list` gives them.
    pub fn snapshot_names(&self, disk: &str) -> Vec<String> {
        self.json(&["snapshot", "list", disk])
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn sock(&self) -> PathBuf {
        self.dir.path().join("nbd.sock")
    }
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock().display())
    }
    pub fn serve(&self) -> Server {
        Server::start(self)
    }
    /// `serve` with more arguments (e.g. `--http ADDR`).
    pub fn serve_with(&self, extra: &[&str]) -> Server {
        Server::start_with(self, extra)
    }
}

pub struct Server {
    pub child: Option<Child>,
}

/// Bytes that no compressor shrinks and no two seeds repeat (a seeded
/// xorshift), so a test's figures do not depend on luck.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

pub fn wait_for(path: &Path) {
    eventually(
        &format!("{} never appeared", path.display()),
        Duration::from_secs(30),
        || path.exists(),
    );
}

/// Poll `cond` every 20 ms until it holds; fail, saying `what`, once
/// `limit` has passed.
pub fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what} (not within {limit:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    pub fn start(s: &Store) -> Server {
        Server::start_with(s, &[])
    }
    pub fn start_with(s: &Store, extra: &[&str]) -> Server {
        Server::start_env(s, extra, &[])
    }
    /// `serve` with more arguments and environment variables.
    pub fn start_env(s: &Store, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let _ = std::fs::remove_file(s.sock());
        let child = Command::new(strata())
            .arg("--datastore")
            .arg(s.path())
            .arg("serve")
            .arg("--nbd-unix")
            .arg(s.sock())
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        wait_for(&s.sock());
        wait_for(&s.path().join("control.sock"));
        Server { child: Some(child) }
    }
    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }
    /// SIGTERM and wait: the server flushes and exits 0.
    pub fn stop(mut self) {
        let mut c = self.child.take().unwrap();
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let Some(st) = exit_within(&mut c, STOP_LIMIT) else {
            let stacks = server_stacks();
            let _ = c.kill();
            let _ = c.wait();
            panic!("the server still ran {STOP_LIMIT:?} after SIGTERM; its stacks:\n{stacks}");
        };
        assert!(st.success(), "server exit status {st}");
    }
    /// Wait up to `limit` for the server to end by itself (a crash point
    /// aborting it); its exit status, or None if it still runs (then it
    /// is killed).
    pub fn wait_exit(mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take().unwrap();
        let st = exit_within(&mut c, limit);
        if st.is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
        st
    }
    /// kill -9.
    pub fn kill9(mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        let _ = c.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `c`'s exit status once it ends, if that is within `limit`.
fn exit_within(c: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// How long a server may take to stop after SIGTERM (its flush included).
pub const STOP_LIMIT: Duration = Duration::from_secs(120);

/// How long a client command of a test may run before it counts as hung.
pub const RUN_LIMIT: Duration = Duration::from_secs(600);

/// Run `cmd` to its end and take its output (at most [`RUN_LIMIT`]).
pub fn run(cmd: &str, args: &[&str]) -> Output {
    run_within(cmd, args, RUN_LIMIT)
}

/// Run `cmd` to its end and take its output; one still running after
/// `limit` (a server that never answers it) fails the test with the
/// stacks of this test's servers, instead of hanging the whole suite.
pub fn run_within(cmd: &str, args: &[&str], limit: Duration) -> Output {
    let child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd}: {e}"));
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            let stacks = server_stacks();
            // SAFETY: kill(2) of our own child, which has not been reaped
            // (its waiting thread is still waiting).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let o = rx.recv().unwrap().unwrap();
            panic!(
                "{cmd} {args:?} still ran after {limit:?}; it printed: {}{}\n\
                 the stacks of this test's servers then:\n{stacks}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

/// The thread stacks of every `strata` process this test started (gdb's,
/// or where each thread sleeps in the kernel when gdb is not there).
pub fn server_stacks() -> String {
    let me = std::process::id().to_string();
    let mut out = String::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, not ')'.
        let Some((comm, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
        else {
            continue;
        };
        if comm != "strata" || rest.split(' ').nth(1) != Some(me.as_str()) {
            continue;
        }
        let cmdline = std::fs::read_to_string(e.path().join("cmdline"))
            .unwrap_or_default()
            .replace('\0', " ");
        out.push_str(&format!("=== pid {pid}: {cmdline}\n"));
        let gdb = Command::new("timeout")
            .args([
                "120",
                "gdb",
                "-p",
                &pid,
                "-batch",
                "-ex",
                "thread apply all bt",
            ])
            .output();
        match gdb {
            Ok(o) if o.status.success() => out.push_str(&String::from_utf8_lossy(&o.stdout)),
            _ => {
                for t in std::fs::read_dir(e.path().join("task"))
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let read =
                        |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
                    out.push_str(&format!(
                        "thread {} {}: waits in {}\n{}",
                        t.file_name().to_string_lossy(),
                        read("comm").trim(),
                        read("wchan"),
                        read("stack")
                    ));
                }
            }
        }
    }
    out
}

/// `qemu-img compare` of two raw images (paths or NBD URIs); the caller
/// checks the status.
pub fn raw_compare(a: &str, b: &str) -> Output {
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", a, b])
}

/// Copy raw image `src` over the existing raw image `dst` (an NBD URI or
/// a file) with qemu-img; fails the test if it fails.
pub fn raw_copy(src: &str, dst: &str) {
    run_ok(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", src, dst],
    );
}

pub fn run_ok(cmd: &str, args: &[&str]) -> String {
    let o = run(cmd, args);
    assert!(
        o.status.success(),
        "{cmd} {args:?} failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// qemu-io's options for a raw NBD export.
pub const RAW: &[&str] = &["-f", "raw"];
/// The same, cached as a guest runs: writes are not FUA, FLUSH makes
/// them durable.
pub const RAW_WRITEBACK: &[&str] = &["-f", "raw", "-t", "writeback"];

/// qemu-io with `opts` (the format first), then `cmds` one `-c` each, on
/// `target`: whether it exited 0 with no command failing, and what it
/// printed (stdout, then stderr). A failed `flush` prints nothing (only
/// the status says so); a failed read or pattern check prints "failed"
/// and may still exit 0.
pub fn qemu_io(opts: &[&str], target: &str, cmds: &[&str]) -> (bool, String) {
    let mut args = opts.to_vec();
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(target);
    let o = run("qemu-io", &args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success() && !text.contains("failed"), text)
}

/// qemu-io that must succeed ([`qemu_io`]'s `ok`): what it printed.
pub fn qemu_io_ok(opts: &[&str], target: &str, cmds: &[&str]) -> String {
    let (ok, text) = qemu_io(opts, target, cmds);
    assert!(ok, "qemu-io {opts:?} {target} {cmds:?}: {text}");
    text
}

/// fio over NBD: `args` for every job, then one job per `(name, uri)`.
/// It writes crc32c verify headers and never saves verify state (the
/// file would land in the crate's source tree).
pub fn fio(jobs: &[(String, String)], args: &[&str]) -> Output {
    let mut all: Vec<String> = ["--ioengine=nbd", "--verify=crc32c", "--verify_state_save=0"]
        .into_iter()
        .chain(args.iter().copied())
        .map(String::from)
        .collect();
    for (name, uri) in jobs {
        all.push(format!("--name={name}"));
        all.push(format!("--uri={uri}"));
    }
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    run("fio", &all)
}

/// [`fio`] that must succeed (`what` names the run): what it printed.
pub fn fio_ok(what: &str, jobs: &[(String, String)], args: &[&str]) -> String {
    let o = fio(jobs, args);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{what}: fio {args:?} failed: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A key file of `len` random bytes, mode 0600, in `dir`.
pub fn key_file(dir: &Path, name: &str, len: usize) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    let bytes: Vec<u8> = (0..len).map(|_| rand::random::<u8>()).collect();
    std::fs::write(&p, bytes).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// Save what export `uri` reads to the raw file `path`.
pub fn save(uri: &str, path: &Path) {
    run_ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            uri,
            path.to_str().unwrap(),
        ],
    );
}

/// Pages of `path` resident in the host page cache (mincore on a mapping).
pub fn resident_pages(path: &Path) -> usize {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    if len == 0 {
        return 0;
    }
    let pages = len.div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: a read-only shared mapping of a file we opened, unmapped
    // before returning; mincore writes one byte per page into `vec`.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(map, libc::MAP_FAILED);
        assert_eq!(libc::mincore(map, len, vec.as_mut_ptr()), 0);
        libc::munmap(map, len);
    }
    vec.iter().filter(|&&b| b & 1 != 0).count()
}

/// Forget the clean pages of `path` in the host page cache.
pub fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: plain syscall on an owned descriptor; only a hint.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// A small tmpfs, so that "the host file system is full" is real;
/// unmounted when dropped.
pub struct Tmpfs {
    pub dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Some(Tmpfs { dir });
        }
        // Containers without CAP_SYS_ADMIN cannot mount even as root.
        eprintln!("skipping: cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)");
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// The lines of a log file a command appends to (none before its first).
pub fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}
