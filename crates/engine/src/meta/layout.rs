//! Layout (docs/FORMAT.md §10): how a disk's grains lie in the pool
//! (fragments), how the pool's free space lies (free extents), and moving a
//! data grain to another place while every map that shares it follows.

use strata_format::{BLOCK_GRAINS, MAP_FANOUT, MAP_FANOUT_SHIFT};

use super::Meta;
use crate::error::Result;

/// Free-run size classes of `free_extent_histogram`, in grains: 1, 2–15
/// (< 64 KiB, never punched), 16–255 (< 1 MiB), 256–4095 (< 16 MiB), more.
pub const FREE_EXTENT_CLASSES: [(&str, u64); 5] = [
    ("4k", 1),
    ("8k-60k", 2),
    ("64k-1020k", 16),
    ("1m-16m", 256),
    ("16m+", 4096),
];

/// Running state of a fragments walk (FORMAT.md §10.1).
#[derive(Debug, Default, Clone, Copy)]
pub struct Fragments {
    /// The pool grain of the last mapped grain seen.
    last: Option<u64>,
    pub fragments: u64,
    pub mapped: u64,
}

impl Fragments {
    /// Count mapped grain `g`, the next in logical order.
    pub fn push(&mut self, g: u64) {
        if self.last.map(|l| l + 1) != Some(g) {
            self.fragments += 1;
        }
        self.last = Some(g);
        self.mapped += 1;
    }
}

/// Running state of a free-extents scan (FORMAT.md §10.1).
#[derive(Debug, Default, Clone)]
pub struct FreeExtents {
    run: u64,
    pub extents: u64,
    pub free_grains: u64,
    /// Runs per class of [`FREE_EXTENT_CLASSES`].
    pub histogram: [u64; 5],
}

impl FreeExtents {
    fn grain(&mut self, free: bool) {
        if free {
            self.run += 1;
            self.free_grains += 1;
        } else {
            self.end_run();
        }
    }

    fn whole_block(&mut self) {
        self.run += BLOCK_GRAINS;
        self.free_grains += BLOCK_GRAINS;
    }

    /// Close the run in progress (at a used grain, or at the pool end).
    pub fn end_run(&mut self) {
        if self.run > 0 {
            self.extents += 1;
            let class = FREE_EXTENT_CLASSES
                .iter()
                .rposition(|&(_, min)| self.run >= min)
                .unwrap_or(0);
            self.histogram[class] += 1;
            self.run = 0;
        }
    }
}

impl Meta {
    /// Count the mapped grains of `[start, end)` of version `ver` into `acc`.
    pub fn fragments_step(
        &mut self,
        ver: u64,
        start: u64,
        end: u64,
        acc: &mut Fragments,
    ) -> Result<()> {
        self.walk(ver, start, end, &mut |_, _, g| {
            if g != 0 {
                acc.push(g)
            }
        })
    }

    /// Scan blocks `[b0, b1)` of the pool (clamped to the pool end) into
    /// `acc`. Returns the block after the last one scanned.
    pub fn free_extents_step(&mut self, b0: u64, b1: u64, acc: &mut FreeExtents) -> Result<u64> {
        let end = b1.min(self.alloc.hwm / BLOCK_GRAINS);
        for b in b0..end {
            if b > 0 && u64::from(self.alloc.block_free[b as usize]) == BLOCK_GRAINS {
                acc.whole_block();
                continue;
            }
            for g in b * BLOCK_GRAINS..(b + 1) * BLOCK_GRAINS {
                // Grain 0 is never allocated, and never free either.
                acc.grain(g != 0 && self.ref_get(g)? == 0);
            }
        }
        Ok(end.max(b0))
    }

    /// Blocks in the pool.
    pub fn pool_blocks(&self) -> u64 {
        self.alloc.hwm / BLOCK_GRAINS
    }

    /// The distinct leaves, over every version (heads, snapshots, orphans),
    /// whose entry for virtual grain `v` is `g`: (leaf grain, index).
    fn leaves_naming(&mut self, v: u64, g: u64) -> Result<Vec<(u64, usize)>> {
        let mut out: Vec<(u64, usize)> = Vec::new();
        for ver in self.version_ids() {
            let st = self.version(ver)?;
            if st.root == 0 || v >> (MAP_FANOUT_SHIFT * st.levels as u32) != 0 {
                continue;
            }
            let mut node = st.root;
            for level in (1..st.levels).rev() {
                let idx = ((v >> (MAP_FANOUT_SHIFT * level as u32)) as usize) & (MAP_FANOUT - 1);
                node = self.node(node, level)?[idx];
                if node == 0 {
                    break;
                }
            }
            if node == 0 {
                continue;
            }
            let idx = (v as usize) & (MAP_FANOUT - 1);
            if self.node(node, 0)?[idx] == g && !out.contains(&(node, idx)) {
                out.push((node, idx));
            }
        }
        Ok(out)
    }

    /// Move data grain `g`, mapped at virtual grain `v`, to `to` (allocated
    /// by `alloc_grain`, its bytes already a copy of `g`'s): every leaf that
    /// names `g` names `to` instead, `to` takes `g`'s count and `g` is
    /// freed (FORMAT.md §10.2). Returns false, changing nothing, when the
    /// leaves found do not account for `g`'s whole count; the caller then
    /// gives `to` back.
    pub fn move_grain(&mut self, v: u64, g: u64, to: u64) -> Result<bool> {
        let count = self.ref_get(g)?;
        let leaves = self.leaves_naming(v, g)?;
        if count == 0 || leaves.len() as u64 != u64::from(count) {
            return Ok(false);
        }
        for &(leaf, idx) in &leaves {
            self.node_set(leaf, 0, idx, to)?;
        }
        self.ref_set(to, count)?;
        if count > 1 {
            self.ref_set(g, 1)?;
        }
        self.decref(g, None)?;
        Ok(true)
    }
}
