//! Versions: create, share, drop, grow, and reclaim orphaned maps in
//! bounded steps (docs/FORMAT.md §6, "orphans").

use strata_format::{VersionState, MAP_FANOUT};

use super::Meta;
use crate::error::Result;

impl Meta {
    /// A new version sharing everything with `src` (snapshot, clone, revert).
    pub fn new_version_from(&mut self, id: u64, src: u64) -> Result<()> {
        let mut st = self.version(src)?;
        if st.root != 0 {
            self.incref(st.root)?;
        }
        st.version = id;
        self.put_version(st);
        // `src`'s grains are shared now: its next writes to a region take a
        // fresh block rather than aim at grains its anchors name, which are
        // taken (FORMAT.md §10.5).
        self.alloc.anchors.retain(|&(owner, _), _| owner != src);
        Ok(())
    }

    /// A new empty version able to address `grains` virtual grains.
    pub fn new_empty_version(&mut self, id: u64, grains: u64) {
        self.put_version(VersionState {
            version: id,
            root: 0,
            levels: strata_format::levels_for(grains),
            mapped_grains: 0,
            nb: 0,
        });
    }

    /// Drop a version: O(1). Its map becomes an *orphan* whose grains are
    /// given back in bounded steps by [`Self::reclaim`], so deleting a
    /// snapshot never stalls I/O for a time that grows with its data.
    pub fn drop_version(&mut self, id: u64) -> Result<()> {
        let st = self.version(id)?;
        self.mark_catalog_dirty();
        if st.root == 0 {
            self.versions.remove(&id);
            self.dirty_versions.remove(&id);
        } else {
            self.catalog.orphans.push(id);
        }
        Ok(())
    }

    /// Make `dst` share `src`'s state (revert); dst's old map is orphaned.
    pub fn replace_version(&mut self, dst: u64, src: u64) -> Result<()> {
        let old = self.version(dst)?;
        if old.root != 0 {
            let orphan = self.catalog.alloc_id();
            self.put_version(VersionState {
                version: orphan,
                ..old
            });
            self.catalog.orphans.push(orphan);
            self.mark_catalog_dirty();
        }
        self.new_version_from(dst, src)
    }

    /// Versions still being reclaimed.
    pub fn orphans(&self) -> usize {
        self.catalog.orphans.len()
    }

    /// Give back grains of orphaned maps: at most about `budget` grains of
    /// work (a whole leaf counts as 512). Returns whether work remains.
    ///
    /// Each step unlinks one child from an orphan node that only the orphan
    /// holds (count 1), writing the unlink to the log, and drops the child's
    /// reference: a shared child costs O(1), an exclusive leaf frees at most
    /// 512 grains, an exclusive interior node is descended into. Crash-safe:
    /// the orphan shrinks in place through ordinary log records, and the
    /// orphan list is in the catalog, so reclaiming resumes after a restart.
    pub fn reclaim(&mut self, mut budget: u64) -> Result<bool> {
        while budget > 0 {
            let Some(&id) = self.catalog.orphans.first() else {
                return Ok(false);
            };
            let mut st = self.version(id)?;
            if st.root == 0 {
                self.versions.remove(&id);
                self.dirty_versions.remove(&id);
                self.catalog.orphans.remove(0);
                self.mark_catalog_dirty();
                continue;
            }
            if self.ref_get(st.root)? > 1 {
                self.decref(st.root, Some(st.levels - 1))?;
                st.root = 0;
                self.put_version(st);
                budget = budget.saturating_sub(1);
                continue;
            }
            // Descend through nodes only this orphan holds.
            let mut parent: Option<(u64, usize)> = None;
            let mut node = st.root;
            let mut level = st.levels - 1;
            loop {
                let first = self.node(node, level)?.iter().position(|&e| e != 0);
                let Some(i) = first else {
                    // An empty node: unlink and free it.
                    match parent {
                        None => {
                            st.root = 0;
                            self.put_version(st);
                        }
                        Some((p, pi)) => {
                            self.node_set(p, level + 1, pi, 0)?;
                        }
                    }
                    self.decref(node, Some(level))?;
                    budget = budget.saturating_sub(1);
                    break;
                };
                let child = self.node(node, level)?[i];
                if level == 0 {
                    self.node_set(node, level, i, 0)?;
                    self.decref(child, None)?;
                    budget = budget.saturating_sub(1);
                    break;
                }
                if level == 1 || self.ref_get(child)? > 1 {
                    self.node_set(node, level, i, 0)?;
                    self.decref(child, Some(level - 1))?;
                    budget = budget.saturating_sub(if level == 1 { MAP_FANOUT as u64 } else { 1 });
                    break;
                }
                parent = Some((node, i));
                node = child;
                level -= 1;
            }
        }
        Ok(!self.catalog.orphans.is_empty())
    }

    /// Deepen `ver`'s map so it addresses `grains` virtual grains.
    pub fn grow_version(&mut self, ver: u64, grains: u64) -> Result<()> {
        let want = strata_format::levels_for(grains);
        let mut st = self.version(ver)?;
        while st.levels < want {
            if st.root != 0 {
                let mut entries = [0u64; MAP_FANOUT];
                entries[0] = st.root; // the version's reference becomes the new root's
                st.root = self.alloc_node(st.levels, &entries)?;
            }
            st.levels += 1;
        }
        self.put_version(st);
        Ok(())
    }
}
