//! A heap buffer aligned for direct I/O.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A byte buffer whose storage starts on a [`AlignedBuf::ALIGN`] boundary
/// and spans whole multiples of it, so a device may pass it to `O_DIRECT`
/// I/O. It dereferences to `[u8]`; every byte is initialised (zeros when
/// allocated).
///
/// Transports keep a few and reuse them ([`AlignedBuf::set_len`]) instead
/// of allocating one per request.
pub struct AlignedBuf {
    /// Start of `capacity` allocated bytes; dangling when `capacity == 0`.
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes allocated: 0, or a multiple of `ALIGN` at least `len`.
    capacity: usize,
    /// From [`AlignedBuf::recycled`]: dropped, the storage goes back to
    /// the shared pool rather than to the system.
    pooled: bool,
}

/// Storage given back by recycled buffers: (address, capacity), at most
/// [`RECYCLE_KEEP`] of at most [`RECYCLE_MAX`] bytes each.
static RECYCLED: parking_lot::Mutex<Vec<(usize, usize)>> = parking_lot::Mutex::new(Vec::new());
/// Most buffers the pool keeps.
const RECYCLE_KEEP: usize = 64;
/// Largest buffer the pool keeps.
const RECYCLE_MAX: usize = 4 << 20;

// SAFETY: the buffer owns its allocation outright, like a `Box<[u8]>`;
// shared references only read it.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` gives out only `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Alignment of the storage, and the unit it is allocated in.
    pub const ALIGN: usize = 4096;

    /// Buffers of this size and more are mapped from the kernel, whose
    /// pages are zero until first written and take no memory before:
    /// the allocator's aligned path would write every byte to zero it, so
    /// a client that announces a 32 MiB WRITE and sends nothing would
    /// cost 32 MiB at once. Mapped, a buffer costs what was received.
    pub const MAPPED_MIN: usize = 1 << 20;

    /// A buffer of `len` zero bytes.
    ///
    /// # Panics
    /// If `len` rounded up to [`ALIGN`](Self::ALIGN) overflows `isize`.
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: NonNull::dangling(),
                len: 0,
                capacity: 0,
                pooled: false,
            };
        }
        let layout = Self::layout(len);
        let raw = if layout.size() >= Self::MAPPED_MIN {
            // SAFETY: a fresh private anonymous mapping of a non-zero size;
            // nothing else refers to it.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    layout.size(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                alloc::handle_alloc_error(layout)
            }
            p.cast::<u8>()
        } else {
            // SAFETY: the layout's size is at least `len`, so not zero.
            unsafe { alloc::alloc_zeroed(layout) }
        };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Self {
            ptr,
            len,
            capacity: layout.size(),
            pooled: false,
        }
    }

    /// A buffer of `len` bytes whose contents are unspecified (what an
    /// earlier recycled buffer held, or zeros), taken from a pool shared by
    /// the process and given back to it when dropped: for a buffer per
    /// request that outlives the request's thread (a planned write's
    /// ciphertext), where a fresh mapping and its page faults per request
    /// cost more than filling it. The caller overwrites every byte.
    pub fn recycled(len: usize) -> Self {
        let found = {
            let mut pool = RECYCLED.lock();
            let at = pool.iter().position(|&(_, cap)| cap >= len);
            at.map(|i| pool.swap_remove(i))
        };
        match found {
            Some((addr, capacity)) if len > 0 => Self {
                // The address came from a buffer's non-null storage.
                ptr: NonNull::new(addr as *mut u8).expect("a recycled buffer's storage"),
                len,
                capacity,
                pooled: true,
            },
            other => {
                if let Some(x) = other {
                    RECYCLED.lock().push(x);
                }
                let mut b = Self::zeroed(len);
                b.pooled = true;
                b
            }
        }
    }

    fn layout(len: usize) -> Layout {
        let size = len
            .checked_next_multiple_of(Self::ALIGN)
            .expect("aligned buffer size overflows");
        Layout::from_size_align(size, Self::ALIGN).expect("aligned buffer size overflows")
    }

    /// Bytes the buffer can hold without reallocating.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Make the buffer `len` bytes long, keeping the storage when it is
    /// large enough. The contents are whatever the storage held (earlier
    /// data or zeros), not cleared: callers overwrite them.
    pub fn set_len(&mut self, len: usize) {
        if len <= self.capacity {
            self.len = len;
        } else {
            *self = Self::zeroed(len);
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `capacity >= len` initialised bytes
        // (zeroed at allocation, only written through `&mut [u8]` since),
        // or dangling but non-null with `len == 0`. `&self` keeps it alive.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.pooled && self.capacity > 0 && self.capacity <= RECYCLE_MAX {
            let mut pool = RECYCLED.lock();
            if pool.len() < RECYCLE_KEEP {
                pool.push((self.ptr.as_ptr() as usize, self.capacity));
                return;
            }
        }
        if self.capacity >= Self::MAPPED_MIN {
            // SAFETY: mapped in `zeroed` with this very size and not
            // unmapped before.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.capacity) };
        } else if self.capacity > 0 {
            // SAFETY: allocated in `zeroed` with this very layout (same
            // size and alignment) and not freed before.
            unsafe {
                alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.capacity, Self::ALIGN),
                )
            };
        }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_is_aligned_zeroed_and_reused_when_large_enough() {
        let mut b = AlignedBuf::zeroed(5000);
        assert_eq!(b.len(), 5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_ptr() as usize % AlignedBuf::ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        b.fill(7);
        let at = b.as_ptr();
        b.set_len(8192);
        assert_eq!(b.as_ptr(), at, "kept the storage");
        assert_eq!(b[4999], 7);
        b.set_len(1 << 20);
        assert_eq!(b.len(), 1 << 20);
        assert_eq!(b.as_ptr() as usize % AlignedBuf::ALIGN, 0);
        let empty = AlignedBuf::zeroed(0);
        assert!(empty.is_empty());
        assert_eq!(empty.capacity(), 0);
    }

    #[test]
    fn a_recycled_buffer_takes_back_storage_given_back() {
        let a = AlignedBuf::recycled(3 << 20);
        let at = a.as_ptr();
        assert_eq!(a.len(), 3 << 20);
        drop(a);
        // Another thread may take it first (tests run in parallel): then a
        // new one comes, aligned and long enough all the same.
        let b = AlignedBuf::recycled(2 << 20);
        assert_eq!(b.len(), 2 << 20);
        assert!(b.capacity() >= 2 << 20);
        assert_eq!(b.as_ptr() as usize % AlignedBuf::ALIGN, 0);
        let _ = at;
        let big = AlignedBuf::recycled(8 << 20);
        assert_eq!(big.len(), 8 << 20);
        drop(big); // past RECYCLE_MAX: unmapped, not kept
        assert!(RECYCLED.lock().iter().all(|&(_, c)| c <= RECYCLE_MAX));
    }

    /// Pages of `b` that are in memory (mincore).
    fn resident_pages(b: &AlignedBuf) -> usize {
        let pages = b.capacity() / 4096;
        let mut v = vec![0u8; pages];
        // SAFETY: the range is the buffer's own page-aligned mapping.
        let r = unsafe { libc::mincore(b.as_ptr() as *mut _, b.capacity(), v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v.iter().filter(|&&p| p & 1 == 1).count()
    }

    #[test]
    fn a_large_buffer_takes_memory_only_where_written() {
        let mut b = AlignedBuf::zeroed(32 << 20);
        assert_eq!(resident_pages(&b), 0, "zeroing touched the pages");
        assert!(b[..1 << 20].iter().all(|&x| x == 0));
        b[..1 << 20].fill(9);
        assert_eq!(resident_pages(&b), 256);
        assert_eq!(b[(1 << 20) - 1], 9);
        assert_eq!(b[(32 << 20) - 1], 0);
    }
}
