//! S3-FIFO eviction by bytes (docs/FORMAT.md §11.8): which cached
//! segments to delete when the cache is over its bound. Only the policy:
//! the caller owns the files and deletes what [`S3Fifo::insert`] and
//! [`S3Fifo::evict_over`] return.
//!
//! A new key enters the small FIFO (a tenth of the bound). Leaving it, a
//! key that was used since it entered moves to the main FIFO; one that was
//! not is evicted and remembered as a ghost (its id only), so that if it
//! comes back soon it enters the main FIFO at once. The main FIFO gives a
//! key that was used another round (one use less, at most [`MAX_USES`]
//! counted) and evicts one that was not. One pass over a segment uses it
//! many times within moments, so a use counts only if the previous counted
//! use (or the arrival) is at least [`USE_GAP`] old: a scan's segments
//! leave through the small FIFO without disturbing the main one.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Uses counted per key at most.
pub const MAX_USES: u8 = 3;
/// Uses closer together than this count once.
pub const USE_GAP: Duration = Duration::from_secs(1);

struct Meta {
    bytes: u64,
    uses: u8,
    main: bool,
    /// A read brought or used it (a key that was only written leaves no
    /// ghost: being read later is its first use, not a return).
    read: bool,
    /// When the last counted use (or the arrival) was.
    used: Instant,
    /// Which of the key's queue places is current (older ones are stale).
    gen: u64,
}

impl Meta {
    /// `m` queued again in the main FIFO with `uses` left, as read.
    fn promoted(m: &Meta, uses: u8) -> Meta {
        Meta {
            uses,
            main: true,
            read: true,
            ..*m
        }
    }
}

/// A key's arrival ([`S3Fifo::insert`]).
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub bytes: u64,
    /// Into the main FIFO: a key found at a restart, or grains kept where
    /// they were.
    pub main: bool,
    /// A read brought it rather than a write.
    pub read: bool,
}

impl Arrival {
    /// `bytes` a read brought.
    pub fn read(bytes: u64) -> Arrival {
        Arrival {
            bytes,
            main: false,
            read: true,
        }
    }
}

/// The policy's state.
pub struct S3Fifo<K> {
    bound: u64,
    small: VecDeque<(K, u64)>,
    main: VecDeque<(K, u64)>,
    small_bytes: u64,
    main_bytes: u64,
    ghost: VecDeque<K>,
    ghosts: HashMap<K, u32>,
    entries: HashMap<K, Meta>,
    gen: u64,
}

impl<K: Copy + Eq + Hash> S3Fifo<K> {
    pub fn new(bound: u64) -> Self {
        S3Fifo {
            bound,
            small: VecDeque::new(),
            main: VecDeque::new(),
            small_bytes: 0,
            main_bytes: 0,
            ghost: VecDeque::new(),
            ghosts: HashMap::new(),
            entries: HashMap::new(),
            gen: 0,
        }
    }

    pub fn bound(&self) -> u64 {
        self.bound
    }

    /// Bytes of the keys held.
    pub fn bytes(&self) -> u64 {
        self.small_bytes + self.main_bytes
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, k: &K) -> bool {
        self.entries.contains_key(k)
    }

    /// Whether `k` is a ghost: evicted without a use after a read brought
    /// it, and not back since (coming back, it enters the main FIFO). A
    /// key held now is not, even if an older eviction's ghost of it is
    /// still counted.
    pub fn is_ghost(&self, k: &K) -> bool {
        !self.entries.contains_key(k) && self.ghosts.contains_key(k)
    }

    /// `k` (of `bytes`) arrived: into the small FIFO, or the main one if it
    /// is a ghost (or `main`: a key found at a restart); `read` if a read
    /// brought it rather than a write. A key held already is only used.
    /// Returns the keys evicted to stay within the bound.
    pub fn insert(&mut self, k: K, a: Arrival, now: Instant) -> Vec<K> {
        if self.entries.contains_key(&k) {
            self.touch(&k, now);
            return Vec::new();
        }
        let main = a.main || self.unghost(&k);
        self.place(
            k,
            Meta {
                bytes: a.bytes,
                uses: 0,
                main,
                read: a.read,
                used: now,
                gen: 0,
            },
        );
        self.evict_over()
    }

    /// `k` holds `delta` bytes more (a grain kept in a sparse file,
    /// FORMAT.md §11.8): a key not held arrives with `delta` bytes, as
    /// [`Self::insert`]; one held is used. The keys evicted to stay within
    /// the bound (it may be `k` itself).
    pub fn grow(&mut self, k: K, delta: u64, read: bool, now: Instant) -> Vec<K> {
        let Some(m) = self.entries.get_mut(&k) else {
            let a = Arrival {
                bytes: delta,
                main: false,
                read,
            };
            return self.insert(k, a, now);
        };
        m.bytes += delta;
        let main = m.main;
        *self.bytes_of(main) += delta;
        self.touch(&k, now);
        self.evict_over()
    }

    /// `k` was used (a hit).
    pub fn touch(&mut self, k: &K, now: Instant) {
        if let Some(m) = self.entries.get_mut(k) {
            m.read = true;
            if now.saturating_duration_since(m.used) >= USE_GAP {
                m.uses = (m.uses + 1).min(MAX_USES);
                m.used = now;
            }
        }
    }

    /// Forget `k` (its file is gone or damaged); not a ghost.
    pub fn remove(&mut self, k: &K) -> bool {
        match self.entries.remove(k) {
            Some(m) => {
                *self.bytes_of(m.main) -= m.bytes;
                true
            }
            None => false,
        }
    }

    /// Evict until the keys fit the bound; the evicted keys. The main
    /// FIFO gives up a key only while it holds more than its share (with
    /// keys of several MiB against a bound of a few dozen, "the small FIFO
    /// is under its tenth" says little).
    pub fn evict_over(&mut self) -> Vec<K> {
        let mut out = Vec::new();
        while self.bytes() > self.bound {
            let from_small =
                self.small_bytes > 0 && self.main_bytes <= self.bound - self.bound / 10;
            if let Some(k) = if from_small {
                self.evict_small()
            } else {
                self.evict_main()
            } {
                out.push(k);
            }
        }
        out
    }

    fn bytes_of(&mut self, main: bool) -> &mut u64 {
        if main {
            &mut self.main_bytes
        } else {
            &mut self.small_bytes
        }
    }

    /// Queue `k` as `m` says (a new queue place: its `gen` is set here).
    fn place(&mut self, k: K, mut m: Meta) {
        self.gen += 1;
        m.gen = self.gen;
        let (bytes, main, gen) = (m.bytes, m.main, m.gen);
        self.entries.insert(k, m);
        *self.bytes_of(main) += bytes;
        if main {
            self.main.push_back((k, gen));
        } else {
            self.small.push_back((k, gen));
        }
    }

    /// The current entry of a queue place, if it is not stale.
    fn current(&self, k: &K, gen: u64) -> bool {
        self.entries.get(k).is_some_and(|m| m.gen == gen)
    }

    /// Take the oldest key of the main or small FIFO out (None: its
    /// place was stale, or the FIFO is empty).
    fn pop(&mut self, main: bool) -> Option<(K, Meta)> {
        let fifo = if main {
            &mut self.main
        } else {
            &mut self.small
        };
        let (k, gen) = fifo.pop_front()?;
        if !self.current(&k, gen) {
            return None;
        }
        let m = self.entries.remove(&k).expect("current");
        *self.bytes_of(main) -= m.bytes;
        Some((k, m))
    }

    fn evict_small(&mut self) -> Option<K> {
        let (k, m) = self.pop(false)?;
        if m.uses > 0 {
            self.place(k, Meta::promoted(&m, 0));
            return None;
        }
        if !m.read {
            return Some(k);
        }
        self.ghost.push_back(k);
        *self.ghosts.entry(k).or_default() += 1;
        while self.ghost.len() > self.main.len().max(16) {
            if let Some(g) = self.ghost.pop_front() {
                self.unghost(&g);
            }
        }
        Some(k)
    }

    fn evict_main(&mut self) -> Option<K> {
        let (k, m) = self.pop(true)?;
        if m.uses > 0 {
            self.place(k, Meta::promoted(&m, m.uses - 1));
            return None;
        }
        Some(k)
    }

    /// Whether `k` was a ghost (it is not one any more).
    fn unghost(&mut self, k: &K) -> bool {
        match self.ghosts.get_mut(k) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.ghosts.remove(k);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn stays_within_its_bound_and_evicts_first_in_first() {
        let t = Instant::now();
        let mut c = S3Fifo::new(64 * MB);
        let mut evicted = Vec::new();
        for k in 0..20u32 {
            evicted.extend(c.insert(k, Arrival::read(8 * MB), t));
            assert!(c.bytes() <= 64 * MB);
        }
        assert_eq!(c.len(), 8);
        assert_eq!(evicted, (0..12).collect::<Vec<_>>());
    }

    #[test]
    fn a_scan_leaves_a_used_hot_set_alone() {
        let mut t = Instant::now();
        let mut c = S3Fifo::new(80 * MB);
        // A hot set of 6 segments, used again a while later.
        for k in 0..6u32 {
            c.insert(k, Arrival::read(8 * MB), t);
        }
        t += USE_GAP;
        for k in 0..6u32 {
            c.touch(&k, t);
        }
        // A scan of 100 segments, each read all over within a moment.
        for k in 1000..1100u32 {
            c.insert(k, Arrival::read(8 * MB), t);
            for _ in 0..50 {
                c.touch(&k, t);
            }
        }
        for k in 0..6u32 {
            assert!(c.contains(&k), "hot segment {k} was evicted by a scan");
        }
        assert!(c.bytes() <= 80 * MB);
    }

    #[test]
    fn a_growing_key_is_counted_by_its_bytes_and_evicted_to_fit() {
        let t = Instant::now();
        let mut c = S3Fifo::new(64 * 1024);
        assert!(c.grow(1u32, 4096, true, t).is_empty());
        assert!(c.grow(1, 4096, true, t).is_empty());
        assert_eq!((c.len(), c.bytes()), (1, 8192));
        for k in 2..=14u32 {
            c.grow(k, 4096, true, t);
        }
        assert_eq!(c.bytes(), 15 * 4096);
        // Past the bound: the oldest key goes, whatever its size.
        let out = c.grow(3, 2 * 4096, true, t);
        assert_eq!(out, vec![1]);
        assert_eq!(c.bytes(), 15 * 4096);
        assert!(!c.remove(&1) && c.remove(&3));
        assert_eq!(c.bytes(), 12 * 4096);
    }

    #[test]
    fn uses_close_together_count_once() {
        let t = Instant::now();
        let mut c = S3Fifo::new(16 * MB);
        c.insert(1u32, Arrival::read(8 * MB), t);
        for _ in 0..100 {
            c.touch(&1, t + Duration::from_millis(10));
        }
        // Not used again after a gap: the next arrivals push it out.
        c.insert(2, Arrival::read(8 * MB), t);
        let out = c.insert(3, Arrival::read(8 * MB), t);
        assert_eq!(out, [1]);
    }

    #[test]
    fn a_ghost_that_comes_back_enters_the_main_fifo() {
        let t = Instant::now();
        let mut c = S3Fifo::new(40 * MB);
        for k in 0..6u32 {
            c.insert(k, Arrival::read(8 * MB), t);
        }
        assert!(!c.contains(&0) && c.is_ghost(&0));
        // 0 comes back: main, so six newcomers pass it by.
        c.insert(0, Arrival::read(8 * MB), t);
        assert!(!c.is_ghost(&0));
        for k in 10..16u32 {
            c.insert(k, Arrival::read(8 * MB), t);
        }
        assert!(c.contains(&0));
    }

    #[test]
    fn removing_a_key_frees_its_bytes_and_stale_places_are_skipped() {
        let t = Instant::now();
        let mut c = S3Fifo::new(32 * MB);
        c.insert(1u32, Arrival::read(8 * MB), t);
        c.insert(2, Arrival::read(8 * MB), t);
        assert!(c.remove(&1));
        assert_eq!(c.bytes(), 8 * MB);
        c.insert(1, Arrival::read(8 * MB), t);
        for k in 3..6u32 {
            c.insert(k, Arrival::read(8 * MB), t);
        }
        assert_eq!(c.bytes(), 32 * MB);
        assert_eq!(c.len(), 4);
    }
}
