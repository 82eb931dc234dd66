//! The request both kinds of ring queue, apart from either so that each
//! can use it.

use std::os::fd::RawFd;

/// One read or write to queue on a ring (either kind, io_uring or native
/// AIO): `len` bytes of the file `fd` at `offset`, read into `ptr` or,
/// with `write`, written from it. Its completion carries `user_data`.
#[derive(Clone, Copy, Debug)]
pub struct Io {
    /// A write of `ptr[..len]` (else a read into it).
    pub write: bool,
    /// The file.
    pub fd: RawFd,
    /// The memory read into or written from.
    pub ptr: *mut u8,
    /// Bytes to transfer.
    pub len: u32,
    /// Where in the file.
    pub offset: u64,
    /// What its completion carries.
    pub user_data: u64,
}
