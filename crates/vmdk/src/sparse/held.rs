//! What the allocation lock of an extent guards: where the next grain goes,
//! and the metadata updates held in memory until the data they point to is
//! durable (docs/FORMAT.md §9.3).

use std::collections::BTreeMap;

use super::header::SeSparseVolatile;

/// Past this many unwritten metadata updates, or tables holding them, a
/// write flushes by itself, bounding the memory they take.
pub const MAX_PENDING_META: usize = 1 << 16;
pub const MAX_DIRTY_TABLES: usize = 512;

#[derive(Default)]
pub struct AllocState {
    /// Byte offset where the next appended grain or table goes.
    pub next_bytes: u64,
    pub se_volatile: SeSparseVolatile,
    /// Table, directory and header bytes not yet written, by file offset.
    meta: BTreeMap<u64, Vec<u8>>,
    /// SEsparse: free grain slots below the declared grains region's end,
    /// found by a scan once appending would pass that end (lowest last).
    pub se_free: Vec<u64>,
    /// While an online shrink runs: every grain allocated since its last
    /// step, as (byte offset, grain), so the shrink's slot map stays a
    /// superset of the used slots (docs/FORMAT.md §9.3, Online shrink).
    pub shrink_log: Option<Vec<(u64, u64)>>,
}

impl AllocState {
    pub fn new(next_bytes: u64, se_volatile: SeSparseVolatile) -> Self {
        Self {
            next_bytes,
            se_volatile,
            ..Default::default()
        }
    }

    /// Hold `bytes` for byte `offset` of the file until the next flush
    /// (a later update of the same offset replaces it).
    pub fn hold(&mut self, offset: u64, bytes: Vec<u8>) {
        self.meta.insert(offset, bytes);
    }

    pub fn held(&self) -> usize {
        self.meta.len()
    }

    /// The held updates as writes, neighbours coalesced. They stay held
    /// until [`AllocState::written`] (a failed write can be retried).
    pub fn runs(&self) -> Vec<(u64, Vec<u8>)> {
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (&off, b) in &self.meta {
            match runs.last_mut() {
                Some((o, buf)) if *o + buf.len() as u64 == off => buf.extend_from_slice(b),
                _ => runs.push((off, b.clone())),
            }
        }
        runs
    }

    /// Every held update has been written.
    pub fn written(&mut self) {
        self.meta.clear();
    }
}
