//! The vhost-user-blk device: features, configuration space and the
//! virtqueue loop, over any [`BlockDevice`].

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_block::ring_io::{Pending, RingIo};
use strata_block::{plan_io, BlockDevice, Planned, SECTOR_BYTES};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::EventFd;

use crate::config::{feature, offset, BlkConfig};
use crate::request::{self, Desc, Limits, Malformed, ID_BYTES};
use crate::Options;

/// Largest discard / write-zeroes range, sectors (1 GiB).
const MAX_RANGE_SECTORS: u32 = 1 << 21;
/// Most ranges in one discard / write-zeroes request.
const MAX_RANGES: u32 = 64;
/// Submission slots of a queue's ring.
const RING_ENTRIES: u32 = 128;

/// One frontend connection's device. Workers (one per queue) share it.
pub struct BlkDevice {
    dev: Arc<dyn BlockDevice>,
    opts: Options,
    mem: Mutex<GuestMemoryAtomic<GuestMemoryMmap>>,
    event_idx: Arc<AtomicBool>,
    /// The guest turned the write cache off (CONFIG_WCE): every write is FUA.
    writethrough: Arc<AtomicBool>,
    acked: AtomicU64,
    exits: Mutex<Vec<EventNotifier>>,
    id: [u8; ID_BYTES],
    limits: Limits,
    /// With `Options::io_threads`, where requests run (several per queue
    /// at once); None: each queue's worker runs its requests in turn.
    pool: Option<Arc<IoPool>>,
    /// Per queue: whether the guest was signalled since this frontend's
    /// memory table arrived. The first event of a queue signals even if
    /// it returns nothing: a backend killed between returning requests
    /// (used ring written) and signalling them would otherwise leave the
    /// guest waiting for an interrupt nobody sends, since the frontend
    /// restarts the queue at the used index and the requests are not
    /// carried out again.
    signalled: Vec<AtomicBool>,
    /// With `Options::ring_io`, per queue: the ring its reads and writes
    /// go through (None where io_uring cannot be set up).
    rings: Vec<Option<QueueRing>>,
    /// Per queue: whether its worker polls before it sleeps.
    polls: Vec<Mutex<PollWindow>>,
}

/// Adaptive polling of one queue (`Options::poll`): after its last
/// request or completion the queue's worker keeps looking at the virtqueue
/// and its ring for `Options::poll` before it sleeps in epoll, while
/// polling pays: while at least a quarter of its recent polls (a moving
/// average over about eight) found a request or a completion before the
/// window ran out. Below that it sleeps at once, and polls again every
/// `POLL_PROBE`th time to see whether the guest got busier. So a queue
/// whose guest is idle or sends a request now and then costs no CPU in
/// polling, and a busy one is served without a wake-up or a kick for each
/// request (the frontend does not kick a queue whose worker is looking).
struct PollWindow {
    /// Polls that found something, a moving average in 1/256ths.
    paid: u32,
    /// Wake-ups since the last poll.
    idle: u32,
}

impl Default for PollWindow {
    fn default() -> Self {
        Self {
            paid: POLL_PAID_FULL,
            idle: 0,
        }
    }
}

/// Writes of at least this many bytes are started with the rest of
/// their batch, not one by one (`ring_request`).
const DEFER_WRITE_BYTES: usize = 64 << 10;

/// `PollWindow::paid` of a queue whose every poll found something.
const POLL_PAID_FULL: u32 = 256;
/// A queue polls while at least this share (of 256) of its polls paid.
const POLL_PAID_MIN: u32 = POLL_PAID_FULL / 4;
/// A queue that stopped polling polls again at this many wake-ups.
const POLL_PROBE: u32 = 64;

impl PollWindow {
    /// Whether to poll at this wake-up.
    fn polls(&self) -> bool {
        self.paid >= POLL_PAID_MIN || self.idle + 1 >= POLL_PROBE
    }

    /// Account a wake-up: `polled` is None if it did not poll, else
    /// whether the poll found something.
    fn record(&mut self, polled: Option<bool>) {
        match polled {
            Some(found) => {
                let target = if found { POLL_PAID_FULL } else { 0 };
                self.paid = (self.paid * 7 + target) / 8;
                self.idle = 0;
            }
            None => self.idle += 1,
        }
    }
}

/// A queue's ring (an io_uring, or with `Options::native_aio` a Linux
/// native AIO context). Its worker plans each request a kick brings in
/// and starts it at once, issued inline (the file system's mapping, the
/// block layer, the device's doorbell) before it takes the next, so the
/// device works on the first while the rest are planned; completions
/// signal `done`, which wakes the same worker (an event of its epoll
/// loop) to return them. No thread of ours is handed a request.
struct QueueRing {
    io: RingIo<RingReq>,
    done: EventFd,
}

impl QueueRing {
    /// None where the ring cannot be set up (warned once): the queue then
    /// works as without it.
    fn new(native: bool) -> Option<QueueRing> {
        let made = RingIo::open(RING_ENTRIES, native, false).and_then(|io| {
            let done = EventFd::new(libc::EFD_NONBLOCK)?;
            use std::os::fd::AsRawFd;
            io.register_eventfd(done.as_raw_fd())?;
            Ok(QueueRing { io, done })
        });
        match made {
            Ok(r) => Some(r),
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!("vhost-user-blk: {e}; requests are served without it")
                });
                None
            }
        }
    }
}

/// A request taken off a queue: where its buffers lie (the guest memory,
/// as loaded for this batch), the queue it goes back to once used, and its
/// head descriptor's index there.
#[derive(Clone, Copy)]
struct Taken<'a> {
    mem: &'a Arc<GuestMemoryMmap>,
    vring: &'a VringRwLock,
    head: u16,
}

/// A read or write in a queue's ring.
struct RingReq {
    /// Keeps the guest memory the data goes to (or comes from) mapped
    /// until the request is handed back (even if the frontend sends a new
    /// memory table).
    mem: Arc<GuestMemoryMmap>,
    vring: VringRwLock,
    head: u16,
    status_at: GuestAddress,
    len: u32,
}

/// Write the status of a request that went through a ring and return it
/// used (the caller signals the guest once per batch).
fn finish_ring_req(mut p: Pending<RingReq>) {
    let write = p.plan.write;
    let ok = p.finish_plan();
    let r = &p.ctx;
    if let Some(errno) = p.failed {
        tracing::debug!(
            "virtio-blk {} failed: {}",
            if write { "write" } else { "read" },
            io::Error::from_raw_os_error(errno)
        );
    }
    let st = if ok {
        request::status::OK
    } else {
        request::status::IOERR
    };
    let written = match r.mem.write_slice(&[st], r.status_at) {
        Ok(()) if ok && !write => r.len.saturating_add(1),
        _ => 1,
    };
    if let Err(e) = r.vring.add_used(r.head, written) {
        tracing::debug!("vhost-user-blk: request {} not returned: {e:?}", r.head);
    }
    if p.abandoned {
        // The kernel may still write into this memory: keep it mapped.
        std::mem::forget(p.ctx.mem.clone());
    }
}

type Task = Box<dyn FnOnce() + Send>;

/// Threads that run requests handed over by the queue workers, so that a
/// queue has as many requests in flight on the disk as the guest sent
/// (direct I/O blocks a thread for the device's whole latency). Started
/// as work arrives, up to `max`.
struct IoPool {
    max: usize,
    state: Mutex<PoolState>,
    work: Condvar,
    idle_cv: Condvar,
}

#[derive(Default)]
struct PoolState {
    tasks: VecDeque<Task>,
    /// Tasks taken and not finished.
    running: usize,
    /// Threads waiting for a task.
    waiting: usize,
    threads: Vec<JoinHandle<()>>,
    closed: bool,
}

impl IoPool {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(IoPool {
            max,
            state: Mutex::default(),
            work: Condvar::new(),
            idle_cv: Condvar::new(),
        })
    }

    fn submit(self: &Arc<Self>, task: Task) {
        let mut s = self.state.lock().unwrap();
        s.tasks.push_back(task);
        if s.waiting < s.tasks.len() && s.threads.len() < self.max {
            let me = self.clone();
            match std::thread::Builder::new()
                .name("vhost-io".into())
                .spawn(move || me.run())
            {
                Ok(h) => s.threads.push(h),
                // The threads there are take the task later.
                Err(e) if !s.threads.is_empty() => {
                    tracing::warn!("vhost-user-blk: cannot start an I/O thread: {e}")
                }
                Err(e) => {
                    // No thread at all: run it here rather than never.
                    tracing::warn!("vhost-user-blk: cannot start an I/O thread: {e}");
                    let t = s.tasks.pop_back().expect("just pushed");
                    drop(s);
                    t();
                    return;
                }
            }
        }
        drop(s);
        self.work.notify_one();
    }

    fn run(&self) {
        let mut s = self.state.lock().unwrap();
        loop {
            if let Some(t) = s.tasks.pop_front() {
                s.running += 1;
                drop(s);
                t();
                s = self.state.lock().unwrap();
                s.running -= 1;
                if s.running == 0 && s.tasks.is_empty() {
                    self.idle_cv.notify_all();
                }
                continue;
            }
            if s.closed {
                return;
            }
            s.waiting += 1;
            s = self.work.wait(s).unwrap();
            s.waiting -= 1;
        }
    }

    /// Wait until every task handed over so far has finished.
    fn wait_idle(&self) -> std::sync::MutexGuard<'_, PoolState> {
        let mut s = self.state.lock().unwrap();
        while s.running > 0 || !s.tasks.is_empty() {
            s = self.idle_cv.wait(s).unwrap();
        }
        s
    }

    /// Wait until every task handed over has finished, then stop the threads.
    fn drain(&self) {
        let mut s = self.wait_idle();
        s.closed = true;
        let threads = std::mem::take(&mut s.threads);
        drop(s);
        self.work.notify_all();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Return a finished request to the guest and notify it if it asked to be.
fn complete(vring: &VringRwLock, event_idx: bool, head: u16, written: u32) -> io::Result<()> {
    vring
        .add_used(head, written)
        .map_err(|e| io::Error::other(format!("add_used: {e:?}")))?;
    signal(vring, event_idx)
}

fn signal(vring: &VringRwLock, event_idx: bool) -> io::Result<()> {
    let needed = if event_idx {
        vring
            .needs_notification()
            .map_err(|e| io::Error::other(format!("needs_notification: {e:?}")))?
    } else {
        true
    };
    if needed {
        vring.signal_used_queue()?;
    }
    Ok(())
}

impl BlkDevice {
    pub fn new(dev: Arc<dyn BlockDevice>, opts: Options) -> Self {
        let pool = (opts.io_threads > 0).then(|| IoPool::new(opts.io_threads));
        let signalled = (0..opts.queues).map(|_| AtomicBool::new(false)).collect();
        let polls = (0..opts.queues)
            .map(|_| Mutex::new(PollWindow::default()))
            .collect();
        let rings = (0..opts.queues)
            .map(|_| {
                opts.ring_io
                    .then(|| QueueRing::new(opts.native_aio))
                    .flatten()
            })
            .collect();
        let mut id = [0u8; ID_BYTES];
        let n = opts.serial.len().min(ID_BYTES);
        id[..n].copy_from_slice(&opts.serial.as_bytes()[..n]);
        let max_data_bytes =
            u64::from(opts.seg_max.max(1)) * u64::from(opts.max_segment_bytes.max(512));
        Self {
            dev,
            opts,
            mem: Mutex::new(GuestMemoryAtomic::new(GuestMemoryMmap::new())),
            event_idx: Arc::new(AtomicBool::new(false)),
            writethrough: Arc::new(AtomicBool::new(false)),
            acked: AtomicU64::new(0),
            exits: Mutex::new(Vec::new()),
            id,
            pool,
            signalled,
            rings,
            polls,
            limits: Limits {
                max_discard_sectors: MAX_RANGE_SECTORS,
                max_discard_seg: MAX_RANGES,
                max_write_zeroes_sectors: MAX_RANGE_SECTORS,
                max_write_zeroes_seg: MAX_RANGES,
                max_data_bytes,
            },
        }
    }

    /// The configuration space as of now (capacity follows the disk).
    pub fn config(&self) -> BlkConfig {
        let grain = self.dev.preferred_block_bytes().max(512);
        BlkConfig {
            capacity_sectors: self.dev.size_bytes() / SECTOR_BYTES,
            size_max: self.opts.max_segment_bytes,
            seg_max: self.opts.seg_max,
            blk_size: SECTOR_BYTES as u32,
            physical_block_exp: (grain / 512).trailing_zeros() as u8,
            min_io_blocks: (grain / 512) as u16,
            opt_io_blocks: (1 << 20) / 512,
            writeback: !self.writethrough.load(Ordering::Relaxed),
            num_queues: self.opts.queues,
            max_discard_sectors: self.limits.max_discard_sectors,
            max_discard_seg: self.limits.max_discard_seg,
            discard_alignment_sectors: grain / 512,
            max_write_zeroes_sectors: self.limits.max_write_zeroes_sectors,
            max_write_zeroes_seg: self.limits.max_write_zeroes_seg,
            write_zeroes_may_unmap: true,
        }
    }

    /// Take every available request of `vring`, carry it out, return it
    /// used; `Ok(true)` if anything was returned.
    fn process(&self, queue: usize, vring: &VringRwLock) -> io::Result<bool> {
        self.process_counting(queue, vring).map(|(used, _)| used)
    }

    /// [`BlkDevice::process`], and whether any request was taken.
    #[expect(clippy::too_many_lines)]
    fn process_counting(&self, queue: usize, vring: &VringRwLock) -> io::Result<(bool, bool)> {
        let atomic = self.mem.lock().unwrap().clone();
        let mem = atomic.memory();
        let mut used = false;
        let mut took = false;
        let ring = self.rings.get(queue).and_then(Option::as_ref);
        // Allocated at the first request: a polling worker calls this
        // often with none.
        let mut descs: Vec<Desc> = Vec::new();
        loop {
            let next = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone());
            let Some(chain) = next else { break };
            took = true;
            let head = chain.head_index();
            descs.clear();
            descs.extend(chain.map(|d| Desc {
                addr: d.addr(),
                len: d.len(),
                write_only: d.is_write_only(),
            }));
            let parsed = request::parse(&mem, &descs);
            if let (Some(ring), Ok(req)) = (ring, &parsed) {
                let shared = mem.clone().into_inner();
                let taken = Taken {
                    mem: &shared,
                    vring,
                    head,
                };
                if let Some(returned) = self.ring_request(ring, req, taken)? {
                    used |= returned;
                    continue;
                }
            }
            let written = match parsed {
                Ok(req) if self.pool.is_some() => {
                    // Run it on the pool; it returns itself used.
                    let pool = self.pool.as_ref().expect("checked");
                    let mem = mem.clone().into_inner();
                    let dev = self.dev.clone();
                    let limits = self.limits;
                    let writethrough = self.writethrough.clone();
                    let event_idx = self.event_idx.clone();
                    let id = self.id;
                    let vring = vring.clone();
                    pool.submit(Box::new(move || {
                        let t = request::Target {
                            dev: dev.as_ref(),
                            limits: &limits,
                            writethrough: &writethrough,
                            id: &id,
                        };
                        let done = request::execute(&mem, t, &req);
                        let idx = event_idx.load(Ordering::Relaxed);
                        if let Err(e) = complete(&vring, idx, head, done.written) {
                            // The frontend reset the queue or went away.
                            tracing::debug!("vhost-user-blk: request {head} not returned: {e}");
                        }
                    }));
                    continue;
                }
                Ok(req) => {
                    // Carried out here, by the thread that also reaps the
                    // ring: what the ring's requests hold (the gate, a
                    // write's stripes) must be released first, or this
                    // could wait for them, and they for it.
                    if let Some(r) = ring {
                        r.io.submit()?;
                        r.io.reap_until_idle(finish_ring_req, || {})?;
                    }
                    let t = request::Target {
                        dev: self.dev.as_ref(),
                        limits: &self.limits,
                        writethrough: &self.writethrough,
                        id: &self.id,
                    };
                    request::execute(&mem, t, &req).written
                }
                Err(Malformed::NoStatus) => {
                    tracing::warn!(
                        "vhost-user-blk: request {head} has no status byte; returned unused"
                    );
                    0
                }
                Err(Malformed::Bad(at, why)) => {
                    tracing::warn!("vhost-user-blk: request {head} refused: {why}");
                    match mem.write_slice(&[request::status::IOERR], at) {
                        Ok(()) => 1,
                        Err(_) => 0,
                    }
                }
            };
            vring
                .add_used(head, written)
                .map_err(|e| io::Error::other(format!("add_used: {e:?}")))?;
            used = true;
        }
        // Large writes queued by `ring_request` start now, together;
        // requests of the ring already done go back with this batch's
        // signal.
        if let Some(r) = ring {
            r.io.submit()?;
            used |= r.io.reap_ready(finish_ring_req, || {})? > 0;
        }
        Ok((used, took))
    }

    /// A read, or a write without FUA, through the ring: plan `req` (the
    /// request `taken`), queue its pieces (returned used once they are
    /// done). None when the
    /// device does not plan this request (the caller carries it out as
    /// any other); else whether anything was returned used now (it, or
    /// requests this waited for). Never waits for the device's gate while
    /// this queue's requests are in the ring (they may hold it): a busy
    /// device is asked again once they are done.
    fn ring_request(
        &self,
        ring: &QueueRing,
        req: &request::Parsed,
        taken: Taken<'_>,
    ) -> io::Result<Option<bool>> {
        let Taken { mem, vring, head } = taken;
        let Some(request::Single {
            ptr,
            len,
            offset: off,
            write,
        }) = request::single(
            mem,
            self.dev.as_ref(),
            req,
            &self.limits,
            &self.writethrough,
        )
        else {
            return Ok(None);
        };
        // SAFETY: the view lies in guest memory, kept mapped by `mem` (the
        // caller's load of the memory table) now and by the request's
        // context while it is in the ring; the guest does not touch a
        // buffer it handed over until the request is returned (and if it
        // does, only its own data changes).
        let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        let dev = self.dev.as_ref();
        let mut planned = plan_io(dev, write, buf, off, false);
        let mut returned = false;
        if let Some(Ok(Planned::Busy)) = planned {
            ring.io.submit()?;
            returned = ring.io.reap_until_idle(finish_ring_req, || {})? > 0;
            planned = plan_io(dev, write, buf, off, true);
        }
        let ring_req = RingReq {
            mem: mem.clone(),
            vring: vring.clone(),
            head,
            status_at: req.status_at,
            len: len as u32,
        };
        match planned {
            Some(Ok(Planned::Plan(plan))) => {
                // SAFETY: as above; `read.mem` keeps the memory mapped.
                if let Some(p) = unsafe { ring.io.start(ring_req, ptr, plan) } {
                    finish_ring_req(p);
                    returned = true;
                }
                // Started at once, not with the rest of the kick's batch: a
                // frontend kicks about once per request, the device works
                // the first while the next is planned (PERFORMANCE.md).
                // Large writes wait for the end of the batch instead
                // (`process_counting` submits them, and before any wait
                // for the ring): sequential ones started with one call are
                // merged into larger device requests by the block layer's
                // plug, which is what a 512 KiB stream's speed follows.
                if !(write && len >= DEFER_WRITE_BYTES) {
                    ring.io.submit()?;
                }
                Ok(Some(returned))
            }
            Some(Err(e)) => {
                tracing::debug!("virtio-blk request failed: {e}");
                let _ = mem.write_slice(&[request::status::IOERR], req.status_at);
                vring
                    .add_used(head, 1)
                    .map_err(|e| io::Error::other(format!("add_used: {e:?}")))?;
                Ok(Some(true))
            }
            None | Some(Ok(Planned::Busy)) => {
                // Not planned after all (the caller carries it out); requests
                // that went back meanwhile are signalled now.
                if returned {
                    self.signal(vring)?;
                }
                Ok(None)
            }
        }
    }

    fn signal(&self, vring: &VringRwLock) -> io::Result<()> {
        signal(vring, self.event_idx.load(Ordering::Relaxed))
    }

    /// How long `queue`'s worker polls this time it woke (`PollWindow`).
    fn window(&self, queue: usize) -> Duration {
        match self.polls.get(queue) {
            Some(p) if p.lock().unwrap().polls() => self.opts.poll,
            _ => Duration::ZERO,
        }
    }

    /// `queue`'s worker goes back to sleep; if it polled, whether that
    /// found anything.
    fn sleeps(&self, queue: usize, polled: Option<bool>) {
        if let Some(p) = self.polls.get(queue) {
            p.lock().unwrap().record(polled);
        }
    }

    /// Keep serving `vring` without sleeping until nothing new (a
    /// request, or a completion of the ring) has come for `window`;
    /// whether anything came.
    fn poll(&self, queue: usize, vring: &VringRwLock, window: Duration) -> io::Result<bool> {
        if window.is_zero() {
            return Ok(false);
        }
        let mut hit = false;
        let mut until = Instant::now() + window;
        loop {
            let (used, took) = self.process_counting(queue, vring)?;
            if used {
                self.signal(vring)?;
            }
            if used || took {
                hit = true;
                until = Instant::now() + window;
            } else if Instant::now() >= until {
                return Ok(hit);
            } else {
                // Not a bare spin: the CPU may be wanted by the io-wq
                // threads that carry out this queue's large writes, or by
                // another queue's worker (pinned to one CPU, a spinning
                // worker lost a quarter of the 512 KiB writes and 6 % of
                // the cold reads that a yielding one made: PERFORMANCE.md).
                // With nothing else to run, the yield returns at once.
                std::thread::yield_now();
            }
        }
    }

    /// The epoll event number of the rings' completions (past the queues'
    /// and the exit event's, as vhost-user-backend asks).
    pub fn ring_event(&self) -> u64 {
        u64::from(self.opts.queues) + 1
    }

    /// The eventfd `queue`'s ring signals at each completion, to register
    /// with that queue's worker (None without a ring).
    pub fn ring_eventfd(&self, queue: usize) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.rings.get(queue)?.as_ref()?.done.as_raw_fd())
    }

    /// Return the requests of `queue`'s ring that are done, and signal them.
    fn reap_ring(&self, queue: usize, vrings: &[VringRwLock]) -> io::Result<()> {
        let Some(Some(r)) = self.rings.get(queue) else {
            return Ok(());
        };
        // Consumed first: a completion posted from here on signals again.
        let _ = r.done.read();
        let returned = r.io.reap_ready(finish_ring_req, || {})?;
        match vrings.first() {
            Some(v) if returned > 0 => self.signal(v),
            _ => Ok(()),
        }
    }

    /// Wait for every request handed to the I/O threads to finish (the
    /// queue workers have stopped), and stop those threads.
    pub fn drain(&self) {
        if let Some(p) = &self.pool {
            p.drain();
        }
        // The queue workers are gone: what is left in the rings is
        // reaped here (and not signalled: the frontend went away).
        for r in self.rings.iter().flatten() {
            // A batch cut short by an error may have left writes queued.
            let _ = r.io.submit();
            if let Err(e) = r.io.reap_until_idle(finish_ring_req, || {}) {
                tracing::error!("vhost-user-blk: a queue's io_uring failed: {e}");
            }
        }
    }
}

impl VhostUserBackend for BlkDevice {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        self.opts.queues as usize
    }

    fn max_queue_size(&self) -> usize {
        self.opts.queue_size as usize
    }

    fn features(&self) -> u64 {
        let mut f = feature::VERSION_1
            | feature::RING_INDIRECT_DESC
            | feature::RING_EVENT_IDX
            | feature::VHOST_USER_PROTOCOL_FEATURES
            | feature::SIZE_MAX
            | feature::SEG_MAX
            | feature::BLK_SIZE
            | feature::TOPOLOGY
            | feature::FLUSH
            | feature::CONFIG_WCE
            | feature::MQ;
        if self.dev.read_only() {
            f |= feature::RO;
        } else {
            f |= feature::DISCARD | feature::WRITE_ZEROES;
        }
        f
    }

    fn acked_features(&self, features: u64) {
        self.acked.store(features, Ordering::Relaxed);
        // Without FLUSH negotiated the driver never flushes: write through.
        if features & feature::FLUSH == 0 {
            self.writethrough.store(true, Ordering::Relaxed);
        }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ
    }

    /// GET_VRING_BASE: the frontend stops the queue and will read its
    /// used index; every request taken from it must be returned first.
    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        if let Some(p) = &self.pool {
            drop(p.wait_idle());
        }
        // The queue's worker reaps its ring's requests as they complete.
        if let Some(Some(r)) = self.rings.get(queue_index as usize) {
            r.io.wait_idle();
        }
        Ok(())
    }

    fn reset_device(&self) {
        self.writethrough.store(false, Ordering::Relaxed);
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        self.config().window(offset, size)
    }

    fn set_config(&self, off: u32, buf: &[u8]) -> io::Result<()> {
        // Only the write-cache byte is writable (CONFIG_WCE).
        if off as usize == offset::WRITEBACK && buf.len() == 1 {
            if self.acked.load(Ordering::Relaxed) & feature::CONFIG_WCE == 0 {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.writethrough.store(buf[0] == 0, Ordering::Relaxed);
            return Ok(());
        }
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        *self.mem.lock().unwrap() = mem;
        for s in &self.signalled {
            s.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.opts.queues).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()?;
        let mine = n.try_clone().ok()?;
        self.exits.lock().unwrap().push(mine);
        Some((c, n))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!(
                "vhost-user-blk: unexpected event set {evset:?}"
            )));
        }
        // One queue per worker thread (`queues_per_thread`): the thread's
        // index is the queue's, and its queue is `vrings[0]` (events are
        // numbered within the thread).
        let queue = thread_id;
        let window = self.window(queue);
        let r = self.serve_event(queue, device_event, vrings, window);
        let hit = matches!(r, Ok(true));
        self.sleeps(queue, (!window.is_zero()).then_some(hit));
        r.map(|_| ())
    }
}

impl BlkDevice {
    /// `handle_event` for `queue`'s worker, which then polls for `window`;
    /// whether polling found anything.
    fn serve_event(
        &self,
        queue: usize,
        device_event: u16,
        vrings: &[VringRwLock],
        window: Duration,
    ) -> io::Result<bool> {
        let mut hit = false;
        let mut device_event = device_event;
        if u64::from(device_event) == self.ring_event() {
            self.reap_ring(queue, vrings)?;
            if window.is_zero() {
                return Ok(false);
            }
            // Polling: on to the queue, as if the guest had kicked.
            device_event = 0;
        }
        let Some(vring) = vrings.get(device_event as usize) else {
            return Err(io::Error::other(format!(
                "vhost-user-blk: event for unknown queue {device_event}"
            )));
        };
        if self.event_idx.load(Ordering::Relaxed) {
            // Keep going until the driver has added nothing since we last
            // looked, so a kick is never lost between the last pop and
            // re-enabling notifications.
            loop {
                vring
                    .disable_notification()
                    .map_err(|e| io::Error::other(format!("{e:?}")))?;
                if self.process(queue, vring)? {
                    self.signal(vring)?;
                }
                hit |= self.poll(queue, vring, window)?;
                let more = vring
                    .enable_notification()
                    .map_err(|e| io::Error::other(format!("{e:?}")))?;
                if !more {
                    break;
                }
            }
        } else {
            if self.process(queue, vring)? {
                self.signal(vring)?;
            }
            hit |= self.poll(queue, vring, window)?;
        }
        let first = self
            .signalled
            .get(queue)
            .is_some_and(|s| !s.swap(true, Ordering::Relaxed));
        if first {
            // Returned before a crash of the backend that served this
            // guest before, maybe never signalled.
            vring.signal_used_queue()?;
        }
        Ok(hit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_polls_while_polling_pays_and_probes_after_it_stops() {
        let mut w = PollWindow::default();
        assert!(w.polls(), "a new queue polls");
        // Polls that find something a third of the time keep it polling.
        for i in 0..300 {
            assert!(w.polls(), "stopped at poll {i} with a third paying");
            w.record(Some(i % 3 == 0));
        }
        // Polls that find nothing: it stops within a dozen.
        let mut misses = 0;
        while w.polls() {
            w.record(Some(false));
            misses += 1;
            assert!(misses <= 12, "still polling after {misses} misses");
        }
        // Asleep, it polls again at the POLL_PROBE-th wake-up, not before.
        for _ in 0..POLL_PROBE - 1 {
            assert!(!w.polls());
            w.record(None);
        }
        assert!(w.polls(), "no probe after {POLL_PROBE} wake-ups");
        // A probe that finds nothing: asleep again.
        w.record(Some(false));
        assert!(!w.polls());
        // Probes that keep finding something bring it back.
        let mut probes = 0;
        while !w.polls() {
            for _ in 0..POLL_PROBE - 1 {
                w.record(None);
            }
            assert!(w.polls());
            w.record(Some(true));
            probes += 1;
            assert!(probes <= 2, "not back after {probes} paying probes");
        }
    }
}
