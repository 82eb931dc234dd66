//! Fragments of packed grains (docs/FORMAT.md §18.8, §18.9): a grain or
//! an aligned pair or quad compressed and back. The pack pass lays what these make
//! out as a stream (`strata_format::packed::encode_stream`); every reader
//! of a packed entry goes through [`decompress`].

use strata_format::packed::{decode_packed, footprint, Codec, Packed, PAIR_BYTES_MAX};
use strata_format::{GRAIN_BYTES, GRAIN_SHIFT};

use crate::error::{Error, ErrorKind, Result};
use crate::store::Store;

const GRAIN: usize = GRAIN_BYTES as usize;

/// zstd's level for the pack pass and the estimate: one past its
/// default, which with quads is what reaches qcow2's ratio on text
/// (FORMAT.md §18.9; decompression is as fast at either).
pub(crate) const ZSTD_LEVEL: i32 = 4;

/// `plain` as an LZ4 block (the reference library's, whose decoder is a
/// third faster than lz4_flex's on 4 KiB grains: most of what a packed
/// read adds, PERFORMANCE.md).
pub(crate) fn compress_lz4(plain: &[u8]) -> Vec<u8> {
    lz4::block::compress(plain, None, false).expect("LZ4 takes any input below 2 GiB")
}

thread_local! {
    /// Each thread's zstd compression context, made once: a context made
    /// per call (`zstd::bulk::compress`) cost the pack pass a fifth of its
    /// time on single grains and some 6% on quads (its tables allocated
    /// and freed each time); the frames are the same.
    static ZSTD_PACK: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// `grain` as a zstd frame at [`ZSTD_LEVEL`] (none if zstd fails, which
/// it does not for 4 KiB in memory).
pub(crate) fn compress_zstd(grain: &[u8]) -> Option<Vec<u8>> {
    ZSTD_PACK.with(|z| {
        let mut z = z.borrow_mut();
        if z.is_none() {
            *z = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?);
        }
        z.as_mut()?.compress(grain).ok()
    })
}

thread_local! {
    /// Each thread's zstd decompression context, made once: making one
    /// per read (an allocation of some 100 KiB and its setup) held 4 KiB
    /// random reads of a packed disk to a fifth of a raw one's.
    static ZSTD: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Decompress a fragment's `len` compressed bytes into `out` (4,096
/// bytes, 8,192 for a pair, 16,384 for a quad), which they must fill exactly: anything
/// else is a damaged fragment (`Corrupt`, said in the error; the caller
/// adds the grain and `v`).
pub(crate) fn decompress(codec: Codec, compressed: &[u8], out: &mut [u8]) -> Result<()> {
    let damaged = |why: String| Error::new(ErrorKind::Corrupt, format!("packed fragment: {why}"));
    let whole = out.len();
    if whole != GRAIN && whole != 2 * GRAIN && whole != 4 * GRAIN {
        return Err(damaged(format!("{whole} bytes asked for")));
    }
    match codec {
        // `whole` is at most 16,384 (checked above).
        Codec::Lz4 => match lz4::block::decompress_to_buffer(compressed, Some(whole as i32), out) {
            Ok(n) if n == whole => Ok(()),
            Ok(n) => Err(damaged(format!(
                "it decompresses to {n} bytes, not {whole}"
            ))),
            Err(e) => Err(damaged(format!("LZ4: {e}"))),
        },
        Codec::Zstd => {
            let r = ZSTD.with(|z| -> Result<std::io::Result<usize>> {
                let mut z = z.borrow_mut();
                if z.is_none() {
                    let d = zstd::bulk::Decompressor::new()
                        .map_err(|e| Error::new(ErrorKind::Io, format!("zstd: {e}")))?;
                    *z = Some(d);
                }
                let d = z.as_mut().expect("just made");
                Ok(d.decompress_to_buffer(compressed, out))
            })?;
            match r {
                Ok(n) if n == whole => Ok(()),
                Ok(n) => Err(damaged(format!(
                    "it decompresses to {n} bytes, not {whole}"
                ))),
                Err(e) => Err(damaged(format!("zstd: {e}"))),
            }
        }
    }
}

/// Room a fragment takes in a packed stream: its directory entry and
/// its stored bytes.
pub(crate) fn room(len: usize) -> usize {
    16 + footprint(len)
}

/// `plain` (a grain, or an aligned pair's or quad's 8 or 16 KiB) compressed with `codec`
/// when that saves an eighth (§18.7) and fits a grain and one spill
/// (7,168 bytes, §18.9), else none: it stays raw.
pub(crate) fn fragment(codec: Codec, plain: &[u8]) -> Option<Vec<u8>> {
    let c = match codec {
        Codec::Lz4 => compress_lz4(plain),
        Codec::Zstd => compress_zstd(plain)?,
    };
    (c.len() <= (plain.len() * 7 / 8).min(PAIR_BYTES_MAX)).then_some(c)
}

/// A fragment decompressed: the bytes of one, two or four virtual grains from
/// `v0`, read from packed stream grain `grain` (none while `plain` is
/// empty).
#[derive(Default)]
pub(crate) struct Unpacked {
    pub grain: u64,
    pub v0: u64,
    pub plain: Vec<u8>,
    /// A spilling fragment's two parts joined (kept for the next one).
    joined: Vec<u8>,
}

impl Unpacked {
    /// Nothing unpacked any more; the buffers kept (a memo reused from
    /// request to request).
    pub(crate) fn cleared(mut self) -> Unpacked {
        self.plain.clear();
        (self.grain, self.v0) = (0, 0);
        self
    }

    /// Virtual grain `v`'s 4,096 bytes, if this fragment of `grain`
    /// holds them.
    pub(crate) fn bytes(&self, grain: u64, v: u64) -> Option<&[u8]> {
        let i = usize::try_from(v.checked_sub(self.v0)?).ok()?;
        (self.grain == grain && i < self.plain.len() / GRAIN)
            .then(|| &self.plain[i * GRAIN..(i + 1) * GRAIN])
    }
}

/// A packed grain's damage, naming the grain and the virtual grain read.
fn packed_damage(grain: u64, v: u64, why: String) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!("packed grain {grain}, virtual grain {v}: {why}"),
    )
}

impl Store {
    /// The fragment of packed stream grain `grain` that holds virtual
    /// grain `v`, decompressed (FORMAT.md §18.8 "Reads"): the grain's
    /// directory checked, the grain after it read too when the fragment
    /// spills there, the fragment's CRC checked. Any damage is `Corrupt`
    /// naming the grain and `v`; no other bytes are ever returned.
    pub(crate) fn unpack(&self, grain: u64, v: u64) -> Result<Unpacked> {
        let mut b = vec![0u8; GRAIN];
        self.pool.read_at(&mut b, grain << GRAIN_SHIFT)?;
        let p = decode_packed(&b).map_err(|e| packed_damage(grain, v, e.to_string()))?;
        self.unpack_in(grain, (&b, &p), v)
    }

    /// [`Store::unpack`] from packed grain `grain` already read (`b`) and
    /// decoded (`p`).
    pub(crate) fn unpack_in(
        &self,
        grain: u64,
        (b, p): (&[u8], &Packed),
        v: u64,
    ) -> Result<Unpacked> {
        let spills = p.find(v).is_some_and(|f| p.spilled(f) > 0);
        let next = if spills {
            let mut n = vec![0u8; GRAIN];
            self.pool.read_at(&mut n, (grain + 1) << GRAIN_SHIFT)?;
            Some(n)
        } else {
            None
        };
        let mut u = Unpacked::default();
        unpack_into(&mut u, grain, (b, p), next.as_deref(), (v, None))?;
        Ok(u)
    }
}

/// Virtual grain `v`'s fragment decompressed into `u` (its buffer
/// reused; on an error it holds nothing) from packed stream grain
/// `grain`, read (`b`) and decoded (`p`), with the grain after it
/// (`next`) when that fragment spills there: none then is damage (the
/// map said the fragment does not spill, §18.8 "Counts"). Given `whole`
/// (a request's 4,096 bytes of `v`), a fragment of that grain alone is
/// decompressed straight into it instead (true; `u` then holds nothing):
/// no other grain could use it, so it is not copied through `u`. On an
/// error `whole` may hold anything; the read fails.
fn unpack_into(
    u: &mut Unpacked,
    grain: u64,
    (b, p): (&[u8], &Packed),
    next: Option<&[u8]>,
    (v, whole): (u64, Option<&mut [u8]>),
) -> Result<bool> {
    let damaged = |why: String| packed_damage(grain, v, why);
    u.plain.clear();
    let f = *p
        .find(v)
        .ok_or_else(|| damaged("its directory does not hold it".into()))?;
    if p.spilled(&f) > 0 && next.is_none() {
        return Err(damaged(
            "its fragment spills into the next grain, which its map entry does not say".into(),
        ));
    }
    let stored = p
        .stored_in(&f, b, next, &mut u.joined)
        .map_err(|e| damaged(e.to_string()))?;
    let compressed = &stored[..f.len as usize];
    if let Some(dst) = whole.filter(|_| f.span == 1) {
        decompress(f.codec, compressed, dst).map_err(|e| damaged(e.message))?;
        return Ok(true);
    }
    u.plain.resize(f.plain_bytes(), 0);
    if let Err(e) = decompress(f.codec, compressed, &mut u.plain) {
        u.plain.clear();
        return Err(damaged(e.message));
    }
    (u.grain, u.v0) = (grain, f.v);
    Ok(false)
}

/// Virtual grain `v`'s fragment from packed stream grain `grain`'s
/// bytes `b` (and the next grain's, `next`, when its map entry says it
/// spills), as a planned read finds them in its buffer, into `u`, or
/// straight into `whole` as [`unpack_into`] says (true).
pub(crate) fn unpack_bytes(
    u: &mut Unpacked,
    grain: u64,
    (b, next): (&[u8], Option<&[u8]>),
    v: u64,
    whole: Option<&mut [u8]>,
) -> Result<bool> {
    u.plain.clear();
    let p = decode_packed(b).map_err(|e| packed_damage(grain, v, e.to_string()))?;
    unpack_into(u, grain, (b, &p), next, (v, whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grain_comes_back_byte_for_byte() {
        let text: Vec<u8> = b"one refcounted map per disk version; "
            .iter()
            .copied()
            .cycle()
            .take(GRAIN)
            .collect();
        let small = compress_lz4(&text);
        assert!(fragment(Codec::Lz4, &text).is_some(), "{}", small.len());
        let mut out = vec![0u8; GRAIN];
        decompress(Codec::Lz4, &small, &mut out).unwrap();
        assert_eq!(out, text);
        // Noise does not pack.
        let noise = noise(GRAIN);
        assert!(fragment(Codec::Lz4, &noise).is_none());
        // A fragment short by a byte, or of another length, is refused.
        assert!(decompress(Codec::Lz4, &small[..small.len() - 1], &mut out).is_err());
        let half = compress_lz4(&text[..2048]);
        let e = decompress(Codec::Lz4, &half, &mut out).unwrap_err();
        assert!(e.to_string().contains("2048 bytes"), "{e}");
        assert_eq!(e.kind, ErrorKind::Corrupt);
        assert!(decompress(Codec::Zstd, &small, &mut out).is_err());
        // zstd: smaller than LZ4 on text, back byte for byte, and a frame
        // of another length or cut short refused.
        let z = compress_zstd(&text).unwrap();
        assert!(z.len() < small.len(), "{} vs {}", z.len(), small.len());
        decompress(Codec::Zstd, &z, &mut out).unwrap();
        assert_eq!(out, text);
        assert!(decompress(Codec::Zstd, &z[..z.len() - 1], &mut out).is_err());
        let half = compress_zstd(&text[..2048]).unwrap();
        let e = decompress(Codec::Zstd, &half, &mut out).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Corrupt, "{e}");
        assert!(decompress(Codec::Lz4, &z, &mut out).is_err());
        // What a fragment takes in a stream; noise stays raw.
        assert!(fragment(Codec::Zstd, &noise).is_none());
        assert_eq!(room(100), 16 + 112);
    }

    #[test]
    fn a_pair_comes_back_whole_and_noise_stays_raw() {
        let text = b"a run of grains compressed together. ".repeat(4 * GRAIN / 37 + 1);
        for codec in [Codec::Lz4, Codec::Zstd] {
            for span in [2, 4] {
                let run = &text[..span * GRAIN];
                let f = fragment(codec, run).unwrap();
                let mut out = vec![0u8; span * GRAIN];
                decompress(codec, &f, &mut out).unwrap();
                assert_eq!(out, run);
                // The wrong size asked for is damage, not a short read.
                assert!(decompress(codec, &f, &mut out[..GRAIN]).is_err());
                assert!(decompress(codec, &f, &mut vec![0u8; 3 * GRAIN]).is_err());
            }
        }
        assert!(fragment(Codec::Zstd, &noise(GRAIN)).is_none());
        // A quad that saves an eighth but does not fit a grain and one
        // spill stays raw: three grains of noise and one of text.
        let mut quad = noise(3 * GRAIN);
        quad.extend_from_slice(&text[..GRAIN]);
        let c = compress_zstd(&quad).unwrap();
        assert!(c.len() <= quad.len() * 7 / 8 && c.len() > PAIR_BYTES_MAX);
        assert!(fragment(Codec::Zstd, &quad).is_none());
    }

    pub(crate) fn noise(n: usize) -> Vec<u8> {
        let mut x = 88172645463325252u64;
        (0..n / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect()
    }
}
