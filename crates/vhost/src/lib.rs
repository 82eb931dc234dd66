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
//! calls ([`BlockDevice::readv_at`], [`BlockDevice::writev_at`]), so a
//! read lands in guest memory without a copy through a socket or a bounce
//! buffer (the engine copies from its page cache straight into the
//! guest's buffer). The status byte goes back, the chain goes on the used
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
//! serial. Protocol features: CONFIG, MQ, REPLY_ACK.
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
//! Not done: telling the frontend the disk grew (the backend-request
//! channel's CONFIG_CHANGE message; the rust-vmm `vhost` crate has no way
//! to send it yet). A guest sees a new capacity after it reconnects.

mod blk;
pub mod config;
pub mod request;

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use strata_block::BlockDevice;
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

pub use blk::BlkDevice;

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
}

impl Default for Options {
    fn default() -> Self {
        Self {
            queues: 4,
            queue_size: 256,
            seg_max: 254,
            max_segment_bytes: 1 << 20,
            serial: String::new(),
        }
    }
}

/// Opens a fresh handle on the served device for each frontend connection.
pub type Opener = Arc<dyn Fn() -> Result<Arc<dyn BlockDevice>, String> + Send + Sync>;

/// vhost-user-blk sockets served by this process.
#[derive(Default)]
pub struct VhostBlkServer {
    stop: Arc<AtomicBool>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    sockets: Vec<Socket>,
}

struct Socket {
    path: PathBuf,
    /// Written to wake the accept loop for shutdown.
    wake: UnixStream,
    /// The connected frontend's daemon, to cut it off at shutdown.
    active: Arc<Mutex<Option<ShutdownHandle>>>,
    thread: JoinHandle<()>,
}

impl VhostBlkServer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Listen on `path` (a stale socket file there is replaced) and serve
    /// the device `open` returns to one frontend at a time, until
    /// [`shutdown`](Self::shutdown).
    pub fn serve(&self, path: &Path, open: Opener, opts: Options) -> io::Result<()> {
        if opts.queues == 0 || opts.queues > 64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} queues: give 1 to 64", opts.queues),
            ));
        }
        let listener = Listener::new(path, true)
            .map_err(|e| io::Error::other(format!("listen on {}: {e}", path.display())))?;
        let (wake_rx, wake) = UnixStream::pair()?;
        let active: Arc<Mutex<Option<ShutdownHandle>>> = Arc::default();
        let stop = self.stop.clone();
        let a = active.clone();
        let name = path.display().to_string();
        let thread = std::thread::Builder::new()
            .name("vhost-accept".into())
            .spawn(move || accept_loop(listener, wake_rx, stop, a, open, opts, name))?;
        self.inner.lock().unwrap().sockets.push(Socket {
            path: path.to_path_buf(),
            wake,
            active,
            thread,
        });
        Ok(())
    }

    /// Stop accepting, cut off every frontend once the requests its
    /// workers took are done, and remove the socket files.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        let sockets = std::mem::take(&mut self.inner.lock().unwrap().sockets);
        for s in &sockets {
            let _ = (&s.wake).write_all(&[1]);
            if let Some(h) = s.active.lock().unwrap().as_ref() {
                h.shutdown();
            }
        }
        for s in sockets {
            let _ = s.thread.join();
            let _ = std::fs::remove_file(&s.path);
        }
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

fn accept_loop(
    mut listener: Listener,
    wake: UnixStream,
    stop: Arc<AtomicBool>,
    active: Arc<Mutex<Option<ShutdownHandle>>>,
    open: Opener,
    opts: Options,
    name: String,
) {
    while wait_readable(listener.as_raw_fd(), &wake, &stop) {
        let dev = match open() {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("vhost-user-blk {name}: cannot open the disk: {e}");
                // Take the connection and close it, so the frontend sees a
                // refusal rather than a hang.
                if let Ok(Some(s)) = listener.accept() {
                    drop(s);
                }
                continue;
            }
        };
        let backend = Arc::new(BlkDevice::new(dev, opts.clone()));
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon = match VhostUserDaemon::new("vhost-blk".to_string(), backend, mem) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("vhost-user-blk {name}: {e}");
                return;
            }
        };
        if let Err(e) = daemon.start(&mut listener) {
            tracing::warn!("vhost-user-blk {name}: accept: {e}");
            continue;
        }
        *active.lock().unwrap() = daemon.shutdown_handle();
        if stop.load(Ordering::Acquire) {
            daemon.request_shutdown();
        }
        match daemon.wait() {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => tracing::info!("vhost-user-blk {name}: frontend disconnected"),
            Err(e) => tracing::warn!("vhost-user-blk {name}: connection ended: {e}"),
        }
        *active.lock().unwrap() = None;
        // Dropping the daemon stops the queue workers and waits for them:
        // every request they took has completed.
        drop(daemon);
    }
}
