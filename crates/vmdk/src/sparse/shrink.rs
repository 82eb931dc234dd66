//! SEsparse wipe-shrink: give the space of all-zero and unmapped grains
//! back to the file system, crash-safely (docs/FORMAT.md §9.3, Shrink).

use std::collections::{HashMap, HashSet};

use strata_api::ShrinkReport;

use super::entry::Gte;
use super::extent::SparseExtent;
use super::header::{Header, SECTOR};
use super::held::AllocState;
use super::io::{rd, wr};
use crate::error::Result;

impl SparseExtent {
    /// Turn all-zero grains into zero entries, move the last grains into
    /// the holes, and truncate the file. Crash-safe: copies are synced
    /// before entries change, entries before truncation.
    pub fn shrink(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<ShrinkReport> {
        let Header::SeSparse(se) = self.header else {
            return Err(crate::error::unsupported(
                &self.name,
                "shrink is for SEsparse extents",
            ));
        };
        if !self.writable {
            return Err(self.readonly());
        }
        let mut st = self.alloc.lock();
        let gb = self.grain_bytes();
        let gstart = se.grains.0 * SECTOR;
        let mut rep = ShrinkReport {
            bytes_before: self
                .file
                .len()
                .map_err(|e| crate::error::io(&self.name, e))?,
            ..Default::default()
        };
        // 1. Find allocated grains; zero ones become zero entries.
        let total = self.grains();
        let mut used = self.shrink_scan(&mut st, gstart, &mut rep, progress)?;
        let mut buf = vec![0u8; gb as usize];
        rep.grains_before = st.next_bytes.saturating_sub(gstart) / gb;
        self.flush_meta(&mut st)?;
        // 2. Move the highest grains into the lowest holes.
        let n = used.len() as u64;
        used.sort_unstable();
        let mut holes = {
            let taken: HashSet<u64> = used.iter().map(|u| u.0).collect();
            (0..n)
                .filter(|i| !taken.contains(i))
                .collect::<Vec<_>>()
                .into_iter()
        };
        let moving: Vec<(u64, u64)> = used.iter().copied().filter(|&(i, _)| i >= n).collect();
        let mut moves = Vec::with_capacity(moving.len());
        for (k, (idx, grain)) in moving.into_iter().enumerate() {
            if k % 256 == 0 {
                progress(total + k as u64, total * 2);
            }
            let to = holes
                .next()
                .ok_or_else(|| self.err("shrink: ran out of holes"))?;
            rd(&*self.file, &self.name, &mut buf, gstart + idx * gb)?;
            wr(&*self.file, &self.name, &buf, gstart + to * gb)?;
            moves.push((grain, to));
        }
        self.flush_meta(&mut st)?;
        // 3. Point the entries at the copies.
        for &(grain, to) in &moves {
            self.set_entry(&mut st, grain, Gte::Data(gstart + to * gb))?;
        }
        self.flush_meta(&mut st)?;
        // 4. Truncate after the last used grain.
        let new_len = gstart + n * gb;
        self.file
            .set_len(new_len)
            .map_err(|e| crate::error::io(&self.name, e))?;
        self.flush_meta(&mut st)?;
        st.next_bytes = new_len;
        st.se_free.clear();
        rep.moved = moves.len() as u64;
        rep.grains_after = n;
        rep.bytes_after = new_len;
        progress(total * 2, total * 2);
        Ok(rep)
    }

    /// Shrink's first pass over the grain table: every data grain as (its
    /// index in the grain area, its grain number). An all-zero grain
    /// becomes a zero entry (counted in `rep`), an unmapped entry still
    /// naming its old grain forgets it, and two grains on one index are
    /// refused (`check --repair` first).
    fn shrink_scan(
        &self,
        st: &mut AllocState,
        gstart: u64,
        rep: &mut ShrinkReport,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Vec<(u64, u64)>> {
        let gb = self.grain_bytes();
        let total = self.grains();
        let mut used = Vec::new();
        let mut buf = vec![0u8; gb as usize];
        let mut seen: HashMap<u64, u64> = HashMap::new();
        for grain in 0..total {
            if grain % 4096 == 0 {
                progress(grain, total * 2);
            }
            let raw = self.raw_entry(grain)?;
            if raw >> 60 == 1 && raw != 1 << 60 {
                // An unmapped entry still naming its old grain: forget it.
                self.set_entry(st, grain, Gte::Unmapped)?;
            }
            if let Gte::Data(o) = self.decode(raw)? {
                rd(&*self.file, &self.name, &mut buf, o)?;
                if buf.iter().all(|&b| b == 0) {
                    self.set_entry(st, grain, Gte::Zero)?;
                    rep.zero_grains_found += 1;
                    continue;
                }
                let idx = (o - gstart) / gb;
                if let Some(other) = seen.insert(idx, grain) {
                    return Err(self.err(format!(
                        "grains {other} and {grain} share grain index {idx}; run `strata vmdk check --repair` first"
                    )));
                }
                used.push((idx, grain));
            }
        }
        Ok(used)
    }
}

/// Grains one online scan step looks at, and grains one move step moves:
/// the most a client request waits for (docs/FORMAT.md §9.3, Online shrink).
pub const ONLINE_SCAN_GRAINS: u64 = 1024;
pub const ONLINE_MOVE_GRAINS: usize = 64;

/// No grain in this slot.
const FREE: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Scan,
    Move,
    Done,
}

/// An SEsparse shrink run step by step while the extent is served. The
/// caller (the chain) holds its I/O lock exclusively around each step.
pub struct OnlineShrink {
    /// Slot index → grain whose entry names it (`FREE` if none): a
    /// superset of the used slots.
    slots: Vec<u64>,
    /// Next grain to scan.
    next_grain: u64,
    /// Every slot below this is taken (the lowest hole is at or above it).
    lo: u64,
    /// Slots to move, as estimated when the scan ended (for progress).
    to_move: u64,
    phase: Phase,
    rep: ShrinkReport,
}

impl OnlineShrink {
    pub fn report(&self) -> ShrinkReport {
        self.rep
    }
}

impl SparseExtent {
    /// Start an online shrink: from now on allocations are logged for it.
    pub fn online_shrink_begin(&self) -> Result<OnlineShrink> {
        let Header::SeSparse(se) = self.header else {
            return Err(crate::error::unsupported(
                &self.name,
                "shrink is for SEsparse extents",
            ));
        };
        if !self.writable {
            return Err(self.readonly());
        }
        let mut st = self.alloc.lock();
        let gstart = se.grains.0 * SECTOR;
        let rep = ShrinkReport {
            bytes_before: self
                .file
                .len()
                .map_err(|e| crate::error::io(&self.name, e))?,
            grains_before: st.next_bytes.saturating_sub(gstart) / self.grain_bytes(),
            ..Default::default()
        };
        st.shrink_log = Some(Vec::new());
        Ok(OnlineShrink {
            slots: Vec::new(),
            next_grain: 0,
            lo: 0,
            to_move: 0,
            phase: Phase::Scan,
            rep,
        })
    }

    /// Stop logging allocations (after an error; a finished shrink stops
    /// by itself). What was done stays done: every step is complete.
    pub fn online_shrink_abort(&self) {
        self.alloc.lock().shrink_log = None;
    }

    /// One bounded step. Returns the bytes it read or copied, or `None`
    /// once the file is truncated and the shrink is over.
    #[expect(clippy::too_many_lines)]
    pub fn online_shrink_step(
        &self,
        sh: &mut OnlineShrink,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Option<u64>> {
        let Header::SeSparse(se) = self.header else {
            return Err(self.err("online shrink of a non-SEsparse extent"));
        };
        let gb = self.grain_bytes();
        let gstart = se.grains.0 * SECTOR;
        let total = self.grains();
        let mut st = self.alloc.lock();
        // Grains clients allocated since the last step.
        for (off, grain) in st
            .shrink_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
        {
            let idx = ((off - gstart) / gb) as usize;
            if idx >= sh.slots.len() {
                sh.slots.resize(idx + 1, FREE);
            }
            sh.slots[idx] = grain;
        }
        match sh.phase {
            Phase::Done => Ok(None),
            Phase::Scan => {
                let end = (sh.next_grain + ONLINE_SCAN_GRAINS).min(total);
                let mut buf = vec![0u8; gb as usize];
                let mut bytes = 0;
                for grain in sh.next_grain..end {
                    let raw = self.raw_entry(grain)?;
                    if raw >> 60 == 1 && raw != 1 << 60 {
                        self.set_entry(&mut st, grain, Gte::Unmapped)?;
                    }
                    let Gte::Data(o) = self.decode(raw)? else {
                        continue;
                    };
                    rd(&*self.file, &self.name, &mut buf, o)?;
                    bytes += gb;
                    if buf.iter().all(|&b| b == 0) {
                        self.set_entry(&mut st, grain, Gte::Zero)?;
                        sh.rep.zero_grains_found += 1;
                        continue;
                    }
                    let idx = ((o - gstart) / gb) as usize;
                    if idx >= sh.slots.len() {
                        sh.slots.resize(idx + 1, FREE);
                    }
                    let other = sh.slots[idx];
                    if other != FREE && other != grain && self.lookup(other)? == Gte::Data(o) {
                        return Err(self.err(format!(
                            "grains {other} and {grain} share grain index {idx}; run `strata vmdk check --repair` first"
                        )));
                    }
                    sh.slots[idx] = grain;
                }
                sh.next_grain = end;
                if end == total {
                    // No entry on disk may still name a slot that is free
                    // in memory: holes are chosen among those. (Client frees
                    // after this only free slots the map still counts as
                    // used, which are never holes; see FORMAT.md §9.3.)
                    self.flush_meta(&mut st)?;
                    sh.phase = Phase::Move;
                    let used = sh.slots.iter().filter(|&&g| g != FREE).count();
                    sh.to_move = sh.slots[used.min(sh.slots.len())..]
                        .iter()
                        .filter(|&&g| g != FREE)
                        .count() as u64;
                }
                progress(end, total * 2);
                Ok(Some(bytes))
            }
            Phase::Move => {
                let mut moves: Vec<(u64, u64, u64)> = Vec::new(); // (grain, from, to)
                let mut filled: HashSet<u64> = HashSet::new();
                while moves.len() < ONLINE_MOVE_GRAINS {
                    while sh.slots.last() == Some(&FREE) {
                        sh.slots.pop();
                    }
                    let Some(&grain) = sh.slots.last() else { break };
                    let hi = sh.slots.len() as u64 - 1;
                    // A slot this step fills has no entry naming it yet.
                    if !filled.contains(&hi) && self.lookup(grain)? != Gte::Data(gstart + hi * gb) {
                        sh.slots[hi as usize] = FREE; // freed by a client since
                        continue;
                    }
                    while sh.lo < hi && sh.slots[sh.lo as usize] != FREE {
                        sh.lo += 1;
                    }
                    if sh.lo >= hi {
                        break;
                    }
                    sh.slots[sh.lo as usize] = grain;
                    sh.slots[hi as usize] = FREE;
                    filled.insert(sh.lo);
                    moves.push((grain, hi, sh.lo));
                }
                if moves.is_empty() {
                    return self.online_shrink_truncate(sh, &mut st, gstart, progress);
                }
                // Copy, make the copies durable, then point the entries at them.
                let mut buf = vec![0u8; gb as usize];
                for &(_, from, to) in &moves {
                    rd(&*self.file, &self.name, &mut buf, gstart + from * gb)?;
                    wr(&*self.file, &self.name, &buf, gstart + to * gb)?;
                }
                self.flush_meta(&mut st)?;
                for &(grain, _, to) in &moves {
                    self.set_entry(&mut st, grain, Gte::Data(gstart + to * gb))?;
                }
                self.flush_meta(&mut st)?;
                st.se_free.retain(|i| !filled.contains(i));
                sh.rep.moved += moves.len() as u64;
                let total2 = total * 2;
                let done = total + (sh.rep.moved * total / sh.to_move.max(1)).min(total - 1);
                progress(done, total2);
                Ok(Some(moves.len() as u64 * gb * 2))
            }
        }
    }

    /// The last step: cut the file after the highest used slot.
    fn online_shrink_truncate(
        &self,
        sh: &mut OnlineShrink,
        st: &mut super::held::AllocState,
        gstart: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Option<u64>> {
        let gb = self.grain_bytes();
        let n = sh.slots.len() as u64;
        let new_len = gstart + n * gb;
        let len = self
            .file
            .len()
            .map_err(|e| crate::error::io(&self.name, e))?;
        self.flush_meta(st)?;
        if new_len < len {
            self.file
                .set_len(new_len)
                .map_err(|e| crate::error::io(&self.name, e))?;
            self.flush_meta(st)?;
        }
        st.next_bytes = new_len;
        st.se_free.clear();
        st.shrink_log = None;
        sh.phase = Phase::Done;
        sh.rep.grains_after = n;
        sh.rep.bytes_after = new_len.min(len);
        progress(self.grains() * 2, self.grains() * 2);
        Ok(None)
    }
}
