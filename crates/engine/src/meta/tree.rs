//! Map trees (docs/FORMAT.md §3): lookups, copy-on-write of shared paths,
//! unmap, walks and diffs. Every node is read through `Meta::node` with the
//! level the walk expects, so a pointer to the wrong kind of page is caught.
//!
//! A leaf entry is a pool grain and, in bits 44–47, the key index of an
//! own-key clone's grains (FORMAT.md §16.4). Entries go in and come out
//! whole where a caller names them so (`lookup_for_write`, `install`,
//! `lookup_entries`); `walk` and `lookup_range` give grain numbers.

use strata_format::{leaf_grain, BLOCK_GRAINS, MAP_FANOUT, MAP_FANOUT_SHIFT};

use super::alloc::{Place, META_OWNER};
use super::{corrupt, Meta};
use crate::error::Result;

/// Where a map node sits in a version's tree: its height (0: a leaf) and
/// the first virtual grain it covers.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    pub level: u8,
    pub base: u64,
}

impl Slot {
    /// Virtual grains one entry of a node here covers.
    pub(super) fn span(self) -> u64 {
        1u64 << (MAP_FANOUT_SHIFT * self.level as u32)
    }
}

/// What stays the same through a diff's recursion: where it stops and
/// what it reports.
struct DiffWalk<'a> {
    /// First virtual grain not compared.
    end: u64,
    /// `f(v, mapped_in_b)` for each grain that differs.
    f: &'a mut dyn FnMut(u64, bool),
}

impl Meta {
    /// Allocate a node of `level` holding `entries` (their references are the
    /// caller's); it is dirty in the cache and logged whole.
    pub(super) fn alloc_node(&mut self, level: u8, entries: &[u64; MAP_FANOUT]) -> Result<u64> {
        let g = self.alloc_grain(META_OWNER, None, u64::MAX, Place::Node)?;
        self.log_record(&strata_format::Record::RefSet { grain: g, count: 1 });
        self.create_node(g, level, entries);
        Ok(g)
    }

    /// Copy a shared node so one referrer can change it.
    fn cow_node(&mut self, p: u64, level: u8) -> Result<u64> {
        let entries = *self.node(p, level)?;
        for e in entries.iter().copied().filter(|&e| e != 0) {
            self.incref(e)?;
        }
        let q = self.alloc_node(level, &entries)?;
        self.decref(p, Some(level))?;
        Ok(q)
    }

    // ------------------------------------------------------------ trees

    /// Leaf entry for virtual grain `v` of version `ver` (key index
    /// included), and whether a write may overwrite that grain in place.
    pub fn lookup_for_write(&mut self, ver: u64, v: u64) -> Result<(u64, bool)> {
        let st = self.version(ver)?;
        let mut node = st.root;
        let mut exclusive = true;
        for level in (0..st.levels).rev() {
            if node == 0 {
                return Ok((0, false));
            }
            exclusive = exclusive && self.sole_owner(node)?;
            let idx = ((v >> (MAP_FANOUT_SHIFT * level as u32)) as usize) & (MAP_FANOUT - 1);
            node = self.node(node, level)?[idx];
        }
        if node == 0 {
            return Ok((0, false));
        }
        let exclusive = exclusive && self.sole_owner(node)?;
        Ok((node, exclusive))
    }

    /// `lookup_for_write` for virtual grains `[first, first + count)`, in
    /// order: each leaf's path is walked once and the data grains' counts
    /// are read a count page at a time, instead of a root-to-leaf walk and
    /// two cache lookups per grain (a 512 KiB write covers 128 grains).
    pub fn lookup_range_for_write(
        &mut self,
        ver: u64,
        first: u64,
        count: u64,
        out: &mut Vec<(u64, bool)>,
    ) -> Result<()> {
        let st = self.version(ver)?;
        let end = first + count;
        let mut v = first;
        while v < end {
            let leaf_end = end.min((v | (MAP_FANOUT as u64 - 1)) + 1);
            let mut node = st.root;
            let mut exclusive = true;
            for level in (1..st.levels).rev() {
                if node == 0 {
                    break;
                }
                exclusive = exclusive && self.sole_owner(node)?;
                let idx = ((v >> (MAP_FANOUT_SHIFT * level as u32)) as usize) & (MAP_FANOUT - 1);
                node = self.node(node, level)?[idx];
            }
            let start = out.len();
            if node == 0 {
                out.extend((v..leaf_end).map(|_| (0, false)));
            } else {
                exclusive = exclusive && self.sole_owner(node)?;
                let entries = self.node(node, 0)?;
                let a = (v as usize) & (MAP_FANOUT - 1);
                let b = a + (leaf_end - v) as usize;
                out.extend(entries[a..b].iter().map(|&e| (e, exclusive && e != 0)));
                if exclusive {
                    self.sole_owners(&mut out[start..])?;
                }
            }
            v = leaf_end;
        }
        Ok(())
    }

    /// Make the path from `ver`'s root down to the node at `stop_level` that
    /// covers `v` private to `ver` (copying shared nodes, creating missing
    /// ones) and return that node.
    fn writable_node(&mut self, ver: u64, v: u64, stop_level: u8) -> Result<u64> {
        let mut st = self.version(ver)?;
        if st.root == 0 {
            st.root = self.alloc_node(st.levels - 1, &[0; MAP_FANOUT])?;
            self.put_version(st);
        } else if self.ref_get(st.root)? > 1 {
            st.root = self.cow_node(st.root, st.levels - 1)?;
            self.put_version(st);
        }
        let mut node = st.root;
        for level in (stop_level + 1..st.levels).rev() {
            let idx = ((v >> (MAP_FANOUT_SHIFT * level as u32)) as usize) & (MAP_FANOUT - 1);
            let child = self.node(node, level)?[idx];
            let new_child = if child == 0 {
                self.alloc_node(level - 1, &[0; MAP_FANOUT])?
            } else if self.ref_get(child)? > 1 {
                self.cow_node(child, level - 1)?
            } else {
                child
            };
            if new_child != child {
                self.node_set(node, level, idx, new_child)?;
            }
            node = new_child;
        }
        Ok(node)
    }

    /// Set leaf entry for `v`, keeping the version's counters; returns the old entry.
    fn leaf_set(&mut self, ver: u64, v: u64, value: u64) -> Result<u64> {
        let leaf = self.writable_node(ver, v, 0)?;
        let idx = (v as usize) & (MAP_FANOUT - 1);
        let old = self.node_set(leaf, 0, idx, value)?;
        if (old == 0) != (value == 0) {
            let half = idx / BLOCK_GRAINS as usize * BLOCK_GRAINS as usize;
            let entries = self.node(leaf, 0)?;
            let others = entries[half..half + BLOCK_GRAINS as usize]
                .iter()
                .enumerate()
                .any(|(i, &e)| half + i != idx && e != 0);
            let mut st = self.version(ver)?;
            if value != 0 {
                st.mapped_grains += 1;
                if !others {
                    st.nb += 1;
                }
            } else {
                st.mapped_grains -= 1;
                if !others {
                    st.nb -= 1;
                }
            }
            self.put_version(st);
        }
        Ok(old)
    }

    /// Point `v` at freshly written grain `e` (a leaf entry: a grain from
    /// `alloc_grain` and its key index).
    pub fn install(&mut self, ver: u64, v: u64, e: u64) -> Result<()> {
        self.log_record(&strata_format::Record::RefSet {
            grain: leaf_grain(e),
            count: 1,
        });
        let old = self.leaf_set(ver, v, e)?;
        if old != 0 {
            self.decref(old, None)?;
        }
        Ok(())
    }

    /// Point virtual grains `v0 ..` of `ver`, all under one leaf, at the
    /// freshly written grains `grains` (leaf entries, each a grain from
    /// `alloc_data_grain` with its key index):
    /// `install` for each, with the leaf's path walked once and the
    /// changes logged as runs (docs/FORMAT.md §5, MAP_RUN and REF_RUN).
    pub fn install_run(&mut self, ver: u64, v0: u64, grains: &[u64]) -> Result<()> {
        let at = (v0 as usize) & (MAP_FANOUT - 1);
        assert!(
            !grains.is_empty() && at + grains.len() <= MAP_FANOUT,
            "a run of {} grains at {v0} crosses a leaf",
            grains.len()
        );
        if grains.len() == 1 {
            return self.install(ver, v0, grains[0]);
        }
        let counted: Vec<u64> = grains.iter().map(|&e| leaf_grain(e)).collect();
        self.log_new_counts(&counted);
        let leaf = self.writable_node(ver, v0, 0)?;
        let mut old = Vec::with_capacity(grains.len());
        self.leaf_set_run(leaf, at, grains, &mut old)?;
        // The version's counters: grains mapped where there were holes,
        // and blocks of the leaf that had no grain mapped before.
        let entries = self.node(leaf, 0)?;
        let block = BLOCK_GRAINS as usize;
        let mut new_blocks = 0;
        let mut h = at / block * block;
        while h < at + grains.len() {
            let had = (h..h + block).any(|i| {
                if (at..at + grains.len()).contains(&i) {
                    old[i - at] != 0
                } else {
                    entries[i] != 0
                }
            });
            if !had {
                new_blocks += 1;
            }
            h += block;
        }
        let mut st = self.version(ver)?;
        st.mapped_grains += old.iter().filter(|&&o| o == 0).count() as u64;
        st.nb += new_blocks;
        self.put_version(st);
        old.retain(|&o| o != 0);
        self.release_data(&old)
    }

    /// Unmap one virtual grain.
    pub fn unmap_grain(&mut self, ver: u64, v: u64) -> Result<()> {
        if self.lookup_for_write(ver, v)?.0 == 0 {
            return Ok(());
        }
        let old = self.leaf_set(ver, v, 0)?;
        if old != 0 {
            self.decref(old, None)?;
        }
        Ok(())
    }

    /// Unmap the whole leaf `leaf_no` (virtual grains leaf_no*512 ..+512) by
    /// dropping the leaf: O(1) in the leaf's contents when it is shared.
    pub fn unmap_leaf(&mut self, ver: u64, leaf_no: u64) -> Result<()> {
        let v = leaf_no << MAP_FANOUT_SHIFT;
        let st = self.version(ver)?;
        // Find the leaf without changing anything; nothing to do if absent.
        let mut node = st.root;
        for level in (1..st.levels).rev() {
            if node == 0 {
                break;
            }
            let idx = ((v >> (MAP_FANOUT_SHIFT * level as u32)) as usize) & (MAP_FANOUT - 1);
            node = self.node(node, level)?[idx];
        }
        if node == 0 {
            return Ok(());
        }
        let leaf = node;
        let entries = *self.node(leaf, 0)?;
        let mapped = entries.iter().filter(|&&e| e != 0).count() as u64;
        let blocks = entries
            .chunks(BLOCK_GRAINS as usize)
            .filter(|c| c.iter().any(|&e| e != 0))
            .count() as u64;
        let mut st = if st.levels == 1 {
            let mut st = st;
            st.root = 0;
            st
        } else {
            let parent = self.writable_node(ver, v, 1)?;
            let idx = ((v >> MAP_FANOUT_SHIFT) as usize) & (MAP_FANOUT - 1);
            let old = self.node_set(parent, 1, idx, 0)?;
            assert_eq!(old, leaf, "a private path leads to the same leaf");
            self.version(ver)?
        };
        st.mapped_grains -= mapped;
        st.nb -= blocks;
        self.put_version(st);
        self.decref(leaf, Some(0))
    }

    /// Visit `[start, end)` of version `ver` as runs: `f(v, count, grain)`,
    /// where grain 0 means `count` unmapped grains and a mapped grain comes
    /// with count 1. Empty subtrees are skipped whole.
    pub fn walk(
        &mut self,
        ver: u64,
        start: u64,
        end: u64,
        f: &mut dyn FnMut(u64, u64, u64),
    ) -> Result<()> {
        self.walk_entries(ver, start, end, &mut |v, n, e| f(v, n, leaf_grain(e)))
    }

    /// `walk` giving leaf entries whole (grain and key index).
    pub fn walk_entries(
        &mut self,
        ver: u64,
        start: u64,
        end: u64,
        f: &mut dyn FnMut(u64, u64, u64),
    ) -> Result<()> {
        let st = self.version(ver)?;
        if start >= end {
            return Ok(());
        }
        if st.root == 0 {
            f(start, end - start, 0);
            return Ok(());
        }
        let at = Slot {
            level: st.levels - 1,
            base: 0,
        };
        self.walk_node(st.root, at, start..end, f)
    }

    /// `walk` below `node`, which sits at `at`, over `range` (inside it).
    fn walk_node(
        &mut self,
        node: u64,
        at: Slot,
        range: std::ops::Range<u64>,
        f: &mut dyn FnMut(u64, u64, u64),
    ) -> Result<()> {
        let (start, end) = (range.start, range.end);
        let (level, base, span) = (at.level, at.base, at.span());
        let lo = ((start - base) / span) as usize;
        let hi = ((end - 1 - base) / span) as usize;
        if hi >= MAP_FANOUT {
            return Err(corrupt(format!(
                "range past the map's reach at grain {end}"
            )));
        }
        let entries: Vec<u64> = self.node(node, level)?[lo..=hi].to_vec();
        for (i, e) in entries.into_iter().enumerate() {
            let child_base = base + (lo + i) as u64 * span;
            let s = start.max(child_base);
            let t = end.min(child_base + span);
            if e == 0 {
                f(s, t - s, 0);
            } else if level == 0 {
                f(s, 1, e);
            } else {
                let child = Slot {
                    level: level - 1,
                    base: child_base,
                };
                self.walk_node(e, child, s..t, f)?;
            }
        }
        Ok(())
    }

    /// Visit the virtual grains below `end` where version `b` maps a
    /// different grain than version `a` (`None`: an empty disk): `f(v,
    /// mapped_in_b)`. Subtrees both versions share are skipped whole, so the
    /// cost follows what changed, not the disk size. Versions of different
    /// heights (one was extended) are compared as if the shorter one had
    /// been grown the same way.
    pub fn diff(
        &mut self,
        a: Option<u64>,
        b: u64,
        end: u64,
        f: &mut dyn FnMut(u64, bool),
    ) -> Result<()> {
        let sb = self.version(b)?;
        let (ra, la) = match a {
            Some(a) => {
                let sa = self.version(a)?;
                (sa.root, sa.levels)
            }
            None => (0, 1),
        };
        let levels = sb.levels.max(la);
        let at = Slot {
            level: levels - 1,
            base: 0,
        };
        let mut w = DiffWalk { end, f };
        self.diff_node(
            &mut w,
            (ra, la.saturating_sub(1)),
            (sb.root, sb.levels - 1),
            at,
        )
    }

    /// Entries of `node` (real height `real`) seen at height `level`: above
    /// its real height a node is the first child of implicit parents.
    fn entries_at(&mut self, node: u64, real: u8, level: u8) -> Result<Vec<u64>> {
        let mut v = vec![0u64; MAP_FANOUT];
        if node == 0 {
            return Ok(v);
        }
        if level > real {
            v[0] = node;
            return Ok(v);
        }
        v.copy_from_slice(self.node(node, real)?);
        Ok(v)
    }

    /// `diff` below nodes `a` and `b` (each a node and its real height),
    /// both seen at `at`.
    fn diff_node(
        &mut self,
        w: &mut DiffWalk<'_>,
        a: (u64, u8),
        b: (u64, u8),
        at: Slot,
    ) -> Result<()> {
        let (level, base, end) = (at.level, at.base, w.end);
        if a == b || base >= end {
            return Ok(());
        }
        let ea = self.entries_at(a.0, a.1, level)?;
        let eb = self.entries_at(b.0, b.1, level)?;
        let span = at.span();
        let child = |n: (u64, u8)| {
            if level > n.1 {
                n.1
            } else {
                level.saturating_sub(1)
            }
        };
        for i in 0..MAP_FANOUT {
            let cb = base + i as u64 * span;
            if cb >= end {
                break;
            }
            if ea[i] == eb[i] && child(a) == child(b) {
                continue;
            }
            if level == 0 {
                (w.f)(cb, eb[i] != 0);
            } else {
                let below = Slot {
                    level: level - 1,
                    base: cb,
                };
                self.diff_node(w, (ea[i], child(a)), (eb[i], child(b)), below)?;
            }
        }
        Ok(())
    }

    /// Virtual grains of `[start, end)` that are mapped in `ver`.
    pub fn mapped_in(&mut self, ver: u64, start: u64, end: u64) -> Result<Vec<u64>> {
        let mut mapped = Vec::new();
        self.walk(ver, start, end, &mut |v, _, g| {
            if g != 0 {
                mapped.push(v)
            }
        })?;
        Ok(mapped)
    }

    /// Grains for `count` virtual grains from `start` (0 = unmapped).
    pub fn lookup_range(
        &mut self,
        ver: u64,
        start: u64,
        count: u64,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        self.lookup_entries(ver, start, count, out)?;
        for e in out.iter_mut() {
            *e = leaf_grain(*e);
        }
        Ok(())
    }

    /// Leaf entries (grain and key index) for `count` virtual grains from
    /// `start` (0 = unmapped).
    pub fn lookup_entries(
        &mut self,
        ver: u64,
        start: u64,
        count: u64,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        out.clear();
        self.walk_entries(ver, start, start + count, &mut |_, n, g| {
            if g == 0 {
                out.extend(std::iter::repeat_n(0, n as usize));
            } else {
                out.push(g);
            }
        })
    }
}
