//! `punchzero` for a kind without its own: read what the disk stores and
//! release every 4 KiB grain that reads all zeros.

use std::time::Instant;

use strata_block::{BlockDevice, ZeroOptions};

use crate::{ChangedRange, Error, ErrorKind, PunchZeroReport, Result, SpaceWork};

const GRAIN: u64 = 4096;
const CHUNK: u64 = 1 << 20;

/// Scan `ranges` of `dev` (what it stores), releasing zero grains; pause,
/// cancel and pace through `work`. The report's `allocated_bytes` is what
/// `stored_after` says the disk stores once done.
pub(crate) fn punch_zero(
    disk: &str,
    dev: &dyn BlockDevice,
    ranges: &[ChangedRange],
    work: &SpaceWork,
    progress: &mut dyn FnMut(u64, u64),
    stored_after: impl FnOnce() -> Result<u64>,
) -> Result<PunchZeroReport> {
    let io = |what: &str, e: strata_block::BlockError| {
        Error::new(ErrorKind::Io, format!("punchzero of '{disk}': {what}: {e}"))
    };
    let total: u64 = ranges.iter().filter(|r| r.mapped).map(|r| r.len).sum();
    let started = Instant::now();
    let (mut scanned, mut released) = (0u64, 0u64);
    let mut buf = vec![0u8; CHUNK as usize];
    let unmap = ZeroOptions {
        may_unmap: true,
        ..Default::default()
    };
    for r in ranges.iter().filter(|r| r.mapped) {
        let end = r.offset + r.len;
        let mut off = r.offset - r.offset % GRAIN;
        while off < end {
            if let Some(c) = &work.control {
                c.checkpoint()?;
            }
            if let Some(rate) = work.rate_bytes_per_sec.filter(|r| *r > 0) {
                let due = std::time::Duration::from_secs_f64(scanned as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            let n = CHUNK.min(end - off).min(dev.size_bytes() - off);
            let b = &mut buf[..n as usize];
            dev.read_at(b, off).map_err(|e| io("read", e))?;
            // Runs of whole zero grains, each released with one call.
            let mut g = 0usize;
            while g < b.len() {
                let zero = |i: usize| {
                    b.len() - i >= GRAIN as usize
                        && b[i..i + GRAIN as usize].iter().all(|&x| x == 0)
                };
                if !zero(g) {
                    g += GRAIN as usize;
                    continue;
                }
                let start = g;
                while g < b.len() && zero(g) {
                    g += GRAIN as usize;
                }
                let len = (g - start) as u64;
                dev.write_zeroes(off + start as u64, len, unmap)
                    .map_err(|e| io("release", e))?;
                released += len;
            }
            scanned += n;
            off += n;
            progress(scanned.min(total), total);
        }
    }
    dev.flush().map_err(|e| io("flush", e))?;
    Ok(PunchZeroReport {
        disk: disk.to_string(),
        scanned_bytes: scanned,
        released_bytes: released,
        allocated_bytes: stored_after()?,
    })
}
