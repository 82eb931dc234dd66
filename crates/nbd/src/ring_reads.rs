//! READs carried out through an io_uring (`ServerOptions::ring_reads`):
//! the connection's reader plans each READ against the device
//! (`BlockDevice::plan_read`), queues its pieces on the connection's ring
//! and submits what it has queued before it waits for the socket again, so
//! requests that arrived together reach the disk with one system call. A
//! reaping thread takes the completions, releases what each read held and
//! sends its reply. ARCHITECTURE.md, "Direct I/O through io_uring".

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use strata_block::ring::Ring;
use strata_block::{AlignedBuf, ReadPlan};

use crate::proto::Request;

/// Submission slots of a connection's ring.
const RING_ENTRIES: u32 = 128;
/// The low bits of a completion's user data: which piece of its read.
const PIECE_BITS: u32 = 20;
/// User data of the no-op that tells the reaping thread to end.
const STOP: u64 = u64::MAX;

/// A read whose pieces are in the ring.
pub(crate) struct Pending {
    pub req: Request,
    pub data: AlignedBuf,
    pub plan: ReadPlan,
    /// Bytes of each piece read so far (a short read is resubmitted).
    done: Vec<usize>,
    /// Pieces not finished yet.
    left: usize,
    /// The first error a piece met (an errno).
    pub failed: Option<i32>,
    /// What the connection's admission charged.
    pub cost: u64,
}

/// The ring of one connection and the reads in it.
pub(crate) struct RingReads {
    ring: Ring,
    pending: Mutex<HashMap<u64, Pending>>,
    /// Signalled when `pending` becomes empty.
    idle: Condvar,
    next: Mutex<u64>,
}

impl RingReads {
    pub fn new() -> io::Result<RingReads> {
        Ok(RingReads {
            ring: Ring::new(RING_ENTRIES)?,
            pending: Mutex::new(HashMap::new()),
            idle: Condvar::new(),
            next: Mutex::new(0),
        })
    }

    /// Queue the pieces of a planned read (submitted by the next
    /// [`RingReads::submit`]). A read without pieces (all holes) is given
    /// back at once, finished.
    pub fn start(
        &self,
        req: Request,
        mut data: AlignedBuf,
        plan: ReadPlan,
        cost: u64,
    ) -> Option<Pending> {
        let n = plan.pieces.len();
        let mut p = Pending {
            req,
            data: AlignedBuf::zeroed(0),
            plan,
            done: vec![0; n],
            left: n,
            failed: None,
            cost,
        };
        if n == 0 {
            p.data = data;
            return Some(p);
        }
        let token = {
            let mut next = self.next.lock();
            *next = (*next + 1) & (u64::MAX >> PIECE_BITS >> 1);
            *next
        };
        // The buffer's memory does not move with the `AlignedBuf` that
        // owns it: the pointers stay good while it waits in `pending`.
        let base = data.as_mut_ptr();
        let pieces = p.plan.pieces.clone();
        let fd = p.plan.fd;
        p.data = data;
        self.pending.lock().insert(token, p);
        for (i, piece) in pieces.iter().enumerate() {
            // SAFETY: the buffer lives in `pending` until every piece's
            // completion is reaped; nothing else touches it meanwhile; the
            // plan holds the device (and so `fd`) until it is finished.
            let r = unsafe {
                self.ring.push_read(
                    fd,
                    base.add(piece.buf_offset),
                    piece.len as u32,
                    piece.file_offset,
                    token << PIECE_BITS | i as u64,
                )
            };
            if let Err(e) = r {
                // The pieces not queued fail the read; the ones queued
                // still complete (and finish it).
                let mut map = self.pending.lock();
                let ended = end_pieces(&mut map, token, n - i, Some(errno_of(&e)));
                if map.is_empty() {
                    self.idle.notify_all();
                }
                return ended;
            }
        }
        None
    }

    /// Start everything queued, with one system call.
    pub fn submit(&self) -> io::Result<()> {
        self.ring.submit()
    }

    /// Wait until no read is in the ring.
    pub fn wait_idle(&self) {
        let mut map = self.pending.lock();
        while !map.is_empty() {
            self.idle.wait(&mut map);
        }
    }

    /// Wait for the reads in the ring, then tell the reaping thread to end.
    pub fn stop(&self) -> io::Result<()> {
        self.wait_idle();
        self.ring.push_nop(STOP)?;
        self.ring.submit()
    }

    /// The reaping thread: hand every finished read to `finish` until
    /// [`RingReads::stop`]. On a ring error the reads left are handed over
    /// failed, their buffers leaked (the kernel may still write into them),
    /// and the error returned.
    pub fn reap(&self, mut finish: impl FnMut(Pending)) -> io::Result<()> {
        let r = self.reap_until_stopped(&mut finish);
        if r.is_err() {
            let left: Vec<Pending> = self.pending.lock().drain().map(|(_, p)| p).collect();
            for mut p in left {
                p.failed.get_or_insert(libc::EIO);
                std::mem::forget(std::mem::replace(&mut p.data, AlignedBuf::zeroed(0)));
                finish(p);
            }
            self.idle.notify_all();
        }
        r
    }

    fn reap_until_stopped(&self, finish: &mut impl FnMut(Pending)) -> io::Result<()> {
        let mut stop = false;
        let mut finished = Vec::new();
        // Short reads to queue again: (user data, fd, where, length, file offset).
        let mut again: Vec<(u64, i32, *mut u8, u32, u64)> = Vec::new();
        while !stop {
            self.ring.reap(|ud, res| {
                if ud == STOP {
                    stop = true;
                    return;
                }
                let token = ud >> PIECE_BITS;
                let i = (ud & ((1 << PIECE_BITS) - 1)) as usize;
                let mut map = self.pending.lock();
                let Some(p) = map.get_mut(&token) else {
                    tracing::error!("NBD: a completion for no pending read ({ud:#x})");
                    return;
                };
                let piece = p.plan.pieces[i];
                let rest = piece.len - p.done[i];
                let mut failed = None;
                let piece_over = match res {
                    r if r < 0 => {
                        failed = Some(-r);
                        true
                    }
                    // Past the end of the file: reads as zeros, as
                    // `Storage::read_at` does.
                    0 => {
                        let at = piece.buf_offset + p.done[i];
                        p.data[at..at + rest].fill(0);
                        true
                    }
                    r if (r as usize) < rest => {
                        p.done[i] += r as usize;
                        let at = piece.buf_offset + p.done[i];
                        // SAFETY: `at` lies inside the buffer (a piece
                        // lies inside it and `done` < its length).
                        let ptr = unsafe { p.data.as_mut_ptr().add(at) };
                        let len = (piece.len - p.done[i]) as u32;
                        again.push((
                            ud,
                            p.plan.fd,
                            ptr,
                            len,
                            piece.file_offset + p.done[i] as u64,
                        ));
                        false
                    }
                    _ => true,
                };
                if piece_over {
                    finished.extend(end_pieces(&mut map, token, 1, failed));
                }
            })?;
            for (ud, fd, ptr, len, offset) in again.drain(..) {
                // SAFETY: as in `start`: the buffer waits in `pending`
                // until this piece's last completion.
                if let Err(e) = unsafe { self.ring.push_read(fd, ptr, len, offset, ud) } {
                    // The piece fails; its read is answered with the error.
                    let mut map = self.pending.lock();
                    finished.extend(end_pieces(
                        &mut map,
                        ud >> PIECE_BITS,
                        1,
                        Some(errno_of(&e)),
                    ));
                }
            }
            // The short reads queued again start together.
            self.ring.submit()?;
            for p in finished.drain(..) {
                finish(p);
            }
            if self.pending.lock().is_empty() {
                self.idle.notify_all();
            }
        }
        Ok(())
    }
}

/// `count` pieces of read `token` are over (failed with `errno`, if
/// given): the read, once its last piece is, taken out of `pending`.
fn end_pieces(
    pending: &mut HashMap<u64, Pending>,
    token: u64,
    count: usize,
    errno: Option<i32>,
) -> Option<Pending> {
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

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// The reaping thread of a connection, joined on drop (after
/// [`RingReads::stop`]).
pub(crate) struct Reaper(pub Option<JoinHandle<()>>, pub Arc<RingReads>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Err(e) = self.1.stop() {
            tracing::error!("NBD: cannot stop a connection's ring: {e}");
            return;
        }
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}
