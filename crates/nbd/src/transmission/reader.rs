//! The reader: one thread per connection reads each request, admits it,
//! and hands it to the ring, runs it itself, or queues it for a worker.
//! A connection that reaps its own ring answers completions while it
//! waits for the next request.

use super::*;

#[expect(clippy::too_many_lines)]
pub(super) fn read_requests<S: NbdStream>(
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
                match conn.ring_request(r, RingReq::new(req, data, cost))? {
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
