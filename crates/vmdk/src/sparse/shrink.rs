//! SEsparse wipe-shrink: give the space of all-zero and unmapped grains
//! back to the file system, crash-safely (docs/FORMAT.md §9.3, Shrink).

use std::collections::{HashMap, HashSet};

use super::entry::Gte;
use super::extent::SparseExtent;
use super::header::{Header, SECTOR};
use super::io::{rd, wr};
use crate::error::{Result, VmdkError};

/// What `shrink` did (serialised as is by `vmdk shrink --json`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ShrinkReport {
    pub grains_before: u64,
    pub grains_after: u64,
    pub zero_grains_found: u64,
    pub moved: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

impl SparseExtent {
    /// Turn all-zero grains into zero entries, move the last grains into
    /// the holes, and truncate the file. Crash-safe: copies are synced
    /// before entries change, entries before truncation.
    pub fn shrink(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<ShrinkReport> {
        let Header::SeSparse(se) = self.header else {
            return Err(VmdkError::unsupported(
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
            bytes_before: self.file.len().map_err(|e| VmdkError::io(&self.name, e))?,
            ..Default::default()
        };
        // 1. Find allocated grains; zero ones become zero entries.
        let mut used: Vec<(u64, u64)> = Vec::new(); // (index, grain)
        let total = self.grains();
        let mut buf = vec![0u8; gb as usize];
        let mut seen: HashMap<u64, u64> = HashMap::new();
        for grain in 0..total {
            if grain % 4096 == 0 {
                progress(grain, total * 2);
            }
            let raw = self.raw_entry(grain)?;
            if raw >> 60 == 1 && raw != 1 << 60 {
                // An unmapped entry still naming its old grain: forget it.
                self.set_entry(&mut st, grain, Gte::Unmapped)?;
            }
            if let Gte::Data(o) = self.decode(raw)? {
                rd(&*self.file, &self.name, &mut buf, o)?;
                if buf.iter().all(|&b| b == 0) {
                    self.set_entry(&mut st, grain, Gte::Zero)?;
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
            .map_err(|e| VmdkError::io(&self.name, e))?;
        self.flush_meta(&mut st)?;
        st.next_bytes = new_len;
        st.se_free.clear();
        rep.moved = moves.len() as u64;
        rep.grains_after = n;
        rep.bytes_after = new_len;
        progress(total * 2, total * 2);
        Ok(rep)
    }
}
