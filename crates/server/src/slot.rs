//! A served disk's slot (docs/MOVE.md): the one device every connection to
//! an export reaches, which can change the device behind it in one step
//! and, while a move copies the disk, records which ranges clients changed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock};
use strata_block::{
    hold_read, BlockDevice, BlockResult, Extent, Held, IoHold, Planned, ReadFill, ZeroOptions,
};

/// The finest granularity of change tracking: a client's 4 KiB write is
/// copied again as 4 KiB, not as a larger unit around it.
pub const TRACK_BYTES: u64 = 4096;
/// At most this many tracked units per disk (a 2 MiB bitmap): larger
/// disks track in larger units (64 KiB at 1 TiB).
const TRACK_UNITS_MAX: u64 = 1 << 24;
/// The granularity of the range locks that order a mover's copy of a
/// range against client writes mirrored into the target.
pub const LOCK_BYTES: u64 = 1 << 20;
const LOCK_STRIPES: u64 = 64;

/// Which units of a disk were changed, set lock-free by client requests
/// and taken whole by the mover.
pub struct DirtyMap {
    words: Vec<AtomicU64>,
    unit: u64,
}

impl DirtyMap {
    fn new(size_bytes: u64) -> DirtyMap {
        let unit = size_bytes
            .div_ceil(TRACK_UNITS_MAX)
            .next_power_of_two()
            .max(TRACK_BYTES);
        let ranges = size_bytes.div_ceil(unit);
        DirtyMap {
            words: (0..ranges.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            unit,
        }
    }

    fn mark(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = offset / self.unit;
        let last = (offset + len - 1) / self.unit;
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
                let off = (i as u64 * 64 + b) * self.unit;
                match out.last_mut() {
                    Some(r) if r.0 + r.1 == off => r.1 += self.unit,
                    _ => out.push((off, self.unit)),
                }
            }
        }
        out
    }
}

struct Inner {
    dev: Arc<dyn BlockDevice>,
    dirty: Option<Arc<DirtyMap>>,
    /// Active mirroring: client writes also go here (after the device),
    /// under the range locks.
    mirror: Option<Arc<dyn BlockDevice>>,
}

/// One export's device, switchable. Requests hold the read side of a lock
/// while they run; [`Slot::switch`] takes the write side, so it waits for
/// the requests in flight and holds new ones until the device is swapped.
pub struct Slot {
    /// In an `Arc` so a planned read can own its hold (`plan_read`).
    inner: Arc<RwLock<Inner>>,
    ranges: Vec<Mutex<()>>,
    /// Client requests while a move tracks changes (the mover yields while
    /// this moves); not counted otherwise, to keep the I/O path to one
    /// shared atomic (the lock's).
    requests: AtomicU64,
}

impl Slot {
    pub fn new(dev: Arc<dyn BlockDevice>) -> Slot {
        Slot {
            inner: Arc::new(RwLock::new(Inner {
                dev,
                dirty: None,
                mirror: None,
            })),
            ranges: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            requests: AtomicU64::new(0),
        }
    }

    /// Client requests served while tracking.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn count(&self, g: &Inner) {
        if g.dirty.is_some() {
            self.requests.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lock the `LOCK_BYTES` ranges `[offset, offset+len)` touches (in
    /// stripe order, so two lockers never wait on each other in a circle).
    pub fn lock_range(&self, offset: u64, len: u64) -> Vec<MutexGuard<'_, ()>> {
        let first = offset / LOCK_BYTES;
        let last = (offset + len.max(1) - 1) / LOCK_BYTES;
        let mut stripes: Vec<u64> = (first..=last.min(first + LOCK_STRIPES - 1))
            .map(|c| c % LOCK_STRIPES)
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
            .into_iter()
            .map(|i| self.ranges[i as usize].lock())
            .collect()
    }

    /// Active mirroring (docs/MOVE.md): from now on every client write,
    /// trim and write-zeroes is applied to `target` too, right after the
    /// device, and is not recorded as changed (unless the target fails it).
    pub fn mirror(&self, target: Arc<dyn BlockDevice>) {
        self.inner.write().mirror = Some(target);
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

    /// Stop recording and mirroring.
    pub fn untrack(&self) {
        let mut g = self.inner.write();
        g.dirty = None;
        g.mirror = None;
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
        g.mirror = None;
        Ok(t.elapsed())
    }

    /// Run a changing request: on the device, then (mirroring) on the
    /// target under the range locks, or else recorded as changed.
    fn change(
        &self,
        offset: u64,
        len: u64,
        op: impl Fn(&dyn BlockDevice) -> BlockResult<()>,
    ) -> BlockResult<()> {
        let g = self.inner.read();
        self.count(&g);
        let Some(m) = &g.mirror else {
            let r = op(&*g.dev);
            if r.is_ok() {
                if let Some(d) = &g.dirty {
                    d.mark(offset, len);
                }
            }
            return r;
        };
        let _ranges = self.lock_range(offset, len);
        op(&*g.dev)?;
        if op(&**m).is_err() {
            // The target missed it: the mover copies it again (and fails
            // the move if the target keeps failing).
            if let Some(d) = &g.dirty {
                d.mark(offset, len);
            }
        }
        Ok(())
    }
}

/// Held by a planned write while changes are tracked: marks its range
/// once the write is over, failed ones too (a piece may have landed).
struct MarkChanged {
    map: Arc<DirtyMap>,
    offset: u64,
    len: u64,
}

impl IoHold for MarkChanged {
    fn done(self: Box<Self>, ok: bool) -> bool {
        self.map.mark(self.offset, self.len);
        ok
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
        let g = self.inner.read();
        self.count(&g);
        g.dev.read_at(buf, offset_bytes)
    }

    fn readv_at(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> BlockResult<ReadFill> {
        let g = self.inner.read();
        self.count(&g);
        g.dev.readv_at(bufs, offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> BlockResult<()> {
        self.change(offset_bytes, buf.len() as u64, |d| {
            d.write_at(buf, offset_bytes, fua)
        })
    }

    fn writev_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> BlockResult<()> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.change(offset_bytes, len, |d| d.writev_at(bufs, offset_bytes, fua))
    }

    fn flush(&self) -> BlockResult<()> {
        self.inner.read().dev.flush()
    }

    fn unmap(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<()> {
        self.change(offset_bytes, len_bytes, |d| {
            d.unmap(offset_bytes, len_bytes)
        })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        opts: ZeroOptions,
    ) -> BlockResult<()> {
        self.change(offset_bytes, len_bytes, |d| {
            d.write_zeroes(offset_bytes, len_bytes, opts)
        })
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<Vec<Extent>> {
        self.inner.read().dev.block_status(offset_bytes, len_bytes)
    }

    fn preferred_block_bytes(&self) -> u32 {
        self.inner.read().dev.preferred_block_bytes()
    }

    fn prefetch(&self, offset_bytes: u64, len_bytes: u64) {
        self.inner.read().dev.prefetch(offset_bytes, len_bytes)
    }

    /// The read side of the switch is held by the plan until its read is
    /// over, as `read_at` holds it for its call: a switch waits for it.
    fn plan_read(
        &self,
        buf: &mut [u8],
        offset_bytes: u64,
        wait: bool,
    ) -> Option<BlockResult<Planned>> {
        let Some(g) = hold_read(&self.inner, wait) else {
            return Some(Ok(Planned::Busy));
        };
        match g.dev.plan_read(buf, offset_bytes, wait)? {
            Ok(Planned::Plan(mut plan)) => {
                self.count(&g);
                plan.holds.push(Box::new(Held(g)));
                Some(Ok(Planned::Plan(plan)))
            }
            other => Some(other),
        }
    }

    /// As `plan_read`, and the range is recorded as changed once the
    /// write is over, as `write_at` records it. While a move
    /// mirrors writes nothing is planned: `write_at` applies each to both
    /// devices under the range locks.
    fn plan_write(
        &self,
        buf: &[u8],
        offset_bytes: u64,
        wait: bool,
    ) -> Option<BlockResult<Planned>> {
        let Some(g) = hold_read(&self.inner, wait) else {
            return Some(Ok(Planned::Busy));
        };
        if g.mirror.is_some() {
            return None;
        }
        match g.dev.plan_write(buf, offset_bytes, wait)? {
            Ok(Planned::Plan(mut plan)) => {
                self.count(&g);
                if let Some(d) = &g.dirty {
                    plan.holds.push(Box::new(MarkChanged {
                        map: d.clone(),
                        offset: offset_bytes,
                        len: buf.len() as u64,
                    }));
                }
                plan.holds.push(Box::new(Held(g)));
                Some(Ok(Planned::Plan(plan)))
            }
            other => Some(other),
        }
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

    #[test]
    fn large_disks_track_in_larger_units() {
        assert_eq!(DirtyMap::new(1 << 30).unit, 4096);
        assert_eq!(DirtyMap::new(1 << 40).unit, 64 * 1024);
        let d = DirtyMap::new(1 << 40);
        d.mark(70 * 1024, 1);
        assert_eq!(d.take(), vec![(64 * 1024, 64 * 1024)]);
        assert!(DirtyMap::new(1 << 40).words.len() <= (1 << 24) / 64);
    }
}
