//! One virtio-blk request: its descriptor chain taken apart and checked,
//! then carried out against a [`BlockDevice`] straight in guest memory.
//!
//! A chain is device-readable descriptors followed by device-writable ones
//! (virtio 1.2 §2.7.4.2). The readable part starts with the 16-byte
//! header (`type`, `reserved`, `sector`), then the data of a write or the
//! ranges of a discard; the writable part holds the data of a read (or the
//! ID of GET_ID) and ends with the one status byte. Nothing here assumes
//! the header or the status has a descriptor of its own: they are cut
//! out of the byte stream wherever they fall.
//!
//! Every guest address is translated through the memory table the frontend
//! gave us; an address outside it, a readable descriptor after a writable
//! one, a request past the end of the disk or a read whose buffers overlap
//! (two `&mut` views of the same guest bytes) gets `IOERR` in the status
//! byte. A chain without a writable byte has nowhere to put a status: it
//! is returned used with length 0 and logged.

use std::sync::atomic::{AtomicBool, Ordering};

use strata_block::{BlockDevice, ErrorKind, ZeroOptions, SECTOR_BYTES};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Request types (virtio 1.2 §5.2.6).
pub mod kind {
    pub const IN: u32 = 0;
    pub const OUT: u32 = 1;
    pub const FLUSH: u32 = 4;
    pub const GET_ID: u32 = 8;
    pub const DISCARD: u32 = 11;
    pub const WRITE_ZEROES: u32 = 13;
}

/// Status byte values.
pub mod status {
    pub const OK: u8 = 0;
    pub const IOERR: u8 = 1;
    pub const UNSUPP: u8 = 2;
}

/// Bytes of the request header.
pub const HEADER_BYTES: usize = 16;
/// Bytes of the ID GET_ID returns.
pub const ID_BYTES: usize = 20;
/// Bytes of one discard / write-zeroes range.
pub const RANGE_BYTES: usize = 16;
/// `flags` bit of a write-zeroes range: the device may unmap.
pub const RANGE_FLAG_UNMAP: u32 = 1;

/// A guest-memory segment: address and length.
pub type Segment = (GuestAddress, u32);

/// The limits a request is checked against (what the config space says).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_discard_sectors: u32,
    pub max_discard_seg: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_write_zeroes_seg: u32,
    /// The most data one read or write may carry: `seg_max` segments of
    /// `size_max` bytes. More is IOERR: without it a guest could make the
    /// backend allocate a bounce buffer as large as the disk (segments may
    /// overlap, so guest memory does not bound their total).
    pub max_data_bytes: u64,
}

/// A descriptor as the parser needs it.
#[derive(Debug, Clone, Copy)]
pub struct Desc {
    pub addr: GuestAddress,
    pub len: u32,
    pub write_only: bool,
}

/// A chain taken apart: the header's fields, the payload segments and
/// where the status byte goes.
#[derive(Debug)]
pub struct Parsed {
    pub kind: u32,
    pub sector: u64,
    /// Readable bytes after the header (write data, discard ranges).
    pub out: Vec<Segment>,
    /// Writable bytes before the status byte (read data, the ID).
    pub inp: Vec<Segment>,
    pub status_at: GuestAddress,
}

/// Why a chain could not be taken apart.
#[derive(Debug, PartialEq, Eq)]
pub enum Malformed {
    /// No writable byte: nowhere to write the status.
    NoStatus,
    /// Something else; the status byte is at `.0`.
    Bad(GuestAddress, &'static str),
}

/// Take `descs` apart.
pub fn parse(mem: &GuestMemoryMmap, descs: &[Desc]) -> Result<Parsed, Malformed> {
    let first_write = descs
        .iter()
        .position(|d| d.write_only)
        .unwrap_or(descs.len());
    let (readable, writable) = descs.split_at(first_write);
    // The status byte: the last byte of the last device-writable
    // descriptor with any bytes at all. A device-readable one after it
    // is not a candidate (its bytes are the driver's, not ours to write):
    // the chain is refused below, with the status there.
    let Some(last) = writable.iter().rposition(|d| d.write_only && d.len > 0) else {
        return Err(Malformed::NoStatus);
    };
    let sd = writable[last];
    let Some(status_at) = sd
        .addr
        .0
        .checked_add(u64::from(sd.len) - 1)
        .map(GuestAddress)
    else {
        return Err(Malformed::NoStatus);
    };
    if !GuestMemoryBackend::check_range(mem, status_at, 1) {
        return Err(Malformed::NoStatus);
    }
    let bad = |why| Err(Malformed::Bad(status_at, why));
    if writable.iter().any(|d| !d.write_only) {
        return bad("a device-readable descriptor after a device-writable one");
    }
    let mut inp: Vec<Segment> = writable[..last]
        .iter()
        .filter(|d| d.len > 0)
        .map(|d| (d.addr, d.len))
        .collect();
    if sd.len > 1 {
        inp.push((sd.addr, sd.len - 1));
    }
    // The header: the first 16 readable bytes, wherever they fall.
    let mut header = [0u8; HEADER_BYTES];
    let mut got = 0usize;
    let mut out = Vec::new();
    for d in readable.iter().filter(|d| d.len > 0) {
        let mut addr = d.addr;
        let mut len = d.len as usize;
        if got < HEADER_BYTES {
            let take = (HEADER_BYTES - got).min(len);
            if mem.read_slice(&mut header[got..got + take], addr).is_err() {
                return bad("header outside guest memory");
            }
            got += take;
            len -= take;
            addr = GuestAddress(addr.0.wrapping_add(take as u64));
        }
        if len > 0 {
            out.push((addr, len as u32));
        }
    }
    if got < HEADER_BYTES {
        return bad("request header shorter than 16 bytes");
    }
    let kind = u32::from_le_bytes(header[0..4].try_into().unwrap());
    let sector = u64::from_le_bytes(header[8..16].try_into().unwrap());
    Ok(Parsed {
        kind,
        sector,
        out,
        inp,
        status_at,
    })
}

/// Host views of guest segments.
struct Views {
    ptrs: Vec<(*mut u8, usize)>,
}

impl Views {
    /// Translate `segs`; `None` if a byte lies outside guest memory.
    fn of(mem: &GuestMemoryMmap, segs: &[Segment]) -> Option<Views> {
        let mut ptrs = Vec::with_capacity(segs.len());
        for &(addr, len) in segs {
            for s in GuestMemoryBackend::get_slices(mem, addr, len as usize) {
                let s = s.ok()?;
                let g = s.ptr_guard_mut();
                ptrs.push((g.as_ptr(), g.len()));
            }
        }
        Some(Views { ptrs })
    }

    fn total(&self) -> u64 {
        self.ptrs.iter().map(|&(_, l)| l as u64).sum()
    }

    /// Whether two views share a byte.
    fn overlap(&self) -> bool {
        let mut v: Vec<(usize, usize)> = self.ptrs.iter().map(|&(p, l)| (p as usize, l)).collect();
        v.sort_unstable();
        v.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0)
    }

    /// # Safety
    /// The views point into guest memory mapped for as long as the memory
    /// table this request was translated with is held (the caller holds
    /// it). No two views overlap ([`Views::overlap`] was checked), so the
    /// slices do not alias each other; the guest must not touch a buffer
    /// while its request is in flight (the virtio contract), and if it
    /// does it only changes its own data.
    unsafe fn as_mut(&mut self) -> Vec<&mut [u8]> {
        self.ptrs
            .iter()
            .map(|&(p, l)| std::slice::from_raw_parts_mut(p, l))
            .collect()
    }

    /// # Safety
    /// As for [`Views::as_mut`]; shared views may overlap.
    unsafe fn as_ref(&self) -> Vec<&[u8]> {
        self.ptrs
            .iter()
            .map(|&(p, l)| std::slice::from_raw_parts(p as *const u8, l))
            .collect()
    }
}

/// A read, or a write without FUA, whose data is one host-contiguous
/// buffer and that passes every check [`execute`] makes, for a transport
/// that carries it out itself (through an io_uring).
pub struct Single {
    pub ptr: *mut u8,
    pub len: usize,
    /// Where on the disk, in bytes.
    pub offset: u64,
    pub write: bool,
}

/// The request as a [`Single`]; None for any other request, including one
/// `execute` would refuse, and every write while the device is read-only
/// or the guest asked for write-through (each write then waits for the
/// medium).
pub fn single(
    mem: &GuestMemoryMmap,
    dev: &dyn BlockDevice,
    req: &Parsed,
    limits: &Limits,
    writethrough: &AtomicBool,
) -> Option<Single> {
    let write = match req.kind {
        kind::IN => false,
        kind::OUT if !dev.read_only() && !writethrough.load(Ordering::Relaxed) => true,
        _ => return None,
    };
    let v = Views::of(mem, if write { &req.out } else { &req.inp })?;
    let [(ptr, len)] = v.ptrs[..] else {
        return None;
    };
    let offset = data_offset(req.sector, len as u64, dev.size_bytes(), limits)?;
    (len > 0).then_some(Single {
        ptr,
        len,
        offset,
        write,
    })
}

/// Where a read or write of `len` bytes at `sector` starts on a disk of
/// `size` bytes; None if it is refused (IOERR): more data than `limits`
/// allow or than a used length can say, a length not in whole sectors,
/// or a range past the end.
fn data_offset(sector: u64, len: u64, size: u64, limits: &Limits) -> Option<u64> {
    // The used length the driver is told is a u32 (virtio's).
    if len > limits.max_data_bytes || len > u64::from(u32::MAX) {
        return None;
    }
    let off = sector.checked_mul(SECTOR_BYTES)?;
    let in_disk = off.checked_add(len).is_some_and(|e| e <= size);
    (len.is_multiple_of(SECTOR_BYTES) && in_disk).then_some(off)
}

/// What carrying out a request gave: the status and the bytes written
/// into guest memory (for the used ring's `len`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub status: u8,
    pub written: u32,
}

/// The disk a request runs on, as the guest sees it: the device, its
/// limits, whether writes are write-through, and its serial.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub dev: &'a dyn BlockDevice,
    pub limits: &'a Limits,
    pub writethrough: &'a AtomicBool,
    pub id: &'a [u8; ID_BYTES],
}

/// Carry out `req` on `t`, write its status byte, and say how many
/// bytes went into guest memory.
pub fn execute(mem: &GuestMemoryMmap, t: Target, req: &Parsed) -> Done {
    let (st, data) = run(mem, t, req);
    let status = match mem.write_slice(&[st], req.status_at) {
        Ok(()) => st,
        Err(_) => status::IOERR,
    };
    Done {
        status,
        written: data.saturating_add(1),
    }
}

#[expect(clippy::too_many_lines)]
fn run(mem: &GuestMemoryMmap, t: Target, req: &Parsed) -> (u8, u32) {
    let Target {
        dev,
        limits,
        writethrough,
        id,
    } = t;
    let size = dev.size_bytes();
    let err = |e: strata_block::BlockError| {
        tracing::debug!("virtio-blk request failed: {e}");
        status_of(e.kind)
    };
    match req.kind {
        kind::IN | kind::OUT => {
            let write = req.kind == kind::OUT;
            let segs = if write { &req.out } else { &req.inp };
            let Some(mut v) = Views::of(mem, segs) else {
                return (status::IOERR, 0);
            };
            let len = v.total();
            let Some(off) = data_offset(req.sector, len, size, limits) else {
                if len > limits.max_data_bytes || len > u64::from(u32::MAX) {
                    tracing::debug!(
                        "virtio-blk request of {len} bytes refused (at most {})",
                        limits.max_data_bytes
                    );
                }
                return (status::IOERR, 0);
            };
            if len == 0 {
                return (status::OK, 0);
            }
            if write {
                if dev.read_only() {
                    return (status::IOERR, 0);
                }
                // SAFETY: see Views::as_ref; the memory table is held by the caller.
                let bufs = unsafe { v.as_ref() };
                match dev.writev_at(&bufs, off, writethrough.load(Ordering::Relaxed)) {
                    Ok(()) => (status::OK, 0),
                    Err(e) => (err(e), 0),
                }
            } else {
                if v.overlap() {
                    return (status::IOERR, 0);
                }
                // SAFETY: see Views::as_mut; overlap was ruled out above.
                let mut bufs = unsafe { v.as_mut() };
                match dev.readv_at(&mut bufs, off) {
                    Ok(_) => (status::OK, len as u32),
                    Err(e) => (err(e), 0),
                }
            }
        }
        kind::FLUSH => match dev.flush() {
            Ok(()) => (status::OK, 0),
            Err(e) => (err(e), 0),
        },
        kind::GET_ID => {
            let mut left = ID_BYTES;
            let mut at = 0usize;
            for &(addr, len) in &req.inp {
                if left == 0 {
                    break;
                }
                let n = (len as usize).min(left);
                if mem.write_slice(&id[at..at + n], addr).is_err() {
                    return (status::IOERR, 0);
                }
                at += n;
                left -= n;
            }
            (status::OK, at as u32)
        }
        kind::DISCARD | kind::WRITE_ZEROES => {
            let zeroes = req.kind == kind::WRITE_ZEROES;
            if dev.read_only() {
                return (status::IOERR, 0);
            }
            let total: u64 = req.out.iter().map(|&(_, l)| u64::from(l)).sum();
            let (max_seg, max_sectors) = if zeroes {
                (limits.max_write_zeroes_seg, limits.max_write_zeroes_sectors)
            } else {
                (limits.max_discard_seg, limits.max_discard_sectors)
            };
            if total == 0
                || !total.is_multiple_of(RANGE_BYTES as u64)
                || total / RANGE_BYTES as u64 > u64::from(max_seg)
            {
                return (status::IOERR, 0);
            }
            let mut raw = vec![0u8; total as usize];
            let mut at = 0usize;
            for &(addr, len) in &req.out {
                if mem
                    .read_slice(&mut raw[at..at + len as usize], addr)
                    .is_err()
                {
                    return (status::IOERR, 0);
                }
                at += len as usize;
            }
            // Check every range before acting on any.
            let mut ranges = Vec::with_capacity(raw.len() / RANGE_BYTES);
            for r in raw.chunks_exact(RANGE_BYTES) {
                let sector = u64::from_le_bytes(r[0..8].try_into().unwrap());
                let n = u32::from_le_bytes(r[8..12].try_into().unwrap());
                let flags = u32::from_le_bytes(r[12..16].try_into().unwrap());
                if flags & !RANGE_FLAG_UNMAP != 0 || (!zeroes && flags != 0) {
                    return (status::UNSUPP, 0);
                }
                let in_disk = sector
                    .checked_add(u64::from(n))
                    .and_then(|e| e.checked_mul(SECTOR_BYTES))
                    .is_some_and(|e| e <= size);
                if n > max_sectors || !in_disk {
                    return (status::IOERR, 0);
                }
                ranges.push((sector * SECTOR_BYTES, u64::from(n) * SECTOR_BYTES, flags));
            }
            let fua = writethrough.load(Ordering::Relaxed);
            for (off, len, flags) in ranges {
                if len == 0 {
                    continue;
                }
                let r = if zeroes {
                    let opts = ZeroOptions {
                        may_unmap: flags & RANGE_FLAG_UNMAP != 0,
                        fast_only: false,
                        fua,
                    };
                    dev.write_zeroes(off, len, opts)
                } else {
                    dev.unmap(off, len)
                };
                if let Err(e) = r {
                    return (err(e), 0);
                }
            }
            (status::OK, 0)
        }
        _ => (status::UNSUPP, 0),
    }
}

/// The status byte of a failed request (docs/ERRORS.md): virtio-blk has
/// only `IOERR` and `UNSUPP`, so every kind but `Unsupported` is `IOERR`.
fn status_of(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Unsupported => status::UNSUPP,
        ErrorKind::NotFound
        | ErrorKind::AlreadyExists
        | ErrorKind::InvalidArgument
        | ErrorKind::OutOfRange
        | ErrorKind::NoSpace
        | ErrorKind::ReadOnly
        | ErrorKind::Locked
        | ErrorKind::Refused
        | ErrorKind::Corrupt
        | ErrorKind::Io
        | ErrorKind::Unavailable
        | ErrorKind::Fenced
        | ErrorKind::Released
        | ErrorKind::Gone => status::IOERR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x10_0000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(BASE), 0x10000)]).unwrap()
    }

    fn d(off: u64, len: u32, write_only: bool) -> Desc {
        Desc {
            addr: GuestAddress(BASE + off),
            len,
            write_only,
        }
    }

    fn header(mem: &GuestMemoryMmap, kind: u32) {
        let mut h = [0u8; HEADER_BYTES];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        mem.write_slice(&h, GuestAddress(BASE)).unwrap();
    }

    // Regression (found by the vhost_chain fuzz target): a device-readable
    // descriptor last in the chain was taken for the status descriptor,
    // so the status and a read's data went into the driver's read-only
    // buffer and the used length counted bytes the chain did not offer.
    #[test]
    fn a_readable_descriptor_last_is_refused_with_the_status_in_the_last_writable_byte() {
        let m = mem();
        header(&m, kind::IN);
        let chain = [d(0, 16, false), d(0x1000, 513, true), d(0x3000, 1, false)];
        assert_eq!(
            parse(&m, &chain).unwrap_err(),
            Malformed::Bad(
                GuestAddress(BASE + 0x1000 + 512),
                "a device-readable descriptor after a device-writable one"
            )
        );
        // The same with the readable descriptor outside memory: refused
        // too, not returned without a status.
        let outside = Desc {
            addr: GuestAddress(BASE + 0x20000),
            len: 1,
            write_only: false,
        };
        let chain = [d(0, 16, false), d(0x1000, 513, true), outside];
        assert!(
            matches!(parse(&m, &chain), Err(Malformed::Bad(a, _)) if a.0 == BASE + 0x1000 + 512)
        );
    }

    #[test]
    fn a_read_never_goes_into_a_readable_buffer() {
        let m = mem();
        header(&m, kind::IN);
        m.write_slice(&[0xaa; 513], GuestAddress(BASE + 0x3000))
            .unwrap();
        // Only an empty writable descriptor: no status byte at all.
        let chain = [d(0, 16, false), d(0x1000, 0, true), d(0x3000, 513, false)];
        assert_eq!(parse(&m, &chain).unwrap_err(), Malformed::NoStatus);
    }
}
