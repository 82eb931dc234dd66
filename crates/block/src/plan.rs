//! Reads and writes planned by a device and carried out by the
//! transport: the device says where the data lies in one file (opened for
//! direct I/O, or a read's page-cache descriptor), the transport reads or
//! writes it there (through an io_uring, [`crate::ring`]) and tells the
//! device when it is done. ARCHITECTURE.md, "Direct I/O through io_uring".

use std::os::fd::RawFd;
use std::sync::Arc;

use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::{RawRwLock, RwLock};

use crate::{AlignedBuf, ReadFill};

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

/// Something a planned read or write holds until its pieces are done: the
/// engine's I/O gate (so the grains it reads or writes are not reused
/// meanwhile) and a write's stripes, a switchable export's read side, a
/// statistics command to finish, a written grain to install. Dropped, or
/// given [`IoHold::done`] or [`IoHold::lost`], on any thread.
pub trait IoHold: Send {
    /// The I/O is over; `ok` says whether every piece of it was done (and
    /// every hold before this one kept it so). Returns whether the request
    /// succeeded: a hold with a finishing step of its own (installing the
    /// grains a write allocated) fails the request when that step fails.
    fn done(self: Box<Self>, ok: bool) -> bool {
        ok
    }
    /// The I/O's fate is unknown: its ring failed with pieces maybe still
    /// under the kernel, which may write them later. As a failure, unless
    /// a hold must not give back what those pieces may still reach.
    fn lost(self: Box<Self>) {
        let _ = self.done(false);
    }
}

/// What a lost plan holds: a failure for whoever finishes it.
struct Lost;

impl IoHold for Lost {
    fn done(self: Box<Self>, _ok: bool) -> bool {
        false
    }

    fn lost(self: Box<Self>) {}
}

/// A plain guard as a hold (released when the I/O is over).
pub struct Held<T: Send>(pub T);

impl<T: Send> IoHold for Held<T> {}

/// One run of the request's buffer that comes from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilePiece {
    /// Where the run starts in the request's buffer.
    pub buf_offset: usize,
    /// Where it starts in the file.
    pub file_offset: u64,
    pub len: usize,
}

/// A read or write as a device planned it
/// ([`crate::BlockDevice::plan_read`], [`crate::BlockDevice::plan_write`]).
pub struct IoPlan {
    /// The file to read from or write to. Opened with `O_DIRECT` (then
    /// buffers, offsets and lengths of the pieces are multiples of 4096
    /// bytes), or, for reads only, a descriptor through the page cache.
    pub fd: RawFd,
    /// Whether the pieces are written to `fd` (from the request's
    /// buffer) rather than read from it.
    pub write: bool,
    /// The runs to read from `fd`, in order. The runs of the buffer that
    /// no piece covers were filled (with zeros) by the plan; a write's
    /// pieces cover its whole buffer.
    pub pieces: Vec<FilePiece>,
    /// How the whole buffer is filled, as `read_at` would report it
    /// (a write's: all data).
    pub fill: ReadFill,
    /// What the I/O holds until its pieces are done; released in order.
    pub holds: Vec<Box<dyn IoHold>>,
    /// The plan's own buffer for the pieces, when the request's is not
    /// where they go: a write's bytes that are not the request's own (an
    /// encrypted disk's ciphertext, FORMAT.md §16.1), or where a read's
    /// pieces land for `after_read` to turn into the answer (packed
    /// grains' stored bytes, §18.4). The pieces' `buf_offset`s are into
    /// this buffer, which the plan keeps until it is dropped; a write
    /// does not read the request's buffer then.
    pub source: Option<AlignedBuf>,
    /// What a read's buffer needs once every piece is in, before it is
    /// answered (an encrypted disk decrypts it in place; a packed disk
    /// decompresses `source` into it): given the whole request buffer
    /// and `source`'s bytes (empty without one); skipped when a piece
    /// failed. An error fails the request (the bytes read were damaged:
    /// never answered as data).
    pub after_read: Option<AfterRead>,
}

/// [`IoPlan::after_read`]: the request's buffer, the plan's `source`.
pub type AfterRead = Box<dyn FnOnce(&mut [u8], &[u8]) -> crate::BlockResult<()> + Send>;

impl IoPlan {
    /// The I/O is over: release what it holds, innermost first. Returns
    /// whether the request succeeded (`ok`, unless a hold's finishing step
    /// failed it); answer the client with that.
    pub fn finish(&mut self, ok: bool) -> bool {
        self.holds.drain(..).fold(ok, |ok, h| h.done(ok))
    }

    /// The I/O's fate is unknown (its ring failed with it in flight):
    /// release what it holds as [`IoHold::lost`]. A later `finish` finds
    /// nothing left and says failed.
    pub fn lose(&mut self) {
        for h in self.holds.drain(..) {
            h.lost();
        }
        self.holds.push(Box::new(Lost));
    }
}

impl Drop for IoPlan {
    fn drop(&mut self) {
        // A plan dropped without `finish` (a connection torn down) still
        // releases what it holds; a command not finished counts as failed.
        let _ = self.finish(false);
    }
}

/// What [`crate::BlockDevice::plan_read`] and `plan_write` give.
pub enum Planned {
    /// The read or write, to be carried out by the caller.
    Plan(IoPlan),
    /// Planning now would have to wait for a lock (a commit, snapshot or
    /// device switch is waiting for the I/O in flight, or another writer
    /// holds the range): the caller asked not to wait, so it should let
    /// its own I/O in flight finish first.
    Busy,
}
