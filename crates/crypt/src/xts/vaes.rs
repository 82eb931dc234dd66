//! AES-256-XTS over 512-byte sectors on VAES + AVX-512 cores, many sectors
//! per call.
//!
//! Why strata has its own: aws-lc's XTS takes one data unit per call, so a
//! 512-byte sector pays the EVP call, an IV reset and a serial encryption
//! of its tweak (about 15 dependent AES rounds) every time, which held
//! one core to about half of what the same code reaches on 4 KiB units.
//! Here one call takes any number of sectors:
//!
//! * the first tweaks of four sectors are encrypted together (one 512-bit
//!   register, four 128-bit lanes, so the tweak key's rounds run once per
//!   four sectors);
//! * a sector's 32 blocks are 8 registers of 4 blocks, run through the 14
//!   rounds together, so the AES units always have independent work;
//! * its 32 tweaks are made in registers, each straight from the sector's
//!   first tweak T: lane i of register r is T·α^(4r+i), a shift by 4r+i
//!   bits per 128-bit lane with the bits shifted out folded back by the
//!   XTS polynomial x¹²⁸ + x⁷ + x² + x + 1 (no chain of 32 doublings).
//!
//! The result is the same bytes as `aes-xts-plain64` (the tests hold it to
//! IEEE 1619 vectors, to aws-lc and to a block-by-block reference).
//!
//! The three key schedules (data key forwards and for the equivalent
//! inverse cipher, tweak key forwards) live in a [`SecretBytes`], so in
//! locked memory left out of core dumps and wiped on drop. While a call
//! runs, the round keys are also in vector registers and may be spilled
//! to that thread's stack.

use std::arch::x86_64::*;

use crate::{Result, SecretBytes, DEK_BYTES, SECTOR_BYTES};

/// Round keys of AES-256: the initial whitening key and 14 rounds.
const ROUNDS: usize = 15;
/// Bytes of one key schedule.
const SCHEDULE_BYTES: usize = ROUNDS * 16;
/// 128-bit blocks in a sector, and 512-bit registers of them.
const SECTOR_REGS: usize = SECTOR_BYTES / 64;

/// Whether this CPU runs [`Keys`]: AES-NI for the key schedules, VAES and
/// AVX-512F for the data.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("aes")
        && is_x86_feature_detected!("vaes")
        && is_x86_feature_detected!("avx512f")
}

/// The expanded keys of one XTS key: data key for encryption, the same for
/// decryption (equivalent inverse cipher order), tweak key for encryption.
pub(super) struct Keys {
    schedules: SecretBytes,
}

impl Keys {
    /// Expands `key` (64 bytes: data key, then tweak key). Only where
    /// [`available`] is true.
    pub(super) fn new(key: &SecretBytes) -> Result<Keys> {
        assert!(available(), "VAES XTS used on a CPU without VAES/AVX-512");
        assert_eq!(key.len(), DEK_BYTES, "XTS key length checked by Xts::new");
        let mut schedules = SecretBytes::zeroed(3 * SCHEDULE_BYTES)?;
        let k = key.expose();
        let out = schedules.expose_mut();
        // SAFETY: `available` checked the CPU's AES-NI; the slices are 32
        // bytes of key and 240 bytes of schedule each.
        unsafe {
            expand(&k[..32], &mut out[..SCHEDULE_BYTES]);
            invert(&mut out[..2 * SCHEDULE_BYTES]);
            expand(&k[32..], &mut out[2 * SCHEDULE_BYTES..]);
        }
        Ok(Keys { schedules })
    }

    /// Encrypts (`ENCRYPT`) or decrypts `len / 512` sectors from `src` into
    /// `dst`, sector `i` with tweak `first + i`.
    ///
    /// # Safety
    /// `src` valid for reads and `dst` for writes of `len` bytes, `len` a
    /// multiple of 512, the ranges identical or disjoint.
    pub(super) unsafe fn run<const ENCRYPT: bool>(
        &self,
        src: *const u8,
        dst: *mut u8,
        len: usize,
        first: u64,
    ) {
        // SAFETY: the CPU has the features (`Keys::new` asserted them); the
        // ranges are the caller's.
        unsafe { sectors::<ENCRYPT>(self, src, dst, len / SECTOR_BYTES, first) }
    }
}

/// AES-256 key expansion (FIPS-197 §5.2) of a 32-byte key into 15 round
/// keys, with AESKEYGENASSIST for SubWord/RotWord/Rcon.
#[target_feature(enable = "aes")]
unsafe fn expand(key: &[u8], out: &mut [u8]) {
    assert!(key.len() == 32 && out.len() == SCHEDULE_BYTES);
    let mut rk = [_mm_setzero_si128(); ROUNDS];
    // SAFETY: 16-byte unaligned loads within `key`.
    unsafe {
        rk[0] = _mm_loadu_si128(key.as_ptr().cast());
        rk[1] = _mm_loadu_si128(key.as_ptr().add(16).cast());
    }
    // Round key 2i from 2i-2 and 2i-1 (a rotated, substituted word and a
    // round constant, which AESKEYGENASSIST takes as an immediate), 2i+1
    // from 2i-1 and 2i (a substituted word only).
    rk[2] = even::<0x01>(rk[0], rk[1]);
    rk[3] = odd(rk[1], rk[2]);
    rk[4] = even::<0x02>(rk[2], rk[3]);
    rk[5] = odd(rk[3], rk[4]);
    rk[6] = even::<0x04>(rk[4], rk[5]);
    rk[7] = odd(rk[5], rk[6]);
    rk[8] = even::<0x08>(rk[6], rk[7]);
    rk[9] = odd(rk[7], rk[8]);
    rk[10] = even::<0x10>(rk[8], rk[9]);
    rk[11] = odd(rk[9], rk[10]);
    rk[12] = even::<0x20>(rk[10], rk[11]);
    rk[13] = odd(rk[11], rk[12]);
    rk[14] = even::<0x40>(rk[12], rk[13]);
    for (k, chunk) in rk.iter().zip(out.chunks_exact_mut(16)) {
        // SAFETY: 16-byte unaligned store within `out`.
        unsafe { _mm_storeu_si128(chunk.as_mut_ptr().cast(), *k) };
    }
    rk = [_mm_setzero_si128(); ROUNDS];
    std::hint::black_box(&rk);
}

/// Each word of a round key XORed with all the words before it in that
/// key: FIPS-197's "w[i] = w[i-8] ^ ..." chain, four words at a time.
#[inline]
#[target_feature(enable = "aes")]
fn spread(x: __m128i) -> __m128i {
    let x = _mm_xor_si128(x, _mm_slli_si128::<4>(x));
    let x = _mm_xor_si128(x, _mm_slli_si128::<4>(x));
    _mm_xor_si128(x, _mm_slli_si128::<4>(x))
}

/// An even round key (2i) from the two before it: RotWord(SubWord(last
/// word of `prev_odd`)) ^ RCON spread over `prev_even`.
#[inline]
#[target_feature(enable = "aes")]
fn even<const RCON: i32>(prev_even: __m128i, prev_odd: __m128i) -> __m128i {
    let t = _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<RCON>(prev_odd));
    _mm_xor_si128(spread(prev_even), t)
}

/// An odd round key (2i+1): SubWord(last word of `even`), no rotation or
/// constant, spread over `prev_odd`.
#[inline]
#[target_feature(enable = "aes")]
fn odd(prev_odd: __m128i, even: __m128i) -> __m128i {
    let t = _mm_shuffle_epi32::<0xaa>(_mm_aeskeygenassist_si128::<0>(even));
    _mm_xor_si128(spread(prev_odd), t)
}

/// Fills the second schedule of `both` with the decryption keys of the
/// first (FIPS-197 §5.3.5, equivalent inverse cipher): the forward keys in
/// reverse order, InvMixColumns applied to all but the outer two.
#[target_feature(enable = "aes")]
unsafe fn invert(both: &mut [u8]) {
    let (fwd, inv) = both.split_at_mut(SCHEDULE_BYTES);
    for r in 0..ROUNDS {
        // SAFETY: 16-byte loads and stores within the two schedules.
        unsafe {
            let k = _mm_loadu_si128(fwd.as_ptr().add((ROUNDS - 1 - r) * 16).cast());
            let k = if r == 0 || r == ROUNDS - 1 {
                k
            } else {
                _mm_aesimc_si128(k)
            };
            _mm_storeu_si128(inv.as_mut_ptr().add(r * 16).cast(), k);
        }
    }
}

/// A schedule's round keys, each in all four lanes of a register.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn broadcast(schedule: &[u8]) -> [__m512i; ROUNDS] {
    let mut k = [_mm512_setzero_si512(); ROUNDS];
    for (r, key) in k.iter_mut().enumerate() {
        // SAFETY: 16-byte load within the 240-byte schedule.
        *key = _mm512_broadcast_i32x4(unsafe {
            _mm_loadu_si128(schedule.as_ptr().add(r * 16).cast())
        });
    }
    k
}

/// The XTS tweak times α^k in each 128-bit lane, k per 64-bit half given in
/// `shift` (k < 32, the same in both halves of a lane) and `back` (64 - k):
/// the k bits shifted out of the low half move into the high half; those
/// out of the high half (x^128 and up) fold back into the low one times
/// x⁷ + x² + x + 1 (0x87). With k < 32 the folded bits stay below x^39,
/// so one fold reduces fully, and the fold's XORs of shifted copies are
/// the carry-less product.
#[inline]
#[target_feature(enable = "avx512f")]
fn times_alpha(t: __m512i, shift: __m512i, back: __m512i) -> __m512i {
    let moved = _mm512_sllv_epi64(t, shift);
    let out = _mm512_srlv_epi64(t, back);
    // Swap halves: the low half's overflow goes up, the high half's down.
    let out = _mm512_shuffle_epi32::<0x4e>(out);
    let folded = _mm512_xor_si512(
        _mm512_xor_si512(out, _mm512_slli_epi64::<1>(out)),
        _mm512_xor_si512(_mm512_slli_epi64::<2>(out), _mm512_slli_epi64::<7>(out)),
    );
    // Low halves (even 64-bit lanes) take the folded bits, high halves the
    // plain carry.
    _mm512_xor_si512(moved, _mm512_mask_blend_epi64(0xaa, folded, out))
}

/// Encrypts or decrypts `n` sectors with `keys`: the data schedule forward
/// or inverse, the tweak schedule forward.
#[target_feature(enable = "avx512f,vaes,aes")]
unsafe fn sectors<const ENCRYPT: bool>(
    keys: &Keys,
    src: *const u8,
    dst: *mut u8,
    n: usize,
    first: u64,
) {
    let s = keys.schedules.expose();
    let data = if ENCRYPT {
        &s[..SCHEDULE_BYTES]
    } else {
        &s[SCHEDULE_BYTES..2 * SCHEDULE_BYTES]
    };
    // SAFETY: the schedules are 240 bytes each.
    let (dk, tk) = unsafe { (broadcast(data), broadcast(&s[2 * SCHEDULE_BYTES..])) };
    let powers = Powers::new();
    let mut at = 0;
    while at < n {
        let firsts = first_tweaks(&tk, first.wrapping_add(at as u64));
        for (i, t) in firsts.iter().enumerate().take(n - at) {
            let off = (at + i) * SECTOR_BYTES;
            // SAFETY: sector `at + i` lies within the caller's ranges.
            unsafe { sector::<ENCRYPT>(&dk, &powers.of(*t), src.add(off), dst.add(off)) };
        }
        at += 4;
    }
}

/// The first tweaks of sectors `at` to `at + 3`: AES under the tweak key
/// of each sector number as a 128-bit little-endian value, the four in the
/// lanes of one register.
#[inline]
#[target_feature(enable = "avx512f,vaes,aes")]
fn first_tweaks(tk: &[__m512i; ROUNDS], at: u64) -> [__m128i; 4] {
    let ivs = _mm512_set_epi64(
        0,
        at.wrapping_add(3) as i64,
        0,
        at.wrapping_add(2) as i64,
        0,
        at.wrapping_add(1) as i64,
        0,
        at as i64,
    );
    let mut t4 = _mm512_xor_si512(ivs, tk[0]);
    for k in &tk[1..ROUNDS - 1] {
        t4 = _mm512_aesenc_epi128(t4, *k);
    }
    t4 = _mm512_aesenclast_epi128(t4, tk[ROUNDS - 1]);
    [
        _mm512_extracti32x4_epi32::<0>(t4),
        _mm512_extracti32x4_epi32::<1>(t4),
        _mm512_extracti32x4_epi32::<2>(t4),
        _mm512_extracti32x4_epi32::<3>(t4),
    ]
}

/// The shifts that make a sector's 32 tweaks from its first: lane i of
/// register r is T·α^(4r+i), each made from T directly (so the 8 registers
/// are independent, not a chain of doublings).
struct Powers {
    shifts: [__m512i; SECTOR_REGS],
    backs: [__m512i; SECTOR_REGS],
}

impl Powers {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Powers {
        let mut p = Powers {
            shifts: [_mm512_setzero_si512(); SECTOR_REGS],
            backs: [_mm512_setzero_si512(); SECTOR_REGS],
        };
        for (r, (shift, back)) in p.shifts.iter_mut().zip(&mut p.backs).enumerate() {
            let k = 4 * r as i64;
            *shift = _mm512_set_epi64(k + 3, k + 3, k + 2, k + 2, k + 1, k + 1, k, k);
            *back = _mm512_sub_epi64(_mm512_set1_epi64(64), *shift);
        }
        p
    }

    /// The 32 tweaks of the sector whose first tweak is `t`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn of(&self, t: __m128i) -> [__m512i; SECTOR_REGS] {
        let t = _mm512_broadcast_i32x4(t);
        let mut tw = [_mm512_setzero_si512(); SECTOR_REGS];
        for (r, w) in tw.iter_mut().enumerate() {
            *w = times_alpha(t, self.shifts[r], self.backs[r]);
        }
        tw
    }
}

/// One sector, 8 registers of 4 blocks through the rounds together: each
/// block XORed with its tweak, enciphered (or deciphered), XORed again.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of 512 bytes, identical or
/// disjoint.
#[inline]
#[target_feature(enable = "avx512f,vaes")]
unsafe fn sector<const ENCRYPT: bool>(
    dk: &[__m512i; ROUNDS],
    tw: &[__m512i; SECTOR_REGS],
    src: *const u8,
    dst: *mut u8,
) {
    let mut b = [_mm512_setzero_si512(); SECTOR_REGS];
    for (r, block) in b.iter_mut().enumerate() {
        // SAFETY: 64 bytes within the caller's source sector.
        let x = unsafe { _mm512_loadu_si512(src.add(r * 64).cast()) };
        *block = _mm512_ternarylogic_epi64::<0x96>(x, tw[r], dk[0]);
    }
    for k in &dk[1..ROUNDS - 1] {
        for block in &mut b {
            *block = if ENCRYPT {
                _mm512_aesenc_epi128(*block, *k)
            } else {
                _mm512_aesdec_epi128(*block, *k)
            };
        }
    }
    for (r, block) in b.iter().enumerate() {
        let y = if ENCRYPT {
            _mm512_aesenclast_epi128(*block, dk[ROUNDS - 1])
        } else {
            _mm512_aesdeclast_epi128(*block, dk[ROUNDS - 1])
        };
        // SAFETY: 64 bytes within the caller's destination sector; every
        // load of the sector came first.
        unsafe { _mm512_storeu_si512(dst.add(r * 64).cast(), _mm512_xor_si512(y, tw[r])) };
    }
}
