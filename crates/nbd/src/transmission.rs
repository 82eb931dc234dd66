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

mod execute;
mod reader;
mod reply;
mod ring;
mod workers;

use reader::read_requests;
use ring::{open_ring, RingReq};
use workers::Workers;

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
        ring: open_ring(shared, self_reaps),
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
    let mut workers = Workers::new(conn.clone(), shared.opts.workers_per_connection);
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

fn errno_of(e: &BlockError) -> u32 {
    wire_errno(e.errno())
}
