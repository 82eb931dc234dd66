//! Splitting what two keyrings share (docs/FORMAT.md §16.4): a deep rekey
//! of a keyring whose grains an own-key clone still reads under the old
//! key copies those grains instead of moving them. The map nodes on the
//! way to them are shared too (the clone was made O(1)), so first the
//! rekeyed side gets copies of the nodes it shares, then its leaves alone
//! point at the re-encrypted grains. Every change is an ordinary node or
//! count record of the same metadata change as the cursor's advance.

use std::collections::{HashMap, HashSet};

use strata_format::{leaf_entry, MAP_FANOUT, MAP_FANOUT_SHIFT};

use super::Meta;
use crate::error::Result;

/// Index within a node of `level` of the entry covering virtual grain `v`.
fn index_at(v: u64, level: u8) -> usize {
    ((v >> (MAP_FANOUT_SHIFT * u32::from(level))) as usize) & (MAP_FANOUT - 1)
}

/// What a grain's move or copy did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// Every map that named the grain names the new one; the old is freed.
    Whole,
    /// The maps of this side name the new grain; the others keep the old.
    Copied,
}

impl Meta {
    /// The map nodes (the leaf included) on the paths of `versions` to
    /// virtual grain `v`.
    pub fn path_nodes(&mut self, versions: &[u64], v: u64) -> Result<HashSet<u64>> {
        let mut out = HashSet::new();
        for &ver in versions {
            let st = self.version(ver)?;
            if st.root == 0 || v >> (MAP_FANOUT_SHIFT * u32::from(st.levels)) != 0 {
                continue;
            }
            let mut node = st.root;
            out.insert(node);
            for level in (1..st.levels).rev() {
                node = self.node(node, level)?[index_at(v, level)];
                if node == 0 {
                    break;
                }
                out.insert(node);
            }
        }
        Ok(out)
    }

    /// Give every version but `others` a path to the leaf covering `v`
    /// that shares no node with theirs (`theirs`: their
    /// [`Self::path_nodes`]): each shared node met on the way down is
    /// copied once (its children are then held by the copy and the
    /// original) and every referrer on this side is pointed at the copy.
    /// The versions in `others` keep every node they had.
    pub fn split_path(
        &mut self,
        others: &HashSet<u64>,
        theirs: &HashSet<u64>,
        v: u64,
    ) -> Result<()> {
        if theirs.is_empty() {
            return Ok(());
        }
        let mut copies: HashMap<u64, u64> = HashMap::new();
        for ver in self.version_ids() {
            let mut st = self.version(ver)?;
            if others.contains(&ver)
                || st.root == 0
                || v >> (MAP_FANOUT_SHIFT * u32::from(st.levels)) != 0
            {
                continue;
            }
            if theirs.contains(&st.root) {
                let (old, level) = (st.root, st.levels - 1);
                st.root = self.copy_for(&mut copies, old, level)?;
                self.put_version(st);
                self.decref(old, Some(level))?;
            }
            let mut node = st.root;
            for level in (1..st.levels).rev() {
                let i = index_at(v, level);
                let child = self.node(node, level)?[i];
                if child == 0 {
                    break;
                }
                if theirs.contains(&child) {
                    let q = self.copy_for(&mut copies, child, level - 1)?;
                    self.node_set(node, level, i, q)?;
                    self.decref(child, Some(level - 1))?;
                    node = q;
                } else {
                    node = child;
                }
            }
        }
        Ok(())
    }

    /// This side's copy of shared node `n` (of `level`), made the first
    /// time (it holds `n`'s children once more) and counted once more for
    /// each further referrer.
    fn copy_for(&mut self, copies: &mut HashMap<u64, u64>, n: u64, level: u8) -> Result<u64> {
        if let Some(&q) = copies.get(&n) {
            self.incref(q)?;
            return Ok(q);
        }
        let entries = *self.node(n, level)?;
        for e in entries.iter().copied().filter(|&e| e != 0) {
            self.incref(e)?;
        }
        let q = self.alloc_node(level, &entries)?;
        copies.insert(n, q);
        Ok(q)
    }

    /// [`Self::move_grain`] where leaves in `theirs` may also name `g` at
    /// `v` (after [`Self::split_path`], none of them is this side's): this
    /// side's leaves name `to` under key index 0 (a deep rekey's new key),
    /// theirs keep `g` and its index, and the counts follow. None,
    /// changing nothing, when the leaves found do not account for `g`'s
    /// whole count or none is this side's.
    pub fn move_or_copy(
        &mut self,
        v: u64,
        g: u64,
        to: u64,
        theirs: &HashSet<u64>,
    ) -> Result<Option<Moved>> {
        let count = self.ref_get(g)?;
        let leaves = self.leaves_naming(v, g)?;
        if count == 0 || leaves.len() as u64 != u64::from(count) {
            return Ok(None);
        }
        let mine: Vec<_> = leaves
            .iter()
            .filter(|l| !theirs.contains(&l.0))
            .copied()
            .collect();
        if mine.is_empty() {
            return Ok(None);
        }
        for &(leaf, i, _) in &mine {
            self.node_set(leaf, 0, i, leaf_entry(to, 0))?;
        }
        let n = mine.len() as u32;
        if mine.len() == leaves.len() {
            // Every referrer follows: `to` takes the count, `g` is freed.
            self.ref_set(to, count)?;
            if count > 1 {
                self.ref_set(g, 1)?;
            }
            self.decref(g, None)?;
            return Ok(Some(Moved::Whole));
        }
        self.ref_set(to, n)?;
        // Through `decref`, so the drop counts as one not yet durable: a
        // writer of their side may not take `g` as its own until it is.
        self.ref_set(g, count - n + 1)?;
        self.decref(g, None)?;
        Ok(Some(Moved::Copied))
    }
}
