//! Reference counts and frees (docs/FORMAT.md §4). A count never falls
//! below zero and a grain is freed only when its count reaches zero: both
//! are checked where counts change; a violation is an error the caller
//! turns into a fail-stop.
//!
//! They take map entries as they are: a leaf entry's key index (bits
//! 44–47, FORMAT.md §16.4) and packed flag (bit 43, §18.1) are left out,
//! so a grain counts the same under any key; a packed entry whose
//! fragment spills (bit 42, §18.8) references the grain after the one it
//! names too, so it counts, and is released, on both.

use super::{corrupt, Meta};
use strata_format::{leaf_grain, leaf_packed, leaf_spills, Record, REFS_PER_PAGE};

use crate::cache::{PageData, PageKey};
use crate::error::Result;

impl Meta {
    pub(super) fn incref(&mut self, e: u64) -> Result<()> {
        self.incref_grain(leaf_grain(e))?;
        if leaf_spills(e) {
            self.incref_grain(leaf_grain(e) + 1)?;
        }
        Ok(())
    }

    fn incref_grain(&mut self, g: u64) -> Result<()> {
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
    /// `level` is Some(level) for a map node, None for a data grain (a
    /// leaf entry: one that spills releases the next grain too).
    pub fn decref(&mut self, e: u64, level: Option<u8>) -> Result<()> {
        let g = leaf_grain(e);
        if level.is_none() && leaf_spills(e) {
            self.decref(g + 1, None)?;
        }
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
            let entries = *self.node(g, l)?;
            for e in entries.into_iter().filter(|&e| e != 0) {
                self.decref(e, if l == 0 { None } else { Some(l - 1) })?;
            }
        }
        self.freed(g);
        Ok(())
    }

    /// Grain `g`'s count just became 0: it is free once the batch is
    /// durable (pending until then), and a map node's cached page goes.
    /// What `g` points at is the caller's business (`decref` drops it, a
    /// moved node keeps it for its copy).
    pub(super) fn freed(&mut self, g: u64) {
        self.decreased_current.insert(g);
        self.cache.remove(PageKey::Map(g));
        self.freed_data(g);
    }

    /// [`Meta::freed`] for a grain that was never a map node since it was
    /// last allocated (a data or stream grain: no cached page to drop).
    fn freed_data(&mut self, g: u64) {
        assert!(self.used_grains > 0, "grain {g} freed with no grain in use");
        self.used_grains -= 1;
        let fresh = self.pending_set.insert(g);
        assert!(fresh, "grain {g} freed twice in one batch");
        self.pending_current.push(g);
    }

    /// Drop one reference of each leaf entry of `entries` (what a write's
    /// new grains replaced), as `decref(e, None)` for each would: the
    /// grains sorted, one count-page lookup per run of them on one page,
    /// and each grain's count logged once, as it ends, consecutive grains
    /// ending alike in one REF_RUN (FORMAT.md §5). A 512 KiB write over
    /// packed grains releases some 70 stream grains 128 times; one at a
    /// time that was most of such a write's metadata work.
    ///
    /// A stream grain (named by packed entries only, §18.1) is not noted
    /// as decreased in the batch: that note only stops a write in place,
    /// and no write goes in place into a packed grain (§18.4).
    pub(super) fn release_data(&mut self, entries: &[u64]) -> Result<()> {
        // (grain, named by a packed entry) for every reference dropped.
        let mut drops: Vec<(u64, bool)> = Vec::with_capacity(entries.len() + entries.len() / 2);
        for &e in entries {
            if leaf_spills(e) {
                drops.push((leaf_grain(e) + 1, true));
            }
            drops.push((leaf_grain(e), leaf_packed(e)));
        }
        drops.sort_unstable_by_key(|d| d.0);
        // (grain, its count after, packed) once per grain, in order.
        let mut ends: Vec<(u64, u32, bool)> = Vec::with_capacity(drops.len());
        let per = REFS_PER_PAGE as u64;
        let mut i = 0;
        while i < drops.len() {
            let page = drops[i].0 / per;
            let counts = self.ref_page_mut(page)?;
            while let Some(&(g, packed)) = drops.get(i).filter(|d| d.0 / per == page) {
                let c = &mut counts[(g % per) as usize];
                if *c == 0 {
                    return Err(corrupt(format!(
                        "grain {g} is released more often than referenced"
                    )));
                }
                *c -= 1;
                match ends.last_mut() {
                    Some(end) if end.0 == g => *end = (g, *c, end.2 && packed),
                    _ => ends.push((g, *c, packed)),
                }
                i += 1;
            }
        }
        let mut j = 0;
        while j < ends.len() {
            let (g, count, _) = ends[j];
            let mut k = j + 1;
            while k < ends.len() && ends[k].0 == g + (k - j) as u64 && ends[k].1 == count {
                k += 1;
            }
            self.log_record(&if k - j == 1 {
                Record::RefSet { grain: g, count }
            } else {
                Record::RefRun {
                    grain: g,
                    n: (k - j) as u32,
                    count,
                }
            });
            j = k;
        }
        for (g, count, packed) in ends {
            if !packed {
                self.decreased_current.insert(g);
            }
            if count == 0 {
                self.freed_data(g);
            }
        }
        Ok(())
    }

    /// `sole_owner` for each entry `(grain, true)` of `pieces`, in place
    /// (entries already false stay false): one count-page lookup per run of
    /// grains on the same page.
    pub(super) fn sole_owners(&mut self, pieces: &mut [(u64, bool)]) -> Result<()> {
        let per_page = REFS_PER_PAGE as u64;
        let mut i = 0;
        while i < pieces.len() {
            if !pieces[i].1 {
                i += 1;
                continue;
            }
            let page = leaf_grain(pieces[i].0) / per_page;
            self.load_ref_page(page)?;
            let Some(PageData::Ref(counts)) = self.cache.get(PageKey::Ref(page)) else {
                unreachable!("ref page just loaded")
            };
            while i < pieces.len() && (!pieces[i].1 || leaf_grain(pieces[i].0) / per_page == page) {
                let (g, ok) = &mut pieces[i];
                if *ok {
                    // A packed entry is never written in place (§18.4).
                    *ok = !leaf_packed(*g) && counts[(leaf_grain(*g) % per_page) as usize] == 1;
                }
                i += 1;
            }
        }
        if !self.decreased_current.is_empty() || !self.decreased_committing.is_empty() {
            for (g, ok) in pieces.iter_mut().filter(|p| p.1) {
                *ok = !self.decreased_in_batch(leaf_grain(*g));
            }
        }
        Ok(())
    }

    /// Whether `g`'s count fell in a batch not yet durable: a crash could
    /// bring back the reference that was dropped, so `g` is not yet the
    /// writer's alone.
    fn decreased_in_batch(&self, g: u64) -> bool {
        self.decreased_current.contains(&g) || self.decreased_committing.contains(&g)
    }

    /// Whether a write may go to grain `g` in place, as far as `g` itself goes.
    pub(super) fn sole_owner(&mut self, g: u64) -> Result<bool> {
        Ok(!leaf_packed(g) && self.ref_get(g)? == 1 && !self.decreased_in_batch(leaf_grain(g)))
    }
}
