//! The block-device interface between strata's drivers and its transports.
//!
//! A driver (the native engine, later the VMDK drivers) implements
//! [`BlockDevice`]; a transport (NBD, later vhost-user-blk and FUSE) serves any
//! `Arc<dyn BlockDevice>` without knowing what is behind it.
//!
//! Contract every implementation keeps:
//! - offsets and lengths are in bytes and must be multiples of
//!   [`SECTOR_BYTES`]; a request past the end of the device is refused with
//!   [`ErrorKind::OutOfRange`], never truncated silently;
//! - methods take `&self` and may be called from many threads at once;
//! - a write that returned `Ok` is visible to every later read on every
//!   handle of the same device; it is durable after a later `flush` returns
//!   `Ok`, or at once when `fua` was set;
//! - a read says how it filled the buffer ([`ReadFill`]): which runs are
//!   data and which are known to read as zeros because nothing is stored
//!   there. A transport builds its reply from that answer (NBD sends hole
//!   chunks) instead of asking [`BlockDevice::block_status`] again, so one
//!   client request is one pass over the device's map and one recorded
//!   command. `Data` is always a correct answer; `Zeros` is a promise.
//!
//! Requests come as one buffer ([`BlockDevice::read_at`],
//! [`BlockDevice::write_at`]) or as a list of segments in order
//! ([`BlockDevice::readv_at`], [`BlockDevice::writev_at`]: a virtio request
//! is a list of guest-memory segments). A device that can do better than
//! the default (one bounce buffer per multi-segment request) overrides the
//! vectored calls. [`AlignedBuf`] is a page-aligned buffer for transports
//! that own their I/O buffers, so a device may hand them to direct I/O.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

mod aio;
mod aligned;
pub mod bytes;
pub mod error;
pub mod eventfd;
mod fill;
pub mod peer;
pub mod plan;
pub mod ring;
pub mod ring_io;
mod ring_req;
pub mod sched;
pub mod throttle;

pub use aligned::AlignedBuf;
pub use error::{Error, Kind, Place};
pub use fill::{Fill, FillRuns, ReadFill};
pub use plan::{hold_read, AfterRead, FilePiece, Held, IoHold, IoPlan, Planned};

/// The addressing unit of every request.
pub const SECTOR_BYTES: u64 = 512;

/// The names transports and drivers used before there was one error
/// (docs/ERRORS.md); the same type.
pub type BlockError = Error;
pub type ErrorKind = Kind;
pub type BlockResult<T> = std::result::Result<T, Error>;

/// How a range is stored, as block-status queries report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len_bytes: u64,
    /// No storage is allocated for the range (a hole).
    pub hole: bool,
    /// The range is known to read as zeros.
    pub zero: bool,
}

/// Options for [`BlockDevice::write_zeroes`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroOptions {
    /// The device may deallocate the range instead of writing zeros.
    pub may_unmap: bool,
    /// Fail with [`ErrorKind::Unsupported`] rather than zero slowly.
    pub fast_only: bool,
    /// Make the result durable before returning.
    pub fua: bool,
}

/// A virtual block device.
pub trait BlockDevice: Send + Sync {
    /// Current size in bytes; may grow while the device is served.
    fn size_bytes(&self) -> u64;

    /// Whether writes are refused.
    fn read_only(&self) -> bool;

    /// Read `buf.len()` bytes at `offset_bytes` and say how the buffer was
    /// filled: runs in order covering all of `buf`
    /// (`fill.len_bytes() == buf.len()`). The buffer is filled either way;
    /// a [`Fill::Zeros`] run holds zeros and is unallocated on the device.
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> BlockResult<ReadFill>;

    /// Write `buf` at `offset_bytes`; durable before returning when `fua`.
    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> BlockResult<()>;

    /// Read into `bufs`, one after the other, from `offset_bytes`: the same
    /// as one [`read_at`](Self::read_at) of their concatenation (one
    /// command, one [`ReadFill`] over the whole length). Segments may have
    /// any length; their total follows the sector rule.
    ///
    /// The default reads a single segment in place and gathers several
    /// through one bounce buffer.
    fn readv_at(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> BlockResult<ReadFill> {
        if let [buf] = bufs {
            return self.read_at(buf, offset_bytes);
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut bounce = AlignedBuf::zeroed(total);
        let fill = self.read_at(&mut bounce, offset_bytes)?;
        let mut at = 0;
        for b in bufs.iter_mut() {
            b.copy_from_slice(&bounce[at..at + b.len()]);
            at += b.len();
        }
        Ok(fill)
    }

    /// Write `bufs`, one after the other, from `offset_bytes`: the same as
    /// one [`write_at`](Self::write_at) of their concatenation.
    ///
    /// The default writes a single segment in place and gathers several
    /// into one bounce buffer.
    fn writev_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> BlockResult<()> {
        if let [buf] = bufs {
            return self.write_at(buf, offset_bytes, fua);
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut bounce = AlignedBuf::zeroed(total);
        let mut at = 0;
        for b in bufs {
            bounce[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        self.write_at(&bounce, offset_bytes, fua)
    }

    /// Make every write that returned before this call durable.
    fn flush(&self) -> BlockResult<()>;

    /// The client no longer needs the range; it reads as zeros afterwards.
    fn unmap(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<()>;

    /// Make the range read as zeros.
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, opts: ZeroOptions)
        -> BlockResult<()>;

    /// Describe how `[offset, offset+len)` is stored. Returns at least one
    /// extent; the extents are contiguous from `offset_bytes` and may end
    /// before `offset_bytes + len_bytes`, never after it.
    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<Vec<Extent>>;

    /// The smallest request size that avoids read-modify-write.
    fn preferred_block_bytes(&self) -> u32 {
        4096
    }

    /// A hint that `[offset, offset+len)` will be read soon: start bringing
    /// it in without waiting for it (read-ahead, NBD `CMD_CACHE`). Never
    /// fails and never changes what a read returns; a range past the end
    /// is cut. The default does nothing.
    fn prefetch(&self, _offset_bytes: u64, _len_bytes: u64) {}

    /// Plan a read of `buf.len()` bytes at `offset_bytes` for the caller
    /// to carry out ([`IoPlan`]): the same answer `read_at` would give,
    /// but the data of its pieces is left for the caller to read from the
    /// plan's file (the rest of `buf` is filled). `None`: this device
    /// reads only by itself (the default; a device plans only when its
    /// data lies in one file the caller may read: an engine disk's pool,
    /// through its direct descriptor or the page cache). With `wait` false the
    /// device answers [`Planned::Busy`] rather than wait for a lock, since
    /// the caller may itself hold it through reads in flight; with `wait`
    /// true the caller holds no plan.
    fn plan_read(
        &self,
        _buf: &mut [u8],
        _offset_bytes: u64,
        _wait: bool,
    ) -> Option<BlockResult<Planned>> {
        None
    }

    /// Plan a write of `buf` at `offset_bytes` without FUA for the caller
    /// to carry out ([`IoPlan`] with `write` set): where in the plan's
    /// file (opened with `O_DIRECT`) each run of `buf` goes, the device
    /// held so that those places stay this range's until the plan is
    /// finished. The caller writes every piece, then finishes the plan
    /// (`ok` false if a piece failed) and answers the client with what
    /// `finish` returns (a finish step, such as the engine's install of
    /// the grains the write allocated, may fail it); the write is durable
    /// at the next `flush`. `None`: this device does not plan this write
    /// (the default; the engine plans aligned writes into a direct pool),
    /// and the caller calls `write_at`. `wait` as for
    /// [`BlockDevice::plan_read`].
    fn plan_write(
        &self,
        _buf: &[u8],
        _offset_bytes: u64,
        _wait: bool,
    ) -> Option<BlockResult<Planned>> {
        None
    }
}

/// [`BlockDevice::plan_write`] of `buf` with `write`, else
/// [`BlockDevice::plan_read`] into it: for a transport that plans either
/// kind of request the same way.
pub fn plan_io(
    dev: &dyn BlockDevice,
    write: bool,
    buf: &mut [u8],
    offset_bytes: u64,
    wait: bool,
) -> Option<BlockResult<Planned>> {
    if write {
        dev.plan_write(buf, offset_bytes, wait)
    } else {
        dev.plan_read(buf, offset_bytes, wait)
    }
}

/// Check alignment and range of a request against a device size.
pub fn check_range(offset_bytes: u64, len_bytes: u64, size_bytes: u64) -> BlockResult<()> {
    if !offset_bytes.is_multiple_of(SECTOR_BYTES) || !len_bytes.is_multiple_of(SECTOR_BYTES) {
        return Err(BlockError::new(
            ErrorKind::InvalidArgument,
            format!("offset {offset_bytes} and length {len_bytes} must be multiples of 512"),
        ));
    }
    check_extent(offset_bytes, len_bytes, size_bytes)
}

/// Check only the range of a request against a device size, at any
/// alignment (a byte-granular view's requests: [`bytes`]).
pub fn check_extent(offset_bytes: u64, len_bytes: u64, size_bytes: u64) -> BlockResult<()> {
    let end = offset_bytes
        .checked_add(len_bytes)
        .ok_or_else(|| BlockError::new(ErrorKind::OutOfRange, "offset + length overflows"))?;
    if end > size_bytes {
        return Err(BlockError::new(
            ErrorKind::OutOfRange,
            format!("request [{offset_bytes}, {end}) ends past the device size {size_bytes}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes `i` hold `i % 251`; the second half is a hole.
    struct Pattern;

    impl BlockDevice for Pattern {
        fn size_bytes(&self) -> u64 {
            8192
        }
        fn read_only(&self) -> bool {
            false
        }
        fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> BlockResult<ReadFill> {
            check_range(offset_bytes, buf.len() as u64, 8192)?;
            let mut fill = ReadFill::new();
            for (i, b) in buf.iter_mut().enumerate() {
                let at = offset_bytes + i as u64;
                let data = at < 4096;
                *b = if data { (at % 251) as u8 } else { 0 };
                fill.push(1, if data { Fill::Data } else { Fill::Zeros });
            }
            Ok(fill)
        }
        fn write_at(&self, buf: &[u8], offset_bytes: u64, _fua: bool) -> BlockResult<()> {
            check_range(offset_bytes, buf.len() as u64, 8192)?;
            for (i, b) in buf.iter().enumerate() {
                assert_eq!(*b, ((offset_bytes + i as u64) % 251) as u8, "byte {i}");
            }
            Ok(())
        }
        fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
        fn unmap(&self, _: u64, _: u64) -> BlockResult<()> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64, _: ZeroOptions) -> BlockResult<()> {
            Ok(())
        }
        fn block_status(&self, _: u64, len_bytes: u64) -> BlockResult<Vec<Extent>> {
            Ok(vec![Extent {
                len_bytes,
                hole: false,
                zero: false,
            }])
        }
    }

    #[test]
    fn vectored_defaults_equal_one_request_over_the_concatenation() {
        // Odd segment lengths: only the total follows the sector rule.
        let mut a = vec![0xffu8; 100];
        let mut b = vec![0xffu8; 3996];
        let mut c = vec![0xffu8; 1024];
        let fill = Pattern
            .readv_at(&mut [&mut a, &mut b, &mut c], 3072)
            .unwrap();
        let mut whole = vec![0u8; 5120];
        assert_eq!(fill, Pattern.read_at(&mut whole, 3072).unwrap());
        assert_eq!(
            fill.runs().collect::<Vec<_>>(),
            vec![(0..1024, Fill::Data), (1024..5120, Fill::Zeros)]
        );
        assert_eq!([a, b, c].concat(), whole);
        let data: Vec<u8> = (0..1536u64).map(|i| ((512 + i) % 251) as u8).collect();
        let (x, y) = data.split_at(7);
        Pattern.writev_at(&[x, y], 512, false).unwrap();
        assert_eq!(
            Pattern
                .readv_at(&mut [&mut [0u8; 100][..]], 0)
                .unwrap_err()
                .kind,
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn check_range_refuses_misaligned_and_past_end() {
        assert!(check_range(0, 512, 1024).is_ok());
        assert_eq!(
            check_range(1, 512, 1024).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            check_range(0, 100, 1024).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            check_range(512, 1024, 1024).unwrap_err().kind,
            ErrorKind::OutOfRange
        );
        assert_eq!(
            check_range(u64::MAX - 511, 1024, u64::MAX)
                .unwrap_err()
                .kind,
            ErrorKind::OutOfRange
        );
    }
}
