//! The write side of an extent: new grains and tables, entry updates held
//! until the data is durable, and the flush that writes them in the only
//! order that is crash-safe without a journal (docs/FORMAT.md §9.3).

use std::sync::Arc;

use super::entry::{self, entry_bytes, se_table_ref, Gte};
use super::extent::SparseExtent;
use super::header::{CowdHeader, Header, SeSparseHeader, SECTOR};
use super::held::{AllocState, MAX_DIRTY_TABLES, MAX_PENDING_META};
use super::io::wr;
use crate::error::Result;

/// At most this many free SEsparse slots are collected by one scan.
const SE_FREE_SCAN_MAX: usize = 1 << 16;

impl SparseExtent {
    /// Set grain `grain`'s entry, allocating its table if needed.
    /// Callers hold the allocation lock (`with_grain`).
    pub(super) fn set_entry(&self, st: &mut AllocState, grain: u64, g: Gte) -> Result<()> {
        let n = self.geometry.gt_entries;
        let (l1, l2) = (grain / n, grain % n);
        let raw = entry::encode(&self.header, g);
        let (off, table) = match self.gt(l1)? {
            Some(x) => x,
            None => {
                if raw == 0 {
                    return Ok(()); // already unallocated
                }
                self.alloc_gt(st, l1)?;
                self.gt(l1)?
                    .ok_or_else(|| self.err("new grain table vanished"))?
            }
        };
        let eb = self.geometry.entry_bytes;
        st.hold(off + l2 * eb, entry_bytes(raw, eb));
        if self.geometry.rgd_offset_bytes.is_some() {
            let rraw = self.rgd.read().get(l1 as usize).copied().unwrap_or(0);
            if rraw != 0 {
                st.hold(rraw * SECTOR + l2 * eb, entry_bytes(raw, eb));
            }
        }
        let mut t = (*table).clone();
        t[l2 as usize] = raw;
        let dirty_tables = self.tables.insert_dirty(l1, Arc::new(t));
        if st.held() >= MAX_PENDING_META || dirty_tables >= MAX_DIRTY_TABLES {
            self.flush_meta(st)?;
        }
        Ok(())
    }

    /// Where a new grain goes: appended at the end, except that an SEsparse
    /// extent whose grains region is used up reuses slots that unmaps and
    /// zeroes freed (after making those entry changes durable, so no durable
    /// entry still names a reused slot).
    fn new_grain_offset(&self, st: &mut AllocState) -> Result<u64> {
        let gb = self.grain_bytes();
        if let Header::SeSparse(se) = self.header {
            let gstart = se.grains.0 * SECTOR;
            let limit = se.grains.1 / SeSparseHeader::GRAIN_SECTORS;
            if (st.next_bytes - gstart) / gb >= limit {
                if st.se_free.is_empty() {
                    self.flush_meta(st)?;
                    st.se_free = self.scan_free_slots(&se, limit)?;
                }
                if let Some(i) = st.se_free.pop() {
                    return Ok(gstart + i * gb);
                }
            }
        }
        let off = st.next_bytes;
        st.next_bytes += gb;
        Ok(off)
    }

    /// SEsparse grain slots below `limit` that no entry names, lowest last.
    fn scan_free_slots(&self, se: &SeSparseHeader, limit: u64) -> Result<Vec<u64>> {
        let gb = self.grain_bytes();
        let mut used = vec![0u64; limit.div_ceil(64) as usize];
        let mut grain = 0;
        while grain < self.grains() {
            let (g, span) = self.lookup_span(grain)?;
            grain += span;
            if let Gte::Data(o) = g {
                let i = (o - se.grains.0 * SECTOR) / gb;
                if i < limit {
                    used[(i / 64) as usize] |= 1 << (i % 64);
                }
            }
        }
        let mut free: Vec<u64> = (0..limit)
            .filter(|i| used[(i / 64) as usize] & (1 << (i % 64)) == 0)
            .take(SE_FREE_SCAN_MAX)
            .collect();
        free.reverse();
        Ok(free)
    }

    /// Make everything durable in the only order that is crash-safe
    /// without a journal: sync the data (and new, zeroed tables), then
    /// write the entries, directory and header updates that point at it,
    /// then sync again.
    pub(super) fn flush_meta(&self, st: &mut AllocState) -> Result<()> {
        let sync = || {
            self.file
                .sync()
                .map_err(|e| crate::error::io(&self.name, e))
        };
        if st.held() == 0 {
            return sync();
        }
        sync()?;
        for (off, b) in &st.runs() {
            wr(&*self.file, &self.name, b, *off)?;
        }
        st.written();
        self.tables.clear_dirty();
        sync()
    }

    /// Give directory entry `l1` a zeroed grain table.
    fn alloc_gt(&self, st: &mut AllocState, l1: u64) -> Result<()> {
        let tb = self.geometry.gt_bytes();
        let zeros = vec![0u8; tb as usize];
        let eb = self.geometry.entry_bytes;
        let gd_off = self.geometry.gd_offset_bytes;
        match self.header {
            Header::SeSparse(se) => {
                let idx = st.se_volatile.free_gt_number;
                if (idx + 1) * SeSparseHeader::GT_SECTORS > se.grain_tables.1 {
                    return Err(self.err("no room left for grain tables"));
                }
                let off = (se.grain_tables.0 + idx * SeSparseHeader::GT_SECTORS) * SECTOR;
                wr(&*self.file, &self.name, &zeros, off)?;
                st.se_volatile.free_gt_number = idx + 1;
                let v = st.se_volatile.encode().to_vec();
                st.hold(se.volatile.0 * SECTOR, v);
                let raw = se_table_ref(idx);
                st.hold(gd_off + l1 * eb, entry_bytes(raw, eb));
                self.gd.write()[l1 as usize] = raw;
            }
            Header::Kdmv(_) | Header::Cowd(_) => {
                // Tables go at the end of the file, grain-aligned so grains stay aligned.
                let gb = self.grain_bytes();
                let span = tb.div_ceil(gb) * gb;
                let off = st.next_bytes;
                st.next_bytes += span;
                wr(&*self.file, &self.name, &zeros, off)?;
                let mut tables = vec![(gd_off, off)];
                if let Some(r) = self.geometry.rgd_offset_bytes {
                    let roff = st.next_bytes;
                    st.next_bytes += span;
                    wr(&*self.file, &self.name, &zeros, roff)?;
                    tables.push((r, roff));
                    self.rgd.write()[l1 as usize] = roff / SECTOR;
                }
                for (dir, t) in tables {
                    st.hold(dir + l1 * eb, entry_bytes(t / SECTOR, eb));
                }
                self.gd.write()[l1 as usize] = off / SECTOR;
                self.update_cowd_free(st)?;
            }
        }
        self.tables.forget(l1);
        Ok(())
    }

    /// COWD keeps the end of its used space in the header (`freeSector`).
    fn update_cowd_free(&self, st: &mut AllocState) -> Result<()> {
        if let Header::Cowd(mut h) = self.header {
            h.free_sector = u32::try_from(st.next_bytes / SECTOR)
                .map_err(|_| self.err("COWD file past 2 TiB"))?;
            st.hold(0, h.encode()[..CowdHeader::LIVE_BYTES].to_vec());
        }
        Ok(())
    }

    /// Run `f` with the allocation lock: the current entry of `grain` is
    /// passed in, re-read under the lock so racing writers see each other.
    pub fn with_grain<T>(
        &self,
        grain: u64,
        f: impl FnOnce(&mut GrainTx<'_>) -> Result<T>,
    ) -> Result<T> {
        if !self.writable {
            return Err(self.readonly());
        }
        let mut st = self.alloc.lock();
        let current = self.lookup(grain)?;
        let mut tx = GrainTx {
            ext: self,
            st: &mut st,
            grain,
            current,
        };
        f(&mut tx)
    }

    /// Write into an allocated grain in place.
    pub fn write_in_place(&self, off: u64, buf: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(self.readonly());
        }
        wr(&*self.file, &self.name, buf, off)
    }

    /// Write the held metadata in crash-safe order and make it all durable.
    pub fn sync(&self) -> Result<()> {
        let mut st = self.alloc.lock();
        self.flush_meta(&mut st)
    }
}

impl Drop for SparseExtent {
    /// Closing without a flush still writes the held metadata (best
    /// effort: errors have nowhere to go), as a write-through driver's
    /// updates would have reached the file.
    fn drop(&mut self) {
        let mut st = self.alloc.lock();
        if st.held() > 0 {
            let _ = self.flush_meta(&mut st);
        }
    }
}

/// A write transaction on one grain, under the extent's allocation lock.
pub struct GrainTx<'a> {
    ext: &'a SparseExtent,
    st: &'a mut AllocState,
    pub grain: u64,
    /// The grain's entry as of taking the lock.
    pub current: Gte,
}

impl GrainTx<'_> {
    /// Write a whole new grain with `data` and point the entry at it.
    pub fn allocate(&mut self, data: &[u8]) -> Result<()> {
        let e = self.ext;
        debug_assert_eq!(data.len() as u64, e.grain_bytes());
        let off = e.new_grain_offset(self.st)?;
        wr(&*e.file, &e.name, data, off)?;
        e.update_cowd_free(self.st)?;
        e.set_entry(self.st, self.grain, Gte::Data(off))?;
        if let Some(log) = &mut self.st.shrink_log {
            log.push((off, self.grain));
        }
        self.current = Gte::Data(off);
        Ok(())
    }

    /// Point the entry at a special value (zero, unmapped, unallocated).
    pub fn set(&mut self, g: Gte) -> Result<()> {
        self.ext.set_entry(self.st, self.grain, g)?;
        self.current = g;
        Ok(())
    }
}
