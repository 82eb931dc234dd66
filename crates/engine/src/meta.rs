//! Metadata state and the operations on it: map trees, reference counts,
//! allocation, and the log buffer. Everything here runs under the engine's
//! metadata mutex; no method does data I/O except loading metadata pages.
//!
//! Invariants (checked by `check.rs` and by the model tests):
//! - a grain's count equals its references (docs/FORMAT.md §4);
//! - a grain with count 0 is allocatable only when it is not *pending*
//!   (freed by a batch that is not yet durable);
//! - a data grain is written in place only when every node on its path and
//!   the grain itself have count 1 and none of them lost a reference in a
//!   batch that is not yet durable (see `lookup_for_write`);
//! - every change to a map node, a count, a version or the catalog is
//!   appended to `log` as an absolute-value record in the same call.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use strata_format::{
    decode_map_node, encode_map_node, tag, Record, VersionState, BLOCK_GRAINS, GRAIN_BYTES,
    MAP_FANOUT, MAP_FANOUT_SHIFT, REFS_PER_PAGE,
};
use strata_storage::Storage;

use crate::cache::{PageCache, PageData, PageKey};
use crate::catalog::{Catalog, VersionRec};
use crate::error::{err, Error, ErrorKind, Result};

/// Owner id used for the allocation cursor of map nodes.
const META_OWNER: u64 = u64::MAX;

/// What a commit takes out of the metadata state.
pub struct Batch {
    pub payload: Vec<u8>,
    pub has_pending_frees: bool,
}

/// Physical allocation: free grains per block and a cursor per owner.
#[derive(Default)]
pub struct Allocator {
    /// Grains below this are in the pool; a multiple of BLOCK_GRAINS.
    pub hwm: u64,
    block_free: Vec<u16>,
    free_blocks: BTreeSet<u64>,
    partial_blocks: BTreeSet<u64>,
    cursors: HashMap<u64, (u64, u64)>,
}

impl Allocator {
    fn set_block_free(&mut self, block: u64, free: u16) {
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

    fn adjust(&mut self, grain: u64, delta: i32) {
        let b = grain / BLOCK_GRAINS;
        let f = self.block_free[b as usize] as i32 + delta;
        debug_assert!((0..=BLOCK_GRAINS as i32).contains(&f));
        self.set_block_free(b, f as u16);
    }

    pub fn free_grains(&self) -> u64 {
        self.block_free.iter().map(|&f| f as u64).sum()
    }
}

pub struct Meta {
    pub pool: Arc<dyn Storage>,
    pub refs: Arc<dyn Storage>,
    pub cache: PageCache,
    /// Disks and snapshots; `catalog.versions` is kept empty: see `versions`.
    pub catalog: Catalog,
    pub versions: HashMap<u64, VersionState>,
    log: Vec<u8>,
    dirty_versions: HashSet<u64>,
    catalog_dirty: bool,
    pub alloc: Allocator,
    pending_current: Vec<u64>,
    pending_committing: Vec<u64>,
    pending_set: HashSet<u64>,
    decreased_current: HashSet<u64>,
    decreased_committing: HashSet<u64>,
    /// Grains with a non-zero count (data and map nodes).
    pub used_grains: u64,
    /// Map nodes rebuilt by replay, written back by the checkpoint that follows.
    replay_pages: HashMap<u64, Box<[u64; MAP_FANOUT]>>,
}

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

impl Meta {
    pub fn new(
        pool: Arc<dyn Storage>,
        refs: Arc<dyn Storage>,
        cache_bytes: u64,
        mut catalog: Catalog,
        hwm: u64,
    ) -> Self {
        let versions = catalog
            .versions
            .drain(..)
            .map(|v| (v.id, VersionState::from(v)))
            .collect();
        Meta {
            pool,
            refs,
            cache: PageCache::new(cache_bytes),
            catalog,
            versions,
            log: Vec::new(),
            dirty_versions: HashSet::new(),
            catalog_dirty: false,
            alloc: Allocator {
                hwm,
                ..Default::default()
            },
            pending_current: Vec::new(),
            pending_committing: Vec::new(),
            pending_set: HashSet::new(),
            decreased_current: HashSet::new(),
            decreased_committing: HashSet::new(),
            used_grains: 0,
            replay_pages: HashMap::new(),
        }
    }

    // ------------------------------------------------------------ catalog

    /// The catalog with versions included, as stored.
    pub fn catalog_full(&self) -> Catalog {
        let mut c = self.catalog.clone();
        let mut v: Vec<VersionRec> = self
            .versions
            .values()
            .map(|s| VersionRec::from(*s))
            .collect();
        v.sort_by_key(|r| r.id);
        c.versions = v;
        c
    }

    pub fn mark_catalog_dirty(&mut self) {
        self.catalog_dirty = true;
    }

    pub fn version(&self, id: u64) -> Result<VersionState> {
        self.versions
            .get(&id)
            .copied()
            .ok_or_else(|| Error::new(ErrorKind::Gone, format!("version {id} no longer exists")))
    }

    fn put_version(&mut self, st: VersionState) {
        self.versions.insert(st.version, st);
        self.dirty_versions.insert(st.version);
    }

    // ------------------------------------------------------------ log

    pub fn log_len(&self) -> usize {
        self.log.len()
    }

    fn log_map_set(&mut self, grain: u64, index: usize, value: u64) {
        Record::MapSet {
            grain,
            index: index as u16,
            value,
        }
        .encode_into(&mut self.log);
    }

    fn log_ref_set(&mut self, grain: u64, count: u32) {
        Record::RefSet { grain, count }.encode_into(&mut self.log);
    }

    fn log_page_image(&mut self, grain: u64, entries: &[u64; MAP_FANOUT]) {
        self.log.push(tag::PAGE_IMAGE);
        self.log.extend_from_slice(&grain.to_le_bytes());
        let start = self.log.len();
        self.log.resize(start + GRAIN_BYTES as usize, 0);
        encode_map_node(entries, &mut self.log[start..]);
    }

    /// Take the log buffer and the frees it makes durable.
    pub fn take_batch(&mut self) -> Batch {
        if self.catalog_dirty {
            Record::Catalog(self.catalog_full().encode()).encode_into(&mut self.log);
            self.catalog_dirty = false;
            self.dirty_versions.clear();
        }
        let mut dirty: Vec<u64> = self.dirty_versions.drain().collect();
        dirty.sort_unstable();
        for id in dirty {
            if let Some(st) = self.versions.get(&id) {
                Record::Version(*st).encode_into(&mut self.log);
            }
        }
        debug_assert!(self.pending_committing.is_empty());
        debug_assert!(self.decreased_committing.is_empty());
        self.pending_committing = std::mem::take(&mut self.pending_current);
        self.decreased_committing = std::mem::take(&mut self.decreased_current);
        Batch {
            payload: std::mem::take(&mut self.log),
            has_pending_frees: !self.pending_committing.is_empty(),
        }
    }

    /// The batch taken last is durable: its frees may be reused. Returns
    /// them, sorted; they stay unallocatable until [`Meta::release`], so
    /// the caller can punch them first without racing a writer that
    /// reuses one.
    pub fn take_committed(&mut self) -> Vec<u64> {
        let mut freed = std::mem::take(&mut self.pending_committing);
        self.decreased_committing.clear();
        freed.sort_unstable();
        freed
    }

    /// Everything in memory was checkpointed: all pending frees are durable.
    /// Returns them, sorted and still unallocatable, as [`Meta::take_committed`].
    pub fn take_all(&mut self) -> Vec<u64> {
        let mut freed = std::mem::take(&mut self.pending_committing);
        freed.append(&mut self.pending_current);
        self.decreased_committing.clear();
        self.decreased_current.clear();
        self.log.clear();
        self.dirty_versions.clear();
        self.catalog_dirty = false;
        freed.sort_unstable();
        freed
    }

    /// Make grains returned by [`Meta::take_committed`] or
    /// [`Meta::take_all`] allocatable.
    pub fn release(&mut self, grains: &[u64]) {
        for &g in grains {
            self.pending_set.remove(&g);
            self.alloc.adjust(g, 1);
        }
    }

    // ------------------------------------------------------------ pages

    fn check_grain(&self, g: u64, what: &str) -> Result<()> {
        if g == 0 || g >= self.alloc.hwm {
            return Err(corrupt(format!(
                "{what} points at grain {g}, outside the pool (1..{})",
                self.alloc.hwm
            )));
        }
        Ok(())
    }

    fn load_node(&mut self, g: u64) -> Result<()> {
        if self.cache.contains(PageKey::Map(g)) {
            return Ok(());
        }
        self.check_grain(g, "map")?;
        let mut buf = vec![0u8; GRAIN_BYTES as usize];
        self.pool.read_at(&mut buf, g * GRAIN_BYTES)?;
        let entries =
            decode_map_node(&buf).map_err(|e| corrupt(format!("map node at grain {g}: {e}")))?;
        self.cache
            .insert(PageKey::Map(g), PageData::Map(entries), false);
        Ok(())
    }

    /// The entries of map node `g`.
    pub fn node(&mut self, g: u64) -> Result<&[u64; MAP_FANOUT]> {
        self.load_node(g)?;
        match self.cache.get(PageKey::Map(g)) {
            Some(PageData::Map(e)) => Ok(e),
            _ => unreachable!("map page just loaded"),
        }
    }

    fn node_set(&mut self, g: u64, index: usize, value: u64) -> Result<u64> {
        self.load_node(g)?;
        let old = match self.cache.get_dirty(PageKey::Map(g)) {
            Some(PageData::Map(e)) => std::mem::replace(&mut e[index], value),
            _ => unreachable!("map page just loaded"),
        };
        self.log_map_set(g, index, value);
        Ok(old)
    }

    fn load_ref_page(&mut self, page: u64) -> Result<()> {
        if self.cache.contains(PageKey::Ref(page)) {
            return Ok(());
        }
        let mut buf = vec![0u8; 4096];
        self.refs.read_at(&mut buf, page * 4096)?;
        let mut counts = Box::new([0u32; REFS_PER_PAGE]);
        for (i, c) in counts.iter_mut().enumerate() {
            *c = u32::from_le_bytes(buf[i * 4..i * 4 + 4].try_into().expect("4"));
        }
        self.cache
            .insert(PageKey::Ref(page), PageData::Ref(counts), false);
        Ok(())
    }

    pub fn ref_get(&mut self, g: u64) -> Result<u32> {
        let page = g / REFS_PER_PAGE as u64;
        self.load_ref_page(page)?;
        match self.cache.get(PageKey::Ref(page)) {
            Some(PageData::Ref(c)) => Ok(c[(g % REFS_PER_PAGE as u64) as usize]),
            _ => unreachable!("ref page just loaded"),
        }
    }

    /// Set a count in memory only (allocation before install; replay).
    fn ref_put(&mut self, g: u64, count: u32) -> Result<()> {
        let page = g / REFS_PER_PAGE as u64;
        self.load_ref_page(page)?;
        match self.cache.get_dirty(PageKey::Ref(page)) {
            Some(PageData::Ref(c)) => c[(g % REFS_PER_PAGE as u64) as usize] = count,
            _ => unreachable!("ref page just loaded"),
        }
        Ok(())
    }

    fn ref_set(&mut self, g: u64, count: u32) -> Result<()> {
        self.ref_put(g, count)?;
        self.log_ref_set(g, count);
        Ok(())
    }

    fn incref(&mut self, g: u64) -> Result<()> {
        let c = self.ref_get(g)?;
        if c == 0 {
            return Err(corrupt(format!(
                "grain {g} is referenced but its count is 0"
            )));
        }
        let n = c
            .checked_add(1)
            .ok_or_else(|| corrupt(format!("reference count of grain {g} overflows")))?;
        self.ref_set(g, n)
    }

    /// Drop one reference; free the grain (and, for a node, its subtree) at 0.
    /// `level` is Some(level) for a map node, None for a data grain.
    pub fn decref(&mut self, g: u64, level: Option<u8>) -> Result<()> {
        let c = self.ref_get(g)?;
        if c == 0 {
            return Err(corrupt(format!(
                "grain {g} is released more often than referenced"
            )));
        }
        self.ref_set(g, c - 1)?;
        self.decreased_current.insert(g);
        if c > 1 {
            return Ok(());
        }
        if let Some(l) = level {
            let entries = *self.node(g)?;
            for e in entries.into_iter().filter(|&e| e != 0) {
                self.decref(e, if l == 0 { None } else { Some(l - 1) })?;
            }
            self.cache.remove(PageKey::Map(g));
        }
        self.used_grains -= 1;
        self.pending_set.insert(g);
        self.pending_current.push(g);
        Ok(())
    }

    /// Whether a write may go to grain `g` in place, as far as `g` itself goes.
    fn sole_owner(&mut self, g: u64) -> Result<bool> {
        Ok(self.ref_get(g)? == 1
            && !self.decreased_current.contains(&g)
            && !self.decreased_committing.contains(&g))
    }

    // ------------------------------------------------------------ allocation

    fn allocatable(&mut self, g: u64) -> Result<bool> {
        Ok(g != 0 && g < self.alloc.hwm && !self.pending_set.contains(&g) && self.ref_get(g)? == 0)
    }

    fn take(&mut self, g: u64) -> Result<()> {
        self.ref_put(g, 1)?;
        self.alloc.adjust(g, -1);
        self.used_grains += 1;
        Ok(())
    }

    fn new_block(&mut self, capacity_grains: u64) -> Option<u64> {
        if let Some(&b) = self.alloc.free_blocks.iter().next() {
            return Some(b);
        }
        if self.alloc.hwm + BLOCK_GRAINS <= capacity_grains.max(BLOCK_GRAINS) {
            let b = self.alloc.hwm / BLOCK_GRAINS;
            self.alloc.hwm += BLOCK_GRAINS;
            self.alloc.block_free.push(0);
            let free = if b == 0 {
                BLOCK_GRAINS - 1
            } else {
                BLOCK_GRAINS
            };
            self.alloc.set_block_free(b, free as u16);
            return Some(b);
        }
        self.alloc.partial_blocks.iter().next().copied()
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
            let Some(b) = self.new_block(capacity_grains) else {
                break;
            };
            self.alloc.cursors.insert(owner, (b, 0));
        }
        // Last resort: any partially free block, scanned whole.
        let partial: Vec<u64> = self.alloc.partial_blocks.iter().copied().take(64).collect();
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
        self.ref_put(g, 0)?;
        self.alloc.adjust(g, 1);
        self.used_grains -= 1;
        Ok(())
    }

    fn alloc_node(&mut self, entries: &[u64; MAP_FANOUT]) -> Result<u64> {
        let g = self.alloc_grain(META_OWNER, None, u64::MAX)?;
        self.log_ref_set(g, 1);
        if entries.iter().all(|&e| e == 0) {
            Record::PageZero { grain: g }.encode_into(&mut self.log);
        } else {
            self.log_page_image(g, entries);
        }
        self.cache
            .insert(PageKey::Map(g), PageData::Map(Box::new(*entries)), true);
        Ok(g)
    }

    /// Copy a shared node so one referrer can change it.
    fn cow_node(&mut self, p: u64, level: u8) -> Result<u64> {
        let entries = *self.node(p)?;
        for e in entries.iter().copied().filter(|&e| e != 0) {
            self.incref(e)?;
        }
        let q = self.alloc_node(&entries)?;
        self.decref(p, Some(level))?;
        Ok(q)
    }

    // ------------------------------------------------------------ trees

    /// Entry for virtual grain `v` of version `ver`, and whether a write may
    /// overwrite that grain in place.
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
            node = self.node(node)?[idx];
        }
        if node == 0 {
            return Ok((0, false));
        }
        let exclusive = exclusive && self.sole_owner(node)?;
        Ok((node, exclusive))
    }

    /// Make the path from `ver`'s root down to the node at `stop_level` that
    /// covers `v` private to `ver` (copying shared nodes, creating missing
    /// ones) and return that node.
    fn writable_node(&mut self, ver: u64, v: u64, stop_level: u8) -> Result<u64> {
        let mut st = self.version(ver)?;
        if st.root == 0 {
            st.root = self.alloc_node(&[0; MAP_FANOUT])?;
            self.put_version(st);
        } else if self.ref_get(st.root)? > 1 {
            st.root = self.cow_node(st.root, st.levels - 1)?;
            self.put_version(st);
        }
        let mut node = st.root;
        for level in (stop_level + 1..st.levels).rev() {
            let idx = ((v >> (MAP_FANOUT_SHIFT * level as u32)) as usize) & (MAP_FANOUT - 1);
            let child = self.node(node)?[idx];
            let new_child = if child == 0 {
                self.alloc_node(&[0; MAP_FANOUT])?
            } else if self.ref_get(child)? > 1 {
                self.cow_node(child, level - 1)?
            } else {
                child
            };
            if new_child != child {
                self.node_set(node, idx, new_child)?;
            }
            node = new_child;
        }
        Ok(node)
    }

    /// Set leaf entry for `v`, keeping the version's counters; returns the old entry.
    fn leaf_set(&mut self, ver: u64, v: u64, value: u64) -> Result<u64> {
        let leaf = self.writable_node(ver, v, 0)?;
        let idx = (v as usize) & (MAP_FANOUT - 1);
        let old = self.node_set(leaf, idx, value)?;
        if (old == 0) != (value == 0) {
            let half = idx / BLOCK_GRAINS as usize * BLOCK_GRAINS as usize;
            let entries = self.node(leaf)?;
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

    /// Point `v` at freshly written grain `g` (allocated by `alloc_grain`).
    pub fn install(&mut self, ver: u64, v: u64, g: u64) -> Result<()> {
        self.log_ref_set(g, 1);
        let old = self.leaf_set(ver, v, g)?;
        if old != 0 {
            self.decref(old, None)?;
        }
        Ok(())
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
            node = self.node(node)?[idx];
        }
        if node == 0 {
            return Ok(());
        }
        let leaf = node;
        let entries = *self.node(leaf)?;
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
            let old = self.node_set(parent, idx, 0)?;
            debug_assert_eq!(old, leaf, "a private path leads to the same leaf");
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
        let st = self.version(ver)?;
        if start >= end {
            return Ok(());
        }
        if st.root == 0 {
            f(start, end - start, 0);
            return Ok(());
        }
        self.walk_node(st.root, st.levels - 1, 0, start, end, f)
    }

    fn walk_node(
        &mut self,
        node: u64,
        level: u8,
        base: u64,
        start: u64,
        end: u64,
        f: &mut dyn FnMut(u64, u64, u64),
    ) -> Result<()> {
        let span = 1u64 << (MAP_FANOUT_SHIFT * level as u32);
        let lo = ((start - base) / span) as usize;
        let hi = ((end - 1 - base) / span) as usize;
        if hi >= MAP_FANOUT {
            return Err(corrupt(format!(
                "range past the map's reach at grain {end}"
            )));
        }
        let entries: Vec<u64> = self.node(node)?[lo..=hi].to_vec();
        for (i, e) in entries.into_iter().enumerate() {
            let child_base = base + (lo + i) as u64 * span;
            let s = start.max(child_base);
            let t = end.min(child_base + span);
            if e == 0 {
                f(s, t - s, 0);
            } else if level == 0 {
                f(s, 1, e);
            } else {
                self.walk_node(e, level - 1, child_base, s, t, f)?;
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
        self.diff_node(
            (ra, la.saturating_sub(1)),
            (sb.root, sb.levels - 1),
            levels - 1,
            0,
            end,
            f,
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
        v.copy_from_slice(self.node(node)?);
        Ok(v)
    }

    fn diff_node(
        &mut self,
        a: (u64, u8),
        b: (u64, u8),
        level: u8,
        base: u64,
        end: u64,
        f: &mut dyn FnMut(u64, bool),
    ) -> Result<()> {
        if a == b || base >= end {
            return Ok(());
        }
        let ea = self.entries_at(a.0, a.1, level)?;
        let eb = self.entries_at(b.0, b.1, level)?;
        let span = 1u64 << (MAP_FANOUT_SHIFT * level as u32);
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
                f(cb, eb[i] != 0);
            } else {
                self.diff_node((ea[i], child(a)), (eb[i], child(b)), level - 1, cb, end, f)?;
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
        out.clear();
        self.walk(ver, start, start + count, &mut |_, n, g| {
            if g == 0 {
                out.extend(std::iter::repeat_n(0, n as usize));
            } else {
                out.push(g);
            }
        })
    }

    // ------------------------------------------------------------ versions

    /// A new version sharing everything with `src` (snapshot, clone, revert).
    pub fn new_version_from(&mut self, id: u64, src: u64) -> Result<()> {
        let mut st = self.version(src)?;
        if st.root != 0 {
            self.incref(st.root)?;
        }
        st.version = id;
        self.put_version(st);
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
        self.catalog_dirty = true;
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
            self.catalog_dirty = true;
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
                self.catalog_dirty = true;
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
                let first = self.node(node)?.iter().position(|&e| e != 0);
                let Some(i) = first else {
                    // An empty node: unlink and free it.
                    match parent {
                        None => {
                            st.root = 0;
                            self.put_version(st);
                        }
                        Some((p, pi)) => {
                            self.node_set(p, pi, 0)?;
                        }
                    }
                    self.decref(node, Some(level))?;
                    budget = budget.saturating_sub(1);
                    break;
                };
                let child = self.node(node)?[i];
                if level == 0 {
                    self.node_set(node, i, 0)?;
                    self.decref(child, None)?;
                    budget = budget.saturating_sub(1);
                    break;
                }
                if level == 1 || self.ref_get(child)? > 1 {
                    self.node_set(node, i, 0)?;
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
                st.root = self.alloc_node(&entries)?;
            }
            st.levels += 1;
        }
        self.put_version(st);
        Ok(())
    }

    // ------------------------------------------------------------ checkpoint

    /// Grains freed but not yet allocatable.
    pub fn pending_len(&self) -> usize {
        self.pending_set.len()
    }

    pub fn needs_checkpoint(&self) -> bool {
        self.cache.dirty_pages() * 2 > self.cache.budget_pages()
    }

    /// Write every dirty page to its place (checkpoint step 2). Adjacent
    /// pages go out as one write of at most 1 MiB; memory use stays at one
    /// such run, not a copy of every dirty page.
    pub fn write_dirty_pages(&mut self) -> Result<()> {
        const RUN_PAGES_MAX: usize = 256;
        let order = |k: &PageKey| match k {
            PageKey::Map(g) => (0u8, *g),
            PageKey::Ref(p) => (1u8, *p),
        };
        let mut keys: Vec<PageKey> = self.cache.dirty().map(|(k, _)| k).collect();
        keys.sort_by_key(order);
        let mut run: Vec<u8> = Vec::with_capacity(RUN_PAGES_MAX * 4096);
        let mut i = 0;
        while i < keys.len() {
            let (kind, first) = order(&keys[i]);
            let mut j = i + 1;
            while j < keys.len()
                && j - i < RUN_PAGES_MAX
                && order(&keys[j]) == (kind, first + (j - i) as u64)
            {
                j += 1;
            }
            run.clear();
            run.resize((j - i) * 4096, 0);
            for (n, k) in keys[i..j].iter().enumerate() {
                let buf = &mut run[n * 4096..(n + 1) * 4096];
                match self.cache.peek(*k) {
                    Some(PageData::Map(e)) => encode_map_node(e, buf),
                    Some(PageData::Ref(c)) => {
                        for (x, v) in c.iter().enumerate() {
                            buf[x * 4..x * 4 + 4].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                    None => unreachable!("dirty pages stay cached until the checkpoint"),
                }
            }
            let target = if kind == 0 { &self.pool } else { &self.refs };
            target.write_at(&run, first * 4096)?;
            i = j;
        }
        Ok(())
    }

    // ------------------------------------------------------------ recovery

    /// Apply one replayed record (docs/FORMAT.md §5).
    pub fn replay(&mut self, rec: Record) -> Result<()> {
        let bump = |hwm: &mut u64, g: u64| {
            let need = (g + 1).div_ceil(BLOCK_GRAINS) * BLOCK_GRAINS;
            if need > *hwm {
                *hwm = need;
            }
        };
        match rec {
            Record::PageImage { grain, data } => {
                bump(&mut self.alloc.hwm, grain);
                let e = decode_map_node(&data[..])?;
                self.replay_pages.insert(grain, e);
            }
            Record::PageZero { grain } => {
                bump(&mut self.alloc.hwm, grain);
                self.replay_pages.insert(grain, Box::new([0; MAP_FANOUT]));
            }
            Record::MapSet {
                grain,
                index,
                value,
            } => {
                if !self.replay_pages.contains_key(&grain) {
                    self.check_grain(grain, "log record")?;
                    let mut buf = vec![0u8; GRAIN_BYTES as usize];
                    self.pool.read_at(&mut buf, grain * GRAIN_BYTES)?;
                    // No validation here: the grain may have been freed and
                    // reused as data later in the log, in which case a later
                    // REF_SET to 0 drops this page before it is ever used.
                    let mut e = Box::new([0u64; MAP_FANOUT]);
                    for (i, slot) in e.iter_mut().enumerate() {
                        *slot = u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8"));
                    }
                    self.replay_pages.insert(grain, e);
                }
                self.replay_pages.get_mut(&grain).expect("inserted")[index as usize] = value;
            }
            Record::RefSet { grain, count } => {
                bump(&mut self.alloc.hwm, grain);
                self.ref_put(grain, count)?;
                if count == 0 {
                    self.replay_pages.remove(&grain);
                    self.cache.remove(PageKey::Map(grain));
                }
            }
            Record::Version(st) => {
                if self.versions.contains_key(&st.version) {
                    self.versions.insert(st.version, st);
                }
            }
            Record::Catalog(bytes) => {
                let mut c = Catalog::decode(&bytes)?;
                self.versions = c
                    .versions
                    .drain(..)
                    .map(|v| (v.id, VersionState::from(v)))
                    .collect();
                self.catalog = c;
            }
        }
        Ok(())
    }

    /// After replay: cache the rebuilt nodes (dirty) and rebuild free space.
    pub fn finish_open(&mut self) -> Result<()> {
        for (g, e) in std::mem::take(&mut self.replay_pages) {
            if let Some((i, v)) = e
                .iter()
                .enumerate()
                .find(|(_, v)| **v & !strata_format::ENTRY_GRAIN_MASK != 0)
            {
                return Err(corrupt(format!(
                    "map node at grain {g} after log replay: entry {i} has reserved bits set: {v:#x}"
                )));
            }
            self.cache.insert(PageKey::Map(g), PageData::Map(e), true);
        }
        let blocks = self.alloc.hwm / BLOCK_GRAINS;
        self.alloc.block_free = vec![0; blocks as usize];
        self.alloc.free_blocks.clear();
        self.alloc.partial_blocks.clear();
        self.used_grains = 0;
        // Scan counts 1 MiB of refcount.data at a time (256 Ki grains).
        const CHUNK_GRAINS: u64 = 256 * 1024;
        let mut buf = vec![0u8; (CHUNK_GRAINS * 4) as usize];
        let mut g0 = 0;
        while g0 < self.alloc.hwm {
            let n = CHUNK_GRAINS.min(self.alloc.hwm - g0);
            self.refs.read_at(&mut buf[..(n * 4) as usize], g0 * 4)?;
            let mut block_free = 0u16;
            for i in 0..n {
                let g = g0 + i;
                let page = g / REFS_PER_PAGE as u64;
                let count = if self.cache.contains(PageKey::Ref(page)) {
                    self.ref_get(g)?
                } else {
                    u32::from_le_bytes(
                        buf[(i * 4) as usize..(i * 4 + 4) as usize]
                            .try_into()
                            .expect("4"),
                    )
                };
                if g != 0 {
                    if count == 0 {
                        block_free += 1;
                    } else {
                        self.used_grains += 1;
                    }
                }
                if (g + 1) % BLOCK_GRAINS == 0 {
                    self.alloc.set_block_free(g / BLOCK_GRAINS, block_free);
                    block_free = 0;
                }
            }
            g0 += n;
        }
        Ok(())
    }
}
