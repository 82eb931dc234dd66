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
//!   `Ok`, or at once when `fua` was set.

use std::fmt;

/// The addressing unit of every request.
pub const SECTOR_BYTES: u64 = 512;

/// What went wrong, in a form a transport can map to its own error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Misaligned offset or length, or an argument that makes no sense.
    InvalidArgument,
    /// The request reaches past the end of the device.
    OutOfRange,
    /// The datastore has no space left for the allocation a write needs.
    NoSpace,
    /// The device is read-only (a snapshot export, a read-only open).
    ReadOnly,
    /// The operation is not supported by this device (e.g. fast zero).
    NotSupported,
    /// Stored metadata failed a check; the device refuses to guess.
    Corrupt,
    /// The underlying storage failed.
    Io,
    /// The device was closed or deleted while the request was in flight.
    Gone,
}

/// An error with a kind for callers to match on and context for people.
#[derive(Debug, Clone)]
pub struct BlockError {
    pub kind: ErrorKind,
    pub context: String,
}

impl BlockError {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Self {
        Self {
            kind,
            context: context.into(),
        }
    }

    /// The Linux errno a transport should report for this error.
    pub fn errno(&self) -> i32 {
        match self.kind {
            ErrorKind::InvalidArgument => 22, // EINVAL
            ErrorKind::OutOfRange => 22,      // EINVAL (NBD spec: out of range is EINVAL)
            ErrorKind::NoSpace => 28,         // ENOSPC
            ErrorKind::ReadOnly => 1,         // EPERM
            ErrorKind::NotSupported => 95,    // ENOTSUP
            ErrorKind::Corrupt => 5,          // EIO
            ErrorKind::Io => 5,               // EIO
            ErrorKind::Gone => 108,           // ESHUTDOWN
        }
    }
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::OutOfRange => "out of range",
            ErrorKind::NoSpace => "no space left in datastore",
            ErrorKind::ReadOnly => "device is read-only",
            ErrorKind::NotSupported => "not supported",
            ErrorKind::Corrupt => "metadata corrupt",
            ErrorKind::Io => "I/O error",
            ErrorKind::Gone => "device is gone",
        };
        if self.context.is_empty() {
            write!(f, "{what}")
        } else {
            write!(f, "{what}: {}", self.context)
        }
    }
}

impl std::error::Error for BlockError {}

pub type BlockResult<T> = Result<T, BlockError>;

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
    /// Fail with [`ErrorKind::NotSupported`] rather than zero slowly.
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

    /// Read `buf.len()` bytes at `offset_bytes`.
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> BlockResult<()>;

    /// Write `buf` at `offset_bytes`; durable before returning when `fua`.
    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> BlockResult<()>;

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
}

/// Check alignment and range of a request against a device size.
pub fn check_range(offset_bytes: u64, len_bytes: u64, size_bytes: u64) -> BlockResult<()> {
    if !offset_bytes.is_multiple_of(SECTOR_BYTES) || !len_bytes.is_multiple_of(SECTOR_BYTES) {
        return Err(BlockError::new(
            ErrorKind::InvalidArgument,
            format!("offset {offset_bytes} and length {len_bytes} must be multiples of 512"),
        ));
    }
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
