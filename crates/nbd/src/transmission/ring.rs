//! READs and WRITEs through the connection's ring: opening it, planning
//! a request into or from its buffer and queueing its pieces, reaping
//! the completions and answering each request once all its pieces are
//! done.

use super::*;

/// Submission slots of a connection's ring.
const RING_ENTRIES: u32 = 128;

/// A READ or WRITE in the ring: the request, the buffer its data goes
/// into or comes from, and what the connection's admission charged.
pub(super) struct RingReq {
    req: Request,
    data: AlignedBuf,
    cost: u64,
    /// A byte-granular client's write holds its export's lock shared
    /// until it is done, as on a worker (`strata_block::bytes`).
    _hold: Option<BytesHold>,
}

/// A shared hold on an export's read-modify-write lock.
type BytesHold = parking_lot::ArcRwLockReadGuard<parking_lot::RawRwLock, ()>;

impl RingReq {
    /// `req`, with its buffer `data` and the `cost` admission charged,
    /// holding no lock.
    pub(super) fn new(req: Request, data: AlignedBuf, cost: u64) -> RingReq {
        RingReq {
            req,
            data,
            cost,
            _hold: None,
        }
    }
}

type Pending = ring_io::Pending<RingReq>;

/// A connection's ring, when asked for and available; with `one_thread`,
/// for the calling thread alone to queue and reap.
pub(super) fn open_ring(shared: &Shared, one_thread: bool) -> Option<Arc<RingIo<RingReq>>> {
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

impl<S: NbdStream> Conn<S> {
    /// Whether `req` may go through the ring: anything, except for a
    /// byte-granular client what cuts a sector.
    pub(super) fn ring_may_take(&self, req: &Request) -> bool {
        self.bytes.is_none() || bytes::aligned(req.offset, req.len as u64)
    }

    /// A WRITE through the ring ([`Conn::ring_request`]), or its payload
    /// back for a worker. A byte-granular client's write goes on the
    /// ring only with its export's lock held shared, taken without
    /// waiting: a read-modify-write waiting for the lock may be waiting
    /// for this ring's writes, which only the reader may be there to
    /// answer.
    pub(super) fn ring_write(
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
        let rr = RingReq {
            _hold: hold,
            ..RingReq::new(req, payload, cost)
        };
        self.ring_request(ring, rr)
    }

    /// READ, or WRITE without FUA, through the ring: plan `rr.req` into or
    /// from `rr.data` (a READ's buffer, a WRITE's payload), queue its
    /// pieces (the reaping thread answers it). Gives the buffer back when
    /// the device does not plan this request (a worker then serves it;
    /// an engine disk plans only aligned writes, under `--cache none`).
    /// Never waits for the gate while requests of this connection are in
    /// the ring (they may hold it): a busy device is asked again once
    /// they are done.
    pub(super) fn ring_request(
        &self,
        ring: &RingIo<RingReq>,
        mut rr: RingReq,
    ) -> io::Result<Option<AlignedBuf>> {
        let req = rr.req;
        let write = req.ty == CMD_WRITE;
        if write && req.flags & FLAG_FUA != 0 {
            return Ok(Some(rr.data));
        }
        let dev = &*self.dev;
        let mut planned = plan_io(dev, write, &mut rr.data, req.offset, false);
        if let Some(Ok(Planned::Busy)) = planned {
            ring.submit()?;
            if self.self_reaps {
                self.reap_until_idle(ring);
            } else {
                ring.wait_idle();
            }
            planned = plan_io(dev, write, &mut rr.data, req.offset, true);
        }
        match planned {
            Some(Ok(Planned::Plan(plan))) => {
                if !write {
                    self.read_ahead(&req);
                }
                // The buffer's memory does not move with the `AlignedBuf`
                // that owns it: the pointer stays good while it waits in
                // the ring (and nothing else touches it meanwhile).
                let at = rr.data.as_mut_ptr();
                // SAFETY: as said above; `rr` owns the buffer until the
                // request is handed back.
                if let Some(p) = unsafe { ring.start(rr, at, plan) } {
                    self.finish_ring_req(p);
                }
                Ok(None)
            }
            Some(Err(e)) => {
                self.recycle(rr.data);
                let r = self.reply_error(&req, errno_of(&e), &e.to_string());
                self.finished(rr.cost);
                r.map(|()| None)
            }
            None | Some(Ok(Planned::Busy)) => Ok(Some(rr.data)),
        }
    }

    /// Answer every request in the ring, on the thread that reaps it.
    pub(super) fn reap_until_idle(&self, ring: &RingIo<RingReq>) {
        if let Err(e) = ring.reap_until_idle(|p| self.finish_ring_req(p), || {}) {
            tracing::error!("NBD: the connection's ring failed: {e}; dropping the connection");
            self.mark_broken(&e);
        }
    }

    /// The reaping thread of the ring.
    pub(super) fn reap_loop(&self) {
        let ring = self.ring.as_ref().expect("a reaper has a ring");
        if let Err(e) = ring.reap(|p| self.finish_ring_req(p), || {}) {
            tracing::error!("NBD: the connection's ring failed: {e}; dropping the connection");
            self.mark_broken(&e);
        }
    }

    /// A request's pieces are done (or failed): release what it held, then
    /// answer.
    pub(super) fn finish_ring_req(&self, mut p: Pending) {
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
}
