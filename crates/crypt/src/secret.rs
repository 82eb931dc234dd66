//! [`SecretBytes`]: key material kept out of swap and core dumps.

use std::fmt;
use std::ptr::NonNull;

use zeroize::Zeroize;

use crate::{CryptError, Result};

/// A fixed-length secret in a private anonymous mapping of its own.
///
/// The mapping (the length rounded up to whole pages, at least one) is
/// locked into memory with `mlock` when the process may (a failure is
/// remembered, see [`SecretBytes::is_locked`], not reported), excluded from
/// core dumps (`MADV_DONTDUMP`) and wiped in a forked child
/// (`MADV_WIPEONFORK`). Dropping it zeroes the whole mapping, unlocks and
/// unmaps it. `Debug` never shows the contents.
pub struct SecretBytes {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
    locked: bool,
}

// SAFETY: the mapping is owned by this value alone (nothing else holds its
// address) and is reached only through `&self` / `&mut self`, so the usual
// borrow rules make sharing and sending it as safe as a `Box<[u8]>`.
unsafe impl Send for SecretBytes {}
// SAFETY: as above; `&SecretBytes` only gives out `&[u8]`.
unsafe impl Sync for SecretBytes {}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl SecretBytes {
    /// `len` zero bytes in a fresh locked mapping.
    pub fn zeroed(len: usize) -> Result<SecretBytes> {
        let page = page_size();
        let map_len = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or_else(|| CryptError::Invalid(format!("secret of {len} bytes is too large")))?;
        // SAFETY: a new private anonymous mapping; no existing memory is
        // touched and the result is checked before use.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(CryptError::Io(format!(
                "cannot map {map_len} bytes for a secret: {e}"
            )));
        }
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| CryptError::Io("mmap returned a null mapping".into()))?;
        // SAFETY: [raw, raw + map_len) is the mapping just made; these calls
        // only change its attributes. Their failures are harmless: an
        // unlocked secret may be swapped out, which `is_locked` reports.
        let locked = unsafe {
            libc::madvise(raw, map_len, libc::MADV_DONTDUMP);
            libc::madvise(raw, map_len, libc::MADV_WIPEONFORK);
            libc::mlock(raw, map_len) == 0
        };
        Ok(SecretBytes {
            ptr,
            len,
            map_len,
            locked,
        })
    }

    /// `len` bytes from the system's cryptographic random generator.
    pub fn random(len: usize) -> Result<SecretBytes> {
        let mut s = SecretBytes::zeroed(len)?;
        aws_lc_rs::rand::fill(s.expose_mut())
            .map_err(|_| CryptError::Io("the random generator failed".into()))?;
        Ok(s)
    }

    /// A copy of `bytes` (the caller remains responsible for its own copy).
    pub fn from_slice(bytes: &[u8]) -> Result<SecretBytes> {
        let mut s = SecretBytes::zeroed(bytes.len())?;
        s.expose_mut().copy_from_slice(bytes);
        Ok(s)
    }

    /// Another secret with the same bytes.
    pub fn try_clone(&self) -> Result<SecretBytes> {
        SecretBytes::from_slice(self.expose())
    }

    /// The secret's bytes.
    pub fn expose(&self) -> &[u8] {
        // SAFETY: ptr is valid for map_len >= len bytes, initialised (the
        // mapping starts zeroed) and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The secret's bytes, writable.
    pub fn expose_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `expose`; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The secret's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the secret has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `mlock` succeeded (when it did not, for instance under a low
    /// `RLIMIT_MEMLOCK`, the pages may reach swap).
    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        // SAFETY: the whole mapping is ours and initialised; after zeroing it
        // is unlocked and unmapped exactly once, and never used again.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.map_len).zeroize();
            let raw = self.ptr.as_ptr().cast::<libc::c_void>();
            if self.locked {
                libc::munlock(raw, self.map_len);
            }
            libc::munmap(raw, self.map_len);
        }
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes(<{} bytes, redacted>)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_and_debug() {
        let s = SecretBytes::from_slice(b"hunter2").unwrap();
        assert_eq!(s.expose(), b"hunter2");
        assert_eq!(s.len(), 7);
        assert_eq!(format!("{s:?}"), "SecretBytes(<7 bytes, redacted>)");
        assert!(!format!("{s:?}").contains("hunter2"));
        let c = s.try_clone().unwrap();
        assert_eq!(c.expose(), b"hunter2");

        let r1 = SecretBytes::random(64).unwrap();
        let r2 = SecretBytes::random(64).unwrap();
        assert_eq!(r1.len(), 64);
        assert_ne!(r1.expose(), r2.expose());
        assert_ne!(r1.expose(), &[0u8; 64][..]);

        let e = SecretBytes::zeroed(0).unwrap();
        assert!(e.is_empty());
        assert_eq!(e.expose(), b"");

        let mut big = SecretBytes::zeroed(3 * 4096 + 1).unwrap();
        big.expose_mut()[3 * 4096] = 7;
        assert_eq!(big.expose()[3 * 4096], 7);
        assert!(SecretBytes::zeroed(usize::MAX).is_err());
    }

    #[test]
    fn send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<SecretBytes>();
    }
}
