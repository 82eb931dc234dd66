//! A served disk's slot (docs/MOVE.md): the one device every connection to
//! an export reaches, which can change the device behind it in one step
//! and, while a move copies the disk, records which ranges clients changed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use strata_block::{BlockDevice, BlockResult, Extent, ReadFill, ZeroOptions};

/// The granularity of change tracking.
pub const TRACK_BYTES: u64 = 64 * 1024;

/// Which `TRACK_BYTES` ranges of a disk were changed, set lock-free by
/// client requests and taken whole by the mover.
pub struct DirtyMap {
    words: Vec<AtomicU64>,
}

impl DirtyMap {
    fn new(size_bytes: u64) -> DirtyMap {
        let ranges = size_bytes.div_ceil(TRACK_BYTES);
        DirtyMap {
            words: (0..ranges.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn mark(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = offset / TRACK_BYTES;
        let last = (offset + len - 1) / TRACK_BYTES;
        for r in first..=last {
            if let Some(w) = self.words.get((r / 64) as usize) {
                w.fetch_or(1 << (r % 64), Ordering::AcqRel);
            }
        }
    }

    /// Take (and clear) the marked ranges, as merged `(offset, len)` runs.
    pub fn take(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, w) in self.words.iter().enumerate() {
            let mut bits = w.swap(0, Ordering::AcqRel);
            while bits != 0 {
                let b = bits.trailing_zeros() as u64;
                bits &= bits - 1;
                let off = (i as u64 * 64 + b) * TRACK_BYTES;
                match out.last_mut() {
                    Some(r) if r.0 + r.1 == off => r.1 += TRACK_BYTES,
                    _ => out.push((off, TRACK_BYTES)),
                }
            }
        }
        out
    }
}

struct Inner {
    dev: Arc<dyn BlockDevice>,
    dirty: Option<Arc<DirtyMap>>,
}

/// One export's device, switchable. Requests hold the read side of a lock
/// while they run; [`Slot::switch`] takes the write side, so it waits for
/// the requests in flight and holds new ones until the device is swapped.
pub struct Slot {
    inner: RwLock<Inner>,
}

impl Slot {
    pub fn new(dev: Arc<dyn BlockDevice>) -> Slot {
        Slot {
            inner: RwLock::new(Inner { dev, dirty: None }),
        }
    }

    /// The device requests go to now.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.inner.read().dev.clone()
    }

    /// Start recording changed ranges (from the requests that complete
    /// after this returns).
    pub fn track(&self) -> Arc<DirtyMap> {
        let mut g = self.inner.write();
        let map = Arc::new(DirtyMap::new(g.dev.size_bytes()));
        g.dirty = Some(map.clone());
        map
    }

    /// Stop recording.
    pub fn untrack(&self) {
        self.inner.write().dirty = None;
    }

    /// Hold every request, run `last` (which sees no request in flight and
    /// returns the new device, or an error that leaves the old one), put its
    /// device in place and stop tracking. Returns how long requests were
    /// held.
    pub fn switch<E>(
        &self,
        last: impl FnOnce() -> Result<Arc<dyn BlockDevice>, E>,
    ) -> Result<std::time::Duration, E> {
        let mut g = self.inner.write();
        let t = std::time::Instant::now();
        let dev = last()?;
        g.dev = dev;
        g.dirty = None;
        Ok(t.elapsed())
    }

    fn changed<T>(&self, g: &Inner, r: BlockResult<T>, offset: u64, len: u64) -> BlockResult<T> {
        if r.is_ok() {
            if let Some(d) = &g.dirty {
                d.mark(offset, len);
            }
        }
        r
    }
}

impl BlockDevice for Slot {
    fn size_bytes(&self) -> u64 {
        self.inner.read().dev.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.inner.read().dev.read_only()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> BlockResult<ReadFill> {
        self.inner.read().dev.read_at(buf, offset_bytes)
    }

    fn readv_at(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> BlockResult<ReadFill> {
        self.inner.read().dev.readv_at(bufs, offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> BlockResult<()> {
        let g = self.inner.read();
        let r = g.dev.write_at(buf, offset_bytes, fua);
        self.changed(&g, r, offset_bytes, buf.len() as u64)
    }

    fn writev_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> BlockResult<()> {
        let g = self.inner.read();
        let r = g.dev.writev_at(bufs, offset_bytes, fua);
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.changed(&g, r, offset_bytes, len)
    }

    fn flush(&self) -> BlockResult<()> {
        self.inner.read().dev.flush()
    }

    fn unmap(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<()> {
        let g = self.inner.read();
        let r = g.dev.unmap(offset_bytes, len_bytes);
        self.changed(&g, r, offset_bytes, len_bytes)
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        opts: ZeroOptions,
    ) -> BlockResult<()> {
        let g = self.inner.read();
        let r = g.dev.write_zeroes(offset_bytes, len_bytes, opts);
        self.changed(&g, r, offset_bytes, len_bytes)
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<Vec<Extent>> {
        self.inner.read().dev.block_status(offset_bytes, len_bytes)
    }

    fn preferred_block_bytes(&self) -> u32 {
        self.inner.read().dev.preferred_block_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_ranges_merge_and_clear() {
        let d = DirtyMap::new(10 * 1024 * 1024);
        d.mark(0, 1);
        d.mark(TRACK_BYTES, 2 * TRACK_BYTES);
        d.mark(5 * TRACK_BYTES + 10, 1);
        d.mark(64 * TRACK_BYTES - 1, 2);
        assert_eq!(
            d.take(),
            vec![
                (0, 3 * TRACK_BYTES),
                (5 * TRACK_BYTES, TRACK_BYTES),
                (63 * TRACK_BYTES, 2 * TRACK_BYTES)
            ]
        );
        assert!(d.take().is_empty());
        // Past the end (a size race) is ignored, not a panic.
        d.mark(1 << 40, 1);
        assert!(d.take().is_empty());
    }
}
