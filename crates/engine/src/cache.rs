//! A bounded cache of metadata pages: map nodes and reference-count pages.
//!
//! Clean pages are evicted by a second-chance clock when the cache is over
//! its budget. Dirty pages stay until the next checkpoint writes them; when
//! they alone exceed the budget the engine checkpoints (see `Meta::needs_checkpoint`).

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use strata_format::{MapNode, REFS_PER_PAGE};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageKey {
    /// A map node, by its pool grain.
    Map(u64),
    /// A count page of `refcount.data`, by page index (grain / REFS_PER_PAGE).
    Ref(u64),
}

impl PageKey {
    /// (file, page index): 0 = `pool.data` by grain, 1 = `refcount.data`
    /// by count page. Sorting by it puts pages in write order, adjacent
    /// pages of a file next to each other.
    pub fn place(&self) -> (u8, u64) {
        match *self {
            PageKey::Map(g) => (0, g),
            PageKey::Ref(p) => (1, p),
        }
    }
}

/// A cached page's contents. Shared, not copied, by a checkpoint's cut:
/// cloning a `PageData` is a reference-count increment, and the first
/// change to a page the checkpoint still holds copies it then
/// ([`PageCache::get_dirty`]). So the cut, which holds the I/O gate,
/// costs a pointer per dirty page instead of 4 KiB.
#[derive(Clone)]
pub enum PageData {
    /// Entries without lanes, and the node's level.
    Map(Arc<MapNode>),
    Ref(Arc<[u32; REFS_PER_PAGE]>),
}

impl PageData {
    pub fn map(node: MapNode) -> Self {
        PageData::Map(Arc::new(node))
    }

    pub fn counts(counts: Box<[u32; REFS_PER_PAGE]>) -> Self {
        PageData::Ref(Arc::from(counts))
    }
}

/// A page's contents, writable: see [`PageCache::get_dirty`].
pub enum PageMut<'a> {
    Map(&'a mut MapNode),
    Ref(&'a mut [u32; REFS_PER_PAGE]),
}

struct Slot {
    data: PageData,
    dirty: bool,
    /// When the page was last made dirty (see [`PageCache::cut`]).
    dirty_seq: u64,
    referenced: bool,
}

pub struct PageCache {
    /// Keyed by page number: ids the engine allocates, not client input,
    /// so a fast non-keyed hash (a page lookup is on every I/O's path).
    pages: FxHashMap<PageKey, Slot>,
    clock: VecDeque<PageKey>,
    budget_pages: usize,
    dirty_pages: usize,
    /// Counts changes to pages, so a checkpoint can tell the pages it
    /// wrote from pages changed again while it ran.
    seq: u64,
    pub hits: u64,
    pub misses: u64,
}

impl PageCache {
    pub fn new(budget_bytes: u64) -> Self {
        PageCache {
            pages: FxHashMap::default(),
            clock: VecDeque::new(),
            budget_pages: (budget_bytes / 4096).max(64) as usize,
            dirty_pages: 0,
            seq: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn dirty_pages(&self) -> usize {
        self.dirty_pages
    }

    pub fn budget_pages(&self) -> usize {
        self.budget_pages
    }

    pub fn contains(&self, key: PageKey) -> bool {
        self.pages.contains_key(&key)
    }

    /// Look a page up, marking it recently used.
    pub fn get(&mut self, key: PageKey) -> Option<&PageData> {
        match self.pages.get_mut(&key) {
            Some(s) => {
                self.hits += 1;
                s.referenced = true;
                Some(&s.data)
            }
            None => None,
        }
    }

    /// Look a page up without counting it as a use (checkpoint writer).
    pub fn peek(&self, key: PageKey) -> Option<&PageData> {
        self.pages.get(&key).map(|s| &s.data)
    }

    /// Look a page up for modification and mark it dirty. A page a
    /// checkpoint's cut still holds is copied first (the checkpoint keeps
    /// the contents it cut).
    pub fn get_dirty(&mut self, key: PageKey) -> Option<PageMut<'_>> {
        match self.pages.get_mut(&key) {
            Some(s) => {
                if !s.dirty {
                    s.dirty = true;
                    self.dirty_pages += 1;
                }
                self.seq += 1;
                s.dirty_seq = self.seq;
                s.referenced = true;
                Some(match &mut s.data {
                    PageData::Map(n) => PageMut::Map(Arc::make_mut(n)),
                    PageData::Ref(c) => PageMut::Ref(Arc::make_mut(c)),
                })
            }
            None => None,
        }
    }

    /// Insert a page (replacing any older copy), then evict clean pages over budget.
    pub fn insert(&mut self, key: PageKey, data: PageData, dirty: bool) {
        self.misses += 1;
        self.seq += 1;
        if let Some(old) = self.pages.insert(
            key,
            Slot {
                data,
                dirty,
                dirty_seq: self.seq,
                referenced: true,
            },
        ) {
            if old.dirty {
                self.dirty_pages -= 1;
            }
        } else {
            self.clock.push_back(key);
        }
        if dirty {
            self.dirty_pages += 1;
        }
        // Never the page just inserted: its caller is about to use it.
        self.evict(Some(key));
    }

    /// Forget a page without writing it (its grain was freed).
    pub fn remove(&mut self, key: PageKey) {
        if let Some(s) = self.pages.remove(&key) {
            if s.dirty {
                self.dirty_pages -= 1;
            }
        }
    }

    /// Evict clean pages while over budget, never `keep`. With nearly
    /// every page dirty, the page just inserted used to be the only clean
    /// one, and evicting it under its caller's feet panicked the server
    /// (found by bench.py's ckpt case with a 16 MiB cache).
    fn evict(&mut self, keep: Option<PageKey>) {
        // Bounded: at most two sweeps of the clock per insertion.
        let mut budget_steps = self.clock.len() * 2;
        while self.pages.len() > self.budget_pages && budget_steps > 0 {
            budget_steps -= 1;
            let Some(key) = self.clock.pop_front() else {
                break;
            };
            let Some(slot) = self.pages.get_mut(&key) else {
                continue; // removed earlier; drop the stale clock entry
            };
            if slot.dirty || slot.referenced || Some(key) == keep {
                slot.referenced = false;
                self.clock.push_back(key);
                continue;
            }
            self.pages.remove(&key);
        }
        // Stale clock entries of removed pages must not grow without bound.
        if self.clock.len() > 2 * self.pages.len() + 1024 {
            let pages = &self.pages;
            self.clock.retain(|k| pages.contains_key(k));
        }
    }

    /// Every dirty page, for a checkpoint's cut ([`Self::cut`]): clone
    /// what it yields (a reference, see [`PageData`]); call
    /// [`Self::mark_clean_upto`] once the checkpoint is durable.
    pub fn dirty(&self) -> impl Iterator<Item = (PageKey, &PageData)> {
        self.pages
            .iter()
            .filter(|(_, s)| s.dirty)
            .map(|(k, s)| (*k, &s.data))
    }

    /// The point a checkpoint cuts at: pages dirty now are the ones it writes.
    pub fn cut(&self) -> u64 {
        self.seq
    }

    /// A checkpoint that cut at `cut` is durable: pages not changed since
    /// are clean (and may be evicted); pages changed while it ran stay dirty.
    pub fn mark_clean_upto(&mut self, cut: u64) {
        let mut cleaned = 0;
        for s in self.pages.values_mut() {
            if s.dirty && s.dirty_seq <= cut {
                s.dirty = false;
                cleaned += 1;
            }
        }
        self.dirty_pages -= cleaned;
        self.evict(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_keeps_the_contents_it_took_while_the_page_changes_on() {
        let mut c = PageCache::new(64 * 4096);
        let key = PageKey::Ref(3);
        c.insert(key, PageData::counts(Box::new([7; REFS_PER_PAGE])), true);
        let cut: Vec<(PageKey, PageData)> = c.dirty().map(|(k, d)| (k, d.clone())).collect();
        match c.get_dirty(key) {
            Some(PageMut::Ref(counts)) => counts[5] = 9,
            _ => panic!("page 3 is cached"),
        }
        let PageData::Ref(taken) = &cut[0].1 else {
            panic!("a count page")
        };
        assert_eq!(taken[5], 7, "the cut's copy changed under the checkpoint");
        match c.peek(key) {
            Some(PageData::Ref(now)) => assert_eq!(now[5], 9),
            _ => panic!("page 3 is cached"),
        }
        // Once the checkpoint has let go, a change copies nothing.
        drop(cut);
        let before = match c.peek(key) {
            Some(PageData::Ref(now)) => Arc::as_ptr(now),
            _ => unreachable!(),
        };
        let Some(PageMut::Ref(counts)) = c.get_dirty(key) else {
            unreachable!()
        };
        assert_eq!(counts.as_ptr(), before as *const u32);
    }

    #[test]
    fn a_page_just_inserted_survives_even_when_every_other_page_is_dirty() {
        let mut c = PageCache::new(64 * 4096);
        for p in 0..64 {
            c.insert(
                PageKey::Ref(p),
                PageData::counts(Box::new([0; REFS_PER_PAGE])),
                true,
            );
        }
        for p in 64..200 {
            c.insert(
                PageKey::Ref(p),
                PageData::counts(Box::new([0; REFS_PER_PAGE])),
                false,
            );
            assert!(
                c.get(PageKey::Ref(p)).is_some(),
                "page {p} evicted on insert"
            );
        }
    }
}
