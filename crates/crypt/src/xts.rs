//! AES-256-XTS over 512-byte sectors (`aes-xts-plain64`).
//!
//! Two engines give the same bytes: on cores with VAES and AVX-512,
//! strata's own (`vaes`), which takes any number of sectors per call and
//! makes their tweaks in registers; elsewhere aws-lc's, one sector per
//! call. [`Xts::engine`] says which one a key uses; `xts_speed` (example)
//! measures both.
//!
//! aws-lc's XTS context processes one data unit per key/IV setting, so each
//! sector re-sets only the IV (`EVP_CipherInit_ex` with no cipher and no
//! key), which keeps the expanded keys and costs a 16-byte copy.
//!
//! Contexts: allocating a context and expanding the two AES keys costs
//! 100 to 250 ns, against about 700 ns for encrypting 4 KiB (measured on a
//! VAES/AVX-512 core: 4.1 to 5.5 GB/s with a context per call, 5.7 to 6.1
//! GB/s reusing contexts; see `ctx_strategies_speed` in the tests). So each
//! aws-lc engine keeps a small pool of initialised contexts per direction,
//! about one per thread that has used it at the same time (at most
//! [`MAX_IDLE`] are kept). A call takes one from the pool under a mutex
//! held only for a `Vec` pop, and puts it back after. Unlike a
//! thread-local cache, the pool belongs to the `Xts`: dropping the `Xts`
//! frees every context at once (`EVP_CIPHER_CTX_free` wipes the key
//! schedule), so no expanded key outlives its `Xts` in some idle thread's
//! cache. aws-lc's expanded keys live in its ordinary heap allocations
//! (not locked memory); the raw key is kept in a [`SecretBytes`] to set up
//! more contexts. The `vaes` engine keeps its schedules in a
//! [`SecretBytes`].

use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Mutex;

use aws_lc_sys as ffi;

use crate::{CryptError, Result, SecretBytes, DEK_BYTES, SECTOR_BYTES};

#[cfg(target_arch = "x86_64")]
mod vaes;

/// Most idle contexts kept per direction; more are freed when returned.
const MAX_IDLE: usize = 64;

/// One aws-lc cipher context set up with an XTS key for one direction.
struct Ctx {
    raw: NonNull<ffi::EVP_CIPHER_CTX>,
    encrypt: bool,
}

// SAFETY: an EVP_CIPHER_CTX has no thread affinity; a `Ctx` is owned by one
// thread at a time (moved in and out of the pool), never shared.
unsafe impl Send for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the pointer came from EVP_CIPHER_CTX_new and is freed once;
        // the free cleanses the key schedule.
        unsafe { ffi::EVP_CIPHER_CTX_free(self.raw.as_ptr()) }
    }
}

impl Ctx {
    /// A context with `key` (64 bytes) expanded for encryption or decryption.
    fn new(key: &[u8], encrypt: bool) -> Option<Ctx> {
        assert_eq!(key.len(), DEK_BYTES, "XTS key length checked by Xts::new");
        // SAFETY: allocates a fresh context; null is checked.
        let raw = NonNull::new(unsafe { ffi::EVP_CIPHER_CTX_new() })?;
        let ctx = Ctx { raw, encrypt };
        // SAFETY: ctx is a valid context; the key pointer is valid for the
        // cipher's 64-byte key length; no IV is set yet (null).
        let ok = unsafe {
            ffi::EVP_CipherInit_ex(
                ctx.raw.as_ptr(),
                ffi::EVP_aes_256_xts(),
                ptr::null_mut(),
                key.as_ptr(),
                ptr::null(),
                c_int::from(encrypt),
            )
        };
        if ok != 1 {
            // SAFETY: clears this thread's aws-lc error queue.
            unsafe { ffi::ERR_clear_error() };
            return None;
        }
        Some(ctx)
    }

    /// Encrypts or decrypts `len / 512` sectors from `src` to `dst`, sector
    /// `i` with tweak `first_sector + i`.
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `len` bytes,
    /// and the two ranges must be either identical or disjoint.
    unsafe fn run(&mut self, src: *const u8, dst: *mut u8, len: usize, first_sector: u64) {
        let step = SECTOR_BYTES as c_int;
        let mut iv = [0u8; 16];
        for i in 0..len / SECTOR_BYTES {
            let sector = first_sector.wrapping_add(i as u64);
            iv[..8].copy_from_slice(&sector.to_le_bytes());
            let at = i * SECTOR_BYTES;
            let mut out_len: c_int = 0;
            // SAFETY: the context is initialised with a key; iv is 16 bytes;
            // src/dst + at are within the caller's ranges for 512 bytes.
            let ok = unsafe {
                let c = self.raw.as_ptr();
                let set = ffi::EVP_CipherInit_ex(
                    c,
                    ptr::null(),
                    ptr::null_mut(),
                    ptr::null(),
                    iv.as_ptr(),
                    -1,
                );
                let run = if self.encrypt {
                    ffi::EVP_EncryptUpdate(c, dst.add(at), &mut out_len, src.add(at), step)
                } else {
                    ffi::EVP_DecryptUpdate(c, dst.add(at), &mut out_len, src.add(at), step)
                };
                set == 1 && run == 1
            };
            // aws-lc fails here only on misuse of the context (a bug).
            assert!(
                ok && out_len == step,
                "aws-lc XTS failed on sector {sector}"
            );
        }
    }
}

/// Initialised contexts for one direction, ready for reuse.
struct Pool {
    encrypt: bool,
    idle: Mutex<Vec<Ctx>>,
}

impl Pool {
    fn new(encrypt: bool) -> Pool {
        Pool {
            encrypt,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn take(&self, key: &SecretBytes) -> Ctx {
        let popped = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        // Xts::new proved that this key initialises a context, so a failure
        // now can only be an allocation failure.
        popped.unwrap_or_else(|| {
            Ctx::new(key.expose(), self.encrypt).expect("aws-lc could not allocate an XTS context")
        })
    }

    fn give(&self, ctx: Ctx) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(ctx);
        }
    }
}

/// AES-256-XTS with a 64-byte key; Send + Sync; cheap to share via Arc.
///
/// Buffers are whole 512-byte sectors; sector `i` of a buffer uses the
/// tweak `first_sector + i` (a 64-bit little-endian IV, as dm-crypt's
/// `plain64`). Passing a buffer whose length is not a multiple of
/// [`SECTOR_BYTES`] is a programming error and panics.
pub struct Xts {
    key: SecretBytes,
    enc: Pool,
    dec: Pool,
    #[cfg(target_arch = "x86_64")]
    vaes: Option<vaes::Keys>,
}

/// Which implementation runs a key's sectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XtsEngine {
    /// strata's own, many sectors per call (VAES + AVX-512 cores).
    Vaes,
    /// aws-lc's, one sector per call.
    AwsLc,
}

impl XtsEngine {
    /// The fastest engine this CPU runs.
    pub fn best() -> XtsEngine {
        #[cfg(target_arch = "x86_64")]
        if vaes::available() {
            return XtsEngine::Vaes;
        }
        XtsEngine::AwsLc
    }

    /// Its name in reports: `vaes` or `aws-lc`.
    pub fn name(self) -> &'static str {
        match self {
            XtsEngine::Vaes => "vaes",
            XtsEngine::AwsLc => "aws-lc",
        }
    }
}

impl Xts {
    /// Invalid if `key` is not 64 bytes or its two halves are equal (XTS
    /// requires distinct keys).
    pub fn new(key: &SecretBytes) -> Result<Xts> {
        Xts::with_engine(key, XtsEngine::best())
    }

    /// As [`Xts::new`] with a chosen engine (for measurements and tests).
    /// Invalid if this CPU cannot run it.
    pub fn with_engine(key: &SecretBytes, engine: XtsEngine) -> Result<Xts> {
        if engine != XtsEngine::AwsLc && XtsEngine::best() != engine {
            return Err(CryptError::Invalid(format!(
                "this CPU cannot run the {} XTS engine",
                engine.name()
            )));
        }
        let k = key.expose();
        if k.len() != DEK_BYTES {
            return Err(CryptError::Invalid(format!(
                "an XTS key is {DEK_BYTES} bytes, not {}",
                k.len()
            )));
        }
        let (a, b) = k.split_at(DEK_BYTES / 2);
        if a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0 {
            return Err(CryptError::Invalid(
                "the two halves of an XTS key must differ".into(),
            ));
        }
        let xts = Xts {
            key: key.try_clone()?,
            enc: Pool::new(true),
            dec: Pool::new(false),
            #[cfg(target_arch = "x86_64")]
            vaes: match engine {
                XtsEngine::Vaes => Some(vaes::Keys::new(key)?),
                XtsEngine::AwsLc => None,
            },
        };
        // The aws-lc engine's first context, which also proves the key;
        // the vaes engine makes none, so no expanded copy of its key
        // lands in aws-lc's ordinary heap.
        if xts.engine() == XtsEngine::AwsLc {
            let first = Ctx::new(xts.key.expose(), true)
                .ok_or_else(|| CryptError::Io("aws-lc refused the XTS key".into()))?;
            xts.enc.give(first);
        }
        Ok(xts)
    }

    /// The engine this key runs on.
    pub fn engine(&self) -> XtsEngine {
        #[cfg(target_arch = "x86_64")]
        if self.vaes.is_some() {
            return XtsEngine::Vaes;
        }
        XtsEngine::AwsLc
    }

    /// Encrypt in place: buf.len() a multiple of 512; sector i of buf uses
    /// tweak first_sector + i.
    pub fn encrypt(&self, buf: &mut [u8], first_sector: u64) {
        check_len(buf.len());
        let p = buf.as_mut_ptr();
        // SAFETY: source and destination are the same valid range.
        unsafe {
            self.run(
                true,
                Span {
                    src: p,
                    dst: p,
                    len: buf.len(),
                },
                first_sector,
            )
        }
    }

    /// Decrypt in place: the inverse of [`Xts::encrypt`].
    pub fn decrypt(&self, buf: &mut [u8], first_sector: u64) {
        check_len(buf.len());
        let p = buf.as_mut_ptr();
        // SAFETY: source and destination are the same valid range.
        unsafe {
            self.run(
                false,
                Span {
                    src: p,
                    dst: p,
                    len: buf.len(),
                },
                first_sector,
            )
        }
    }

    /// Encrypt src into dst (same length), src untouched.
    pub fn encrypt_to(&self, src: &[u8], dst: &mut [u8], first_sector: u64) {
        check_lens(src.len(), dst.len());
        // SAFETY: two valid ranges of the same length; `&` and `&mut` borrows
        // cannot overlap.
        unsafe { self.run(true, Span::between(src, dst), first_sector) }
    }

    /// Decrypt src into dst (same length), src untouched.
    pub fn decrypt_to(&self, src: &[u8], dst: &mut [u8], first_sector: u64) {
        check_lens(src.len(), dst.len());
        // SAFETY: as in `encrypt_to`.
        unsafe { self.run(false, Span::between(src, dst), first_sector) }
    }

    /// # Safety
    /// As [`Ctx::run`], for `span`.
    unsafe fn run(&self, encrypt: bool, span: Span, first: u64) {
        if span.len == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(keys) = &self.vaes {
            // SAFETY: forwarded from the caller.
            unsafe {
                if encrypt {
                    keys.run::<true>(span.src, span.dst, span.len, first);
                } else {
                    keys.run::<false>(span.src, span.dst, span.len, first);
                }
            }
            return;
        }
        let pool = if encrypt { &self.enc } else { &self.dec };
        let mut ctx = pool.take(&self.key);
        // SAFETY: forwarded from the caller.
        unsafe { ctx.run(span.src, span.dst, span.len, first) };
        pool.give(ctx);
    }
}

/// Source and destination of one call: either the same range or two
/// disjoint ones, `len` bytes each.
struct Span {
    src: *const u8,
    dst: *mut u8,
    len: usize,
}

impl Span {
    fn between(src: &[u8], dst: &mut [u8]) -> Span {
        Span {
            src: src.as_ptr(),
            dst: dst.as_mut_ptr(),
            len: src.len(),
        }
    }
}

fn check_len(len: usize) {
    assert!(
        len.is_multiple_of(SECTOR_BYTES),
        "XTS buffer of {len} bytes is not whole {SECTOR_BYTES}-byte sectors"
    );
}

fn check_lens(src: usize, dst: usize) {
    assert_eq!(src, dst, "XTS source and destination lengths differ");
    check_len(src);
}

impl std::fmt::Debug for Xts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Xts(<aes-xts-plain64 key, redacted>)")
    }
}

#[cfg(test)]
mod tests;
