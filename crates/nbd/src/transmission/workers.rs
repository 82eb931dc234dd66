//! Admission and the workers: the in-flight budget a request is charged
//! against before it is read, the queue the reader hands requests to,
//! the worker threads that carry them out, and the pool of idle
//! buffers.

use super::*;

/// The worker threads of a connection; dropping this drains the queue.
pub(super) struct Workers<S: NbdStream> {
    conn: Arc<Conn<S>>,
    threads: Vec<JoinHandle<()>>,
    max: usize,
}

impl<S: NbdStream> Workers<S> {
    /// None yet, for `conn`; [`Workers::grow`] starts up to `max`.
    pub(super) fn new(conn: Arc<Conn<S>>, max: usize) -> Self {
        Workers {
            conn,
            threads: Vec::new(),
            max,
        }
    }

    /// Start one more worker if allowed. Fails only if none can run.
    pub(super) fn grow(&mut self) -> io::Result<()> {
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

/// Whether the in-flight budget `q` has no room for a request of `cost`
/// (one request is always admitted when nothing else is in flight).
fn no_room(q: &Queue, cost: u64, shared: &Shared) -> bool {
    q.inflight > 0
        && (q.inflight >= shared.opts.max_inflight_requests
            || q.inflight_bytes + cost > shared.opts.max_inflight_bytes)
}

impl<S: NbdStream> Conn<S> {
    /// Wait until the in-flight budget has room for a request of `cost`
    /// bytes, then charge it (true). A lone request is always admitted.
    /// Before it waits, what the reader queued on the ring starts: the
    /// room it waits for may be what those requests hold. Gives up
    /// (false) when the server stops or the connection breaks meanwhile.
    pub(super) fn admit(&self, cost: u64, shared: &Shared) -> io::Result<bool> {
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
    pub(super) fn reap_for_room(
        &self,
        ring: &RingIo<RingReq>,
        cost: u64,
        shared: &Shared,
    ) -> io::Result<()> {
        while no_room(&self.queue.lock(), cost, shared) && ring.busy() {
            ring.submit()?;
            ring.reap_waiting(|p| self.finish_ring_req(p), || {})?;
        }
        Ok(())
    }

    /// Release what [`admit`](Self::admit) charged.
    pub(super) fn finished(&self, cost: u64) {
        let mut q = self.queue.lock();
        q.inflight -= 1;
        q.inflight_bytes -= cost;
        drop(q);
        self.room.notify_one();
    }

    /// Queue a job; true if no idle worker will pick it up.
    pub(super) fn push(&self, job: Job) -> bool {
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
    pub(super) fn runs_inline(&self, req: &Request, limit: u32) -> bool {
        req.ty == CMD_WRITE && req.flags & FLAG_FUA == 0 && req.len <= limit && self.bytes.is_none()
    }

    /// Carry out an admitted request and answer it (on a worker, or on
    /// the reader for [`Conn::runs_inline`]).
    pub(super) fn run(&self, job: Job) {
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
    pub(super) fn take_buffer(&self, len: usize) -> AlignedBuf {
        let mut b = {
            let mut p = self.pool.lock();
            let b = p.free.pop().unwrap_or_else(|| AlignedBuf::zeroed(0));
            p.bytes -= b.capacity();
            b
        };
        b.set_len(len);
        b
    }

    pub(super) fn recycle(&self, b: AlignedBuf) {
        if b.capacity() == 0 {
            return;
        }
        let mut p = self.pool.lock();
        if p.bytes + b.capacity() <= POOL_KEEP_BYTES {
            p.bytes += b.capacity();
            p.free.push(b);
        }
    }
}
