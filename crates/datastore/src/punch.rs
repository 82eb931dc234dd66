//! `punchzero` for a kind without its own: read what the disk stores and
//! release every 4 KiB grain that reads all zeros.

use strata_block::{BlockDevice, ZeroOptions};
use strata_engine::Pacer;

use crate::{Error, ErrorKind, PunchZeroReport, Result, SpaceWork};

const GRAIN: u64 = 4096;
const CHUNK: u64 = 1 << 20;
/// Block status is asked this much at a time.
const STATUS_SPAN: u64 = 64 << 20;

/// Where `dev` stores something (block status: neither hole nor zero),
/// as (offset, length), merged and ascending.
pub(crate) fn stored_ranges(dev: &dyn BlockDevice) -> Result<Vec<(u64, u64)>> {
    let size = dev.size_bytes();
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut off = 0;
    while off < size {
        let span = STATUS_SPAN.min(size - off);
        let mut at = off;
        for e in dev
            .block_status(off, span)
            .map_err(|e| Error::new(ErrorKind::Io, format!("block status: {e}")))?
        {
            if !e.hole && !e.zero {
                match out.last_mut() {
                    Some(r) if r.0 + r.1 == at => r.1 += e.len_bytes,
                    _ => out.push((at, e.len_bytes)),
                }
            }
            at += e.len_bytes;
        }
        off += span;
    }
    Ok(out)
}

/// Scan what `dev` stores, releasing zero grains; pause, cancel and pace
/// through `work`. The report's `allocated_bytes` is what the disk stores
/// once done.
pub(crate) fn punch_zero(
    disk: &str,
    dev: &dyn BlockDevice,
    work: &SpaceWork,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PunchZeroReport> {
    let io = |what: &str, e: strata_block::BlockError| {
        Error::new(ErrorKind::Io, format!("punchzero of '{disk}': {what}: {e}"))
    };
    let ranges = stored_ranges(dev)?;
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    let mut pacer = Pacer::new(work.rate_bytes_per_sec, work.control.as_deref());
    let (mut scanned, mut released) = (0u64, 0u64);
    let mut buf = vec![0u8; CHUNK as usize];
    let unmap = ZeroOptions {
        may_unmap: true,
        ..Default::default()
    };
    for &(start, len) in &ranges {
        let end = start + len;
        let mut off = start - start % GRAIN;
        while off < end {
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
                let first = g;
                while g < b.len() && zero(g) {
                    g += GRAIN as usize;
                }
                let len = (g - first) as u64;
                dev.write_zeroes(off + first as u64, len, unmap)
                    .map_err(|e| io("release", e))?;
                released += len;
            }
            scanned += n;
            off += n;
            progress(scanned.min(total), total);
            pacer.pace(n, false)?;
        }
    }
    dev.flush().map_err(|e| io("flush", e))?;
    Ok(PunchZeroReport {
        disk: disk.to_string(),
        scanned_bytes: scanned,
        released_bytes: released,
        allocated_bytes: stored_ranges(dev)?.iter().map(|r| r.1).sum(),
    })
}
