//! The grain-table cache of one extent: tables read on demand, at most
//! [`GT_CACHE_LIMIT`] of them. Tables with updates not yet written to the
//! file ("dirty") are never evicted, since the cache is then the only copy
//! of those entries; `clear_dirty` is called once the updates are durable.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

/// Grain tables kept in memory at most; beyond, arbitrary clean ones are
/// dropped (tables with unwritten updates stay until the next flush).
pub const GT_CACHE_LIMIT: usize = 4096;

pub type Table = Arc<Vec<u64>>;

#[derive(Default)]
pub struct GtCache {
    tables: Mutex<HashMap<u64, Table>>,
    /// Lock order: `tables`, then `dirty`.
    dirty: Mutex<HashSet<u64>>,
}

impl GtCache {
    pub fn get(&self, l1: u64) -> Option<Table> {
        self.tables.lock().get(&l1).cloned()
    }

    /// Cache table `l1` as just read from the file, evicting a clean table
    /// when full. A writer may have cached a newer copy meanwhile: that one
    /// is kept and returned.
    pub fn insert_read(&self, l1: u64, t: Table) -> Table {
        let mut c = self.tables.lock();
        if c.len() >= GT_CACHE_LIMIT {
            let dirty = self.dirty.lock();
            if let Some(k) = c.keys().find(|k| !dirty.contains(k)).copied() {
                c.remove(&k);
            }
        }
        c.entry(l1).or_insert(t).clone()
    }

    /// Cache a table whose updates are not yet in the file; returns how
    /// many tables are dirty now.
    pub fn insert_dirty(&self, l1: u64, t: Table) -> usize {
        // Dirty before cached, so a reader's eviction cannot drop it.
        let dirty_tables = {
            let mut d = self.dirty.lock();
            d.insert(l1);
            d.len()
        };
        self.tables.lock().insert(l1, t);
        dirty_tables
    }

    /// Drop table `l1` (its directory entry changed).
    pub fn forget(&self, l1: u64) {
        self.tables.lock().remove(&l1);
    }

    /// Every held update reached the file: all tables may be evicted again.
    pub fn clear_dirty(&self) {
        self.dirty.lock().clear();
    }
}
