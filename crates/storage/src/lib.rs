//! The storage layer under strata's engine.
//!
//! The engine never touches files directly: it asks a [`Backend`] for named
//! objects and does all I/O through the [`Storage`] trait. Two backends:
//!
//! - [`FileBackend`]: files in a directory (pread/pwrite/fdatasync/fallocate).
//! - [`SimBackend`]: in memory, keeping for every object a *durable* image
//!   and the writes issued since the last `sync`. [`SimBackend::crash`] loses,
//!   keeps or tears each of those writes at random (seeded), as a power cut
//!   would, and makes every handle opened before it fail from then on.
//!
//! The trait is deliberately narrow (read, write, sync, length, punch) so
//! that other stores (object storage, io_uring) can sit under it later.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

use std::io;
use std::sync::Arc;

/// Unit of tearing in the simulator: a torn write keeps or loses whole sectors.
pub const SECTOR_BYTES: usize = 512;

/// One storage object (a file).
pub trait Storage: Send + Sync {
    /// Read exactly `buf.len()` bytes at `offset`; bytes past the end read as zeros.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`, growing the object if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Make every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Deallocate a range; it reads as zeros afterwards. May be a no-op that
    /// writes zeros instead.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Truncate or extend (with zeros) to exactly `len` bytes; durable at
    /// the next `sync`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Hold `[offset, offset + len)` on the underlying store, so that later
    /// writes there cannot fail for want of space (`fallocate`). With
    /// `keep_size` the object's length does not change; without it, it
    /// grows to cover the range. What the range reads is unchanged (zeros
    /// past the old end). Stores without space to hold (like the simulator)
    /// only adjust the length.
    fn allocate(&self, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
        if !keep_size && offset + len > self.len()? {
            self.set_len(offset + len)?;
        }
        Ok(())
    }
    /// The descriptor every read goes through, when this handle reads and
    /// writes with `O_DIRECT` only (`Backend::open_direct`): a caller may
    /// read from it itself (through an io_uring), with 4096-aligned
    /// buffers, offsets and lengths. `None` otherwise (the default).
    fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// The descriptor a caller may read from itself (through an
    /// io_uring), and whether it is [`Storage::direct_fd`] (whose reads
    /// must be 4096-aligned) or reads through the host page cache.
    /// `None` where reads cannot bypass this handle (the default).
    fn read_fd(&self) -> Option<(std::os::fd::RawFd, bool)> {
        self.direct_fd().map(|fd| (fd, true))
    }
    /// Write zeros over `[offset, offset + len)`, for real: afterwards the
    /// range is allocated and written on the host, with no extent left for
    /// the file system to convert on a first write. Files use `O_DIRECT`
    /// where they can, so the host page cache is not flooded. Offsets and
    /// lengths are multiples of 4096.
    fn write_zeros(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(ZEROS.0.len() as u64) as usize;
            self.write_at(&ZEROS.0[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
    /// A hint that `[offset, offset + len)` will be read soon: files start
    /// reading it in the background (`posix_fadvise(WILLNEED)`), so many
    /// scattered reads proceed at once; handles opened for direct I/O
    /// ignore it (they bypass the page cache it fills), as do other stores.
    fn will_need(&self, _offset: u64, _len: u64) {}
    /// Whether `[offset, offset + len)` is known to be a hole (nothing
    /// allocated on the underlying store), so punching it would change
    /// nothing. Files ask the file system (`SEEK_DATA`); stores that cannot
    /// tell say false.
    fn is_hole(&self, _offset: u64, _len: u64) -> io::Result<bool> {
        Ok(false)
    }
    /// Bytes the object occupies on the underlying store: allocated
    /// blocks, holes left out. Stores that cannot tell (the simulator)
    /// report the length.
    fn allocated_bytes(&self) -> io::Result<u64> {
        self.len()
    }
    /// Whether the object is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Take an advisory lock on the object, held until this handle
    /// (its last clone) is dropped. Fails with [`io::ErrorKind::WouldBlock`]
    /// when another holder's lock conflicts (shared locks coexist; an
    /// exclusive one excludes every other). Files take OFD locks (see
    /// [`FileBackend`]); stores without locks, like the simulator, and file
    /// systems without OFD locks succeed without doing anything.
    fn try_lock(&self, mode: LockMode) -> io::Result<()> {
        let _ = mode;
        Ok(())
    }
}

/// Alignment of buffers, offsets and lengths for `O_DIRECT` I/O: a page,
/// which covers every logical block size a host disk has (512 or 4096).
pub const DIRECT_ALIGN: usize = 4096;

/// A megabyte of zeros, aligned for `O_DIRECT`.
#[repr(C, align(4096))]
struct AlignedZeros([u8; 1 << 20]);
static ZEROS: AlignedZeros = AlignedZeros([0; 1 << 20]);

/// The kind of advisory lock [`Storage::try_lock`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// A read lock: any number of holders, no exclusive one.
    Shared,
    /// A write lock: the only holder. The object must be open for writing.
    Exclusive,
}

/// A namespace of storage objects (a directory).
pub trait Backend: Send + Sync {
    /// Open `name`, creating it empty when `create` is set.
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn Storage>>;
    /// Open an existing `name` for reading only; writes through the handle
    /// fail. Backends without permissions open it normally.
    fn open_read_only(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        self.open(name, false)
    }
    /// Open an existing `name` whose reads and writes should bypass any
    /// cache the backend keeps on the host (`--cache none`: the engine's
    /// own caches are the only ones). Files use `O_DIRECT`, buffers of any
    /// alignment accepted (see [`FileBackend`]); backends without such a
    /// cache open it normally.
    fn open_direct(&self, name: &str, read_only: bool) -> io::Result<Arc<dyn Storage>> {
        if read_only {
            self.open_read_only(name)
        } else {
            self.open(name, false)
        }
    }
    /// Whether `name` exists.
    fn exists(&self, name: &str) -> bool;
    /// Remove `name` if it exists.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Replace `to` with `from` atomically; the change is durable when this
    /// returns. Handles opened on either name before it are not valid after.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Where the objects live, for messages and for the lock and sockets.
    fn describe(&self) -> String;
    /// Bytes the underlying file system could still give (None if unknown).
    fn free_bytes(&self) -> Option<u64>;
}

mod file;
mod sim;

pub use file::{statvfs, statvfs_free, FileBackend};
pub use sim::{CrashReport, SimBackend, SimFile};

#[cfg(test)]
mod tests;
