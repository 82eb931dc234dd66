//! Reads planned by a device and carried out by the transport: the
//! device says where the data lies in one file opened for direct I/O, the
//! transport reads it there (through an io_uring, [`crate::ring`]) and
//! tells the device when the data is in. ARCHITECTURE.md, "Direct I/O
//! through io_uring".

use std::os::fd::RawFd;
use std::sync::Arc;

use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::{RawRwLock, RwLock};

use crate::ReadFill;

/// The read side of `lock`, for a plan to hold until its read is over.
/// Waited for only with `wait` (the caller holds no plan); otherwise None
/// when a writer holds the lock or waits for it: a caller whose own plans
/// hold it must not wait for a writer that waits for them
/// (ARCHITECTURE.md, "Direct I/O through io_uring"). parking_lot's writer
/// sets its bit as it starts waiting, so from then on this fails, and the
/// writer waits only for the plans already out.
pub fn hold_read<T>(lock: &Arc<RwLock<T>>, wait: bool) -> Option<ArcRwLockReadGuard<RawRwLock, T>> {
    if wait {
        Some(lock.read_arc())
    } else {
        lock.try_read_arc()
    }
}

/// Something a planned read holds until its data is in: the engine's I/O
/// gate (so the grains it reads are not reused meanwhile), a switchable
/// export's read side, a statistics command to finish. Dropped, or given
/// [`ReadHold::done`], on any thread.
pub trait ReadHold: Send {
    /// The read is over; `ok` says whether every piece of it was read.
    fn done(self: Box<Self>, ok: bool) {
        let _ = ok;
    }
}

/// A plain guard as a hold (released when the read is over).
pub struct Held<T: Send>(pub T);

impl<T: Send> ReadHold for Held<T> {}

/// One run of the request's buffer that comes from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilePiece {
    /// Where the run starts in the request's buffer.
    pub buf_offset: usize,
    /// Where it starts in the file.
    pub file_offset: u64,
    pub len: usize,
}

/// A read as a device planned it ([`crate::BlockDevice::plan_read`]).
pub struct ReadPlan {
    /// The file to read from, opened with `O_DIRECT`: buffers, offsets
    /// and lengths of the pieces are multiples of 4096 bytes.
    pub fd: RawFd,
    /// The runs to read from `fd`, in order. The runs of the buffer that
    /// no piece covers were filled (with zeros) by the plan.
    pub pieces: Vec<FilePiece>,
    /// How the whole buffer is filled, as `read_at` would report it.
    pub fill: ReadFill,
    /// What the read holds until the pieces are in; released in order.
    pub holds: Vec<Box<dyn ReadHold>>,
}

impl ReadPlan {
    /// The read is over: release what it holds, innermost first.
    pub fn finish(&mut self, ok: bool) {
        for h in self.holds.drain(..) {
            h.done(ok);
        }
    }
}

impl Drop for ReadPlan {
    fn drop(&mut self) {
        // A plan dropped without `finish` (a connection torn down) still
        // releases what it holds; a command not finished counts as failed.
        self.finish(false);
    }
}

/// What [`crate::BlockDevice::plan_read`] gives.
pub enum Planned {
    /// The read, to be carried out by the caller.
    Plan(ReadPlan),
    /// Planning now would have to wait for a lock (a commit, snapshot or
    /// device switch is waiting for the reads in flight): the caller asked
    /// not to wait, so it should let its own reads in flight finish first.
    Busy,
}
