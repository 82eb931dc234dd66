//! Copying ranges from one device to another, for moves and full clones:
//! counted for progress, paced to a rate, paused and cancelled through a
//! job's control, and under a slot's range locks while clients write.

use std::sync::Arc;
use std::time::Instant;

use strata_block::{BlockDevice, ZeroOptions};
use strata_datastore::ChangedRange as Changed;
use strata_engine::{Error, ErrorKind, WorkControl};

/// Copy unit (a range lock's span, so a chunk takes one lock).
pub(crate) const CHUNK: u64 = crate::slot::LOCK_BYTES;
/// While clients do I/O, rest this many times each chunk's copy time: the
/// copy then takes at most a third of the time it competes for.
const BUSY_REST: u32 = 2;

pub(crate) fn io(what: &str, e: strata_block::BlockError) -> Error {
    Error::new(ErrorKind::Io, format!("{what}: {e}"))
}

/// How [`Copier::copy`] copies.
#[derive(Clone, Copy)]
pub(crate) enum Pass<'s> {
    /// Paced to the rate, paused and cancelled through the job's control:
    /// no client writes the target.
    Paced,
    /// Paced too, each chunk under its range lock of the slot whose
    /// clients write the source (and, mirrored, the target): their writes
    /// are ordered before or after the chunk, never between its read and
    /// its write.
    Locked(&'s crate::slot::Slot),
    /// At the switch, client I/O held: neither paced nor locked.
    Held,
}

/// What long work reports to: a job's control (pause and cancel; None
/// outside a job) and its progress callback (done, total).
pub struct Work<'a> {
    pub control: Option<Arc<WorkControl>>,
    pub progress: &'a mut dyn FnMut(u64, u64),
}

impl Work<'_> {
    /// Waits while the job is paused; `Err` once it is cancelled.
    pub fn checkpoint(&self) -> Result<(), Error> {
        match &self.control {
            Some(c) => c.checkpoint(),
            None => Ok(()),
        }
    }

    /// `e`, or when it is how the job was stopped, what the stop leaves
    /// (`WorkControl::stopped_leaving`).
    pub fn stopped_leaving(&self, e: Error, left: &str) -> Error {
        match &self.control {
            Some(c) => c.stopped_leaving(e, left),
            None => e,
        }
    }
}

/// What a stopped or failed export of an image leaves: nothing.
pub(crate) const EXPORT_REMOVED: &str = "the partial export was removed; export again";

/// Copies ranges from one device to another, counting and pacing.
pub(crate) struct Copier<'a> {
    pub(crate) control: Option<Arc<WorkControl>>,
    rate: Option<u64>,
    started: Instant,
    pub(crate) copied: u64,
    /// Progress: bytes done of the total known so far.
    done: u64,
    pub(crate) total: u64,
    progress: &'a mut dyn FnMut(u64, u64),
    buf: Vec<u8>,
    /// The client request count last seen (resting while it moves).
    pub(crate) seen: u64,
}

impl<'a> Copier<'a> {
    /// A copier obeying `control`'s pause and cancel.
    pub(crate) fn new(
        control: Option<Arc<WorkControl>>,
        rate: Option<u64>,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> Self {
        Copier {
            control,
            rate,
            started: Instant::now(),
            copied: 0,
            done: 0,
            total: 0,
            progress,
            buf: vec![0u8; CHUNK as usize],
            seen: 0,
        }
    }

    pub(crate) fn checkpoint(&self) -> Result<(), Error> {
        match &self.control {
            Some(c) => c.checkpoint(),
            None => Ok(()),
        }
    }

    fn pace(&self) {
        if let Some(rate) = self.rate.filter(|r| *r > 0) {
            let due = std::time::Duration::from_secs_f64(self.copied as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }

    /// Make `dst` read like `src` over `ranges`, as `pass` says (paced
    /// and pausable, under a slot's range locks, or neither at the
    /// switch).
    pub(crate) fn copy(
        &mut self,
        src: &dyn BlockDevice,
        dst: &dyn BlockDevice,
        ranges: &[Changed],
        pass: Pass<'_>,
    ) -> Result<(), Error> {
        let (paced, slot) = match pass {
            Pass::Paced => (true, None),
            Pass::Locked(s) => (true, Some(s)),
            Pass::Held => (false, None),
        };
        let size = dst.size_bytes().min(src.size_bytes());
        for r in ranges {
            let end = (r.offset + r.len).min(size);
            let mut off = r.offset;
            while off < end {
                if paced {
                    self.checkpoint()?;
                    self.pace();
                }
                let t = Instant::now();
                let n = (CHUNK - off % CHUNK).min(end - off);
                let _ranges = slot.map(|s| s.lock_range(off, n));
                // Zeros unmap into every kind of disk: a thick one keeps
                // its reservation (an eager-zeroed one writes zeros into
                // its own grains), while zeros written through the write
                // path (no unmap) would cost the copy a WRITE of every
                // empty range and map it.
                let zero = ZeroOptions {
                    may_unmap: true,
                    ..Default::default()
                };
                if !r.mapped {
                    dst.write_zeroes(off, n, zero)
                        .map_err(|e| io("write the target", e))?;
                } else {
                    let b = &mut self.buf[..n as usize];
                    src.read_at(b, off).map_err(|e| io("read the source", e))?;
                    if b.iter().all(|&x| x == 0) {
                        dst.write_zeroes(off, n, zero)
                    } else {
                        dst.write_at(b, off, false)
                    }
                    .map_err(|e| io("write the target", e))?;
                    self.copied += n;
                }
                off += n;
                self.done += n;
                (self.progress)(self.done, self.total.max(self.done));
                if let (true, Some(s)) = (paced, slot) {
                    let seen = std::mem::replace(&mut self.seen, s.requests());
                    if seen != self.seen {
                        std::thread::sleep(t.elapsed() * BUSY_REST);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The unit `put_grains` tests for zeros: one grain.
const GRAIN_BYTES: u64 = 4096;

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// Write `buf` (at disk offset `off`) grain by grain, skipping zero grains
/// (`zero_mask`: zero grains must mask what is below, so zero them).
pub(crate) fn put_grains(
    h: &dyn BlockDevice,
    buf: &[u8],
    off: u64,
    zero_mask: bool,
) -> Result<(), Error> {
    let mut p = 0usize;
    while p < buf.len() {
        let n = (GRAIN_BYTES as usize).min(buf.len() - p);
        let piece = &buf[p..p + n];
        if !is_zero(piece) {
            h.write_at(piece, off + p as u64, false)?;
        } else if zero_mask {
            h.write_zeroes(
                off + p as u64,
                n as u64,
                ZeroOptions {
                    may_unmap: true,
                    fast_only: false,
                    fua: false,
                },
            )?;
        }
        p += n;
    }
    Ok(())
}
