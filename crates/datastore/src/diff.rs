//! Changed ranges by content, for a kind that cannot compare maps.

use strata_block::BlockDevice;

use crate::{ChangedRange, Error, ErrorKind, Result};

/// Where `b` differs from `a` (None: zeros), reading only where either
/// stores something, compared in 64 KiB units (a range is a whole number
/// of units, the last one cut at `b`'s end). `mapped`: `b` reads anything
/// but zeros in it.
pub fn content_diff(a: Option<&dyn BlockDevice>, b: &dyn BlockDevice) -> Result<Vec<ChangedRange>> {
    const STEP: u64 = 1 << 20;
    const UNIT: usize = 64 * 1024;
    let size = b.size_bytes();
    let io = |e: strata_block::BlockError| Error::new(ErrorKind::Io, e.to_string());
    let stored = |d: &dyn BlockDevice, off: u64, len: u64| -> Result<bool> {
        let ext = d.block_status(off, len).map_err(io)?;
        Ok(ext.iter().any(|e| !e.hole && !e.zero)
            || ext.iter().map(|e| e.len_bytes).sum::<u64>() < len)
    };
    let mut out: Vec<ChangedRange> = Vec::new();
    let mut ba = vec![0u8; STEP as usize];
    let mut bb = vec![0u8; STEP as usize];
    let mut off = 0;
    while off < size {
        let len = STEP.min(size - off);
        let in_a = match a {
            Some(a) if off < a.size_bytes() => stored(a, off, len.min(a.size_bytes() - off))?,
            _ => false,
        };
        if in_a || stored(b, off, len)? {
            let n = len as usize;
            ba[..n].fill(0);
            if let Some(a) = a.filter(|_| in_a) {
                let an = n.min((a.size_bytes() - off) as usize);
                a.read_at(&mut ba[..an], off).map_err(io)?;
            }
            b.read_at(&mut bb[..n], off).map_err(io)?;
            for (i, (x, y)) in ba[..n].chunks(UNIT).zip(bb[..n].chunks(UNIT)).enumerate() {
                if x == y {
                    continue;
                }
                let o = off + (i * UNIT) as u64;
                let mapped = y.iter().any(|&c| c != 0);
                match out.last_mut() {
                    Some(r) if r.offset + r.len == o && r.mapped == mapped => {
                        r.len += y.len() as u64
                    }
                    _ => out.push(ChangedRange {
                        offset: o,
                        len: y.len() as u64,
                        mapped,
                    }),
                }
            }
        }
        off += len;
    }
    Ok(out)
}
