//! The transmission phase: one reader per connection, a few workers, and
//! replies written under a mutex.

use std::collections::VecDeque;
use std::io::{self, BufReader, IoSlice, Read};
use std::net::Shutdown;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use strata_block::bytes::{self, ByteIo};
use strata_block::ring_io::{self, Reaper, RingIo};
use strata_block::{
    check_range, plan_io, AlignedBuf, BlockDevice, BlockError, Fill, Planned, ReadFill, ZeroOptions,
};

use crate::handshake::{discard, io_invalid, negotiate, note_handshake, Context};
use crate::proto::*;
use crate::readahead::{Plan, Prefetcher};
use crate::tls::Link;
use crate::{NbdStream, Refusal, Shared};

/// Submission slots of a connection's ring.
const RING_ENTRIES: u32 = 128;

/// A READ or WRITE in the ring: the request, the buffer its data goes
/// into or comes from, and what the connection's admission charged.
struct RingReq {
    req: Request,
    data: AlignedBuf,
    cost: u64,
    /// A byte-granular client's write holds its export's lock shared
    /// until it is done, as on a worker (`strata_block::bytes`).
    _hold: Option<BytesHold>,
}

/// A shared hold on an export's read-modify-write lock.
type BytesHold = parking_lot::ArcRwLockReadGuard<parking_lot::RawRwLock, ()>;

type Pending = ring_io::Pending<RingReq>;

/// Receive buffer of the reader: batches small pipelined requests.
const READ_BUFFER_BYTES: usize = 128 * 1024;
/// A refused WRITE payload up to this size is read and dropped so the
/// connection can go on; a larger one closes the connection.
const WRITE_DISCARD_MAX: u64 = 256 << 20;
/// Idle buffers a connection keeps for reuse, in bytes.
const POOL_KEEP_BYTES: usize = 16 << 20;
/// Longest error message sent in an ERROR chunk.
const ERROR_MESSAGE_MAX: usize = 1024;
/// Structured READs at least this long (and without DF) send the holes the
/// device reported as OFFSET_HOLE chunks instead of zeros; shorter ones
/// are one OFFSET_DATA chunk, as small reads gain nothing from splitting.
const HOLE_READ_MIN: u32 = 64 * 1024;
/// Shortest hole sent as its own chunk; shorter runs of zeros go out as
/// part of the data around them (a chunk header costs a client more than
/// a few hundred bytes of zeros).
const HOLE_CHUNK_MIN: u64 = 4096;
/// How often a reader waiting for room in its in-flight budget looks
/// whether the server is stopping or the connection broke.
const ADMIT_RECHECK: Duration = Duration::from_millis(100);
/// Most descriptors in one BLOCK_STATUS reply; the rest of the range is
/// left for the client to ask again.
const DESCRIPTORS_MAX: usize = 128 * 1024;

/// Negotiate, then serve requests until the client leaves, sends DISC,
/// breaks the protocol, or the server shuts down.
pub(crate) fn serve<S: NbdStream>(shared: &Shared, id: u64, stream: S) -> io::Result<()> {
    // The socket itself, under any TLS: what was sent is delivered
    // before it is shut down (`NbdStream::linger`).
    let raw = stream.clone_stream()?;
    // Plain until the client asks for TLS; every clone follows it there.
    let stream = Link::new(stream);
    let writer = stream.clone_stream()?;
    let closer = stream.clone_stream()?;
    let result = serve_inner(shared, id, stream, writer);
    // The TLS session's close_notify first, so the wait covers it too.
    let _ = closer.end_tls();
    raw.linger(shared.opts.shutdown_grace);
    let _ = closer.shutdown_stream(Shutdown::Both);
    result
}

fn serve_inner<S: NbdStream>(
    shared: &Shared,
    id: u64,
    stream: Link<S>,
    writer: Link<S>,
) -> io::Result<()> {
    let timeout = shared.opts.handshake_timeout;
    stream.set_timeouts(timeout, timeout)?;
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let negotiated = negotiate(shared, id, &mut reader).inspect_err(|e| note_handshake(shared, e));
    let Some(session) = negotiated? else {
        return Ok(());
    };
    reader.get_ref().set_timeouts(None, None)?;
    // A shutdown that raced with the handshake may have set a write
    // timeout that was just cleared; it has set `stopping` first.
    if shared.stopping() {
        return Ok(());
    }
    let guide = read_ahead_guide(&session.contexts);
    // With `one_thread`, over a plain socket, this thread reaps the ring
    // too, waiting for the socket and the ring at once; otherwise (and
    // over TLS, whose session may hold plaintext the socket does not
    // announce) a thread of its own does.
    let self_reaps =
        shared.opts.ring_io && shared.opts.one_thread && reader.get_mut().fd_to_poll().is_some();
    let conn = Arc::new(Conn {
        out: Mutex::new(writer),
        broken: AtomicBool::new(false),
        dev: session.device,
        structured: session.structured,
        contexts: session.contexts,
        max_request: shared.opts.max_request_bytes,
        queue: Mutex::new(Queue::default()),
        work: Condvar::new(),
        room: Condvar::new(),
        pool: Mutex::new(Pool::default()),
        guide,
        plan: Mutex::new(Plan::new(shared.opts.read_ahead_bytes)),
        prefetcher: Mutex::new(None),
        ring: ring(shared, self_reaps),
        self_reaps,
        bytes: session.byte_granular.then(|| session.slot.rmw.clone()),
    });
    // Takes the completions of the ring's reads and answers them, unless
    // this thread does; ended and joined (after the reads in the ring)
    // when this is dropped.
    let _reaper = match &conn.ring {
        Some(r) if !self_reaps => {
            let c = conn.clone();
            Some(Reaper::spawn("nbd-reap", r.clone(), move || c.reap_loop())?)
        }
        _ => None,
    };
    let mut workers = Workers {
        conn: conn.clone(),
        threads: Vec::new(),
        max: shared.opts.workers_per_connection,
    };
    // The reader waits for its socket and this eventfd, which the ring
    // signals at each completion.
    let ready = match (&conn.ring, self_reaps) {
        (Some(r), true) => {
            let fd = strata_block::eventfd::new_eventfd(0)?;
            r.register_eventfd(fd.as_raw_fd())?;
            Some(fd)
        }
        _ => None,
    };
    let wait = Wait {
        ready,
        window: shared.opts.poll,
    };
    let result = read_requests(shared, &conn, &mut reader, &mut workers, &wait).inspect_err(|e| {
        if e.kind() == io::ErrorKind::InvalidData {
            shared
                .refusals
                .note(Refusal::ProtocolError, &format!("in transmission: {e}"));
        }
    });
    if let (Some(r), true) = (&conn.ring, self_reaps) {
        // What is still in the ring is answered (or, the client gone,
        // released) before the ring and the buffers go.
        let _ = r.submit();
        conn.reap_until_idle(r);
    }
    // Dropping `workers` closes the queue and waits for every queued
    // request to be executed and answered.
    drop(workers);
    result
}

/// The context whose replies guide read-ahead (`Conn::guide`): one that
/// marks what a copying client reads next, else base:allocation's data.
fn read_ahead_guide(contexts: &[(u32, Context)]) -> Option<(u32, Option<u32>)> {
    let marked = contexts.iter().find_map(|(id, c)| match c {
        Context::Other(c) => c.read_next_flags().map(|f| (*id, Some(f))),
        Context::Allocation => None,
    });
    marked.or_else(|| {
        contexts
            .iter()
            .find(|(_, c)| matches!(c, Context::Allocation))
            .map(|(id, _)| (*id, None))
    })
}

/// One request handed to a worker.
struct Job {
    req: Request,
    /// The payload of a WRITE; empty otherwise.
    payload: AlignedBuf,
    /// Bytes charged against the in-flight budget.
    cost: u64,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Admitted and not yet answered (queued, being read, or executing).
    inflight: usize,
    inflight_bytes: u64,
    /// Workers waiting for a job.
    idle: usize,
    closed: bool,
}

/// Idle buffers for WRITE payloads and READ data.
#[derive(Default)]
struct Pool {
    free: Vec<AlignedBuf>,
    /// Capacity of the buffers in `free`.
    bytes: usize,
}

/// State shared by the reader and the workers of one connection.
struct Conn<S> {
    out: Mutex<S>,
    /// A reply could not be written: the client is gone.
    broken: AtomicBool,
    dev: Arc<dyn BlockDevice>,
    structured: bool,
    /// The metadata contexts selected, with their ids.
    contexts: Vec<(u32, Context)>,
    max_request: u32,
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or the queue closes.
    work: Condvar,
    /// Signalled when an admitted request is answered.
    room: Condvar,
    pool: Mutex<Pool>,
    /// The context id whose BLOCK_STATUS replies feed `plan`, with the
    /// flags that mark what is read next (`None`: base:allocation's data).
    guide: Option<(u32, Option<u32>)>,
    /// Read-ahead along what the client was told it will read.
    plan: Mutex<Plan>,
    /// Started with the first hint.
    prefetcher: Mutex<Option<Prefetcher>>,
    /// READs and WRITEs through an io_uring (`ServerOptions::ring_io`).
    ring: Option<Arc<RingIo<RingReq>>>,
    /// The reader reaps the ring itself (no reaping thread).
    self_reaps: bool,
    /// For a client that did not agree to the block sizes (it may send
    /// any alignment): its export's lock that orders the writes of such
    /// clients, so a read-modify-write of a sector is not undone by
    /// another (`strata_block::bytes`).
    bytes: Option<Arc<RwLock<()>>>,
}

/// How a connection that reaps its own ring waits for its socket and its
/// ring at once (`read_requests`).
struct Wait {
    /// The eventfd the ring signals at each completion (None: a reaping
    /// thread answers the ring's requests).
    ready: Option<OwnedFd>,
    /// `ServerOptions::poll`.
    window: Duration,
}

/// A connection's ring, when asked for and available; with `one_thread`,
/// for the calling thread alone to queue and reap.
fn ring(shared: &Shared, one_thread: bool) -> Option<Arc<RingIo<RingReq>>> {
    if !shared.opts.ring_io {
        return None;
    }
    match RingIo::open(RING_ENTRIES, shared.opts.native_aio, one_thread) {
        Ok(r) => Some(Arc::new(r)),
        Err(e) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!("NBD: {e}; worker threads serve every request instead")
            });
            None
        }
    }
}

/// The worker threads of a connection; dropping this drains the queue.
struct Workers<S: NbdStream> {
    conn: Arc<Conn<S>>,
    threads: Vec<JoinHandle<()>>,
    max: usize,
}

impl<S: NbdStream> Workers<S> {
    /// Start one more worker if allowed. Fails only if none can run.
    fn grow(&mut self) -> io::Result<()> {
        if self.threads.len() >= self.max {
            return Ok(());
        }
        let conn = self.conn.clone();
        let spawned = thread::Builder::new()
            .name("nbd-worker".into())
            .spawn(move || conn.work_loop());
        match spawned {
            Ok(h) => {
                self.threads.push(h);
                Ok(())
            }
            Err(e) if self.threads.is_empty() => Err(e),
            Err(e) => {
                tracing::warn!("NBD: cannot start another worker: {e}");
                Ok(())
            }
        }
    }
}

impl<S: NbdStream> Drop for Workers<S> {
    fn drop(&mut self) {
        self.conn.queue.lock().closed = true;
        self.conn.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Jobs left behind only if no worker ever ran; forget them.
        self.conn.queue.lock().jobs.clear();
    }
}

#[expect(clippy::too_many_lines)]
fn read_requests<S: NbdStream>(
    shared: &Shared,
    conn: &Conn<Link<S>>,
    reader: &mut BufReader<Link<S>>,
    workers: &mut Workers<Link<S>>,
    wait: &Wait,
) -> io::Result<()> {
    let mut head = [0u8; REQUEST_BYTES];
    loop {
        if shared.stopping() || conn.broken.load(Ordering::Relaxed) {
            return Ok(());
        }
        if let Some(r) = &conn.ring {
            if let Err(e) = start_queued(conn, r, reader, wait) {
                conn.mark_broken(&e);
                return Err(e);
            }
        }
        if let Err(e) = reader.read_exact(&mut head) {
            // A client that hangs up between requests ends normally.
            return match e.kind() {
                io::ErrorKind::UnexpectedEof => Ok(()),
                _ => Err(e),
            };
        }
        let Some(req) = Request::parse(&head) else {
            return Err(io_invalid("bad request magic"));
        };
        if req.ty == CMD_DISC {
            return Ok(());
        }
        if let Err((errno, msg)) = conn.validate(&req) {
            if req.ty == CMD_WRITE {
                if req.len as u64 > WRITE_DISCARD_MAX {
                    return Err(io_invalid(format!(
                        "refused WRITE with a {}-byte payload",
                        req.len
                    )));
                }
                discard(reader, req.len as u64)?;
            }
            conn.reply_error(&req, errno, &msg)?;
            continue;
        }
        let cost = match req.ty {
            CMD_READ | CMD_WRITE => req.len as u64,
            _ => 0,
        };
        if let (Some(r), Some(_)) = (&conn.ring, &wait.ready) {
            // Nothing but this thread answers the ring's requests: while
            // they fill the budget, it answers them instead of waiting
            // for room that only it could make.
            if let Err(e) = conn.reap_for_room(r, cost, shared) {
                conn.mark_broken(&e);
                return Err(e);
            }
        }
        match conn.admit(cost, shared) {
            Ok(true) => {}
            // Stopping, or the client is gone: this request is not
            // answered (nor, for a WRITE, its payload read).
            Ok(false) => return Ok(()),
            Err(e) => {
                conn.mark_broken(&e);
                return Err(e);
            }
        }
        if req.ty == CMD_READ && conn.ring_may_take(&req) {
            if let Some(r) = &conn.ring {
                let data = conn.take_buffer(req.len as usize);
                match conn.ring_request(r, req, data, cost, None)? {
                    None => continue,
                    Some(data) => conn.recycle(data),
                }
            }
        }
        let mut payload = AlignedBuf::zeroed(0);
        if req.ty == CMD_WRITE {
            // The ring was submitted before this header was read
            // (`start_queued`): no read waits for the payload to arrive.
            payload = conn.take_buffer(req.len as usize);
            // The whole payload is on its way: the socket need not wake
            // the reader for each piece of it.
            let buffered = reader.buffer().len();
            reader
                .get_mut()
                .expect(payload.len().saturating_sub(buffered));
            if let Err(e) = reader.read_exact(&mut payload) {
                conn.finished(cost);
                return Err(e);
            }
            if let Some(r) = &conn.ring {
                match conn.ring_write(r, req, payload, cost)? {
                    None => continue,
                    Some(p) => payload = p,
                }
            }
        }
        let job = Job { req, payload, cost };
        if conn.runs_inline(&job.req, shared.opts.inline_write_bytes) {
            conn.run(job);
            continue;
        }
        if conn.push(job) {
            workers.grow()?;
        }
    }
}

/// Before the reader reads the next request: start the reads queued on
/// the ring, all with one call, unless another READ is already in the
/// receive buffer to join them. Nothing on the way from there to queueing
/// that READ waits (`admit` submits before it does), and every other
/// request starts with the ring submitted: no thread ever waits for a
/// completion of a read that was queued and not submitted
/// (ARCHITECTURE.md, "Direct I/O through io_uring"). With nothing
/// buffered, a connection that reaps its own ring answers completions
/// until the next request is here.
fn start_queued<S: NbdStream>(
    conn: &Conn<Link<S>>,
    r: &RingIo<RingReq>,
    reader: &mut BufReader<Link<S>>,
    wait: &Wait,
) -> io::Result<()> {
    if reader.buffer().len() >= REQUEST_BYTES {
        if read_is_buffered(reader.buffer()) {
            return Ok(());
        }
        return r.submit();
    }
    let fd = match (&wait.ready, r.busy()) {
        (Some(ready), true) => reader
            .get_mut()
            .fd_to_poll()
            .map(|fd| (fd, ready.as_raw_fd())),
        _ => None,
    };
    match fd {
        // Answer what completes until the next request is here (the
        // socket has input, or was shut down).
        Some((fd, ready)) => wait_for_input(conn, r, fd, ready, wait.window),
        None => {
            r.submit()?;
            // Reads the page cache answered are in already: answer them
            // here rather than wake the reaping thread.
            r.reap_ready(|p| conn.finish_ring_req(p), || {}).map(|_| ())
        }
    }
}

/// Whether the next request is a READ whose header is already in the
/// receive buffer `b` (it can join the reads queued before it).
fn read_is_buffered(b: &[u8]) -> bool {
    b.len() >= REQUEST_BYTES && u16::from_be_bytes([b[6], b[7]]) == CMD_READ
}

/// Answer what completes in the ring until the socket `fd` has input
/// (or was shut down): each time it would sleep, keep looking at both
/// for up to `window` first, then sleep in `poll(2)` on the socket and
/// the ring's eventfd `ready`. (The window pays even where a poll seldom
/// finds anything in it: a CPU left idle between completions draws the
/// client's wake-ups onto the connection's CPU, and on two cores that
/// halved cold reads: PERFORMANCE.md, "NBD's two modes".) A wake-up for
/// input is checked by a look at
/// the socket itself: a readiness report has been seen a moment before
/// there was anything to read, and a reader blocked on an empty socket
/// would leave the requests in the ring unanswered, and its client
/// waiting for them, for ever.
fn wait_for_input<S: NbdStream>(
    conn: &Conn<S>,
    r: &RingIo<RingReq>,
    fd: RawFd,
    ready: RawFd,
    window: Duration,
) -> io::Result<()> {
    r.submit()?;
    loop {
        r.reap_ready(|p| conn.finish_ring_req(p), || {})?;
        if !r.busy() || has_input(fd) {
            return Ok(());
        }
        if !window.is_zero() {
            match poll_for_input(conn, r, fd, window)? {
                Some(Found::Input) => return Ok(()),
                Some(Found::Completion) => continue,
                None => {}
            }
        }
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: ready,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two live pollfds, for the length given.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        if fds[1].revents != 0 {
            // Consumed before the reap at the top: a completion posted
            // from here on signals it again.
            let mut count = 0u64;
            // SAFETY: an 8-byte read into a live u64; the descriptor is
            // non-blocking.
            unsafe { libc::read(ready, (&mut count as *mut u64).cast(), 8) };
        }
    }
}

/// What a poll found.
enum Found {
    /// The client's next request (or the end of the connection).
    Input,
    /// Requests of the ring finished, and were answered.
    Completion,
}

/// Keep answering the ring's completions and looking at the socket `fd`,
/// without sleeping, for up to `window`; what came first, if anything.
fn poll_for_input<S: NbdStream>(
    conn: &Conn<S>,
    r: &RingIo<RingReq>,
    fd: RawFd,
    window: Duration,
) -> io::Result<Option<Found>> {
    let until = Instant::now() + window;
    loop {
        if r.reap_ready(|p| conn.finish_ring_req(p), || {})? > 0 {
            return Ok(Some(Found::Completion));
        }
        if !r.busy() || has_input(fd) {
            return Ok(Some(Found::Input));
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        // Not a bare spin: on a machine with few cores the client (or
        // the kernel's workers for this ring) may want this CPU.
        std::thread::yield_now();
    }
}

/// Whether a read of socket `fd` would not block: bytes (or the end, or
/// an error) are waiting.
fn has_input(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte peek into a live byte; nothing is consumed.
    let r = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
}

/// Whether the in-flight budget `q` has no room for a request of `cost`
/// (one request is always admitted when nothing else is in flight).
fn no_room(q: &Queue, cost: u64, shared: &Shared) -> bool {
    q.inflight > 0
        && (q.inflight >= shared.opts.max_inflight_requests
            || q.inflight_bytes + cost > shared.opts.max_inflight_bytes)
}

fn errno_of(e: &BlockError) -> u32 {
    wire_errno(e.errno())
}

/// Header of an OFFSET_DATA chunk carrying `len` bytes read at `offset`.
fn data_chunk_header(out: &mut [u8], flags: u16, cookie: u64, offset: u64, len: u32) {
    chunk_header(out, flags, CHUNK_OFFSET_DATA, cookie, 8 + len);
    out[CHUNK_HEADER_BYTES..DATA_CHUNK_HEADER_BYTES].copy_from_slice(&offset.to_be_bytes());
}

/// The chunks of a structured READ reply of `len` bytes, in order, as
/// `(range in the buffer, is a hole)`: each `Zeros` run of at least
/// [`HOLE_CHUNK_MIN`] becomes a hole, everything between is data. A fill
/// that does not cover exactly the buffer (a device breaking its contract)
/// is not trusted: the reply is then all data, which is always correct.
fn read_chunks(fill: &ReadFill, len: u64) -> Vec<(Range<u64>, bool)> {
    if fill.len_bytes() != len {
        tracing::warn!(
            "NBD: the device described {} bytes of a {len}-byte read; sending it all as data",
            fill.len_bytes()
        );
        return vec![(0..len, false)];
    }
    let mut chunks: Vec<(Range<u64>, bool)> = Vec::new();
    for (range, f) in fill.runs() {
        let hole = f == Fill::Zeros && range.end - range.start >= HOLE_CHUNK_MIN;
        match chunks.last_mut() {
            Some((last, false)) if !hole => last.end = range.end,
            _ => chunks.push((range, hole)),
        }
    }
    chunks
}

impl<S: NbdStream> Conn<S> {
    /// Check a request before it is queued: `Err((errno, message))`.
    fn validate(&self, r: &Request) -> Result<(), (u32, String)> {
        fn fail(errno: u32, msg: &str) -> Result<(), (u32, String)> {
            Err((errno, msg.to_string()))
        }
        if r.flags & !FLAGS_KNOWN != 0 {
            return fail(EINVAL, "unknown command flags");
        }
        let writes = matches!(r.ty, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        match r.ty {
            CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE | CMD_BLOCK_STATUS
            | CMD_FLUSH => {}
            _ => return fail(EINVAL, "unknown command"),
        }
        self.check_flags(r.ty, r.flags)?;
        if r.ty == CMD_FLUSH {
            return Ok(());
        }
        if writes && self.dev.read_only() {
            return fail(EPERM, "the export is read-only");
        }
        if r.ty == CMD_BLOCK_STATUS && self.contexts.is_empty() {
            return fail(EINVAL, "no metadata context was negotiated");
        }
        if r.len == 0 {
            return fail(EINVAL, "zero-length request");
        }
        if matches!(r.ty, CMD_READ | CMD_WRITE) && r.len > self.max_request {
            // EOVERFLOW is the protocol's answer for a READ only.
            let errno = if r.ty == CMD_READ { EOVERFLOW } else { EINVAL };
            return fail(errno, "request longer than the maximum block size");
        }
        self.check_extent(r)
    }

    /// Whether command flags `flags` go with command `ty`: FUA with any
    /// command, each other flag with one (clients must not send it
    /// elsewhere; qemu-nbd refuses it too). `Err` names the strays.
    fn check_flags(&self, ty: u16, flags: u16) -> Result<(), (u32, String)> {
        let valid = FLAG_FUA
            | match ty {
                CMD_READ if self.structured => FLAG_DF,
                CMD_WRITE_ZEROES => FLAG_NO_HOLE | FLAG_FAST_ZERO,
                CMD_BLOCK_STATUS => FLAG_REQ_ONE,
                _ => 0,
            };
        match flags & !valid {
            0 => Ok(()),
            stray => Err((
                EINVAL,
                format!("command flags {stray:#x} do not apply to this command"),
            )),
        }
    }

    /// Whether `r` lies inside the export, on sector boundaries unless
    /// the client is byte-granular. A write past the end is out of
    /// space (ENOSPC), anything else invalid.
    fn check_extent(&self, r: &Request) -> Result<(), (u32, String)> {
        let (len, size) = (r.len as u64, self.dev.size_bytes());
        let checked = match self.bytes {
            Some(_) => strata_block::check_extent(r.offset, len, size),
            None => check_range(r.offset, len, size),
        };
        checked.map_err(|e| {
            let errno = match (e.kind, r.ty) {
                (strata_block::ErrorKind::OutOfRange, CMD_WRITE | CMD_WRITE_ZEROES) => ENOSPC,
                _ => EINVAL,
            };
            (errno, e.to_string())
        })
    }

    /// Whether `req` may go through the ring: anything, except for a
    /// byte-granular client what cuts a sector.
    fn ring_may_take(&self, req: &Request) -> bool {
        self.bytes.is_none() || bytes::aligned(req.offset, req.len as u64)
    }

    /// The byte-level view of the device for a byte-granular client.
    fn byte_io<'a>(&'a self, lock: &'a RwLock<()>) -> ByteIo<'a> {
        ByteIo {
            dev: &*self.dev,
            lock,
        }
    }

    /// Wait until the in-flight budget has room for a request of `cost`
    /// bytes, then charge it (true). A lone request is always admitted.
    /// Before it waits, what the reader queued on the ring starts: the
    /// room it waits for may be what those requests hold. Gives up
    /// (false) when the server stops or the connection breaks meanwhile.
    fn admit(&self, cost: u64, shared: &Shared) -> io::Result<bool> {
        let mut q = self.queue.lock();
        if no_room(&q, cost, shared) {
            if let Some(r) = &self.ring {
                drop(q);
                r.submit()?;
                q = self.queue.lock();
            }
        }
        while no_room(&q, cost, shared) {
            if shared.stopping() || self.broken.load(Ordering::Relaxed) {
                return Ok(false);
            }
            // Woken by each answer; the timeout only bounds how late a
            // shutdown is noticed (it has no handle on this condvar).
            self.room.wait_for(&mut q, ADMIT_RECHECK);
        }
        q.inflight += 1;
        q.inflight_bytes += cost;
        Ok(true)
    }

    /// For a connection whose reader is its ring's only reaper: while the
    /// budget has no room for a request of `cost` and requests are in the
    /// ring, wait for them and answer them ([`admit`](Self::admit) would
    /// wait for ever for room that only this thread can make).
    fn reap_for_room(&self, ring: &RingIo<RingReq>, cost: u64, shared: &Shared) -> io::Result<()> {
        while no_room(&self.queue.lock(), cost, shared) && ring.busy() {
            ring.submit()?;
            ring.reap_waiting(|p| self.finish_ring_req(p), || {})?;
        }
        Ok(())
    }

    /// Release what [`admit`](Self::admit) charged.
    fn finished(&self, cost: u64) {
        let mut q = self.queue.lock();
        q.inflight -= 1;
        q.inflight_bytes -= cost;
        drop(q);
        self.room.notify_one();
    }

    /// Queue a job; true if no idle worker will pick it up.
    fn push(&self, job: Job) -> bool {
        let mut q = self.queue.lock();
        q.jobs.push_back(job);
        let short = q.jobs.len() > q.idle;
        drop(q);
        self.work.notify_one();
        short
    }

    fn pop(&self) -> Option<Job> {
        let mut q = self.queue.lock();
        loop {
            if let Some(job) = q.jobs.pop_front() {
                return Some(job);
            }
            if q.closed {
                return None;
            }
            q.idle += 1;
            self.work.wait(&mut q);
            q.idle -= 1;
        }
    }

    fn work_loop(&self) {
        while let Some(job) = self.pop() {
            self.run(job);
        }
    }

    /// Whether the reader carries `req` out itself
    /// (`ServerOptions::inline_write_bytes`): a WRITE without FUA of at
    /// most `limit` bytes (a FUA write waits for the medium).
    /// Never for a byte-granular client: its writes wait for its
    /// export's lock, which may wait for the writes in this ring that
    /// the reader answers.
    fn runs_inline(&self, req: &Request, limit: u32) -> bool {
        req.ty == CMD_WRITE && req.flags & FLAG_FUA == 0 && req.len <= limit && self.bytes.is_none()
    }

    /// Carry out an admitted request and answer it (on a worker, or on
    /// the reader for [`Conn::runs_inline`]).
    fn run(&self, job: Job) {
        let Job { req, payload, cost } = job;
        if !self.broken.load(Ordering::Relaxed) {
            let run = catch_unwind(AssertUnwindSafe(|| self.execute(&req, payload)));
            match run {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.mark_broken(&e),
                Err(_) => {
                    tracing::error!("NBD: the device panicked serving a request");
                    if let Err(e) = self.reply_error(&req, EIO, "internal error") {
                        self.mark_broken(&e);
                    }
                }
            }
        }
        self.finished(cost);
    }

    /// A buffer of exactly `len` bytes (contents unspecified).
    fn take_buffer(&self, len: usize) -> AlignedBuf {
        let mut b = {
            let mut p = self.pool.lock();
            let b = p.free.pop().unwrap_or_else(|| AlignedBuf::zeroed(0));
            p.bytes -= b.capacity();
            b
        };
        b.set_len(len);
        b
    }

    fn recycle(&self, b: AlignedBuf) {
        if b.capacity() == 0 {
            return;
        }
        let mut p = self.pool.lock();
        if p.bytes + b.capacity() <= POOL_KEEP_BYTES {
            p.bytes += b.capacity();
            p.free.push(b);
        }
    }

    /// Write one whole reply.
    fn send(&self, buf: &[u8]) -> io::Result<()> {
        self.out.lock().write_all(buf)
    }

    /// Write one whole reply made of `parts` (headers and data buffers),
    /// with as few `writev` calls as the socket allows.
    fn send_parts(&self, mut parts: &mut [IoSlice<'_>]) -> io::Result<()> {
        let mut out = self.out.lock();
        IoSlice::advance_slices(&mut parts, 0);
        while !parts.is_empty() {
            match out.write_vectored(parts) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut parts, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn mark_broken(&self, e: &io::Error) {
        if !self.broken.swap(true, Ordering::Relaxed) {
            tracing::debug!("NBD: cannot write a reply, dropping the connection: {e}");
            // Wake the reader, which may be blocked on the socket.
            let _ = self.out.lock().shutdown_stream(Shutdown::Both);
        }
    }

    fn reply_ok(&self, req: &Request) -> io::Result<()> {
        let mut b = [0u8; SIMPLE_REPLY_BYTES];
        simple_reply(&mut b, 0, req.cookie);
        self.send(&b)
    }

    /// An error reply: an ERROR chunk with a message once structured
    /// replies are on (required for READ, preferred for the rest).
    fn reply_error(&self, req: &Request, errno: u32, msg: &str) -> io::Result<()> {
        if !self.structured {
            let mut b = [0u8; SIMPLE_REPLY_BYTES];
            simple_reply(&mut b, errno, req.cookie);
            return self.send(&b);
        }
        let msg = truncate_utf8(msg, ERROR_MESSAGE_MAX).as_bytes();
        let mut b = vec![0u8; CHUNK_HEADER_BYTES + 6 + msg.len()];
        chunk_header(
            &mut b,
            CHUNK_DONE,
            CHUNK_ERROR,
            req.cookie,
            6 + msg.len() as u32,
        );
        b[20..24].copy_from_slice(&errno.to_be_bytes());
        b[24..26].copy_from_slice(&(msg.len() as u16).to_be_bytes());
        b[26..].copy_from_slice(msg);
        self.send(&b)
    }

    fn reply_result(&self, req: &Request, r: Result<(), BlockError>) -> io::Result<()> {
        match r {
            Ok(()) => self.reply_ok(req),
            Err(e) => self.reply_error(req, errno_of(&e), &e.to_string()),
        }
    }

    /// Run a validated request and send its reply. `Err` only when the
    /// reply could not be written.
    fn execute(&self, req: &Request, payload: AlignedBuf) -> io::Result<()> {
        if let Some(lock) = &self.bytes {
            if let Some(r) = self.execute_bytes(req, &payload, lock) {
                self.recycle(payload);
                return r;
            }
        }
        let dev = &*self.dev;
        let fua = req.flags & FLAG_FUA != 0;
        let len = req.len as usize;
        match req.ty {
            CMD_READ => self.read(req),
            CMD_WRITE => {
                let r = dev.write_at(&payload[..len], req.offset, fua);
                self.recycle(payload);
                self.reply_result(req, r)
            }
            CMD_FLUSH => self.reply_result(req, dev.flush()),
            CMD_TRIM => {
                let r = dev.unmap(req.offset, req.len as u64);
                self.reply_result(req, flush_if_fua(dev, req, r))
            }
            CMD_WRITE_ZEROES => {
                let r = dev.write_zeroes(req.offset, req.len as u64, zero_options(req));
                self.reply_result(req, r)
            }
            CMD_CACHE => {
                dev.prefetch(req.offset, req.len as u64);
                self.reply_ok(req)
            }
            CMD_BLOCK_STATUS => self.block_status(req),
            // validate() let nothing else through.
            _ => self.reply_error(req, EINVAL, "unknown command"),
        }
    }

    /// For a byte-granular client, what differs from [`Conn::execute`]:
    /// writes, trims and zeroes under its export's lock (a write that
    /// cuts a sector by read-modify-write), misaligned reads through a
    /// bounce buffer, misaligned CACHE and BLOCK_STATUS rounded out to
    /// sectors. None: served as any other request.
    fn execute_bytes(
        &self,
        req: &Request,
        payload: &AlignedBuf,
        lock: &RwLock<()>,
    ) -> Option<io::Result<()>> {
        let io = self.byte_io(lock);
        let dev = &*self.dev;
        let (off, len) = (req.offset, req.len as u64);
        let r = match req.ty {
            CMD_WRITE => io.write(&payload[..len as usize], off, req.flags & FLAG_FUA != 0),
            CMD_TRIM => {
                // Only whole sectors are released; the edges keep their
                // bytes (a trim promises nothing about what reads back).
                let (from, to) = (bytes::up(off), bytes::down(off + len));
                let r = if from < to {
                    let _shared = lock.read();
                    dev.unmap(from, to - from)
                } else {
                    Ok(())
                };
                flush_if_fua(dev, req, r)
            }
            CMD_WRITE_ZEROES => {
                // Durable once all of it is done, edges included.
                let opts = ZeroOptions {
                    fua: false,
                    ..zero_options(req)
                };
                let r = io.zero(off, len, &|d, o, l| d.write_zeroes(o, l, opts));
                flush_if_fua(dev, req, r)
            }
            _ if bytes::aligned(off, len) => return None,
            CMD_READ => {
                let mut data = self.take_buffer(len as usize);
                let r = match io.read(&mut data, off) {
                    Ok(()) => self.send_read(req, &data, &ReadFill::all_data(len)),
                    Err(e) => self.reply_error(req, errno_of(&e), &e.to_string()),
                };
                self.recycle(data);
                return Some(r);
            }
            CMD_CACHE => {
                let from = bytes::down(off);
                dev.prefetch(from, bytes::up(off + len) - from);
                Ok(())
            }
            CMD_BLOCK_STATUS => return Some(self.block_status(req)),
            _ => return None,
        };
        Some(self.reply_result(req, r))
    }

    /// A WRITE through the ring ([`Conn::ring_request`]), or its payload
    /// back for a worker. A byte-granular client's write goes on the
    /// ring only with its export's lock held shared, taken without
    /// waiting: a read-modify-write waiting for the lock may be waiting
    /// for this ring's writes, which only the reader may be there to
    /// answer.
    fn ring_write(
        &self,
        ring: &RingIo<RingReq>,
        req: Request,
        payload: AlignedBuf,
        cost: u64,
    ) -> io::Result<Option<AlignedBuf>> {
        if !self.ring_may_take(&req) {
            return Ok(Some(payload));
        }
        let hold = match &self.bytes {
            Some(lock) => match lock.try_read_arc() {
                Some(h) => Some(h),
                None => return Ok(Some(payload)),
            },
            None => None,
        };
        self.ring_request(ring, req, payload, cost, hold)
    }

    /// READ, or WRITE without FUA, through the ring: plan it into or from
    /// `data` (a READ's buffer, a WRITE's payload), queue its pieces (the
    /// reaping thread answers it). Gives `data` back when the device does
    /// not plan this request (a worker then serves it; an engine disk
    /// plans only aligned writes, under `--cache none`). Never waits
    /// for the gate while requests of this connection are in the ring
    /// (they may hold it): a busy device is asked again once they are done.
    #[expect(clippy::too_many_arguments)]
    fn ring_request(
        &self,
        ring: &RingIo<RingReq>,
        req: Request,
        mut data: AlignedBuf,
        cost: u64,
        hold: Option<BytesHold>,
    ) -> io::Result<Option<AlignedBuf>> {
        let write = req.ty == CMD_WRITE;
        if write && req.flags & FLAG_FUA != 0 {
            return Ok(Some(data));
        }
        let dev = &*self.dev;
        let mut planned = plan_io(dev, write, &mut data, req.offset, false);
        if let Some(Ok(Planned::Busy)) = planned {
            ring.submit()?;
            if self.self_reaps {
                self.reap_until_idle(ring);
            } else {
                ring.wait_idle();
            }
            planned = plan_io(dev, write, &mut data, req.offset, true);
        }
        match planned {
            Some(Ok(Planned::Plan(plan))) => {
                if !write {
                    self.read_ahead(&req);
                }
                // The buffer's memory does not move with the `AlignedBuf`
                // that owns it: the pointer stays good while it waits in
                // the ring (and nothing else touches it meanwhile).
                let at = data.as_mut_ptr();
                let ring_req = RingReq {
                    req,
                    data,
                    cost,
                    _hold: hold,
                };
                // SAFETY: as said above; `ring_req` owns the buffer until
                // the request is handed back.
                if let Some(p) = unsafe { ring.start(ring_req, at, plan) } {
                    self.finish_ring_req(p);
                }
                Ok(None)
            }
            Some(Err(e)) => {
                self.recycle(data);
                let r = self.reply_error(&req, errno_of(&e), &e.to_string());
                self.finished(cost);
                r.map(|()| None)
            }
            None | Some(Ok(Planned::Busy)) => Ok(Some(data)),
        }
    }

    /// Answer every request in the ring, on the thread that reaps it.
    fn reap_until_idle(&self, ring: &RingIo<RingReq>) {
        if let Err(e) = ring.reap_until_idle(|p| self.finish_ring_req(p), || {}) {
            tracing::error!("NBD: the connection's ring failed: {e}; dropping the connection");
            self.mark_broken(&e);
        }
    }

    /// The reaping thread of the ring.
    fn reap_loop(&self) {
        let ring = self.ring.as_ref().expect("a reaper has a ring");
        if let Err(e) = ring.reap(|p| self.finish_ring_req(p), || {}) {
            tracing::error!("NBD: the connection's ring failed: {e}; dropping the connection");
            self.mark_broken(&e);
        }
    }

    /// A request's pieces are done (or failed): release what it held, then
    /// answer.
    fn finish_ring_req(&self, mut p: Pending) {
        p.finish_plan();
        let RingReq {
            req, data, cost, ..
        } = &p.ctx;
        if !self.broken.load(Ordering::Relaxed) {
            let write = p.plan.write;
            let r = match p.failed {
                None if write => self.reply_ok(req),
                None => self.send_read(req, data, &p.plan.fill),
                Some(errno) => self.reply_error(
                    req,
                    wire_errno(errno),
                    &format!(
                        "{} the disk: {}",
                        if write { "writing" } else { "reading" },
                        io::Error::from_raw_os_error(errno)
                    ),
                ),
            };
            if let Err(e) = r {
                self.mark_broken(&e);
            }
        }
        let cost = *cost;
        let data = std::mem::replace(&mut p.ctx.data, AlignedBuf::zeroed(0));
        if p.abandoned {
            // The kernel may still write into it.
            std::mem::forget(data);
        } else {
            self.recycle(data);
        }
        self.finished(cost);
    }

    /// Read-ahead along what the client was told it reads next.
    fn read_ahead(&self, req: &Request) {
        if self.guide.is_some() {
            let hints = self.plan.lock().on_read(req.offset, req.len as u64);
            if !hints.is_empty() {
                let mut p = self.prefetcher.lock();
                if p.is_none() {
                    *p = Prefetcher::start(self.dev.clone());
                }
                for (offset, len) in hints {
                    if let Some(p) = &*p {
                        p.hint(offset, len);
                    }
                }
            }
        }
    }

    /// READ: one pass over the device, which fills a page-aligned buffer
    /// and says where the holes are; the reply (header(s) and data) goes
    /// out in one vectored write.
    fn read(&self, req: &Request) -> io::Result<()> {
        self.read_ahead(req);
        let mut data = self.take_buffer(req.len as usize);
        let result = match self.dev.read_at(&mut data, req.offset) {
            Ok(fill) => self.send_read(req, &data, &fill),
            Err(e) => self.reply_error(req, errno_of(&e), &e.to_string()),
        };
        self.recycle(data);
        result
    }

    fn send_read(&self, req: &Request, data: &[u8], fill: &ReadFill) -> io::Result<()> {
        if !self.structured {
            let mut head = [0u8; SIMPLE_REPLY_BYTES];
            simple_reply(&mut head, 0, req.cookie);
            return self.send_parts(&mut [IoSlice::new(&head), IoSlice::new(data)]);
        }
        let holes = req.flags & FLAG_DF == 0 && req.len >= HOLE_READ_MIN;
        if !holes || fill.is_all(Fill::Data) {
            let mut head = [0u8; DATA_CHUNK_HEADER_BYTES];
            data_chunk_header(&mut head, CHUNK_DONE, req.cookie, req.offset, req.len);
            return self.send_parts(&mut [IoSlice::new(&head), IoSlice::new(data)]);
        }
        let chunks = read_chunks(fill, data.len() as u64);
        // Every header first (a hole chunk's is its whole chunk), then the
        // slices that interleave them with the data.
        let mut heads = vec![0u8; chunks.len() * HOLE_CHUNK_BYTES];
        let mut at = 0;
        for (i, (range, hole)) in chunks.iter().enumerate() {
            let flags = if i + 1 == chunks.len() { CHUNK_DONE } else { 0 };
            let offset = req.offset + range.start;
            // Chunks lie inside the u32 request length.
            let len = (range.end - range.start) as u32;
            if *hole {
                let b = &mut heads[at..at + HOLE_CHUNK_BYTES];
                chunk_header(b, flags, CHUNK_OFFSET_HOLE, req.cookie, 12);
                b[CHUNK_HEADER_BYTES..CHUNK_HEADER_BYTES + 8]
                    .copy_from_slice(&offset.to_be_bytes());
                b[CHUNK_HEADER_BYTES + 8..].copy_from_slice(&len.to_be_bytes());
                at += HOLE_CHUNK_BYTES;
            } else {
                let b = &mut heads[at..at + DATA_CHUNK_HEADER_BYTES];
                data_chunk_header(b, flags, req.cookie, offset, len);
                at += DATA_CHUNK_HEADER_BYTES;
            }
        }
        let mut parts = Vec::with_capacity(chunks.len() * 2);
        let mut rest = &heads[..];
        for (range, hole) in &chunks {
            let n = if *hole {
                HOLE_CHUNK_BYTES
            } else {
                DATA_CHUNK_HEADER_BYTES
            };
            let (head, tail) = rest.split_at(n);
            rest = tail;
            parts.push(IoSlice::new(head));
            if !hole {
                parts.push(IoSlice::new(
                    &data[range.start as usize..range.end as usize],
                ));
            }
        }
        self.send_parts(&mut parts)
    }

    /// BLOCK_STATUS: one chunk per selected context (the last one marked
    /// done), each with neighbouring runs of equal flags merged, nothing
    /// past the requested range, one descriptor only with REQ_ONE. Every
    /// context is asked before anything is sent, so a failure is one error
    /// reply.
    fn block_status(&self, req: &Request) -> io::Result<()> {
        // A byte-granular client's range, rounded out to sectors for the
        // device; what lies before its offset is cut off the runs.
        let from = bytes::down(req.offset);
        let (skip, span) = (
            req.offset - from,
            bytes::up(req.offset + req.len as u64) - from,
        );
        let mut chunks = Vec::with_capacity(self.contexts.len());
        for (id, ctx) in &self.contexts {
            let runs = match ctx {
                Context::Allocation => match self.dev.block_status(from, span) {
                    Ok(extents) => extents
                        .iter()
                        .map(|x| {
                            let flags = if x.hole { STATE_HOLE } else { 0 }
                                | if x.zero { STATE_ZERO } else { 0 };
                            (x.len_bytes, flags)
                        })
                        .collect(),
                    Err(e) => return self.reply_error(req, errno_of(&e), &e.to_string()),
                },
                Context::Other(c) => match c.extents(from, span) {
                    Ok(runs) => runs,
                    Err(e) => return self.reply_error(req, EIO, &e.to_string()),
                },
            };
            let runs = skip_runs(runs, skip);
            let descs = descriptors(&runs, req.len as u64, req.flags & FLAG_REQ_ONE != 0);
            if descs.is_empty() {
                return self.reply_error(req, EIO, "the device reported no extent");
            }
            if let Some((_, next)) = self.guide.filter(|g| g.0 == *id) {
                let read_next = |flags: u32| match next {
                    Some(bits) => flags & bits != 0,
                    None => flags & (STATE_HOLE | STATE_ZERO) == 0,
                };
                let runs = descs.iter().map(|&(l, f)| (l as u64, read_next(f)));
                self.plan.lock().announced(req.offset, runs);
            }
            chunks.push((*id, descs));
        }
        let mut b = Vec::new();
        let n = chunks.len();
        for (i, (id, descs)) in chunks.into_iter().enumerate() {
            let payload = 4 + 8 * descs.len();
            let at = b.len();
            b.resize(at + CHUNK_HEADER_BYTES, 0);
            chunk_header(
                &mut b[at..],
                if i + 1 == n { CHUNK_DONE } else { 0 },
                CHUNK_BLOCK_STATUS,
                req.cookie,
                payload as u32,
            );
            b.extend_from_slice(&id.to_be_bytes());
            for (len, flags) in descs {
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(&flags.to_be_bytes());
            }
        }
        self.send(&b)
    }
}

/// What a WRITE_ZEROES request's flags ask of the device.
fn zero_options(req: &Request) -> ZeroOptions {
    ZeroOptions {
        may_unmap: req.flags & FLAG_NO_HOLE == 0,
        fast_only: req.flags & FLAG_FAST_ZERO != 0,
        fua: req.flags & FLAG_FUA != 0,
    }
}

/// `r`, then a flush of `dev` if it succeeded and `req` has FUA.
fn flush_if_fua(
    dev: &dyn BlockDevice,
    req: &Request,
    r: Result<(), BlockError>,
) -> Result<(), BlockError> {
    match r {
        Ok(()) if req.flags & FLAG_FUA != 0 => dev.flush(),
        r => r,
    }
}

/// `runs` of `(length, flags)` without their first `skip` bytes.
fn skip_runs(mut runs: Vec<(u64, u32)>, mut skip: u64) -> Vec<(u64, u32)> {
    if skip == 0 {
        return runs;
    }
    runs.retain_mut(|(len, _)| {
        let cut = skip.min(*len);
        *len -= cut;
        skip -= cut;
        *len > 0
    });
    runs
}

/// A BLOCK_STATUS chunk's descriptors from runs of `(length, flags)`:
/// equal neighbours merged, at most `len` bytes in all, one descriptor
/// only if `one` (REQ_ONE), at most [`DESCRIPTORS_MAX`].
fn descriptors(runs: &[(u64, u32)], len: u64, one: bool) -> Vec<(u32, u32)> {
    let mut descs: Vec<(u32, u32)> = Vec::with_capacity(runs.len().min(1024));
    let mut left = len;
    for &(run, flags) in runs {
        if left == 0 {
            break;
        }
        let n = run.min(left);
        if n == 0 {
            continue;
        }
        left -= n;
        // `n` fits: the total never exceeds the u32 request length.
        match descs.last_mut() {
            Some(last) if last.1 == flags => last.0 += n as u32,
            _ => {
                if (one && !descs.is_empty()) || descs.len() >= DESCRIPTORS_MAX {
                    break;
                }
                descs.push((n as u32, flags));
            }
        }
    }
    descs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_merge_cut_and_honour_req_one() {
        let runs = [(4096, 1), (4096, 1), (8192, 0), (1 << 20, 1)];
        assert_eq!(
            descriptors(&runs, 1 << 30, false),
            [(8192, 1), (8192, 0), (1 << 20, 1)]
        );
        assert_eq!(descriptors(&runs, 12288, false), [(8192, 1), (4096, 0)]);
        assert_eq!(descriptors(&runs, 1 << 30, true), [(8192, 1)]);
        assert!(descriptors(&[(0, 1)], 4096, false).is_empty());
    }
}
