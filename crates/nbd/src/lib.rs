//! An NBD server for any [`BlockDevice`]: fixed newstyle handshake,
//! `OPT_GO`/`OPT_INFO`/`OPT_LIST`, structured replies, `base:allocation`
//! block status, TRIM, WRITE_ZEROES (with FAST_ZERO), FLUSH, FUA, CACHE and
//! multi-conn.
//!
//! Structure: one thread accepts on each listener; each connection gets a
//! reader thread (handshake, then request parsing) and a small pool of
//! worker threads that execute requests, so many requests are in flight per
//! connection. Replies go out under a mutex on the socket, header and data in
//! one write. Bounds: [`ServerOptions::max_connections`],
//! [`ServerOptions::max_request_bytes`], option payloads of at most
//! [`OPTION_BYTES_MAX`], and at most [`ServerOptions::inflight_max`]
//! requests queued per connection (the reader blocks beyond that).
//!
//! Nothing a client sends can panic the server: malformed handshakes and
//! request headers close that connection only; bad requests get an errno.

mod proto;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use parking_lot::Mutex;
use strata_block::{BlockDevice, BlockError, ErrorKind, ZeroOptions};

use proto::*;

/// Largest option payload accepted during the handshake.
pub const OPTION_BYTES_MAX: u32 = 64 * 1024;
/// Largest write payload that is read and discarded (then refused) rather
/// than closing the connection.
const DISCARD_BYTES_MAX: u32 = 64 << 20;

pub struct ExportInfo {
    pub name: String,
    pub description: String,
}

/// Where the server finds its exports.
pub trait ExportProvider: Send + Sync {
    fn list(&self) -> Vec<ExportInfo>;
    /// Open an export for one connection; `Err(message)` if unknown.
    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, String>;
}

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub max_request_bytes: u32,
    pub max_connections: usize,
    pub workers_per_connection: usize,
    pub inflight_max: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_request_bytes: 32 << 20,
            max_connections: 128,
            workers_per_connection: 4,
            inflight_max: 64,
        }
    }
}

/// A socket of either kind.
enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
        })
    }
    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(how),
            Conn::Tcp(s) => s.shutdown(how),
        };
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Shared {
    provider: Arc<dyn ExportProvider>,
    opts: ServerOptions,
    stopping: AtomicBool,
    active: AtomicUsize,
    /// Sockets of live connections (for shutdown) and their threads.
    conns: Mutex<Vec<(Conn, JoinHandle<()>)>>,
    listeners: Mutex<Vec<(i32, JoinHandle<()>)>>,
}

/// The server. Listeners and connections run on their own threads.
pub struct NbdServer {
    shared: Arc<Shared>,
}

impl NbdServer {
    pub fn new(provider: Arc<dyn ExportProvider>, opts: ServerOptions) -> Self {
        NbdServer {
            shared: Arc::new(Shared {
                provider,
                opts,
                stopping: AtomicBool::new(false),
                active: AtomicUsize::new(0),
                conns: Mutex::new(Vec::new()),
                listeners: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Accept connections on a Unix socket, on a thread of its own.
    pub fn serve_unix(&self, listener: UnixListener) -> io::Result<()> {
        let fd = listener.as_raw_fd();
        let shared = self.shared.clone();
        let h = thread::Builder::new()
            .name("nbd-accept-unix".into())
            .spawn(move || {
                for s in listener.incoming() {
                    if shared.stopping.load(Ordering::Acquire) {
                        break;
                    }
                    match s {
                        Ok(s) => accept(&shared, Conn::Unix(s)),
                        Err(e) => tracing::warn!("accept: {e}"),
                    }
                }
            })?;
        self.shared.listeners.lock().push((fd, h));
        Ok(())
    }

    /// Accept connections on a TCP socket, on a thread of its own.
    pub fn serve_tcp(&self, listener: TcpListener) -> io::Result<()> {
        let fd = listener.as_raw_fd();
        let shared = self.shared.clone();
        let h = thread::Builder::new()
            .name("nbd-accept-tcp".into())
            .spawn(move || {
                for s in listener.incoming() {
                    if shared.stopping.load(Ordering::Acquire) {
                        break;
                    }
                    match s {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            accept(&shared, Conn::Tcp(s))
                        }
                        Err(e) => tracing::warn!("accept: {e}"),
                    }
                }
            })?;
        self.shared.listeners.lock().push((fd, h));
        Ok(())
    }

    /// Number of connections being served.
    pub fn connections(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// Stop accepting, let in-flight requests finish and get their replies,
    /// close every connection, and wait for all threads.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        let listeners: Vec<(i32, JoinHandle<()>)> =
            std::mem::take(&mut *self.shared.listeners.lock());
        for (fd, h) in listeners {
            // SAFETY: shutting down a listening socket we still own makes
            // its blocked accept() return; the fd stays open until the thread ends.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            let _ = h.join();
        }
        let conns: Vec<(Conn, JoinHandle<()>)> = std::mem::take(&mut *self.shared.conns.lock());
        for (c, _) in &conns {
            c.shutdown(Shutdown::Read);
        }
        for (_, h) in conns {
            let _ = h.join();
        }
    }
}

fn accept(shared: &Arc<Shared>, conn: Conn) {
    if shared.active.load(Ordering::Acquire) >= shared.opts.max_connections {
        tracing::warn!(
            "refusing connection: {} already open",
            shared.opts.max_connections
        );
        return;
    }
    let Ok(handle) = conn.try_clone() else { return };
    shared.active.fetch_add(1, Ordering::AcqRel);
    let s = shared.clone();
    let h = thread::Builder::new()
        .name("nbd-conn".into())
        .spawn(move || {
            if let Err(e) = serve_conn(&s, conn) {
                tracing::debug!("connection closed: {e}");
            }
            s.active.fetch_sub(1, Ordering::AcqRel);
        });
    match h {
        Ok(h) => {
            let mut conns = shared.conns.lock();
            conns.retain(|(_, h)| !h.is_finished());
            conns.push((handle, h));
        }
        Err(_) => {
            shared.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn proto_err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn discard(r: &mut impl Read, mut n: u64) -> io::Result<()> {
    let mut buf = [0u8; 8192];
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        r.read_exact(&mut buf[..k])?;
        n -= k as u64;
    }
    Ok(())
}

fn opt_reply(w: &mut impl Write, opt: u32, ty: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&ty.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

/// Negotiated state of one connection.
struct Session {
    device: Arc<dyn BlockDevice>,
    structured: bool,
    base_allocation: bool,
}

fn transmission_flags(dev: &dyn BlockDevice) -> u16 {
    let mut f = TF_HAS_FLAGS
        | TF_SEND_FLUSH
        | TF_SEND_FUA
        | TF_SEND_TRIM
        | TF_SEND_WRITE_ZEROES
        | TF_SEND_DF
        | TF_CAN_MULTI_CONN
        | TF_SEND_CACHE
        | TF_SEND_FAST_ZERO;
    if dev.read_only() {
        f |= TF_READ_ONLY;
    }
    f
}

/// Parse `u32 len, name` at the start of an option payload.
fn take_name(data: &[u8]) -> Option<(String, &[u8])> {
    if data.len() < 4 {
        return None;
    }
    let n = u32::from_be_bytes(data[..4].try_into().ok()?) as usize;
    let rest = &data[4..];
    if rest.len() < n {
        return None;
    }
    let name = String::from_utf8(rest[..n].to_vec()).ok()?;
    Some((name, &rest[n..]))
}

fn default_name(shared: &Shared, name: String) -> String {
    if name.is_empty() {
        shared
            .provider
            .list()
            .into_iter()
            .next()
            .map(|e| e.name)
            .unwrap_or_default()
    } else {
        name
    }
}

/// The handshake; returns the session to serve, or None if the client left.
fn handshake(shared: &Shared, conn: &mut Conn) -> io::Result<Option<Session>> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    conn.write_all(&hello)?;
    let client = read_u32(conn)?;
    if client & FLAG_FIXED_NEWSTYLE as u32 == 0 || client & !CLIENT_KNOWN != 0 {
        return Err(proto_err(format!("unsupported client flags {client:#x}")));
    }
    let no_zeroes = client & FLAG_NO_ZEROES as u32 != 0;
    let mut structured = false;
    let mut base_allocation = false;
    // Bounded: a client gets at most this many options.
    for _ in 0..1024 {
        if read_u64(conn)? != IHAVEOPT {
            return Err(proto_err("bad option magic"));
        }
        let opt = read_u32(conn)?;
        let len = read_u32(conn)?;
        if len > OPTION_BYTES_MAX {
            if len as u64 > 16 * OPTION_BYTES_MAX as u64 {
                return Err(proto_err("option payload far too large"));
            }
            discard(conn, len as u64)?;
            opt_reply(conn, opt, REP_ERR_TOO_BIG, b"option too large")?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        conn.read_exact(&mut data)?;
        match opt {
            OPT_EXPORT_NAME => {
                let name = default_name(shared, String::from_utf8_lossy(&data).into_owned());
                let dev = shared
                    .provider
                    .open(&name)
                    .map_err(|e| proto_err(format!("unknown export '{name}': {e}")))?;
                let mut b = Vec::with_capacity(134);
                b.extend_from_slice(&dev.size_bytes().to_be_bytes());
                b.extend_from_slice(&transmission_flags(&*dev).to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                conn.write_all(&b)?;
                return Ok(Some(Session {
                    device: dev,
                    structured: false,
                    base_allocation: false,
                }));
            }
            OPT_ABORT => {
                let _ = opt_reply(conn, opt, REP_ACK, &[]);
                return Ok(None);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    opt_reply(conn, opt, REP_ERR_INVALID, b"LIST takes no data")?;
                    continue;
                }
                for e in shared.provider.list() {
                    let mut p = Vec::new();
                    p.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    p.extend_from_slice(e.name.as_bytes());
                    p.extend_from_slice(e.description.as_bytes());
                    opt_reply(conn, opt, REP_SERVER, &p)?;
                }
                opt_reply(conn, opt, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                let Some((name, rest)) = take_name(&data) else {
                    opt_reply(conn, opt, REP_ERR_INVALID, b"malformed INFO/GO")?;
                    continue;
                };
                if rest.len() < 2 {
                    opt_reply(conn, opt, REP_ERR_INVALID, b"malformed INFO/GO")?;
                    continue;
                }
                let n = u16::from_be_bytes([rest[0], rest[1]]) as usize;
                if rest.len() != 2 + 2 * n {
                    opt_reply(
                        conn,
                        opt,
                        REP_ERR_INVALID,
                        b"malformed INFO/GO request list",
                    )?;
                    continue;
                }
                let reqs: Vec<u16> = rest[2..]
                    .chunks(2)
                    .map(|c| u16::from_be_bytes([c[0], c[1]]))
                    .collect();
                let name = default_name(shared, name);
                let dev = match shared.provider.open(&name) {
                    Ok(d) => d,
                    Err(e) => {
                        opt_reply(
                            conn,
                            opt,
                            REP_ERR_UNKNOWN,
                            format!("unknown export '{name}': {e}").as_bytes(),
                        )?;
                        continue;
                    }
                };
                let mut info = Vec::new();
                info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                info.extend_from_slice(&dev.size_bytes().to_be_bytes());
                info.extend_from_slice(&transmission_flags(&*dev).to_be_bytes());
                opt_reply(conn, opt, REP_INFO, &info)?;
                if reqs.contains(&INFO_NAME) {
                    let mut p = INFO_NAME.to_be_bytes().to_vec();
                    p.extend_from_slice(name.as_bytes());
                    opt_reply(conn, opt, REP_INFO, &p)?;
                }
                if reqs.contains(&INFO_DESCRIPTION) {
                    let desc = shared
                        .provider
                        .list()
                        .into_iter()
                        .find(|e| e.name == name)
                        .map(|e| e.description)
                        .unwrap_or_default();
                    let mut p = INFO_DESCRIPTION.to_be_bytes().to_vec();
                    p.extend_from_slice(desc.as_bytes());
                    opt_reply(conn, opt, REP_INFO, &p)?;
                }
                let mut p = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                p.extend_from_slice(&512u32.to_be_bytes());
                p.extend_from_slice(&dev.preferred_block_bytes().max(512).to_be_bytes());
                p.extend_from_slice(&shared.opts.max_request_bytes.to_be_bytes());
                opt_reply(conn, opt, REP_INFO, &p)?;
                opt_reply(conn, opt, REP_ACK, &[])?;
                if opt == OPT_GO {
                    return Ok(Some(Session {
                        device: dev,
                        structured,
                        base_allocation,
                    }));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    opt_reply(
                        conn,
                        opt,
                        REP_ERR_INVALID,
                        b"STRUCTURED_REPLY takes no data",
                    )?;
                    continue;
                }
                structured = true;
                opt_reply(conn, opt, REP_ACK, &[])?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let set = opt == OPT_SET_META_CONTEXT;
                if set && !structured {
                    opt_reply(
                        conn,
                        opt,
                        REP_ERR_INVALID,
                        b"negotiate structured replies first",
                    )?;
                    continue;
                }
                let Some((name, rest)) = take_name(&data) else {
                    opt_reply(
                        conn,
                        opt,
                        REP_ERR_INVALID,
                        b"malformed meta context request",
                    )?;
                    continue;
                };
                if rest.len() < 4 {
                    opt_reply(
                        conn,
                        opt,
                        REP_ERR_INVALID,
                        b"malformed meta context request",
                    )?;
                    continue;
                }
                let count = u32::from_be_bytes(rest[..4].try_into().expect("4"));
                let mut q = &rest[4..];
                let mut queries = Vec::new();
                let mut ok = true;
                for _ in 0..count {
                    match take_name(q) {
                        Some((s, r)) => {
                            queries.push(s);
                            q = r;
                        }
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok || !q.is_empty() {
                    opt_reply(
                        conn,
                        opt,
                        REP_ERR_INVALID,
                        b"malformed meta context queries",
                    )?;
                    continue;
                }
                let name = default_name(shared, name);
                if let Err(e) = shared.provider.open(&name) {
                    opt_reply(
                        conn,
                        opt,
                        REP_ERR_UNKNOWN,
                        format!("unknown export '{name}': {e}").as_bytes(),
                    )?;
                    continue;
                }
                let matches = if queries.is_empty() {
                    !set
                } else {
                    queries
                        .iter()
                        .any(|s| s == META_CONTEXT_BASE_ALLOCATION || (!set && s == "base:"))
                };
                if set {
                    base_allocation = matches;
                }
                if matches {
                    let mut p = META_CONTEXT_ID.to_be_bytes().to_vec();
                    p.extend_from_slice(META_CONTEXT_BASE_ALLOCATION.as_bytes());
                    opt_reply(conn, opt, REP_META_CONTEXT, &p)?;
                }
                opt_reply(conn, opt, REP_ACK, &[])?;
            }
            OPT_STARTTLS => opt_reply(conn, opt, REP_ERR_UNSUP, b"TLS is not supported")?,
            _ => opt_reply(conn, opt, REP_ERR_UNSUP, b"option not supported")?,
        }
    }
    Err(proto_err("too many options"))
}

/// One request handed to a worker.
struct Job {
    flags: u16,
    ty: u16,
    cookie: u64,
    offset: u64,
    len: u32,
    payload: Vec<u8>,
}

/// Reply writer shared by the workers of a connection.
struct Replies {
    out: Mutex<Conn>,
    structured: bool,
}

impl Replies {
    fn simple(&self, cookie: u64, errno: u32, data: &[u8]) -> io::Result<()> {
        let mut b = Vec::with_capacity(16 + data.len());
        b.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b.extend_from_slice(&errno.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(data);
        self.out.lock().write_all(&b)
    }

    fn chunk_header(b: &mut Vec<u8>, flags: u16, ty: u16, cookie: u64, len: u32) {
        b.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&ty.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
    }

    /// Error reply: structured for READ/BLOCK_STATUS when negotiated.
    fn error(&self, job: &Job, errno: u32, msg: &str) -> io::Result<()> {
        if self.structured && (job.ty == CMD_READ || job.ty == CMD_BLOCK_STATUS) {
            let msg = &msg.as_bytes()[..msg.len().min(4096)];
            let mut b = Vec::with_capacity(26 + msg.len());
            Self::chunk_header(
                &mut b,
                REPLY_FLAG_DONE,
                REPLY_TYPE_ERROR,
                job.cookie,
                6 + msg.len() as u32,
            );
            b.extend_from_slice(&errno.to_be_bytes());
            b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
            b.extend_from_slice(msg);
            self.out.lock().write_all(&b)
        } else {
            self.simple(job.cookie, errno, &[])
        }
    }
}

fn errno_of(e: &BlockError) -> u32 {
    e.errno() as u32
}

fn execute(
    dev: &dyn BlockDevice,
    replies: &Replies,
    job: Job,
    base_allocation: bool,
) -> io::Result<()> {
    let fua = job.flags & CMD_FLAG_FUA != 0;
    let ro_refused = dev.read_only() && matches!(job.ty, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if ro_refused {
        return replies.error(&job, EPERM, "export is read-only");
    }
    let result: Result<(), BlockError> = match job.ty {
        CMD_READ => {
            let len = job.len as usize;
            let hdr = if replies.structured { 28 } else { 16 };
            let mut b = vec![0u8; hdr + len];
            match dev.read_at(&mut b[hdr..], job.offset) {
                Ok(()) => {
                    let mut h = Vec::with_capacity(hdr);
                    if replies.structured {
                        Replies::chunk_header(
                            &mut h,
                            REPLY_FLAG_DONE,
                            REPLY_TYPE_OFFSET_DATA,
                            job.cookie,
                            8 + job.len,
                        );
                        h.extend_from_slice(&job.offset.to_be_bytes());
                    } else {
                        h.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
                        h.extend_from_slice(&0u32.to_be_bytes());
                        h.extend_from_slice(&job.cookie.to_be_bytes());
                    }
                    b[..hdr].copy_from_slice(&h);
                    return replies.out.lock().write_all(&b);
                }
                Err(e) => Err(e),
            }
        }
        CMD_WRITE => dev.write_at(&job.payload, job.offset, fua),
        CMD_FLUSH => dev.flush(),
        CMD_TRIM => {
            dev.unmap(job.offset, job.len as u64)
                .and_then(|_| if fua { dev.flush() } else { Ok(()) })
        }
        CMD_WRITE_ZEROES => dev.write_zeroes(
            job.offset,
            job.len as u64,
            ZeroOptions {
                may_unmap: job.flags & CMD_FLAG_NO_HOLE == 0,
                fast_only: job.flags & CMD_FLAG_FAST_ZERO != 0,
                fua,
            },
        ),
        CMD_CACHE => strata_block::check_range(job.offset, job.len as u64, dev.size_bytes()),
        CMD_BLOCK_STATUS => {
            if !base_allocation || !replies.structured {
                return replies.error(&job, EINVAL, "no meta context negotiated");
            }
            if job.len == 0 {
                return replies.error(&job, EINVAL, "zero-length block status");
            }
            match dev.block_status(job.offset, job.len as u64) {
                Ok(extents) => {
                    let mut descs: Vec<(u32, u32)> = Vec::new();
                    for x in extents {
                        let flags = (if x.hole { STATE_HOLE } else { 0 })
                            | (if x.zero { STATE_ZERO } else { 0 });
                        let len = x.len_bytes.min(u32::MAX as u64) as u32;
                        if len == 0 {
                            continue;
                        }
                        descs.push((len, flags));
                        if job.flags & CMD_FLAG_REQ_ONE != 0 {
                            break;
                        }
                    }
                    if descs.is_empty() {
                        return replies.error(&job, EIO, "device reported no extent");
                    }
                    let mut b = Vec::with_capacity(24 + 8 * descs.len());
                    Replies::chunk_header(
                        &mut b,
                        REPLY_FLAG_DONE,
                        REPLY_TYPE_BLOCK_STATUS,
                        job.cookie,
                        4 + 8 * descs.len() as u32,
                    );
                    b.extend_from_slice(&META_CONTEXT_ID.to_be_bytes());
                    for (l, f) in descs {
                        b.extend_from_slice(&l.to_be_bytes());
                        b.extend_from_slice(&f.to_be_bytes());
                    }
                    return replies.out.lock().write_all(&b);
                }
                Err(e) => Err(e),
            }
        }
        _ => return replies.error(&job, EINVAL, "unknown command"),
    };
    match result {
        Ok(()) => {
            if replies.structured && job.ty == CMD_READ {
                unreachable!("reads reply above");
            }
            replies.simple(job.cookie, 0, &[])
        }
        Err(e) => {
            let errno = match e.kind {
                ErrorKind::NotSupported => ENOTSUP,
                ErrorKind::Gone => ESHUTDOWN,
                _ => errno_of(&e),
            };
            replies.error(&job, errno, &e.to_string())
        }
    }
}

fn serve_conn(shared: &Arc<Shared>, mut conn: Conn) -> io::Result<()> {
    let Some(session) = handshake(shared, &mut conn)? else {
        return Ok(());
    };
    let replies = Arc::new(Replies {
        out: Mutex::new(conn.try_clone()?),
        structured: session.structured,
    });
    let (tx, rx) = sync_channel::<Job>(shared.opts.inflight_max);
    let rx = Arc::new(std::sync::Mutex::new(rx));
    let mut workers = Vec::new();
    for _ in 0..shared.opts.workers_per_connection.max(1) {
        let rx: Arc<std::sync::Mutex<Receiver<Job>>> = rx.clone();
        let dev = session.device.clone();
        let replies = replies.clone();
        let base = session.base_allocation;
        workers.push(
            thread::Builder::new()
                .name("nbd-worker".into())
                .spawn(move || loop {
                    let job = {
                        let r = rx.lock().unwrap_or_else(|p| p.into_inner());
                        r.recv()
                    };
                    let Ok(job) = job else { break };
                    if execute(&*dev, &replies, job, base).is_err() {
                        break; // the socket is gone; the reader will notice too
                    }
                })?,
        );
    }
    let result = read_requests(shared, &mut conn, &replies, &tx);
    drop(tx);
    for w in workers {
        let _ = w.join();
    }
    conn.shutdown(Shutdown::Both);
    result
}

fn read_requests(
    shared: &Shared,
    conn: &mut Conn,
    replies: &Replies,
    tx: &std::sync::mpsc::SyncSender<Job>,
) -> io::Result<()> {
    let mut hdr = [0u8; 28];
    loop {
        match conn.read_exact(&mut hdr) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let magic = u32::from_be_bytes(hdr[0..4].try_into().expect("4"));
        if magic != REQUEST_MAGIC {
            return Err(proto_err(format!("bad request magic {magic:#x}")));
        }
        let flags = u16::from_be_bytes(hdr[4..6].try_into().expect("2"));
        let ty = u16::from_be_bytes(hdr[6..8].try_into().expect("2"));
        let cookie = u64::from_be_bytes(hdr[8..16].try_into().expect("8"));
        let offset = u64::from_be_bytes(hdr[16..24].try_into().expect("8"));
        let len = u32::from_be_bytes(hdr[24..28].try_into().expect("4"));
        let mut job = Job {
            flags,
            ty,
            cookie,
            offset,
            len,
            payload: Vec::new(),
        };
        match ty {
            CMD_DISC => return Ok(()),
            CMD_WRITE => {
                if len > shared.opts.max_request_bytes {
                    if len > DISCARD_BYTES_MAX {
                        return Err(proto_err("write payload too large"));
                    }
                    discard(conn, len as u64)?;
                    replies.error(&job, EOVERFLOW, "request too large")?;
                    continue;
                }
                job.payload = vec![0u8; len as usize];
                conn.read_exact(&mut job.payload)?;
            }
            CMD_READ if len > shared.opts.max_request_bytes => {
                replies.error(&job, EOVERFLOW, "request too large")?;
                continue;
            }
            _ => {}
        }
        if tx.send(job).is_err() {
            return Err(proto_err("workers gone"));
        }
    }
}
