//! Reads through packed entries (docs/FORMAT.md §18.4): the fragment
//! holding a virtual grain is decompressed and the part asked for
//! copied. A request's runs are one grain each; the last fragment
//! decompressed is kept for the next grain of the same request, so a
//! sequential read decompresses each fragment (a pair or quad holds two
//! or four grains) once.
//!
//! A planned read (the NBD and vhost-user rings) reads the stream grains
//! and raw runs a request needs into the plan's own buffer, and its
//! `after_read` step decompresses and copies them into the request's
//! buffer on the ring's reaping thread: no hand-off to a worker thread,
//! which cost more than the decompression (PERFORMANCE.md, issue 64).

use strata_block::{AlignedBuf, FilePiece, Fill, IoHold, IoPlan, ReadFill};
use strata_format::{GRAIN_BYTES, GRAIN_SHIFT};

use super::{packed_place, DiskHandle, Run};
use crate::compress::{unpack_bytes, Unpacked};
use crate::error::{Error, ErrorKind, Result};

const GRAIN: usize = GRAIN_BYTES as usize;

impl DiskHandle {
    /// Fill `dst` with virtual grain `v`'s bytes from byte `within` of it
    /// on, through packed stream grain `grain`. `memo` keeps the fragment
    /// last decompressed for the request.
    pub(super) fn read_packed(
        &self,
        dst: &mut [u8],
        (grain, v, within): (u64, u64, usize),
        encrypted: bool,
        memo: &mut Unpacked,
    ) -> Result<()> {
        if encrypted {
            return Err(self.packed_on_encrypted((v << GRAIN_SHIFT) + within as u64));
        }
        if memo.bytes(grain, v).is_none() {
            *memo = self.inner.unpack(grain, v)?;
        }
        let bytes = memo.bytes(grain, v).expect("just unpacked");
        debug_assert!(within + dst.len() <= GRAIN);
        dst.copy_from_slice(&bytes[within..within + dst.len()]);
        Ok(())
    }

    /// A packed entry met at byte `at` of an encrypted disk: the pass
    /// leaves encrypted disks raw (§18.8), so it is damage, never a reason
    /// to return other bytes.
    pub(super) fn packed_on_encrypted(&self, at: u64) -> Error {
        Error::new(
            ErrorKind::Corrupt,
            format!(
                "'{}' at byte {at}: a packed entry on an encrypted disk (a damaged map entry)",
                self.name
            ),
        )
    }
}

/// What the `after_read` step of a planned read over packed grains puts
/// into the request's buffer at `to`, from the plan's buffer at `from`.
enum Step {
    /// A raw run's bytes, as they are.
    Copy {
        from: usize,
        to: std::ops::Range<usize>,
    },
    /// Part of virtual grain `v` (from byte `within`) from stream grain
    /// `grain`, whose bytes are at `from`, followed by the next grain's
    /// when `spills`.
    Unpack {
        from: usize,
        spills: bool,
        place: (u64, u64, usize),
        to: std::ops::Range<usize>,
    },
}

/// The plan of a read at `offset` whose runs (`DiskHandle::mapped_runs`
/// of a plain disk) include packed ones: holes filled in `buf` now; raw
/// runs and stream grains (two where a fragment spills) read from `fd`
/// into the plan's buffer, each stream grain once however many virtual
/// grains of the request it holds; `after_read` decompresses. `gate` is
/// held until the plan is finished, so no grain read is freed meanwhile.
pub(super) fn plan(
    fd: std::os::fd::RawFd,
    buf: &mut [u8],
    offset: u64,
    runs: &[Run],
    gate: Box<dyn IoHold>,
) -> IoPlan {
    let mut fill = ReadFill::new();
    let mut pieces = Pieces::default();
    let mut steps = Vec::with_capacity(runs.len());
    // Stream grains already placed: (grain, bytes read from it, where).
    let mut placed: Vec<(u64, usize, usize)> = Vec::new();
    for r in runs {
        let n = r.buf.len();
        let Some(at) = r.pool else {
            buf[r.buf.clone()].fill(0);
            fill.push(n as u64, Fill::Zeros);
            continue;
        };
        fill.push(n as u64, Fill::Data);
        if !r.packed {
            let from = pieces.take(at, n);
            steps.push(Step::Copy {
                from,
                to: r.buf.clone(),
            });
            continue;
        }
        let place = packed_place(r, offset);
        let want = if r.spills { 2 * GRAIN } else { GRAIN };
        let from = match placed
            .iter()
            .find(|&&(g, len, _)| g == place.0 && len >= want)
        {
            Some(&(_, _, from)) => from,
            None => {
                let from = pieces.take(at, want);
                placed.push((place.0, want, from));
                from
            }
        };
        steps.push(Step::Unpack {
            from,
            spills: r.spills,
            place,
            to: r.buf.clone(),
        });
    }
    // The pieces cover it whole.
    let source = AlignedBuf::recycled(pieces.end);
    IoPlan {
        fd,
        write: false,
        pieces: pieces.list,
        fill,
        holds: vec![gate],
        source: Some(source),
        after_read: Some(unpacking(steps)),
    }
}

/// A planned read's pieces as they fill the plan's buffer.
#[derive(Default)]
struct Pieces {
    list: Vec<FilePiece>,
    /// Bytes of the buffer taken.
    end: usize,
}

impl Pieces {
    /// `len` bytes of the pool from `at` read into the buffer next (one
    /// piece with the last when they follow it in both); where they land.
    fn take(&mut self, at: u64, len: usize) -> usize {
        let from = self.end;
        self.end += len;
        match self.list.last_mut() {
            Some(p) if p.file_offset + p.len as u64 == at && p.buf_offset + p.len == from => {
                p.len += len;
            }
            _ => self.list.push(FilePiece {
                buf_offset: from,
                file_offset: at,
                len,
            }),
        }
        from
    }
}

/// The `after_read` step that carries out `steps`.
fn unpacking(steps: Vec<Step>) -> strata_block::AfterRead {
    Box::new(move |out: &mut [u8], src: &[u8]| {
        // The fragment last decompressed, in the thread's buffer; from
        // this request only (once the plan is finished the grains read
        // may be freed and used again).
        let mut memo = PLAIN.take().cleared();
        let r = unpack_steps(&steps, out, src, &mut memo);
        PLAIN.set(memo);
        r
    })
}

thread_local! {
    /// Each ring thread's buffers for the fragment a planned read
    /// decompresses (an allocation per read cost as much as LZ4).
    static PLAIN: std::cell::Cell<Unpacked> = std::cell::Cell::new(Unpacked::default());
}

/// A planned read's `after_read`: `steps` carried out from the plan's
/// buffer `src` into the request's `out`.
fn unpack_steps(steps: &[Step], out: &mut [u8], src: &[u8], memo: &mut Unpacked) -> Result<()> {
    for s in steps {
        match *s {
            Step::Copy { from, ref to } => {
                out[to.clone()].copy_from_slice(&src[from..from + to.len()]);
            }
            Step::Unpack {
                from,
                spills,
                place: (grain, v, within),
                ref to,
            } => {
                if memo.bytes(grain, v).is_none() {
                    let next = spills.then(|| &src[from + GRAIN..from + 2 * GRAIN]);
                    let b = (&src[from..from + GRAIN], next);
                    // A whole grain asked for: decompressed straight into
                    // the request when its fragment holds it alone.
                    let whole = (to.len() == GRAIN).then(|| &mut out[to.clone()]);
                    if unpack_bytes(memo, grain, b, v, whole)? {
                        continue;
                    }
                }
                let bytes = memo.bytes(grain, v).expect("just unpacked");
                out[to.clone()].copy_from_slice(&bytes[within..within + to.len()]);
            }
        }
    }
    Ok(())
}
