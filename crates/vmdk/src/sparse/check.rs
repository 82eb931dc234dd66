//! `vmdk check`: verify an extent's directories, tables and grains; with
//! repair, fix what needs no guessing (through the write side in `alloc`).

use std::collections::HashMap;

use strata_api::ExtentCheck;

use super::entry::Gte;
use super::extent::SparseExtent;
use super::header::{Header, KdmvHeader, SECTOR};
use super::io::{rd, wr};
use crate::error::Result;

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
    pub fn check(&self, repair: bool) -> Result<ExtentCheck> {
        let mut r = ExtentCheck::default();
        let len = self
            .file
            .len()
            .map_err(|e| crate::error::io(&self.name, e))?;
        let gb = self.grain_bytes();
        self.check_unclean(&mut r, repair)?;
        let gd_len = self.gd.read().len() as u64;
        let mut owners = Owners {
            file_len: len,
            repair,
            by_offset: HashMap::new(),
            doubles: Vec::new(),
        };
        let mut table_offsets: HashMap<u64, u64> = HashMap::new();
        for l1 in 0..gd_len {
            if !self.table_in_place(&mut r, l1, len, &mut table_offsets) {
                continue;
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
                    Gte::Data(_) | Gte::Compressed(_) => {
                        r.allocated_grains += 1;
                        self.check_grain_data(&mut r, &mut owners, grain, g)?;
                    }
                }
            }
        }
        if repair && self.writable && !self.compressed() {
            for &(grain, o) in &owners.doubles {
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

    /// `check` of a KDMV header's unclean-shutdown flag, which `repair`
    /// clears.
    fn check_unclean(&self, r: &mut ExtentCheck, repair: bool) -> Result<()> {
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
        Ok(())
    }

    /// `check` of grain directory entry `l1`: its redundant copy agrees,
    /// and the table it names lies in the `len`-byte file, past the
    /// header, shared with no other entry (`seen`: table offsets by
    /// entry). False when there is no table to read.
    fn table_in_place(
        &self,
        r: &mut ExtentCheck,
        l1: u64,
        len: u64,
        seen: &mut HashMap<u64, u64>,
    ) -> bool {
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
            Ok(None) => return false,
            Err(e) => {
                r.errors.push(e.message);
                return false;
            }
        };
        let tb = self.geometry.gt_bytes();
        if off + tb > len {
            r.errors.push(format!(
                "grain table {l1} at byte {off} lies past the end of the file"
            ));
            return false;
        }
        if off < 512 {
            r.errors.push(format!(
                "grain table {l1} at byte {off} overlaps the header"
            ));
            return false;
        }
        if let Some(other) = seen.insert(off, l1) {
            r.errors.push(format!(
                "grain tables {other} and {l1} are the same table at byte {off}"
            ));
        }
        true
    }

    /// `check` of one data or compressed grain: inside the grain area,
    /// wholly in the file (with `repair`, a grain never written becomes
    /// zero or unallocated, one cut short is padded with zeros), and its
    /// bytes used by no other grain.
    fn check_grain_data(
        &self,
        r: &mut ExtentCheck,
        owners: &mut Owners,
        grain: u64,
        g: Gte,
    ) -> Result<()> {
        let (o, end) = match g {
            Gte::Data(o) => (o, o + self.grain_bytes()),
            Gte::Compressed(o) => (o, o + 12),
            _ => return Ok(()),
        };
        let (len, repair) = (owners.file_len, owners.repair);
        let data_start = self.data_start_bytes();
        if o < data_start {
            r.errors.push(format!(
                "grain {grain} at byte {o} overlaps the metadata (grains start at {data_start})"
            ));
            return Ok(());
        }
        if o >= len {
            r.errors.push(format!(
                "grain {grain} at byte {o} lies past the end of the {len}-byte file"
            ));
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
            return Ok(());
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
        if let Some(first) = owners.by_offset.insert(o, grain) {
            r.errors.push(format!(
                "grains {first} and {grain} both use the data at byte {o}"
            ));
            owners.doubles.push((grain, o));
        }
        Ok(())
    }
}

/// What `check` knows of the file's data: its length, whether to repair,
/// the data offsets seen so far by the grain that uses each, and the
/// grains found using an offset another grain used first.
struct Owners {
    file_len: u64,
    repair: bool,
    by_offset: HashMap<u64, u64>,
    doubles: Vec<(u64, u64)>,
}
