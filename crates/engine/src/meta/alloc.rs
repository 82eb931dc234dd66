//! Physical allocation: free grains per block, and a cursor per owner so a
//! disk's sequential writes land in sequential grains (DESIGN §4).

use std::collections::{BTreeSet, HashMap};

use strata_format::BLOCK_GRAINS;

use super::Meta;
use crate::error::{err, ErrorKind, Result};

/// Owner id used for the allocation cursor of map nodes.
pub(super) const META_OWNER: u64 = u64::MAX;
/// Partially free blocks scanned whole by one allocation, at most.
const PARTIAL_SCAN_BLOCKS_MAX: usize = 64;

/// The smallest pool end (a whole number of blocks) that holds `grain`:
/// what replaying a record that names `grain` raises the pool end to.
pub fn pool_end_covering(grain: u64) -> u64 {
    (grain + 1).div_ceil(BLOCK_GRAINS) * BLOCK_GRAINS
}

/// Free-space summary of the pool, rebuilt at open from the counts.
#[derive(Default)]
pub struct Allocator {
    /// Grains below this are in the pool; a multiple of BLOCK_GRAINS.
    pub(super) hwm: u64,
    block_free: Vec<u16>,
    free_blocks: BTreeSet<u64>,
    partial_blocks: BTreeSet<u64>,
    cursors: HashMap<u64, (u64, u64)>,
}

impl Allocator {
    pub fn new(hwm: u64) -> Self {
        Allocator {
            hwm,
            ..Default::default()
        }
    }

    pub(super) fn set_block_free(&mut self, block: u64, free: u16) {
        assert!(
            free as u64 <= BLOCK_GRAINS,
            "block {block}: {free} free grains"
        );
        self.block_free[block as usize] = free;
        if free as u64 == BLOCK_GRAINS {
            self.free_blocks.insert(block);
            self.partial_blocks.remove(&block);
        } else if free > 0 {
            self.free_blocks.remove(&block);
            self.partial_blocks.insert(block);
        } else {
            self.free_blocks.remove(&block);
            self.partial_blocks.remove(&block);
        }
    }

    /// One grain of `grain`'s block became free (+1) or taken (-1).
    pub(super) fn adjust(&mut self, grain: u64, delta: i32) {
        let b = grain / BLOCK_GRAINS;
        let f = self.block_free[b as usize] as i32 + delta;
        assert!(
            (0..=BLOCK_GRAINS as i32).contains(&f),
            "block {b}: free grains would become {f}"
        );
        self.set_block_free(b, f as u16);
    }

    /// Forget the summary and size it for `hwm` (open, before the scan).
    pub(super) fn reset(&mut self) {
        self.block_free = vec![0; (self.hwm / BLOCK_GRAINS) as usize];
        self.free_blocks.clear();
        self.partial_blocks.clear();
    }

    pub fn free_grains(&self) -> u64 {
        self.block_free.iter().map(|&f| f as u64).sum()
    }
}

impl Meta {
    fn allocatable(&mut self, g: u64) -> Result<bool> {
        Ok(g != 0 && g < self.alloc.hwm && !self.pending_set.contains(&g) && self.ref_get(g)? == 0)
    }

    fn take(&mut self, g: u64) -> Result<()> {
        self.ref_put(g, 1)?;
        self.alloc.adjust(g, -1);
        self.used_grains += 1;
        Ok(())
    }

    fn new_block(&mut self, capacity_grains: u64) -> Result<Option<u64>> {
        if let Some(&b) = self.alloc.free_blocks.iter().next() {
            return Ok(Some(b));
        }
        if self.alloc.hwm + BLOCK_GRAINS <= capacity_grains.max(BLOCK_GRAINS) {
            let b = self.alloc.hwm / BLOCK_GRAINS;
            let old = self.alloc.hwm;
            self.alloc.hwm += BLOCK_GRAINS;
            self.alloc.block_free.push(0);
            let free = if b == 0 {
                BLOCK_GRAINS - 1
            } else {
                BLOCK_GRAINS
            };
            self.alloc.set_block_free(b, free as u16);
            // Count pages covering the new grains are written by the next
            // checkpoint even if no count in them changes (FORMAT.md §4).
            self.materialize_ref_pages(old, self.alloc.hwm)?;
            return Ok(Some(b));
        }
        Ok(self.alloc.partial_blocks.iter().next().copied())
    }

    /// Allocate one grain for `owner`, next to `hint` when possible. The grain
    /// has count 1 in memory and nothing in the log until it is installed.
    pub fn alloc_grain(
        &mut self,
        owner: u64,
        hint: Option<u64>,
        capacity_grains: u64,
    ) -> Result<u64> {
        if let Some(h) = hint {
            let g = h + 1;
            if g % BLOCK_GRAINS != 0 && self.allocatable(g)? {
                self.take(g)?;
                return Ok(g);
            }
        }
        for _ in 0..4 {
            if let Some(&(b, next)) = self.alloc.cursors.get(&owner) {
                if (b as usize) < self.alloc.block_free.len()
                    && self.alloc.block_free[b as usize] > 0
                {
                    for i in next..BLOCK_GRAINS {
                        let g = b * BLOCK_GRAINS + i;
                        if self.allocatable(g)? {
                            self.take(g)?;
                            self.alloc.cursors.insert(owner, (b, i + 1));
                            return Ok(g);
                        }
                    }
                }
            }
            let Some(b) = self.new_block(capacity_grains)? else {
                break;
            };
            self.alloc.cursors.insert(owner, (b, 0));
        }
        // Last resort: any partially free block, scanned whole.
        let partial: Vec<u64> = self
            .alloc
            .partial_blocks
            .iter()
            .copied()
            .take(PARTIAL_SCAN_BLOCKS_MAX)
            .collect();
        for b in partial {
            for i in 0..BLOCK_GRAINS {
                let g = b * BLOCK_GRAINS + i;
                if self.allocatable(g)? {
                    self.take(g)?;
                    self.alloc.cursors.insert(owner, (b, i + 1));
                    return Ok(g);
                }
            }
        }
        err(ErrorKind::NoSpace, "no free grain left in the datastore")
    }

    /// Undo an allocation that was never installed (its write failed).
    pub fn abort_alloc(&mut self, g: u64) -> Result<()> {
        assert_eq!(
            self.ref_get(g)?,
            1,
            "grain {g}: an aborted allocation has count 1"
        );
        self.ref_put(g, 0)?;
        self.alloc.adjust(g, 1);
        self.used_grains -= 1;
        Ok(())
    }
}
