//! Metadata state and the operations on it: map trees, reference counts,
//! allocation, and the log buffer. Everything here runs under the engine's
//! metadata mutex; nothing here does data I/O except loading and (at a
//! checkpoint) writing metadata pages.
//!
//! Submodules, each one job, all below this file's state:
//! - `pages`: loading, checking and encoding map nodes and count pages
//!   (docs/FORMAT.md §3–4); the checks run after every read and, as
//!   assertions, before every write;
//! - `refs`: reference counts, frees and the "pending" rules;
//! - `alloc`: physical allocation (free grains per block, cursors);
//! - `tree`: lookups, copy-on-write paths, unmap, walks and diffs;
//! - `versions`: creating, dropping and reclaiming versions;
//! - `replay`: applying log records at open, and rebuilding free space;
//! - `space`: what dropping versions would free (read-only simulation);
//! - `layout`: fragments, free extents, moving a shared grain (§10).
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

mod alloc;
mod layout;
mod pack;
mod pages;
mod refs;
mod replay;
mod space;
mod split;
mod tree;
mod versions;

use std::collections::HashMap;

use rustc_hash::FxHashSet;
use std::sync::Arc;

use strata_format::{Record, VersionState, GRAIN_BYTES};
use strata_storage::Storage;

use crate::cache::PageCache;
use crate::catalog::{Catalog, VersionRec};
use crate::error::{Error, ErrorKind, Result};

pub use alloc::{pool_end_covering, Allocator, DataSlot, Place};
pub use layout::{Fragments, FreeExtents, SpanLeaves, ZoneGrain, ZoneScan};
pub use pack::Packing;
pub use pages::{DirtyPages, EncodedPage};
pub use split::Moved;

/// What a commit takes out of the metadata state.
pub struct Batch {
    pub payload: Vec<u8>,
    pub has_pending_frees: bool,
}

pub struct Meta {
    pool: Arc<dyn Storage>,
    refs: Arc<dyn Storage>,
    cache: PageCache,
    /// Disks and snapshots; `catalog.versions` is kept empty: see `versions`.
    pub catalog: Catalog,
    versions: HashMap<u64, VersionState>,
    log: Vec<u8>,
    dirty_versions: FxHashSet<u64>,
    catalog_dirty: bool,
    alloc: Allocator,
    /// `pool_grains` of the durable superblock: count pages wholly at or
    /// above it may read as zeros (never written), pages below may not.
    durable_hwm: u64,
    pending_current: Vec<u64>,
    pending_committing: Vec<u64>,
    pending_set: FxHashSet<u64>,
    decreased_current: FxHashSet<u64>,
    decreased_committing: FxHashSet<u64>,
    /// Grains with a non-zero count (data and map nodes).
    used_grains: u64,
    /// See [`Meta::change_count`].
    changes: u64,
    replay: replay::ReplayState,
}

/// The runs of `grains` in order, as `(start, end, first grain)`: holes
/// (0) together, or grains that go up by one (physically adjacent).
pub(crate) fn grain_runs(grains: &[u64]) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
    let mut i = 0usize;
    std::iter::from_fn(move || {
        if i >= grains.len() {
            return None;
        }
        let g0 = grains[i];
        let mut j = i + 1;
        while j < grains.len()
            && ((g0 == 0 && grains[j] == 0) || (g0 != 0 && grains[j] == g0 + (j - i) as u64))
        {
            j += 1;
        }
        let run = (i, j, g0);
        i = j;
        Some(run)
    })
}

pub(crate) fn corrupt(msg: impl Into<String>) -> Error {
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
        let versions = catalog.take_versions();
        Meta {
            pool,
            refs,
            cache: PageCache::new(cache_bytes),
            catalog,
            versions,
            log: Vec::new(),
            dirty_versions: FxHashSet::default(),
            catalog_dirty: false,
            alloc: Allocator::new(hwm),
            durable_hwm: hwm,
            pending_current: Vec::new(),
            pending_committing: Vec::new(),
            pending_set: FxHashSet::default(),
            decreased_current: FxHashSet::default(),
            decreased_committing: FxHashSet::default(),
            used_grains: 0,
            changes: 0,
            replay: replay::ReplayState::default(),
        }
    }

    // ------------------------------------------------------------ state

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
        self.changes += 1;
    }

    /// Changes made so far (records logged, versions or the catalog marked
    /// dirty): an error after this moved means a change was half made.
    pub fn change_count(&self) -> u64 {
        self.changes
    }

    pub fn version(&self, id: u64) -> Result<VersionState> {
        self.versions
            .get(&id)
            .copied()
            .ok_or_else(|| Error::new(ErrorKind::Gone, format!("version {id} no longer exists")))
    }

    /// A version's state, if it exists (counters for `info`).
    pub fn version_state(&self, id: u64) -> Option<VersionState> {
        self.versions.get(&id).copied()
    }

    /// The head version of every disk (the versions clients write), sorted.
    pub fn head_versions(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.catalog.disks.iter().map(|d| d.head).collect();
        v.sort_unstable();
        v
    }

    /// Every version id, sorted.
    pub fn version_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.versions.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    fn put_version(&mut self, st: VersionState) {
        self.changes += 1;
        self.versions.insert(st.version, st);
        self.dirty_versions.insert(st.version);
    }

    /// Grains below this are in the pool.
    pub fn hwm(&self) -> u64 {
        self.alloc.hwm
    }

    /// Grains with a non-zero count (data and map nodes).
    pub fn used_grains(&self) -> u64 {
        self.used_grains
    }

    /// Mapped grains summed over every disk's head and every snapshot
    /// (their counters: O(disks + snapshots)), what they would take if
    /// nothing were shared.
    pub fn logical_grains(&self) -> u64 {
        let heads = self.catalog.disks.iter().map(|d| d.head);
        let snaps = self.catalog.snapshots.iter().map(|s| s.version);
        heads
            .chain(snaps)
            .filter_map(|v| self.version_state(v))
            .map(|s| s.mapped_grains)
            .sum()
    }

    /// Grains in the pool that are free and allocatable.
    pub fn free_grains(&self) -> u64 {
        self.alloc.free_grains()
    }

    /// Bytes of metadata pages held in memory.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.len() as u64 * GRAIN_BYTES
    }

    /// Dirty pages exceed the whole cache budget: checkpoint before more.
    pub fn cache_over_budget(&self) -> bool {
        self.cache.dirty_pages() > self.cache.budget_pages()
    }

    pub fn needs_checkpoint(&self) -> bool {
        self.cache.dirty_pages() * 2 > self.cache.budget_pages()
    }

    // ------------------------------------------------------------ log

    pub fn log_len(&self) -> usize {
        self.log.len()
    }

    fn log_record(&mut self, r: &Record) {
        self.changes += 1;
        r.encode_into(&mut self.log);
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
        assert!(
            self.pending_committing.is_empty(),
            "a batch is taken while the previous one's frees are not settled"
        );
        assert!(
            self.decreased_committing.is_empty(),
            "a batch is taken while the previous one's decreases are not settled"
        );
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

    /// Make grains returned by [`Meta::take_committed`] allocatable.
    pub fn release(&mut self, grains: &[u64]) {
        for &g in grains {
            self.pending_set.remove(&g);
            self.alloc.adjust(g, 1);
        }
    }

    /// Grains freed but not yet allocatable.
    pub fn pending_len(&self) -> usize {
        self.pending_set.len()
    }
}
