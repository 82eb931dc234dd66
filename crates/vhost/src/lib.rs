//! A vhost-user-blk backend that serves any [`BlockDevice`] to QEMU,
//! cloud-hypervisor or any vhost-user frontend, on the rust-vmm crates.
//!
//! # Data path
//!
//! The frontend shares the guest's memory (memfd, `share=on`) and the
//! virtqueues live in it. Each queue has one worker thread
//! ([`Options::queues`] of them, up to what the frontend enables): on a
//! kick it pops every available descriptor chain, turns the chain's guest
//! addresses into host slices and hands them to the device's vectored
//! calls ([`BlockDevice::readv_at`], [`BlockDevice::writev_at`]): no copy
//! through a socket. With [`Options::ring_io`] (`--cache none`), a read
//! into one guest buffer, or a write without FUA from one, that the device
//! plans for direct I/O goes through the queue's io_uring instead, and the
//! same worker returns it when the ring's eventfd says it is done
//! (ARCHITECTURE.md, "Direct I/O through io_uring"). A request of one segment is read from the pool file
//! straight into the guest's buffer (and written from it); the engine
//! does not override the vectored calls yet, so a request of several
//! segments goes through one bounce buffer. The status byte goes back, the chain goes on the used
//! ring, and the frontend is signalled once per batch (EVENT_IDX when
//! negotiated). See [`request`] for what is checked in a chain.
//!
//! # Features
//!
//! VERSION_1, INDIRECT_DESC, EVENT_IDX, SIZE_MAX, SEG_MAX, BLK_SIZE,
//! TOPOLOGY (physical block = the device's preferred block), FLUSH,
//! CONFIG_WCE (a guest that turns its write cache off gets every write
//! made durable before it completes), MQ, DISCARD and WRITE_ZEROES (with
//! unmap) for writable devices, RO for read-only ones; GET_ID answers the
//! serial. Protocol features: CONFIG, MQ, REPLY_ACK, BACKEND_REQ.
//!
//! # Connections and restarts
//!
//! [`VhostBlkServer::serve`] listens on a Unix socket and serves one
//! frontend at a time; when it disconnects, the socket accepts the next one
//! (QEMU's `reconnect=` chardev option). Requests are carried out
//! synchronously by the queue's worker, so when the server stops, every
//! request it popped has completed and been returned before the
//! connection closes; requests the guest queued but the worker had not
//! popped stay in the ring, and a frontend that reconnects resumes from the
//! used index, so they run then. After a crash (kill -9) requests that were
//! popped but not returned run again when the frontend reconnects: a
//! write may be applied twice (same data, same place) and no flushed
//! write is lost, because a flush completes only after it is durable.
//! `VHOST_USER_GET_INFLIGHT_FD` is not implemented.
//!
//! Sockets can be added ([`VhostBlkServer::serve`]) and removed
//! ([`VhostBlkServer::remove`]) while others serve; each lists its
//! frontend ([`VhostBlkServer::sessions`]: the export, the frontend's pid,
//! since when), which [`VhostBlkServer::disconnect`] cuts off.
//!
//! The frontend's control messages pass through a relay (`relay.rs`) on
//! their way to the rust-vmm daemon, unchanged; it keeps the backend
//! channel the frontend offers (`BACKEND_REQ`), so that when the disk's
//! size changes (`strata extend` while served; checked every 250 ms) the
//! frontend is told (`CONFIG_CHANGE_MSG`), reads the configuration space
//! again and the guest sees the new capacity without a reboot.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

mod blk;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
mod relay;
pub mod request;

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use strata_block::BlockDevice;
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

pub use blk::BlkDevice;

/// How often a connection checks its disk's size (to tell the frontend
/// of an extend).
const SIZE_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// How a device is served.
#[derive(Debug, Clone)]
pub struct Options {
    /// Queues offered (the frontend may enable fewer); one worker each.
    pub queues: u16,
    /// Largest queue the frontend may set up.
    pub queue_size: u16,
    /// Most data segments in one request (config `seg_max`).
    pub seg_max: u32,
    /// Largest segment, bytes (config `size_max`).
    pub max_segment_bytes: u32,
    /// What GET_ID answers (up to 20 bytes).
    pub serial: String,
    /// Threads that run a connection's requests, several at once (0: each
    /// queue's worker runs its requests one after the other, which is
    /// fastest when the disk answers from the page cache; with direct
    /// I/O, use about the queue depth the guest keeps).
    pub io_threads: usize,
    /// Reads and writes without FUA that the device plans for direct I/O
    /// (`--cache none`; an engine disk plans its 4 KiB-aligned writes) go
    /// through one io_uring per queue: each starts as soon as it is
    /// planned, and the queue's worker returns them as they complete.
    /// Other requests run as without it.
    pub ring_io: bool,
    /// With `ring_io`, a Linux native AIO context per queue instead of an
    /// io_uring (`serve --aio native`, QEMU's aio=native).
    pub native_aio: bool,
    /// Polling: after its last request or completion a queue's worker
    /// keeps looking for the next this long before it sleeps (no wake-up,
    /// and no kick from the guest, while it looks; QEMU's iothread
    /// `poll-max-ns`), while polling pays (at least a quarter of its
    /// recent polls found something; else it polls now and then to see).
    /// Zero: never.
    pub poll: std::time::Duration,
    /// The export's name (`vm`, `vm@s1`), for [`VhostBlkServer::sessions`].
    pub export: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            queues: 4,
            queue_size: 256,
            seg_max: 254,
            max_segment_bytes: 1 << 20,
            serial: String::new(),
            io_threads: 0,
            ring_io: false,
            native_aio: false,
            poll: std::time::Duration::from_micros(32),
            export: String::new(),
        }
    }
}

/// Opens a fresh handle on the served device for each frontend
/// connection, given the export's name as it is then (a rename changes it:
/// [`VhostBlkServer::rename_exports`]).
pub type Opener =
    Arc<dyn Fn(&str) -> Result<Arc<dyn BlockDevice>, strata_block::Error> + Send + Sync>;

/// vhost-user-blk sockets served by this process.
#[derive(Default)]
pub struct VhostBlkServer {
    /// Set by [`VhostBlkServer::shutdown`]: no socket is served after it.
    stop: Arc<AtomicBool>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    sockets: Vec<Socket>,
}

struct Socket {
    path: PathBuf,
    /// The export's name, which a rename changes.
    export: Arc<Mutex<String>>,
    /// This socket's own stop (a `remove`, or the server's shutdown).
    stop: Arc<AtomicBool>,
    /// Written to wake the accept loop for shutdown.
    wake: UnixStream,
    /// The connected frontend, to list it and to cut it off.
    active: Arc<Mutex<Option<Active>>>,
    thread: JoinHandle<()>,
}

/// The frontend a socket serves now.
struct Active {
    stream: UnixStream,
    pid: Option<i32>,
    read_only: bool,
    since_unix: u64,
}

/// A frontend connected to one of the server's sockets: a session
/// (docs/INTERLOCKS.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub socket: PathBuf,
    pub export: String,
    /// The frontend's process (`SO_PEERCRED`), when the kernel says.
    pub pid: Option<i32>,
    pub read_only: bool,
    pub since_unix: u64,
}

/// A socket the server listens on and the export it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening {
    pub socket: PathBuf,
    pub export: String,
}

/// Queues a device may have: 1 to 64.
fn check_queues(opts: &Options) -> io::Result<()> {
    if opts.queues == 0 || opts.queues > 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} queues: give 1 to 64", opts.queues),
        ));
    }
    Ok(())
}

impl VhostBlkServer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Listen on `path` (a stale socket file there is replaced) and serve
    /// the device `open` returns to one frontend at a time, until
    /// [`shutdown`](Self::shutdown).
    pub fn serve(&self, path: &Path, open: Opener, opts: Options) -> io::Result<()> {
        check_queues(&opts)?;
        // A socket file left by a server that died goes; anything else
        // at the path is an error.
        if let Ok(m) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if m.file_type().is_socket() {
                std::fs::remove_file(path)?;
            }
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| io::Error::new(e.kind(), format!("listen on {}: {e}", path.display())))?;
        self.serve_listener(path, listener, open, opts)
    }

    /// [`Self::serve`] on `listener`, already listening at `path` (a
    /// caller that sets the socket's mode and owner before its file
    /// appears binds it itself).
    pub fn serve_listener(
        &self,
        path: &Path,
        listener: UnixListener,
        open: Opener,
        opts: Options,
    ) -> io::Result<()> {
        check_queues(&opts)?;
        if self.stop.load(Ordering::Acquire) {
            return Err(io::Error::other("the vhost-user-blk server is shut down"));
        }
        if self
            .inner
            .lock()
            .unwrap()
            .sockets
            .iter()
            .any(|s| s.path == path)
        {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} is served already", path.display()),
            ));
        }
        let (wake_rx, wake) = UnixStream::pair()?;
        let active: Arc<Mutex<Option<Active>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let export = Arc::new(Mutex::new(opts.export.clone()));
        let e = export.clone();
        let a = active.clone();
        let s = stop.clone();
        let name = path.display().to_string();
        let thread = std::thread::Builder::new()
            .name("vhost-accept".into())
            .spawn(move || {
                Acceptor {
                    listener,
                    wake: wake_rx,
                    stop: s,
                    active: a,
                    open,
                    export: e,
                    opts,
                    name,
                }
                .run()
            })?;
        self.inner.lock().unwrap().sockets.push(Socket {
            path: path.to_path_buf(),
            export,
            stop,
            wake,
            active,
            thread,
        });
        Ok(())
    }

    /// The sockets served now, in the order they were added.
    pub fn listening(&self) -> Vec<Listening> {
        let inner = self.inner.lock().unwrap();
        inner
            .sockets
            .iter()
            .map(|s| Listening {
                socket: s.path.clone(),
                export: s.export.lock().unwrap().clone(),
            })
            .collect()
    }

    /// The frontends connected now, one per socket at most.
    pub fn sessions(&self) -> Vec<Session> {
        let inner = self.inner.lock().unwrap();
        inner
            .sockets
            .iter()
            .filter_map(|s| {
                let a = s.active.lock().unwrap();
                let a = a.as_ref()?;
                Some(Session {
                    socket: s.path.clone(),
                    export: s.export.lock().unwrap().clone(),
                    pid: a.pid,
                    read_only: a.read_only,
                    since_unix: a.since_unix,
                })
            })
            .collect()
    }

    /// Cut off the frontend of `socket` (a forced `rm` or revert): its
    /// connection is shut down once the requests its workers took are
    /// done; the socket accepts the next frontend as after any
    /// disconnect. False when nobody is connected there.
    pub fn disconnect(&self, socket: &Path) -> bool {
        let inner = self.inner.lock().unwrap();
        let Some(s) = inner.sockets.iter().find(|s| s.path == socket) else {
            return false;
        };
        let a = s.active.lock().unwrap();
        match a.as_ref() {
            Some(a) => {
                let _ = a.stream.shutdown(std::net::Shutdown::Both);
                true
            }
            None => false,
        }
    }

    /// Stop serving `socket` (`strata vhost remove`): as [`Self::shutdown`]
    /// does for every socket, for this one alone. Its export; NotFound
    /// when the server does not serve that socket.
    pub fn remove(&self, socket: &Path) -> io::Result<String> {
        let s = {
            let mut inner = self.inner.lock().unwrap();
            let Some(i) = inner.sockets.iter().position(|s| s.path == socket) else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no vhost-user-blk export on {}", socket.display()),
                ));
            };
            inner.sockets.remove(i)
        };
        let export = s.export.lock().unwrap().clone();
        stop_sockets(vec![s]);
        Ok(export)
    }

    /// Sockets follow a rename (`strata rename`, `snapshot rename`): each
    /// export `rename` maps to a new name is served and listed under it
    /// from now on (a connected frontend keeps its device).
    pub fn rename_exports(&self, rename: &dyn Fn(&str) -> Option<String>) {
        for s in &self.inner.lock().unwrap().sockets {
            let mut e = s.export.lock().unwrap();
            if let Some(new) = rename(&e) {
                *e = new;
            }
        }
    }

    /// Stop accepting, cut off every frontend once the requests its
    /// workers took are done, and remove the socket files.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        let sockets = std::mem::take(&mut self.inner.lock().unwrap().sockets);
        stop_sockets(sockets);
    }
}

/// Stop `sockets`' accept loops and frontends, wait for them, and remove
/// the socket files.
fn stop_sockets(sockets: Vec<Socket>) {
    for s in &sockets {
        s.stop.store(true, Ordering::Release);
        let _ = (&s.wake).write_all(&[1]);
        if let Some(a) = s.active.lock().unwrap().as_ref() {
            let _ = a.stream.shutdown(std::net::Shutdown::Both);
        }
    }
    for s in sockets {
        let _ = s.thread.join();
        let _ = std::fs::remove_file(&s.path);
    }
}

/// Wait until `fd` or `wake` is readable; `false` when woken to stop.
fn wait_readable(fd: i32, wake: &UnixStream, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        let mut p = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `p` is a valid array of two pollfd for the call.
        let r = unsafe { libc::poll(p.as_mut_ptr(), 2, 1000) };
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
        if p[1].revents != 0 || stop.load(Ordering::Acquire) {
            return false;
        }
        if p[0].revents != 0 {
            return true;
        }
    }
}

/// The accept loop of one socket, on a thread of its own: the listening
/// socket, what wakes it for shutdown, where it records the frontend it
/// serves (to cut it off), and how it opens the device for each.
struct Acceptor {
    listener: UnixListener,
    /// Readable when the server shuts down.
    wake: UnixStream,
    stop: Arc<AtomicBool>,
    /// The connected frontend ([`Socket::active`]).
    active: Arc<Mutex<Option<Active>>>,
    open: Opener,
    /// The export's name ([`Socket::export`]).
    export: Arc<Mutex<String>>,
    opts: Options,
    /// The socket's path, for messages.
    name: String,
}

impl Acceptor {
    /// Serve one frontend at a time until the server shuts down.
    fn run(self) {
        let Acceptor {
            listener,
            wake,
            stop,
            active,
            open,
            export,
            opts,
            name,
        } = self;
        while wait_readable(listener.as_raw_fd(), &wake, &stop) {
            let front = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("vhost-user-blk {name}: accept: {e}");
                    continue;
                }
            };
            let current = export.lock().unwrap().clone();
            let dev = match open(&current) {
                Ok(d) => d,
                Err(e) => {
                    // Closing the connection tells the frontend; it may retry.
                    tracing::error!("vhost-user-blk {name}: cannot open the disk: {e}");
                    continue;
                }
            };
            if let Err(e) = serve_one(front, dev, &opts, &active, &stop) {
                tracing::warn!("vhost-user-blk {name}: {e}");
            }
        }
    }
}

/// Serve one frontend connection until it ends.
fn serve_one(
    front: UnixStream,
    dev: Arc<dyn BlockDevice>,
    opts: &Options,
    active: &Mutex<Option<Active>>,
    stop: &AtomicBool,
) -> io::Result<()> {
    let backend = Arc::new(BlkDevice::new(dev.clone(), opts.clone()));
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon = VhostUserDaemon::new("vhost-blk".to_string(), backend.clone(), mem)
        .map_err(|e| io::Error::other(e.to_string()))?;
    // Each queue's worker also returns the reads of its queue's ring.
    for (q, h) in daemon.get_epoll_handlers().iter().enumerate() {
        if let Some(fd) = backend.ring_eventfd(q) {
            h.register_listener(fd, vmm_sys_util::epoll::EventSet::IN, backend.ring_event())?;
        }
    }
    let (inner, to_daemon) = relay::private_pair()?;
    daemon
        .start(&mut Listener::from(inner))
        .map_err(|e| io::Error::other(format!("start: {e}")))?;
    *active.lock().unwrap() = Some(Active {
        stream: front.try_clone()?,
        pid: strata_block::peer::peer_pid(front.as_raw_fd()),
        read_only: dev.read_only(),
        since_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    if stop.load(Ordering::Acquire) {
        let _ = front.shutdown(std::net::Shutdown::Both);
    }
    let channel = relay::BackendChannel::default();
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| relay::relay(&front, &to_daemon, Some(&channel)));
        sc.spawn(|| relay::relay(&to_daemon, &front, None));
        // Tell the frontend when the disk's size changes (an extend).
        sc.spawn(|| {
            let mut size = dev.size_bytes();
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(SIZE_POLL);
                let now = dev.size_bytes();
                if now != size && channel.config_changed() {
                    tracing::info!("vhost-user-blk: capacity {size} -> {now} bytes, frontend told");
                    size = now;
                }
            }
        });
        match daemon.wait() {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => tracing::info!("vhost-user-blk: frontend disconnected"),
            Err(e) => tracing::warn!("vhost-user-blk: connection ended: {e}"),
        }
        done.store(true, Ordering::Release);
        let _ = front.shutdown(std::net::Shutdown::Both);
        let _ = to_daemon.shutdown(std::net::Shutdown::Both);
    });
    *active.lock().unwrap() = None;
    // Dropping the daemon stops the queue workers and waits for them:
    // every request they took has completed, or has been handed to the
    // I/O threads, which finish it now.
    drop(daemon);
    backend.drain();
    Ok(())
}
