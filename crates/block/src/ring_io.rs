//! Planned reads and writes in flight on one [`Ring`]: a transport's
//! reader plans a request against the device
//! ([`crate::BlockDevice::plan_read`], `plan_write`), queues its pieces
//! here and submits what it has queued before it waits for its next
//! request, so requests that arrived together reach the disk with one
//! system call. A reaping thread takes the completions, resubmits short
//! transfers, and hands each request back once all its pieces are done;
//! the transport then releases what it held and answers it. The NBD
//! server (one ring per connection) and the vhost-user-blk backend (one
//! per queue) share this. ARCHITECTURE.md, "Direct I/O through io_uring".

use std::collections::HashMap;
use std::io;

use parking_lot::{Condvar, Mutex};

use crate::ring::{Io, Ring};
use crate::IoPlan;

/// The low bits of a completion's user data: which piece of its request.
const PIECE_BITS: u32 = 20;
/// User data of the no-op that tells the reaping thread to end.
const STOP: u64 = u64::MAX;

/// What one batch of completions held.
struct Batch {
    /// The stop no-op was among them.
    stop: bool,
    /// Requests handed over.
    handed: usize,
}

/// Where a read's data goes, or a write's comes from: memory the
/// transport keeps alive (in the request's context) until the request is
/// handed back.
struct Dest(*mut u8);

// SAFETY: the pointer is only a destination handed to the kernel and
// written (zeros past the end of the file) by the reaping thread; the
// caller of `RingIo::start` vouches that nothing else touches it.
unsafe impl Send for Dest {}

/// A read or write whose pieces are in the ring, with the transport's
/// context `T` (the request to answer, the buffer's owner).
pub struct Pending<T> {
    pub ctx: T,
    pub plan: IoPlan,
    /// Where the pieces go: the request's buffer, or the plan's `source`.
    dest: Dest,
    /// The request's buffer.
    out: Dest,
    /// Bytes of each piece done so far (a short transfer is resubmitted).
    done: Vec<usize>,
    /// Pieces not finished yet.
    left: usize,
    /// The first error a piece met (an errno).
    pub failed: Option<i32>,
    /// The ring failed with this request's pieces maybe still under the
    /// kernel: its buffer must never be freed or reused (leak it).
    pub abandoned: bool,
}

impl<T> Pending<T> {
    /// Release what the plan holds, running its finish steps (a write's
    /// install among them); a step that fails the request fails it with
    /// EIO. Returns whether the request succeeded: what to answer.
    pub fn finish_plan(&mut self) -> bool {
        if let (None, Some(f)) = (self.failed, self.plan.after_read.take()) {
            let len = self.plan.fill.len_bytes() as usize;
            let source = self.plan.source.as_deref().unwrap_or(&[]);
            // SAFETY: `out` is the request's buffer of `len` bytes, every
            // piece is in, and it is ours until the request is handed
            // back; `source`, when there is one, is another allocation.
            let out = unsafe { std::slice::from_raw_parts_mut(self.out.0, len) };
            if let Err(e) = f(out, source) {
                tracing::error!("a planned read failed after its I/O: {e}");
                self.failed = Some(libc::EIO);
            }
        }
        if !self.plan.finish(self.failed.is_none()) {
            self.failed.get_or_insert(libc::EIO);
        }
        self.failed.is_none()
    }

    /// The part of piece `i` not transferred yet, to queue again with
    /// `user_data`.
    fn rest_of_piece(&self, i: usize, user_data: u64) -> Io {
        let piece = self.plan.pieces[i];
        let done = self.done[i];
        Io {
            write: self.plan.write,
            fd: self.plan.fd,
            // SAFETY: a piece lies inside the destination, and `done` is
            // less than its length.
            ptr: unsafe { self.dest.0.add(piece.buf_offset + done) },
            len: (piece.len - done) as u32,
            offset: piece.file_offset + done as u64,
            user_data,
        }
    }
}

struct State<T> {
    pending: HashMap<u64, Pending<T>>,
    /// Reads taken out of `pending` and being handed back.
    finishing: usize,
    next: u64,
}

/// The ring of one reader and the requests in it.
pub struct RingIo<T> {
    ring: Ring,
    state: Mutex<State<T>>,
    /// Signalled when no request is in the ring or being handed back.
    idle: Condvar,
}

impl<T: Send> RingIo<T> {
    /// An io_uring of `entries` submission slots (issued inline);
    /// fails where io_uring is not available (the transport then works
    /// by itself).
    pub fn new(entries: u32) -> io::Result<RingIo<T>> {
        Ok(Self::over(Ring::new(entries)?))
    }

    /// The same over a Linux native AIO context ([`Ring::native`]) of
    /// `depth` operations.
    pub fn native(depth: u32) -> io::Result<RingIo<T>> {
        Ok(Self::over(Ring::native(depth)?))
    }

    /// A transport's ring for `entries` requests' pieces at a time: an
    /// io_uring, or with `native` a native AIO context (twice as deep: it
    /// holds completions too). With `one_thread`, the calling thread is
    /// the only one that will queue and reap (an io_uring then posts
    /// completions only when it asks: [`Ring::for_one_thread`]). The
    /// error says which could not be set up.
    pub fn open(entries: u32, native: bool, one_thread: bool) -> io::Result<RingIo<T>> {
        let (made, what) = if native {
            (Self::native(entries * 2), "native AIO context")
        } else if one_thread {
            (Ring::for_one_thread(entries).map(Self::over), "io_uring")
        } else {
            (Self::new(entries), "io_uring")
        };
        made.map_err(|e| io::Error::new(e.kind(), format!("no {what} ({e})")))
    }

    fn over(ring: Ring) -> RingIo<T> {
        RingIo {
            ring,
            state: Mutex::new(State {
                pending: HashMap::new(),
                finishing: 0,
                next: 0,
            }),
            idle: Condvar::new(),
        }
    }

    /// Queue the pieces of a planned request, into or from `dest` (they start at the
    /// next [`RingIo::submit`]). A request without pieces (a read of holes), or
    /// one whose pieces could not all be queued, is given back at once
    /// (failed, in the second case, once the pieces queued are in).
    ///
    /// # Safety
    /// `dest` must point at the buffer `plan` was made for and stay valid,
    /// untouched by anyone else, until the request is handed back (by this
    /// call or to the reaping thread's `finish`); `ctx` may own it.
    pub unsafe fn start(&self, ctx: T, dest: *mut u8, plan: IoPlan) -> Option<Pending<T>> {
        let n = plan.pieces.len();
        // A write of bytes the plan made itself goes out from its buffer
        // (the kernel only reads a write's memory); a read with one lands
        // there for `after_read`.
        let out = dest;
        let dest = match &plan.source {
            Some(b) => b.as_ptr().cast_mut(),
            None => dest,
        };
        let p = Pending {
            ctx,
            plan,
            dest: Dest(dest),
            out: Dest(out),
            done: vec![0; n],
            left: n,
            failed: None,
            abandoned: false,
        };
        if n == 0 {
            return Some(p);
        }
        let pieces = p.plan.pieces.clone();
        let (fd, write) = (p.plan.fd, p.plan.write);
        let token = {
            let mut s = self.state.lock();
            s.next = (s.next + 1) & (u64::MAX >> PIECE_BITS >> 1);
            let token = s.next;
            s.pending.insert(token, p);
            token
        };
        for (i, piece) in pieces.iter().enumerate() {
            // SAFETY: the caller vouches for `dest` until the request is
            // handed back, which is after every piece's completion is
            // reaped; the plan holds the device (and so `fd`) until it is
            // finished.
            let r = unsafe {
                self.ring.push_io(Io {
                    write,
                    fd,
                    ptr: dest.add(piece.buf_offset),
                    len: piece.len as u32,
                    offset: piece.file_offset,
                    user_data: token << PIECE_BITS | i as u64,
                })
            };
            if let Err(e) = r {
                // The pieces not queued fail the read; the ones queued
                // still complete (and finish it).
                let mut s = self.state.lock();
                let ended = end_pieces(&mut s.pending, token, n - i, Some(errno_of(&e)));
                self.notify_if_idle(&s);
                return ended;
            }
        }
        None
    }

    /// Start everything queued, with one system call.
    pub fn submit(&self) -> io::Result<()> {
        self.ring.submit()
    }

    fn notify_if_idle(&self, s: &State<T>) {
        if s.pending.is_empty() && s.finishing == 0 {
            self.idle.notify_all();
        }
    }

    /// Wait until every request started has been handed back (and `finish`
    /// returned for it). What is queued is submitted first: no wait here
    /// is for a request the kernel was never given. A submission that
    /// fails leaves the queued requests to fail with the ring (their
    /// reaping thread sees the error), so this returns rather than wait
    /// for them.
    pub fn wait_idle(&self) {
        if let Err(e) = self.ring.submit() {
            tracing::error!("io_uring: cannot submit before waiting for the ring: {e}");
            return;
        }
        let mut s = self.state.lock();
        while !s.pending.is_empty() || s.finishing > 0 {
            self.idle.wait(&mut s);
        }
    }

    /// Wait for the requests in the ring, then tell the reaping thread to end.
    pub fn stop(&self) -> io::Result<()> {
        self.wait_idle();
        self.ring.push_nop(STOP)?;
        self.ring.submit()
    }

    /// Whether requests are in the ring (started and not handed back).
    pub fn busy(&self) -> bool {
        !self.state.lock().pending.is_empty()
    }

    /// Hand over finished requests as [`RingIo::reap_ready`] does, but
    /// first wait for one to finish (for a thread that reaps its own ring
    /// and has nothing else to do until one does); how many were.
    pub fn reap_waiting(
        &self,
        finish: impl FnMut(Pending<T>),
        batch_done: impl FnMut(),
    ) -> io::Result<usize> {
        self.ring.submit()?;
        self.reap_handing(true, finish, batch_done)
    }

    /// Have the kernel signal the eventfd `fd` at each completion, for a
    /// transport whose own event loop reaps ([`RingIo::reap_ready`])
    /// rather than a thread of its own.
    pub fn register_eventfd(&self, fd: std::os::fd::RawFd) -> io::Result<()> {
        self.ring.register_eventfd(fd)
    }

    /// The reaping thread: hand every finished request to `finish`, and call
    /// `batch_done` after each batch of completions handed over, until
    /// [`RingIo::stop`]. On a ring error the requests left are handed over
    /// failed and `abandoned`, and the error returned.
    pub fn reap(
        &self,
        mut finish: impl FnMut(Pending<T>),
        mut batch_done: impl FnMut(),
    ) -> io::Result<()> {
        loop {
            match self.reap_batch(true, &mut finish, &mut batch_done) {
                Ok(b) if b.stop => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(self.abandon(e, &mut finish, &mut batch_done)),
            }
        }
    }

    /// Without waiting: hand over the requests whose last completion is in,
    /// as [`RingIo::reap`] does (for an event loop woken by the
    /// eventfd of [`RingIo::register_eventfd`]); how many were.
    pub fn reap_ready(
        &self,
        finish: impl FnMut(Pending<T>),
        batch_done: impl FnMut(),
    ) -> io::Result<usize> {
        self.reap_handing(false, finish, batch_done)
    }

    /// One batch (waiting for a completion with `wait`): how many requests
    /// were handed over; on a ring error the rest are abandoned.
    fn reap_handing(
        &self,
        wait: bool,
        mut finish: impl FnMut(Pending<T>),
        mut batch_done: impl FnMut(),
    ) -> io::Result<usize> {
        self.reap_batch(wait, &mut finish, &mut batch_done)
            .map(|b| b.handed)
            .map_err(|e| self.abandon(e, &mut finish, &mut batch_done))
    }

    /// Reap, waiting, until no request is in the ring (for a transport that
    /// reaps in its own event loop and must see its requests done first); how
    /// many requests were handed over.
    pub fn reap_until_idle(
        &self,
        mut finish: impl FnMut(Pending<T>),
        mut batch_done: impl FnMut(),
    ) -> io::Result<usize> {
        self.ring.submit()?;
        let mut handed = 0;
        while self.busy() {
            match self.reap_batch(true, &mut finish, &mut batch_done) {
                Ok(b) => handed += b.handed,
                Err(e) => return Err(self.abandon(e, &mut finish, &mut batch_done)),
            }
        }
        Ok(handed)
    }

    /// The ring failed: hand over the requests left, failed and abandoned.
    fn abandon(
        &self,
        e: io::Error,
        finish: &mut impl FnMut(Pending<T>),
        batch_done: &mut impl FnMut(),
    ) -> io::Error {
        let left: Vec<Pending<T>> = {
            let mut s = self.state.lock();
            let left: Vec<_> = s.pending.drain().map(|(_, p)| p).collect();
            s.finishing += left.len();
            left
        };
        let n = left.len();
        for mut p in left {
            p.failed.get_or_insert(libc::EIO);
            p.abandoned = true;
            p.plan.lose();
            finish(p);
        }
        batch_done();
        let mut s = self.state.lock();
        s.finishing -= n;
        self.notify_if_idle(&s);
        e
    }

    /// Take the completions in (waiting for one with `wait`), queue short
    /// transfers again, hand over the requests that are over.
    fn reap_batch(
        &self,
        wait: bool,
        finish: &mut impl FnMut(Pending<T>),
        batch_done: &mut impl FnMut(),
    ) -> io::Result<Batch> {
        let mut stop = false;
        let mut finished = Vec::new();
        // Short transfers to queue again: what is left of each.
        let mut again: Vec<Io> = Vec::new();
        let n = self.ring.reap_some(wait, |ud, res| {
            if ud == STOP {
                stop = true;
                return;
            }
            let token = ud >> PIECE_BITS;
            let i = (ud & ((1 << PIECE_BITS) - 1)) as usize;
            let mut s = self.state.lock();
            let Some(p) = s.pending.get_mut(&token) else {
                tracing::error!("io_uring: a completion for no pending read ({ud:#x})");
                return;
            };
            let piece = p.plan.pieces[i];
            let rest = piece.len - p.done[i];
            // SAFETY: a piece lies inside the destination, and `done`
            // is less than its length.
            let at = unsafe { p.dest.0.add(piece.buf_offset + p.done[i]) };
            let mut failed = None;
            let piece_over = match res {
                r if r < 0 => {
                    failed = Some(-r);
                    true
                }
                // A write that moved nothing would never end.
                0 if p.plan.write => {
                    failed = Some(libc::EIO);
                    true
                }
                // Past the end of the file: reads as zeros, as
                // `Storage::read_at` does.
                0 => {
                    // SAFETY: `at[..rest]` is the piece's unread part,
                    // ours until the read is handed back.
                    unsafe { at.write_bytes(0, rest) };
                    true
                }
                r if (r as usize) < rest => {
                    p.done[i] += r as usize;
                    again.push(p.rest_of_piece(i, ud));
                    false
                }
                _ => true,
            };
            if piece_over {
                finished.extend(end_pieces(&mut s.pending, token, 1, failed));
            }
        })?;
        if n == 0 {
            return Ok(Batch { stop, handed: 0 });
        }
        for io in again.drain(..) {
            // SAFETY: as in `start`: the buffer is the request's until
            // this piece's last completion.
            if let Err(e) = unsafe { self.ring.push_io(io) } {
                // The piece fails; its read is answered with the error.
                let mut s = self.state.lock();
                let token = io.user_data >> PIECE_BITS;
                finished.extend(end_pieces(&mut s.pending, token, 1, Some(errno_of(&e))));
            }
        }
        // The short reads queued again start together.
        self.ring.submit()?;
        let handed = finished.len();
        if handed > 0 {
            self.state.lock().finishing += handed;
            for p in finished.drain(..) {
                finish(p);
            }
            batch_done();
            let mut s = self.state.lock();
            s.finishing -= handed;
            self.notify_if_idle(&s);
        }
        Ok(Batch { stop, handed })
    }
}

/// `count` pieces of request `token` are over (failed with `errno`, if
/// given): the request, once its last piece is, taken out of `pending`.
fn end_pieces<T>(
    pending: &mut HashMap<u64, Pending<T>>,
    token: u64,
    count: usize,
    errno: Option<i32>,
) -> Option<Pending<T>> {
    let p = pending.get_mut(&token)?;
    if let Some(e) = errno {
        p.failed.get_or_insert(e);
    }
    p.left -= count;
    if p.left == 0 {
        pending.remove(&token)
    } else {
        None
    }
}

/// The errno of an I/O error (EIO when it has none).
fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// A reaping thread, told to end and joined on drop (after the requests in
/// its ring are handed back).
pub struct Reaper<T: Send> {
    thread: Option<std::thread::JoinHandle<()>>,
    reads: std::sync::Arc<RingIo<T>>,
}

impl<T: Send + 'static> Reaper<T> {
    /// Start a thread named `name` that runs `body` (which should call
    /// [`RingIo::reap`] on `reads`).
    pub fn spawn(
        name: &str,
        reads: std::sync::Arc<RingIo<T>>,
        body: impl FnOnce() + Send + 'static,
    ) -> io::Result<Reaper<T>> {
        let thread = std::thread::Builder::new().name(name.into()).spawn(body)?;
        Ok(Reaper {
            thread: Some(thread),
            reads,
        })
    }
}

impl<T: Send> Drop for Reaper<T> {
    fn drop(&mut self) {
        if let Err(e) = self.reads.stop() {
            tracing::error!("io_uring: cannot stop a ring's reaping thread: {e}");
            return;
        }
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AlignedBuf, FilePiece, ReadFill};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;

    /// An 8 KiB request of `fd` in two 4 KiB pieces: the buffer's first
    /// half at `first`, its second at `second`.
    fn two_pieces(fd: i32, write: bool, first: u64, second: u64) -> IoPlan {
        let piece = |buf_offset, file_offset| FilePiece {
            buf_offset,
            file_offset,
            len: 4096,
        };
        IoPlan {
            fd,
            write,
            pieces: vec![piece(0, first), piece(4096, second)],
            fill: ReadFill::all_data(8192),
            holds: Vec::new(),
            source: None,
            after_read: None,
        }
    }

    #[test]
    fn pieces_come_back_as_one_read_each_with_the_tail_past_eof_zeroed() {
        let Ok(reads) = RingIo::<(usize, AlignedBuf)>::new(8) else {
            eprintln!("io_uring is not available here: skipped");
            return;
        };
        let reads = Arc::new(reads);
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..40 * 1024u32).map(|i| (i % 251) as u8 + 1).collect();
        f.write_all(&data).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let batches = Arc::new(Mutex::new(0usize));
        let (r2, g2, b2) = (reads.clone(), got.clone(), batches.clone());
        let reaper = Reaper::spawn("test-reap", reads.clone(), move || {
            r2.reap(|p| g2.lock().push((p.ctx, p.failed)), || *b2.lock() += 1)
                .unwrap()
        })
        .unwrap();
        // Six reads of two pieces each (the second half of the buffer from
        // 8 KiB further on); the last ones run past the end of the file.
        for k in 0..6usize {
            let mut buf = AlignedBuf::zeroed(8192);
            buf.fill(0xee);
            let dest = buf.as_mut_ptr();
            let plan = two_pieces(
                f.as_raw_fd(),
                false,
                k as u64 * 8192,
                k as u64 * 8192 + 8192,
            );
            // SAFETY: `buf` moves into the context; its memory does not move.
            assert!(unsafe { reads.start((k, buf), dest, plan) }.is_none());
        }
        reads.submit().unwrap();
        reads.wait_idle();
        drop(reaper);
        let mut got = std::mem::take(&mut *got.lock());
        got.sort_by_key(|((k, _), _)| *k);
        assert_eq!(got.len(), 6);
        assert!(*batches.lock() >= 1);
        for ((k, buf), failed) in got {
            assert_eq!(failed, None);
            for (half, file_at) in [(0, k * 8192), (4096, k * 8192 + 8192)] {
                let want: Vec<u8> = (file_at..file_at + 4096)
                    .map(|i| data.get(i).copied().unwrap_or(0))
                    .collect();
                assert_eq!(&buf[half..half + 4096], &want[..], "read {k} at {half}");
            }
        }
    }

    #[test]
    fn writes_land_piece_by_piece_and_come_back_once_each() {
        let Ok(ring) = RingIo::<(usize, AlignedBuf)>::new(8) else {
            eprintln!("io_uring is not available here: skipped");
            return;
        };
        let ring = Arc::new(ring);
        let f = tempfile::tempfile().unwrap();
        f.set_len(64 * 1024).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let (r2, g2) = (ring.clone(), got.clone());
        let reaper = Reaper::spawn("test-reap", ring.clone(), move || {
            r2.reap(|p| g2.lock().push((p.ctx.0, p.failed)), || {})
                .unwrap()
        })
        .unwrap();
        // Four writes of 8 KiB, each in two pieces that go to places in
        // the file in the opposite order of the buffer's halves.
        for k in 0..4usize {
            let mut buf = AlignedBuf::zeroed(8192);
            buf[..4096].fill(2 * k as u8 + 1);
            buf[4096..].fill(2 * k as u8 + 2);
            let src = buf.as_mut_ptr();
            let at = k as u64 * 16384;
            let plan = two_pieces(f.as_raw_fd(), true, at + 8192, at);
            // SAFETY: `buf` moves into the context; its memory does not move.
            assert!(unsafe { ring.start((k, buf), src, plan) }.is_none());
        }
        ring.submit().unwrap();
        ring.wait_idle();
        drop(reaper);
        let mut got = std::mem::take(&mut *got.lock());
        got.sort();
        assert_eq!(got, (0..4).map(|k| (k, None)).collect::<Vec<_>>());
        use std::os::unix::fs::FileExt;
        let mut back = vec![0u8; 64 * 1024];
        f.read_exact_at(&mut back, 0).unwrap();
        for k in 0..4usize {
            let at = k * 16384;
            assert!(
                back[at..at + 4096].iter().all(|&b| b == 2 * k as u8 + 2),
                "write {k}"
            );
            assert!(
                back[at + 4096..at + 8192].iter().all(|&b| b == 0),
                "write {k}"
            );
            assert!(
                back[at + 8192..at + 12288]
                    .iter()
                    .all(|&b| b == 2 * k as u8 + 1),
                "write {k}"
            );
        }
    }
}
