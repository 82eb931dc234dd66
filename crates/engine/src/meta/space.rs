//! What dropping versions would free, computed without changing anything
//! (docs/FORMAT.md §7, "exclusive bytes").
//!
//! Dropping a version takes one reference from its root; a grain is freed
//! when its count reaches zero, and a freed node drops one reference from
//! each child. The simulation replays that with a map of pending
//! decrements instead of the counts themselves: a grain is freed iff the
//! references taken from it (by the dropped roots and by freed parents)
//! equal its count. A child whose count stays above the references taken
//! is kept, and nothing below it is visited, so the cost follows what is
//! exclusive to the dropped versions (plus one count read per entry of each
//! freed node), not what they share.
//!
//! Orphans (versions already dropped, still being reclaimed) are simulated
//! first, once: what they will free is not anyone's to free again, and what
//! they share with a live version becomes that version's own once their
//! reclaim ends. The result is confluent: the set of grains freed does not
//! depend on the order the worklist takes, so "orphans, then the set" gives
//! exactly what the real drop and a complete reclaim free.

use std::collections::HashMap;

use strata_format::leaf_grain;

use super::{corrupt, Meta};
use crate::error::Result;

/// Decrements already due from orphaned versions; see [`Meta::drop_baseline`].
pub struct DropBaseline {
    taken: HashMap<u64, u32>,
}

impl Meta {
    /// Simulate the reclaim of every orphan: the references it will take.
    pub fn drop_baseline(&mut self) -> Result<DropBaseline> {
        let empty = HashMap::new();
        let mut taken = HashMap::new();
        let orphans = self.catalog.orphans.clone();
        self.simulate_drop(&orphans, &empty, &mut taken)?;
        Ok(DropBaseline { taken })
    }

    /// Grains that dropping `versions` together would free once every
    /// reclaim (theirs and the orphans') has ended. Reads pages through the
    /// cache; changes no count, no page and no dirty state.
    pub fn exclusive_grains(&mut self, base: &DropBaseline, versions: &[u64]) -> Result<u64> {
        let mut taken = HashMap::new();
        self.simulate_drop(versions, &base.taken, &mut taken)
    }

    /// Drop one reference of each version's root, then of each child of a
    /// node freed so. Returns the grains freed. `taken` keeps the grains
    /// that lost references but stay (a freed grain leaves it: no live
    /// version can reach a grain only dropped ones referenced), so its size
    /// follows the shared boundary, not the exclusive data.
    fn simulate_drop(
        &mut self,
        versions: &[u64],
        base: &HashMap<u64, u32>,
        taken: &mut HashMap<u64, u32>,
    ) -> Result<u64> {
        let mut freed = 0u64;
        let mut work: Vec<(u64, u8)> = Vec::new();
        for &v in versions {
            let st = self.version(v)?;
            if st.root != 0 && self.sim_take(st.root, Some(st.levels - 1), base, taken)? {
                freed += 1;
                work.push((st.root, st.levels - 1));
            }
        }
        while let Some((node, level)) = work.pop() {
            let entries = *self.node(node, level)?;
            let child_level = level.checked_sub(1);
            for entry in entries.into_iter().filter(|&e| e != 0) {
                // A data grain by its number, whatever key wrote it.
                let e = if child_level.is_none() {
                    leaf_grain(entry)
                } else {
                    entry
                };
                // A packed fragment spilling into the next grain holds
                // that one too (§18.8).
                if child_level.is_none()
                    && strata_format::leaf_spills(entry)
                    && self.sim_take(e + 1, None, base, taken)?
                {
                    freed += 1;
                }
                if self.sim_take(e, child_level, base, taken)? {
                    freed += 1;
                    if let Some(l) = child_level {
                        work.push((e, l));
                    }
                }
            }
        }
        Ok(freed)
    }

    /// Take one simulated reference from grain `g`; true when that frees it.
    fn sim_take(
        &mut self,
        g: u64,
        level: Option<u8>,
        base: &HashMap<u64, u32>,
        taken: &mut HashMap<u64, u32>,
    ) -> Result<bool> {
        let count = self.ref_get(g)?;
        let before = base.get(&g).copied().unwrap_or(0);
        let mine = taken.get(&g).copied().unwrap_or(0) + 1;
        let total = before as u64 + mine as u64;
        if total > count as u64 {
            let what = if level.is_some() {
                "map node"
            } else {
                "data grain"
            };
            return Err(corrupt(format!(
                "{what} {g} has count {count} but {total} references to it were found"
            )));
        }
        let gone = total == count as u64;
        if gone {
            taken.remove(&g);
        } else {
            taken.insert(g, mine);
        }
        Ok(gone)
    }
}
