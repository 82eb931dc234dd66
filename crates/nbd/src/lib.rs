//! An NBD server that exports any [`BlockDevice`] over Unix and TCP sockets.
//!
//! # What is supported
//!
//! Fixed-newstyle negotiation only (no oldstyle): `EXPORT_NAME`, `ABORT`,
//! `LIST`, `INFO`, `GO`, `STRUCTURED_REPLY`, `LIST_META_CONTEXT` and
//! `SET_META_CONTEXT` with `base:allocation` and the contexts the export
//! provider offers (strata's `qemu:dirty-bitmap:SNAP`), and `STARTTLS`
//! when the server has credentials ([`TlsOptions`]: x509 in QEMU's
//! directory layout; with [`TlsMode::Require`] every other option before
//! it is refused with `NBD_REP_ERR_TLS_REQD`, the spec's FORCEDTLS; what
//! was negotiated before it is forgotten). `EXTENDED_HEADERS` and unknown
//! options are answered with `NBD_REP_ERR_UNSUP`. In transmission every command of the base protocol
//! is served: READ, WRITE (with FUA), DISC, FLUSH, TRIM, CACHE (validated,
//! then a no-op), WRITE_ZEROES (NO_HOLE, FAST_ZERO) and BLOCK_STATUS
//! (REQ_ONE). Exports advertise `CAN_MULTI_CONN`: a device's flush covers
//! writes made through every handle, so clients may spread I/O over many
//! connections. A READ is one call to the device's `read_at`, whose
//! [`ReadFill`] says which runs are holes; the server never asks
//! `block_status` to answer a READ (so a statistics wrapper sees exactly
//! the client's commands). A structured READ reply is one `OFFSET_DATA`
//! chunk, except for reads of 64 KiB or more without `DF`: there every hole
//! of at least 4 KiB the read reported goes out as an `OFFSET_HOLE` chunk
//! without data, and the data between as `OFFSET_DATA` chunks, in order
//! (a read that is all hole is one `OFFSET_HOLE` chunk). Simple replies are
//! used for successful commands that return no data; errors go out as
//! `ERROR` chunks (with a message) once structured replies are negotiated.
//! `DF` is advertised only with structured replies, as the spec requires.
//!
//! # Threads
//!
//! - One accept thread per listener ([`NbdServer::serve_unix`],
//!   [`NbdServer::serve_tcp`]; any number of them on one server). It waits in
//!   `poll(2)` on the listening socket and on a wake-up socket that
//!   [`NbdServer::shutdown`] writes to.
//! - One thread per connection: it runs the handshake, then reads request
//!   headers and write payloads, validates each request, and queues it.
//!   Requests that fail validation are answered at once by this thread,
//!   and so are small WRITEs when [`ServerOptions::inline_write_bytes`]
//!   asks for it (a device that writes into a cache).
//! - Up to [`ServerOptions::workers_per_connection`] worker threads per
//!   connection, started on demand, execute queued requests against the
//!   device and write the replies. Replies go out under a mutex on the
//!   socket, each as one vectored write of its header(s) and data (READ
//!   data is read from the device straight into the buffer that is sent).
//!   WRITE payloads and READ data live in page-aligned buffers
//!   ([`AlignedBuf`]), recycled through a small per-connection pool.
//! - With [`ServerOptions::ring_io`], READs and WRITEs (without FUA) that
//!   the device plans skip the workers: the connection's thread starts
//!   them on a ring of its own, and a reaping thread answers them. With
//!   [`ServerOptions::one_thread`], over a plain socket, the connection's
//!   thread takes their completions and answers them itself, waiting in
//!   `poll(2)` on its socket and the ring's eventfd (after polling both
//!   for up to [`ServerOptions::poll`]), as QEMU's main loop does.
//!
//! # Bounds
//!
//! Connections: [`ServerOptions::max_connections`]; when all are taken a
//! new connection takes the place of the one negotiating longest, and is
//! closed at once only when every place is past its handshake. Requests: at most [`ServerOptions::max_request_bytes`]
//! of data per READ/WRITE, advertised as the maximum block size; per
//! connection at most [`ServerOptions::max_inflight_requests`] requests
//! and [`ServerOptions::max_inflight_bytes`] of READ/WRITE data queued or
//! executing (the reader stops reading until replies free room; one that
//! answers its own ring's requests answers them meanwhile). A connection
//! that answers on its reading thread reads no request while a reply
//! waits for the client to take it: clients read replies while they send,
//! as libnbd, QEMU and the kernel's client do. Handshake:
//! option payloads of at most [`OPTION_BYTES_MAX`] (larger ones are read,
//! discarded and refused with `ERR_TOO_BIG`, huge ones close the
//! connection), a bounded number of options, and an idle timeout
//! ([`ServerOptions::handshake_timeout`]).
//!
//! # Errors and hostile clients
//!
//! Nothing a client sends makes the server panic. A malformed handshake, a
//! request header with a bad magic, or an oversized payload that cannot be
//! skipped closes that connection only. A well-formed request that is
//! invalid (misaligned, past the end, too long, unknown command or flag,
//! write to a read-only export) gets an errno reply and the connection goes
//! on. Device errors map through [`BlockError::errno`]. A device that
//! panics while serving a request gets `EIO` for that request.
//!
//! # Shutdown
//!
//! [`NbdServer::shutdown`] stops the listeners, stops every connection from
//! reading further requests, lets queued and executing requests finish and
//! send their replies (bounded by [`ServerOptions::shutdown_grace`] for
//! clients that do not read), closes the sockets, and returns once every
//! connection has released its device handle. The caller can then flush
//! and close the devices. It returns within twice the grace whatever the
//! clients do: connections still busy after one grace (a reply that was
//! already blocked on a client that stopped reading when the timeout was
//! set) are closed both ways, and any still there after a second one (a
//! device that never answers) are left behind, with an error logged.
//!
//! Every connection ends with a lingering close: its TLS session's
//! close_notify, then a wait (up to the grace) until the client has
//! acknowledged everything sent, reading and dropping what it still
//! sends, and only then the shutdown both ways. Over TCP, data that
//! arrives once a socket has shut down reading and sent its FIN resets
//! the connection, and a reset discards replies not yet delivered.
//!
//! [`BlockError::errno`]: strata_block::BlockError::errno
//! [`ReadFill`]: strata_block::ReadFill
//! [`AlignedBuf`]: strata_block::AlignedBuf
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

mod authz;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod proto;
mod readahead;
mod sessions;
mod tls;
mod transmission;

pub use authz::{Access, Authz};
use sessions::OpenedBy;
pub use sessions::{Session, SessionList};
use strata_block::peer::peer_pid;
pub use tls::{server_config, TlsMode, TlsOptions};

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use strata_block::BlockDevice;

/// Largest option payload accepted during the handshake.
pub const OPTION_BYTES_MAX: u32 = 64 * 1024;

/// One export as listed to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    /// Free text shown by clients (`nbdinfo`); may be empty.
    pub description: String,
}

/// Where the server finds its exports. Called from connection threads.
pub trait ExportProvider: Send + Sync {
    /// Every export, in order; the first one is the default export (the
    /// one a client gets when it asks for the empty name).
    fn list(&self) -> Vec<ExportInfo>;
    /// Open an export by name for one client connection, or say why not:
    /// the error's kind decides the option reply a client gets (no such
    /// export, a store the server cannot reach, a disk another host
    /// holds), its message is what the client prints. The handle is
    /// dropped when the connection ends.
    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error>;

    /// The metadata contexts `export` offers besides `base:allocation`
    /// (full names, such as `qemu:dirty-bitmap:s1`), for
    /// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
    fn contexts(&self, _export: &str) -> Vec<String> {
        Vec::new()
    }

    /// Context `name` of `export`, selected by one connection (None: it
    /// does not exist, and is not selected).
    fn context(&self, _export: &str, _name: &str) -> Option<Arc<dyn MetaContext>> {
        None
    }
}

/// A metadata context other than `base:allocation`: the status flags a
/// BLOCK_STATUS reply gives for it.
pub trait MetaContext: Send + Sync {
    /// Runs of `(length, flags)` from `offset`, ascending, covering at
    /// least a first part of `[offset, offset + len)`; runs past the range
    /// are cut.
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u32)>>;

    /// The flag bits that mark the ranges a client copying the export reads
    /// next (a backup reads the dirty ones of a dirty bitmap), if the
    /// context has such bits. A connection that selected such a context
    /// reads ahead along the ranges its replies marked; otherwise along the
    /// data `base:allocation` reported.
    fn read_next_flags(&self) -> Option<u32> {
        None
    }
}

/// Why the server turned a client away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// More connections than [`ServerOptions::max_connections`].
    TooManyConnections,
    /// An option other than `STARTTLS` before TLS, on a server that
    /// requires it.
    TlsRequired,
    /// A TLS handshake failed (a client that does not trust the server, or
    /// whose certificate the server does not).
    TlsHandshake,
    /// An export no `--tls-authz` rule grants to the client.
    NotGranted,
    /// An export already open on
    /// [`ServerOptions::max_connections_per_export`] connections.
    ExportFull,
    /// A client that did not finish its handshake within
    /// [`ServerOptions::handshake_timeout`].
    HandshakeTimeout,
    /// A client still in its handshake, closed to make room for a new one
    /// when every place of [`ServerOptions::max_connections`] was taken.
    HandshakeEvicted,
    /// A client that broke the protocol: a bad magic number, a length
    /// past the limits, a request that makes no sense on the wire.
    ProtocolError,
}

impl Refusal {
    pub const ALL: [Refusal; 8] = [
        Refusal::TooManyConnections,
        Refusal::TlsRequired,
        Refusal::TlsHandshake,
        Refusal::NotGranted,
        Refusal::ExportFull,
        Refusal::HandshakeTimeout,
        Refusal::HandshakeEvicted,
        Refusal::ProtocolError,
    ];

    /// Its name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::TooManyConnections => "too_many_connections",
            Refusal::TlsRequired => "tls_required",
            Refusal::TlsHandshake => "tls_handshake",
            Refusal::NotGranted => "not_granted",
            Refusal::ExportFull => "export_full",
            Refusal::HandshakeTimeout => "handshake_timeout",
            Refusal::HandshakeEvicted => "handshake_evicted",
            Refusal::ProtocolError => "protocol_error",
        }
    }
}

/// How often a server turned clients away, per cause; each cause is
/// logged at most once a minute (with how many since), so a hostile
/// client cannot flood the log.
#[derive(Default)]
pub struct Refusals {
    counts: [std::sync::atomic::AtomicU64; Refusal::ALL.len()],
    /// Per cause: when it was last logged, and refusals since.
    logged: Mutex<[(Option<std::time::Instant>, u64); Refusal::ALL.len()]>,
}

/// Least time between two log lines of one refusal cause.
const REFUSAL_LOG_GAP: Duration = Duration::from_secs(60);

impl Refusals {
    /// Refusals of `cause` so far.
    pub fn count(&self, cause: Refusal) -> u64 {
        self.counts[cause as usize].load(Ordering::Relaxed)
    }

    /// Count a refusal, and log it unless its cause was logged within the
    /// last minute.
    pub(crate) fn note(&self, cause: Refusal, what: &str) {
        self.counts[cause as usize].fetch_add(1, Ordering::Relaxed);
        let mut l = self.logged.lock();
        let (at, since) = &mut l[cause as usize];
        *since += 1;
        if at.is_some_and(|t| t.elapsed() < REFUSAL_LOG_GAP) {
            return;
        }
        let more = match *since {
            1 => String::new(),
            n => format!(" ({} more of this kind since the last line)", n - 1),
        };
        tracing::warn!(
            event = "refused",
            cause = cause.name(),
            since_last = *since,
            "NBD: refused ({}): {what}{more}",
            cause.name()
        );
        *at = Some(std::time::Instant::now());
        *since = 0;
    }
}

/// Limits and tuning of a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest READ or WRITE, advertised as the maximum block size
    /// (rounded down to a multiple of 512). Default 32 MiB.
    pub max_request_bytes: u32,
    /// Connections served at once, counting those still negotiating.
    /// When all are taken, a new connection closes the one that has been
    /// negotiating longest ([`Refusal::HandshakeEvicted`]); it is refused
    /// only when every place is past its handshake. Default 128.
    pub max_connections: usize,
    /// Connections one export may be open on at once (a `GO` or
    /// `EXPORT_NAME` past it is refused); 0: no limit but
    /// `max_connections`. Default 64.
    pub max_connections_per_export: usize,
    /// Worker threads per connection, started as requests queue up.
    /// Default 4.
    pub workers_per_connection: usize,
    /// Requests of one connection queued or executing at once. Default 64.
    pub max_inflight_requests: usize,
    /// READ/WRITE bytes of one connection queued or executing at once; a
    /// single request is always admitted when nothing else is in flight.
    /// Default 64 MiB.
    pub max_inflight_bytes: u64,
    /// How long the handshake may wait for the client's next message (and
    /// for the client to take our replies). `None` waits forever.
    /// Default 10 s.
    pub handshake_timeout: Option<Duration>,
    /// During [`NbdServer::shutdown`], how long a reply may wait for a
    /// client that does not read before the connection is dropped.
    /// Default 5 s.
    pub shutdown_grace: Duration,
    /// Bytes of the ranges a connection's BLOCK_STATUS replies marked as
    /// read next that the device is asked to prefetch ahead of the
    /// client's reads along them (see `readahead.rs`); 0 turns this off.
    /// Default 8 MiB.
    pub read_ahead_bytes: u64,
    /// READs and WRITEs (without FUA) of devices that plan them
    /// (`BlockDevice::plan_read`, `plan_write`: an engine disk; writes
    /// only aligned ones under `--cache none`) go through an
    /// io_uring per connection, submitted in batches, instead of a worker
    /// each (`serve --aio io_uring`, the server's default). The reader
    /// answers those already done when it has submitted (reads the page
    /// cache held complete inside the submission); a reaping thread
    /// answers the rest, unless `one_thread`. Where a ring cannot be set
    /// up the workers serve them. Default false.
    pub ring_io: bool,
    /// With `ring_io` over a plain socket, the connection's reader
    /// answers every request of its ring itself, waiting for its socket
    /// and its ring at once: one thread per connection, as QEMU's main
    /// loop (serve sets it under `--cache none`, where it removed the
    /// two-thread hand-over's bimodal cold reads; under writeback, 64
    /// connections on two cores showed a longer read tail with it).
    /// Over TLS, whose session may hold bytes the socket does not
    /// announce, a reaping thread answers whatever this says. Default
    /// false.
    pub one_thread: bool,
    /// With `ring_io`, a Linux native AIO context per connection instead
    /// of an io_uring (`serve --aio native`, QEMU's aio=native): a
    /// completion signals the connection straight from the device's
    /// interrupt, where an io_uring's is posted by the connection's
    /// thread when it asks. Only for direct I/O (elsewhere its
    /// submissions block).
    /// Default false.
    pub native_aio: bool,
    /// With `one_thread`: how long, at most, the
    /// connection's thread keeps looking for the client's next request
    /// and the ring's next completion each time it would sleep with
    /// requests in the ring (never while the ring is empty, so an idle
    /// connection costs nothing). Zero: it sleeps at once. Default 32 µs.
    pub poll: Duration,
    /// WRITEs of at most this many bytes without FUA are carried out by
    /// the connection's reader itself, between reading one request and
    /// the next, instead of being handed to a worker. For a device whose
    /// writes land in a cache (an engine disk under the default writeback
    /// cache: a copy into the host page cache), where the hand-over (a
    /// wake-up and a switch to the worker and back) costs more than the
    /// write: with many connections on few cores, those extra threads
    /// woken per request make the tail (PERFORMANCE.md, "Many disks").
    /// 0: every request goes to the workers. Default 0.
    pub inline_write_bytes: u32,
    /// The CPU-scheduler slice each connection's threads ask for
    /// (`strata_block::sched`; Linux 6.12+, ignored before): short
    /// slices bring a preempted connection thread back sooner, which
    /// shortens the tail when many clients share few cores and every
    /// disk's writes meet in one pool file. `None`: the kernel's default.
    /// Default `None`.
    pub sched_slice: Option<Duration>,
    /// TLS credentials and whether TLS is required (`STARTTLS`); `None`
    /// refuses `STARTTLS`. Replaced while serving by
    /// [`NbdServer::set_tls`]; each connection uses what was set when it
    /// was accepted. Default `None`.
    pub tls: Option<TlsOptions>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_request_bytes: 32 << 20,
            max_connections: 128,
            max_connections_per_export: 64,
            workers_per_connection: 4,
            max_inflight_requests: 64,
            max_inflight_bytes: 64 << 20,
            handshake_timeout: Some(Duration::from_secs(10)),
            shutdown_grace: Duration::from_secs(5),
            read_ahead_bytes: 8 << 20,
            ring_io: false,
            one_thread: false,
            native_aio: false,
            poll: Duration::from_micros(32),
            inline_write_bytes: 0,
            sched_slice: None,
            tls: None,
        }
    }
}

impl ServerOptions {
    /// Bring every limit into the range the protocol and the server need.
    fn sanitized(mut self) -> Self {
        self.max_request_bytes = (self.max_request_bytes & !511).max(4096);
        self.max_connections = self.max_connections.max(1);
        self.workers_per_connection = self.workers_per_connection.max(1);
        self.max_inflight_requests = self.max_inflight_requests.max(1);
        self.max_inflight_bytes = self.max_inflight_bytes.max(1);
        self
    }
}

/// A connected byte stream the server can serve: a socket that can be
/// cloned into a read half and a write half and shut down from another
/// thread. Implemented for [`UnixStream`] and [`TcpStream`].
pub trait NbdStream: Read + Write + Send + Sized + 'static {
    /// Another handle on the same socket.
    fn clone_stream(&self) -> io::Result<Self>;
    /// `shutdown(2)` the socket.
    fn shutdown_stream(&self, how: Shutdown) -> io::Result<()>;
    /// Who is at the other end, for people: `ip:port`, or `local pid N`
    /// over a Unix socket.
    fn peer(&self) -> String {
        "unknown".to_string()
    }
    /// Set `SO_RCVTIMEO` / `SO_SNDTIMEO` (`None` blocks forever).
    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()>;
    /// Tune a freshly accepted socket (e.g. `TCP_NODELAY`).
    fn tune(&self) -> io::Result<()> {
        Ok(())
    }
    /// Wake a reader blocked on the socket only once `bytes` have arrived
    /// (`SO_RCVLOWAT`; 1: at the first byte). Only for bytes that are sure
    /// to come: a client that sends fewer and waits would wait for ever.
    /// A socket that cannot do it ignores it.
    fn set_wake_bytes(&self, _bytes: usize) -> io::Result<()> {
        Ok(())
    }
    /// The descriptor to poll for the next bytes, when everything read
    /// comes straight from it (no layer that holds bytes back, as TLS
    /// does): the connection then waits for its socket and its ring at
    /// once.
    fn poll_fd(&self) -> Option<RawFd> {
        None
    }
    /// Once the connection is over, before it is shut down and closed:
    /// wait up to `limit` for what was sent to be delivered, reading and
    /// dropping what the client still sends meanwhile. For TCP, where
    /// closing with unread bytes, or bytes arriving once both ways are
    /// shut down, resets the connection, and a reset discards the
    /// replies the client has not received yet.
    fn linger(&self, _limit: Duration) {}
}

impl NbdStream for UnixStream {
    fn clone_stream(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn peer(&self) -> String {
        // Not the socket's path: a server may bind a temporary name and
        // rename it into place.
        match peer_pid(self.as_raw_fd()) {
            Some(pid) => format!("local pid {pid}"),
            None => "a local process".into(),
        }
    }
    fn shutdown_stream(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(read)?;
        self.set_write_timeout(write)
    }
    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }
}

impl NbdStream for TcpStream {
    fn clone_stream(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn peer(&self) -> String {
        self.peer_addr()
            .map_or("a TCP client".into(), |a| a.to_string())
    }
    fn shutdown_stream(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(read)?;
        self.set_write_timeout(write)
    }
    fn tune(&self) -> io::Result<()> {
        self.set_nodelay(true)
    }
    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }
    fn linger(&self, limit: Duration) {
        let fd = self.as_raw_fd();
        let until = Instant::now() + limit;
        let mut wait = Duration::from_micros(100);
        let mut scratch = [0u8; 16 * 1024];
        loop {
            // Requests of a client that was still sending when the
            // server stopped are dropped (nothing unread at the close).
            // SAFETY: a read into a live buffer of its length.
            while unsafe {
                libc::recv(
                    fd,
                    scratch.as_mut_ptr().cast(),
                    scratch.len(),
                    libc::MSG_DONTWAIT,
                )
            } > 0
            {}
            let mut unsent: libc::c_int = 0;
            // SAFETY: SIOCOUTQ writes one c_int, into a live one.
            let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut unsent) };
            // A connection the client reset keeps counting what it never
            // acknowledged: nothing more will be delivered.
            if r != 0 || unsent == 0 || tcp_closed(fd) || Instant::now() >= until {
                return;
            }
            thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_millis(20));
        }
    }
    fn set_wake_bytes(&self, bytes: usize) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let v = bytes.clamp(1, i32::MAX as usize) as libc::c_int;
        // SAFETY: the descriptor is this socket's, open for its lifetime;
        // the option's value is a c_int read for its size.
        let r = unsafe {
            libc::setsockopt(
                self.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Whether the TCP connection of socket `fd` is closed (reset, or over).
fn tcp_closed(fd: RawFd) -> bool {
    // The first byte of `struct tcp_info` is the state; TCP_CLOSE is 7.
    const TCP_CLOSE: u8 = 7;
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `info`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    r != 0 || info[0] == TCP_CLOSE
}

/// What shutdown needs to stop one live connection.
trait Stop: Send {
    fn stop(&self, grace: Duration);
    /// Close at once, both ways (a handshake evicted for a new client).
    fn close(&self);
    /// Whether the client has hung up (its end is closed), though this
    /// side may not have read that yet.
    fn hung_up(&self) -> bool;
}

impl<S: NbdStream> Stop for S {
    fn hung_up(&self) -> bool {
        let Some(fd) = self.poll_fd() else {
            return false;
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd, for a descriptor this stream owns; no wait.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }
    fn stop(&self, grace: Duration) {
        // Writes of replies to a client that does not read give up after
        // the grace period; a reader blocked on the socket sees EOF.
        let _ = self.set_timeouts(None, Some(grace));
        let _ = self.shutdown_stream(Shutdown::Read);
    }
    fn close(&self) {
        let _ = self.shutdown_stream(Shutdown::Both);
    }
}

#[derive(Default)]
struct Registry {
    /// Ids grow with each admission: the smallest is the oldest.
    next_id: u64,
    live: HashMap<u64, Live>,
}

/// What [`Registry::make_room`] did.
enum Room {
    /// A place was free.
    Free,
    /// A connection still negotiating was closed for the new one.
    Evicted,
    /// Every place is past its handshake, or as many evicted connections
    /// as there are places have not yet gone.
    Full,
}

impl Registry {
    /// Make room for one more connection within `max` places. Connections
    /// closed to make room hold no place until they are gone, but at most
    /// `max` of them may exist, so there are never more than twice `max`
    /// connection threads.
    fn make_room(&mut self, max: usize) -> Room {
        if self.live.len() < max {
            return Room::Free;
        }
        let evicted = self.live.values().filter(|c| c.evicted).count();
        if self.live.len() - evicted < max {
            return Room::Free;
        }
        if evicted >= max {
            return Room::Full;
        }
        let oldest = self
            .live
            .iter_mut()
            .filter(|(_, c)| c.negotiating && !c.evicted)
            .min_by_key(|(id, _)| **id);
        match oldest {
            Some((_, c)) => {
                c.evicted = true;
                c.stop.close();
                Room::Evicted
            }
            None => Room::Full,
        }
    }
}

/// One admitted connection.
struct Live {
    stop: Box<dyn Stop>,
    /// Still in its handshake (it may be evicted for a new client).
    negotiating: bool,
    evicted: bool,
    /// Who it is ([`NbdStream::peer`]) and since when (Unix seconds).
    peer: String,
    since_unix: u64,
    /// The export it opened, once it has (past its handshake).
    open: Option<OpenedBy>,
}

#[derive(Default)]
struct Listeners {
    /// Both ends of the wake-up socket: accept threads poll the first,
    /// shutdown writes to the second.
    wake: Option<(UnixStream, UnixStream)>,
    threads: Vec<JoinHandle<()>>,
}

pub(crate) struct Shared {
    pub(crate) provider: Arc<dyn ExportProvider>,
    pub(crate) opts: ServerOptions,
    stopping: AtomicBool,
    conns: Mutex<Registry>,
    conn_gone: Condvar,
    listeners: Mutex<Listeners>,
    /// The TLS setup new connections get (see [`ServerOptions::tls`]).
    tls: Mutex<Option<TlsOptions>>,
    pub(crate) refusals: Arc<Refusals>,
    /// The exports open on connections.
    export_conns: Arc<Mutex<HashMap<String, OpenExport>>>,
}

/// An export some connections are open on.
#[derive(Default)]
struct OpenExport {
    /// How many.
    conns: usize,
    /// Orders the writes of its byte-granular clients (`bytes::ByteIo`).
    rmw: Arc<parking_lot::RwLock<()>>,
}

/// One connection's hold on an export, given back when dropped.
pub(crate) struct ExportSlot {
    conns: Arc<Mutex<HashMap<String, OpenExport>>>,
    name: String,
    /// The export's read-modify-write lock, shared by its connections.
    pub(crate) rmw: Arc<parking_lot::RwLock<()>>,
}

impl Drop for ExportSlot {
    fn drop(&mut self) {
        let mut m = self.conns.lock();
        if let Some(e) = m.get_mut(&self.name) {
            e.conns -= 1;
            if e.conns == 0 {
                m.remove(&self.name);
            }
        }
    }
}

impl Shared {
    /// Take a place on export `name`, or say why not (its limit is full).
    pub(crate) fn export_slot(&self, name: &str) -> Result<ExportSlot, strata_block::Error> {
        let limit = self.opts.max_connections_per_export;
        let mut m = self.export_conns.lock();
        let e = m.entry(name.to_string()).or_default();
        let n = e.conns;
        if limit > 0 && n >= limit {
            let why = format!("export '{name}' is open on {n} connections already (the limit)");
            self.refusals.note(Refusal::ExportFull, &why);
            return Err(strata_block::Error::new(strata_block::Kind::Refused, why));
        }
        e.conns += 1;
        Ok(ExportSlot {
            conns: self.export_conns.clone(),
            name: name.to_string(),
            rmw: e.rmw.clone(),
        })
    }

    pub(crate) fn tls(&self) -> Option<TlsOptions> {
        self.tls.lock().clone()
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Admit a connection, or say why not (the server is full or
    /// stopping). When every place is taken, the connection that has been
    /// negotiating longest is closed to make room ([`Registry::make_room`]):
    /// a client that stalls its handshake cannot keep others out, while one
    /// past its handshake keeps its place.
    fn register<S: NbdStream>(&self, stream: &S) -> io::Result<u64> {
        let mut reg = self.conns.lock();
        if self.stopping() {
            return Err(io::Error::other("the server is shutting down"));
        }
        let max = self.opts.max_connections;
        match reg.make_room(max) {
            Room::Free => {}
            Room::Evicted => self.refusals.note(
                Refusal::HandshakeEvicted,
                &format!(
                    "all {max} connection places taken: closed the one negotiating longest \
                     to admit a new client"
                ),
            ),
            Room::Full => {
                let e = format!("too many connections (limit {max})");
                self.refusals.note(Refusal::TooManyConnections, &e);
                return Err(io::Error::other(e));
            }
        }
        let handle = stream.clone_stream()?;
        let id = reg.next_id;
        reg.next_id += 1;
        reg.live.insert(
            id,
            Live {
                peer: stream.peer(),
                stop: Box::new(handle),
                negotiating: true,
                evicted: false,
                since_unix: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                open: None,
            },
        );
        Ok(id)
    }

    /// Connection `id` has picked its export `export` (its handshake is
    /// decided): it keeps its place now, and is a [`Session`].
    pub(crate) fn negotiated(&self, id: u64, export: &str, read_only: bool, who: Option<&str>) {
        if let Some(c) = self.conns.lock().live.get_mut(&id) {
            c.negotiating = false;
            c.open = Some(OpenedBy {
                export: export.to_string(),
                read_only,
                who: who.map(str::to_string),
            });
        }
    }
}

/// Removes a connection from the registry when its thread is done with
/// it, even if the thread unwinds.
struct Registered<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut reg = self.shared.conns.lock();
        reg.live.remove(&self.id);
        drop(reg);
        self.shared.conn_gone.notify_all();
    }
}

/// Serve a registered connection to its end; the device handle and all
/// sockets are released before the registration is.
fn run_connection<S: NbdStream>(shared: &Shared, id: u64, stream: S) -> io::Result<()> {
    let _registered = Registered { shared, id };
    let _ = stream.tune();
    transmission::serve(shared, id, stream)
}

/// A listening socket an accept thread can wait on.
trait Listen: AsRawFd + Send + 'static {
    type Stream: NbdStream;
    fn accept_stream(&self) -> io::Result<Self::Stream>;
    fn make_nonblocking(&self) -> io::Result<()>;
}

impl Listen for UnixListener {
    type Stream = UnixStream;
    fn accept_stream(&self) -> io::Result<UnixStream> {
        let (s, _) = self.accept()?;
        s.set_nonblocking(false)?;
        Ok(s)
    }
    fn make_nonblocking(&self) -> io::Result<()> {
        self.set_nonblocking(true)
    }
}

impl Listen for TcpListener {
    type Stream = TcpStream;
    fn accept_stream(&self) -> io::Result<TcpStream> {
        let (s, _) = self.accept()?;
        s.set_nonblocking(false)?;
        Ok(s)
    }
    fn make_nonblocking(&self) -> io::Result<()> {
        self.set_nonblocking(true)
    }
}

/// Wait until `listen` or `wake` is readable. Returns whether `wake` is.
fn wait_readable(listen: RawFd, wake: RawFd) -> io::Result<bool> {
    let mut fds = [
        libc::pollfd {
            fd: listen,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd structures that
        // lives across the call; both descriptors stay open meanwhile.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n >= 0 {
            return Ok(fds[1].revents != 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn accept_loop<L: Listen>(shared: Arc<Shared>, listener: L, wake: UnixStream) {
    loop {
        match wait_readable(listener.as_raw_fd(), wake.as_raw_fd()) {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                tracing::error!("NBD listener: poll failed: {e}");
                break;
            }
        }
        if shared.stopping() {
            break;
        }
        match listener.accept_stream() {
            Ok(stream) => spawn_connection(&shared, stream),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Typically EMFILE: the pending connection stays queued and
                // poll would report it again at once, so back off briefly.
                tracing::warn!("NBD listener: accept failed: {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn spawn_connection<S: NbdStream>(shared: &Arc<Shared>, stream: S) {
    let id = match shared.register(&stream) {
        Ok(id) => id,
        Err(e) => {
            tracing::debug!("NBD: refusing a connection: {e}");
            let _ = stream.shutdown_stream(Shutdown::Both);
            return;
        }
    };
    let s = shared.clone();
    let spawned = thread::Builder::new()
        .name("nbd-conn".into())
        .spawn(move || {
            // Before anything else: the workers and the reaping thread
            // this one starts inherit it.
            if let Some(slice) = s.opts.sched_slice {
                strata_block::sched::ask_for_slice(slice);
            }
            if let Err(e) = run_connection(&s, id, stream) {
                tracing::debug!("NBD connection ended: {e}");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("NBD: cannot start a connection thread: {e}");
        // The closure (and the stream) were dropped; forget the connection.
        drop(Registered { shared, id });
    }
}

/// An NBD server. Listeners and connections run on their own threads; all
/// methods take `&self` and may be called from any thread.
///
/// Dropping the server shuts it down (see [`NbdServer::shutdown`]).
pub struct NbdServer {
    shared: Arc<Shared>,
}

impl NbdServer {
    pub fn new(provider: Arc<dyn ExportProvider>, opts: ServerOptions) -> Self {
        let tls = Mutex::new(opts.tls.clone());
        NbdServer {
            shared: Arc::new(Shared {
                provider,
                tls,
                refusals: Arc::default(),
                export_conns: Arc::default(),
                opts: opts.sanitized(),
                stopping: AtomicBool::new(false),
                conns: Mutex::new(Registry::default()),
                conn_gone: Condvar::new(),
                listeners: Mutex::new(Listeners::default()),
            }),
        }
    }

    /// Accept connections on `listener` from a thread of its own until
    /// [`shutdown`](Self::shutdown); each connection gets its own threads.
    pub fn serve_unix(&self, listener: UnixListener) -> io::Result<()> {
        self.listen(listener, "nbd-accept-unix")
    }

    /// Like [`serve_unix`](Self::serve_unix) for TCP; accepted sockets get
    /// `TCP_NODELAY`.
    pub fn serve_tcp(&self, listener: TcpListener) -> io::Result<()> {
        self.listen(listener, "nbd-accept-tcp")
    }

    fn listen<L: Listen>(&self, listener: L, name: &str) -> io::Result<()> {
        let mut l = self.shared.listeners.lock();
        if self.shared.stopping() {
            return Err(io::Error::other("the server is shut down"));
        }
        if l.wake.is_none() {
            l.wake = Some(UnixStream::pair()?);
        }
        let wake = match &l.wake {
            Some((r, _)) => r.try_clone()?,
            None => unreachable!("created above"),
        };
        listener.make_nonblocking()?;
        let shared = self.shared.clone();
        let h = thread::Builder::new()
            .name(name.into())
            .spawn(move || accept_loop(shared, listener, wake))?;
        l.threads.push(h);
        Ok(())
    }

    /// Serve one already-accepted connection on the calling thread; returns
    /// when the client disconnects or the server shuts down. It counts
    /// against [`ServerOptions::max_connections`] and is stopped by
    /// [`shutdown`](Self::shutdown) like any other.
    pub fn serve_connection<S: NbdStream>(&self, stream: S) -> io::Result<()> {
        let id = match self.shared.register(&stream) {
            Ok(id) => id,
            Err(e) => {
                let _ = stream.shutdown_stream(Shutdown::Both);
                return Err(e);
            }
        };
        run_connection(&self.shared, id, stream)
    }

    /// Use `tls` for connections accepted from now on (reloaded
    /// certificates, say); connections already served keep theirs.
    pub fn set_tls(&self, tls: Option<TlsOptions>) {
        *self.shared.tls.lock() = tls;
    }

    /// How often this server turned clients away, per cause.
    pub fn refusals(&self) -> Arc<Refusals> {
        self.shared.refusals.clone()
    }

    /// Number of connections being served (including those negotiating).
    pub fn connections(&self) -> usize {
        self.shared.conns.lock().live.len()
    }

    /// The connections past their handshake, each with the export it has
    /// open, oldest first.
    pub fn sessions(&self) -> Vec<Session> {
        self.shared.sessions()
    }

    /// A handle that lists [`sessions`](Self::sessions) for as long as the
    /// server runs (nothing after), without keeping it alive.
    pub fn session_list(&self) -> SessionList {
        SessionList(Arc::downgrade(&self.shared))
    }

    /// Stop accepting, stop reading requests, let requests already read
    /// finish and get their replies, close every connection, and return
    /// when all of them have released their devices, or at the latest
    /// after twice [`ServerOptions::shutdown_grace`] (see the crate's
    /// "Shutdown"). Idempotent; the server cannot be restarted.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let threads = {
            let mut l = self.shared.listeners.lock();
            if let Some((_, w)) = &l.wake {
                let _ = (&*w).write(&[1]);
            }
            std::mem::take(&mut l.threads)
        };
        for t in threads {
            let _ = t.join();
        }
        let grace = self.shared.opts.shutdown_grace;
        let mut reg = self.shared.conns.lock();
        for c in reg.live.values() {
            c.stop.stop(grace);
        }
        if self.wait_for_connections(&mut reg, grace) {
            return;
        }
        // A reply that was already being sent when the timeout was set
        // keeps waiting (the timeout counts from the start of a send):
        // closing the socket both ways ends it.
        tracing::warn!(
            "NBD: {} connection(s) still busy {grace:?} into the shutdown \
             (clients not reading their replies?): closing them",
            reg.live.len()
        );
        for c in reg.live.values() {
            c.stop.close();
        }
        if !self.wait_for_connections(&mut reg, grace) {
            tracing::error!(
                "NBD: {} connection(s) did not end {:?} after being closed \
                 (a device that does not answer?): stopping without them",
                reg.live.len(),
                grace * 2
            );
        }
    }

    /// Wait up to `limit` for every connection to end; whether they did.
    fn wait_for_connections(&self, reg: &mut MutexGuard<'_, Registry>, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while !reg.live.is_empty() {
            if self.shared.conn_gone.wait_until(reg, until).timed_out() {
                return reg.live.is_empty();
            }
        }
        true
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
