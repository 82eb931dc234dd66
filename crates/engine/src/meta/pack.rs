//! The metadata side of the pack pass (docs/FORMAT.md §18.5, §18.8):
//! contiguous grains for a stream, and one region's entries pointed at
//! the streams, with their counts, in one batch.

use strata_format::{leaf_entry, LEAF_PACKED, LEAF_SPILLS, MAP_FANOUT};

use super::{corrupt, Meta, Place, SpanLeaves};
use crate::error::Result;

/// The allocator's owner for stream grains (its cursor).
const PACK_OWNER: u64 = u64::MAX - 2;

/// One raw grain to be read through a stream from now on: at virtual
/// grain `v`, grain `from` becomes the fragment starting in stream grain
/// `into` (and continuing into `into + 1` when it `spills`). With
/// `repack`, `from` is itself a stream grain, where the fragment holding
/// `v` starts now, moved as it is (§18.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packing {
    pub v: u64,
    pub from: u64,
    pub into: u64,
    pub spills: bool,
    pub repack: bool,
}

impl Meta {
    /// Up to `want` consecutive free grains for a stream, the first after
    /// `hint` when it can: (first grain, how many). Each has count 1 in
    /// memory, as from `alloc_grain`, until the stream is installed or
    /// given back.
    pub fn alloc_stream(&mut self, want: u64, hint: Option<u64>, cap: u64) -> Result<(u64, u64)> {
        let g0 = self.alloc_grain(PACK_OWNER, hint, cap, Place::Any)?;
        let mut got = 1;
        while got < want {
            let g = g0 + got;
            let took = if g.is_multiple_of(strata_format::BLOCK_GRAINS) {
                self.alloc_block_start(g, cap)?.is_some()
            } else if self.allocatable(g)? {
                self.take(g)?;
                true
            } else {
                false
            };
            if !took {
                break;
            }
            got += 1;
        }
        Ok((g0, got))
    }

    /// How many leaf entries name stream grain `g` at `v` (packed: what
    /// a repack of its fragment there moves, §18.10).
    /// The leaves covering `v` are taken from `memo`.
    pub fn packed_naming(&mut self, memo: &mut SpanLeaves, v: u64, g: u64) -> Result<u32> {
        Ok(self.packed_leaves_naming(memo, v, g)?.len() as u32)
    }

    /// The leaves naming stream grain `g` at `v` with the packed flag, as
    /// `leaves_naming` gives them.
    fn packed_leaves_naming(
        &mut self,
        memo: &mut SpanLeaves,
        v: u64,
        g: u64,
    ) -> Result<Vec<(u64, usize, u8)>> {
        let mut packed = Vec::new();
        for l in self.leaves_naming_in(memo, v, g)? {
            if strata_format::leaf_packed(self.node(l.0, 0)?[l.1]) {
                packed.push(l);
            }
        }
        Ok(packed)
    }

    /// Point every entry naming each packing's `from` at its `v` to its
    /// `into` (packed flag set, the spill bit where it spills, key index
    /// kept), set the stream grains' counts (`counts[i]` for `stream + i`:
    /// the entries that will reference it) and free the raw grains; a
    /// repacked fragment's old entries each release what they named (its
    /// old stream grain, and the next one where it spilled). First checks
    /// that the leaves naming each raw `from` at `v` account for its
    /// whole count, and that some packed entry still names each repacked
    /// one; if one does not, nothing changes and false is returned.
    pub fn install_packed(
        &mut self,
        stream: u64,
        counts: &[u32],
        packs: &[Packing],
    ) -> Result<bool> {
        // The leaves naming each raw grain, found once: checked here,
        // changed below.
        let mut naming = Vec::with_capacity(packs.len());
        let memo = &mut SpanLeaves::default();
        for p in packs {
            // A repacked fragment's old stream grain keeps its count
            // (its entries release it below); a raw grain's is read.
            let (count, leaves, accounted) = if p.repack {
                let leaves = self.packed_leaves_naming(memo, p.v, p.from)?;
                let named = !leaves.is_empty();
                (0, leaves, named)
            } else {
                let count = self.ref_get(p.from)?;
                let leaves = self.leaves_naming_in(memo, p.v, p.from)?;
                let whole = count != 0 && leaves.len() as u64 == u64::from(count);
                (count, leaves, whole)
            };
            if !accounted {
                return Ok(false);
            }
            naming.push((count, leaves));
        }
        for (i, &w) in counts.iter().enumerate() {
            if w == 0 {
                return Err(corrupt(format!(
                    "stream grain {} would have no reference",
                    stream + i as u64
                )));
            }
            self.ref_set(stream + i as u64, w)?;
        }
        for (p, (count, leaves)) in packs.iter().zip(naming) {
            let idx = (p.v as usize) & (MAP_FANOUT - 1);
            for &(leaf, _, key) in &leaves {
                let spill = if p.spills { LEAF_SPILLS } else { 0 };
                let e = leaf_entry(p.into, key) | LEAF_PACKED | spill;
                let old = self.node_set(leaf, 0, idx, e)?;
                if p.repack {
                    self.decref(old, None)?;
                }
            }
            if p.repack {
                continue;
            }
            if count > 1 {
                self.ref_set(p.from, 1)?;
            }
            self.decref(p.from, None)?;
        }
        Ok(true)
    }
}
