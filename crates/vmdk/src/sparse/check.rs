//! `vmdk check`: verify an extent's directories, tables and grains; with
//! repair, fix what needs no guessing (through the write side in `alloc`).

use std::collections::HashMap;

use super::entry::Gte;
use super::extent::SparseExtent;
use super::header::{Header, KdmvHeader, SECTOR};
use super::io::{rd, wr};
use crate::error::Result;

/// What `check` found in one extent (serialised as is by `vmdk check --json`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ExtentCheck {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub repaired: Vec<String>,
    pub allocated_grains: u64,
    pub zero_grains: u64,
    pub unmapped_grains: u64,
}

impl SparseExtent {
    /// Byte offset where grain data may start (below: headers and tables).
    fn data_start_bytes(&self) -> u64 {
        match self.header {
            Header::Kdmv(h) => h.overhead.saturating_mul(SECTOR),
            Header::Cowd(_) => self.geometry.gd_offset_bytes,
            Header::SeSparse(s) => s.grains.0 * SECTOR,
        }
    }

    /// Verify tables and grains; with `repair`, fix what needs no guessing.
    #[expect(clippy::too_many_lines)]
    pub fn check(&self, repair: bool) -> Result<ExtentCheck> {
        let mut r = ExtentCheck::default();
        let len = self
            .file
            .len()
            .map_err(|e| crate::error::io(&self.name, e))?;
        let gb = self.grain_bytes();
        let data_start = self.data_start_bytes();
        if let Header::Kdmv(h) = self.header {
            if h.unclean {
                r.warnings.push("the unclean-shutdown flag is set".into());
                if repair && self.writable {
                    let mut h2 = h;
                    h2.unclean = false;
                    let at = KdmvHeader::UNCLEAN_BYTE;
                    wr(&*self.file, &self.name, &h2.encode()[at..at + 1], at as u64)?;
                    r.repaired.push("cleared the unclean-shutdown flag".into());
                }
            }
        }
        let gd_len = self.gd.read().len() as u64;
        let mut owners: HashMap<u64, u64> = HashMap::new();
        let mut doubles: Vec<(u64, u64)> = Vec::new();
        let mut table_offsets: HashMap<u64, u64> = HashMap::new();
        for l1 in 0..gd_len {
            let raw = self.gd.read()[l1 as usize];
            // Redundant directory agreement (KDMV).
            if self.geometry.rgd_offset_bytes.is_some() {
                let rraw = self.rgd.read()[l1 as usize];
                if (raw == 0) != (rraw == 0) {
                    r.errors.push(format!(
                        "grain directory entry {l1} and its redundant copy disagree about whether a table exists"
                    ));
                }
            }
            let off = match self.gt_offset(raw, l1) {
                Ok(Some(o)) => o,
                Ok(None) => continue,
                Err(e) => {
                    r.errors.push(e.message);
                    continue;
                }
            };
            let tb = self.geometry.gt_bytes();
            if off + tb > len {
                r.errors.push(format!(
                    "grain table {l1} at byte {off} lies past the end of the file"
                ));
                continue;
            }
            if off < 512 {
                r.errors.push(format!(
                    "grain table {l1} at byte {off} overlaps the header"
                ));
                continue;
            }
            if let Some(other) = table_offsets.insert(off, l1) {
                r.errors.push(format!(
                    "grain tables {other} and {l1} are the same table at byte {off}"
                ));
            }
            let Some((_, t)) = self.gt(l1)? else { continue };
            for (l2, &e) in t.iter().enumerate() {
                let grain = l1 * self.geometry.gt_entries + l2 as u64;
                if grain >= self.grains() {
                    if e != 0 {
                        r.warnings.push(format!(
                            "grain table entry for grain {grain}, past the capacity, is set"
                        ));
                    }
                    continue;
                }
                let g = match self.decode(e) {
                    Ok(g) => g,
                    Err(err) => {
                        r.errors.push(format!("grain {grain}: {}", err.message));
                        continue;
                    }
                };
                match g {
                    Gte::Unalloc => {}
                    Gte::Zero => r.zero_grains += 1,
                    Gte::Unmapped => r.unmapped_grains += 1,
                    Gte::Data(o) | Gte::Compressed(o) => {
                        r.allocated_grains += 1;
                        let end = if matches!(g, Gte::Data(_)) {
                            o + gb
                        } else {
                            o + 12
                        };
                        if o < data_start {
                            r.errors.push(format!("grain {grain} at byte {o} overlaps the metadata (grains start at {data_start})"));
                            continue;
                        }
                        if o >= len {
                            r.errors.push(format!("grain {grain} at byte {o} lies past the end of the {len}-byte file"));
                            if repair && self.writable {
                                let replacement = if self.has_zero_entries() {
                                    Gte::Zero
                                } else {
                                    Gte::Unalloc
                                };
                                let mut st = self.alloc.lock();
                                self.set_entry(&mut st, grain, replacement)?;
                                r.repaired.push(format!(
                                    "grain {grain}: its data was never written; now {}",
                                    if replacement == Gte::Zero {
                                        "a zero grain"
                                    } else {
                                        "unallocated"
                                    }
                                ));
                            }
                            continue;
                        }
                        if end > len {
                            r.errors.push(format!(
                                "grain {grain} at byte {o} is cut short by the end of the file"
                            ));
                            if repair && self.writable {
                                self.file
                                    .set_len(end)
                                    .map_err(|e| crate::error::io(&self.name, e))?;
                                r.repaired.push(format!(
                                    "grain {grain}: extended the file with zeros to hold it"
                                ));
                            }
                        }
                        if let Some(first) = owners.insert(o, grain) {
                            r.errors.push(format!(
                                "grains {first} and {grain} both use the data at byte {o}"
                            ));
                            doubles.push((grain, o));
                        }
                    }
                }
            }
        }
        if repair && self.writable && !self.compressed() {
            for (grain, o) in doubles {
                // Both grains read the same bytes now; give the second its own copy.
                let mut buf = vec![0u8; gb as usize];
                rd(&*self.file, &self.name, &mut buf, o)?;
                self.with_grain(grain, |tx| tx.allocate(&buf))?;
                r.repaired.push(format!(
                    "grain {grain}: copied the shared data to a grain of its own"
                ));
            }
        }
        if repair && !r.repaired.is_empty() {
            self.sync()?;
        }
        Ok(r)
    }
}
