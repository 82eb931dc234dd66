//! Which regions a pack pass need not read again (docs/FORMAT.md §18.5,
//! "Regions a pass found nothing in"): in memory only, so the first pass
//! after an open reads everything, as before.
//!
//! A pass that read a region and found nothing to pack (every raw grain
//! too incompressible, or zeros, and no half-dead stream grain) notes
//! there a fingerprint of its plan (the raw candidates, their counts and
//! the stream grains with theirs) and, for each named head, that the
//! head has not been written in the region since. A later pass whose plan
//! fingerprints the same and whose heads were not written there leaves
//! the region unread: what did not pack then would not pack now.
//!
//! What changes a region's outcome is either in its plan (a copy-on-write,
//! an unmap, a snapshot deleted, a grain moved) or an in-place write of a
//! head's own grain, which holds the write's stripes and clears the
//! head's mark here. The pass holds every head's stripes of the region
//! while it plans, reads and marks, so no write falls between. A write
//! path that did not clear the mark would only leave a region unpacked
//! until the next open; nothing read depends on this.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use parking_lot::{Mutex, RwLock};

/// Region size: 1 MiB of virtual grains (as the passes' `REGION`).
pub(crate) const REGION_SHIFT: u32 = 8;
/// At most this many regions' fingerprints are kept (some 32 MiB); past
/// it they are forgotten and passes read those regions again.
const MAX_REGIONS: usize = 1 << 20;

#[derive(Default)]
pub struct Settled {
    /// Whether a pass ever noted a region: until then a write need not
    /// look (it is set with the region's stripes held, as writes look).
    any: AtomicBool,
    /// Per head version: a bit per region, set where a pass noted the
    /// region, cleared by the head's writes there.
    heads: RwLock<HashMap<u64, Vec<AtomicU64>>>,
    /// Per region (its first virtual grain): the fingerprint of the plan
    /// a pass found nothing to pack in.
    plans: Mutex<HashMap<u64, u64>>,
}

/// The word and bit of region `r` in a head's bitmap.
fn at(r: u64) -> (usize, u64) {
    ((r / 64) as usize, 1 << (r % 64))
}

impl Settled {
    /// Head `ver` is written (data, zeros or an unmap) in virtual grains
    /// `[first, last]`, its stripes held.
    pub fn written(&self, ver: u64, first: u64, last: u64) {
        if !self.any.load(Relaxed) {
            return;
        }
        let heads = self.heads.read();
        let Some(bits) = heads.get(&ver) else {
            return;
        };
        let (r0, r1) = (first >> REGION_SHIFT, last >> REGION_SHIFT);
        let (w0, w1) = (at(r0).0, at(r1).0.min(bits.len().saturating_sub(1)));
        for (w, word) in bits.iter().enumerate().take(w1 + 1).skip(w0) {
            // The bits of [r0, r1] in word w.
            let lo = if w == w0 { r0 % 64 } else { 0 };
            let hi = if w == at(r1).0 { r1 % 64 } else { 63 };
            let mask = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            if word.load(Relaxed) & mask != 0 {
                word.fetch_and(!mask, Relaxed);
            }
        }
    }

    /// Whether region `first` was noted with `plan` by a pass and none of
    /// `heads` was written there since.
    pub fn unchanged(&self, first: u64, plan: u64, heads: &[u64]) -> bool {
        if self.plans.lock().get(&first) != Some(&plan) {
            return false;
        }
        let (w, bit) = at(first >> REGION_SHIFT);
        let bits = self.heads.read();
        heads.iter().all(|h| {
            bits.get(h)
                .and_then(|b| b.get(w))
                .is_some_and(|x| x.load(Relaxed) & bit != 0)
        })
    }

    /// A pass found nothing to pack in region `first` of `heads` (and
    /// their snapshots), whose plan fingerprints as `plan`.
    pub fn note(&self, first: u64, plan: u64, heads: &[u64]) {
        {
            let mut plans = self.plans.lock();
            if plans.len() >= MAX_REGIONS && !plans.contains_key(&first) {
                plans.clear();
            }
            plans.insert(first, plan);
        }
        self.any.store(true, Relaxed);
        let (w, bit) = at(first >> REGION_SHIFT);
        let mut bits = self.heads.write();
        for h in heads {
            let b = bits.entry(*h).or_default();
            if b.len() <= w {
                b.resize_with(w + 1, AtomicU64::default);
            }
            b[w].fetch_or(bit, Relaxed);
        }
    }

    /// Forget the marks of versions that are no longer heads (a disk
    /// deleted, a head replaced).
    pub fn keep_heads(&self, heads: &[u64]) {
        self.heads.write().retain(|v, _| heads.contains(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_anywhere_in_a_noted_region_clears_it_and_only_it() {
        let s = Settled::default();
        for r in [0u64, 63, 64, 65, 200] {
            s.note(r << REGION_SHIFT, 7, &[1, 2]);
        }
        assert!(s.unchanged(64 << REGION_SHIFT, 7, &[1, 2]));
        assert!(!s.unchanged(64 << REGION_SHIFT, 8, &[1, 2]), "another plan");
        assert!(
            !s.unchanged(64 << REGION_SHIFT, 7, &[1, 3]),
            "a head never noted"
        );
        assert!(
            !s.unchanged(1 << REGION_SHIFT, 7, &[1]),
            "a region never noted"
        );
        // A write of head 2 from the last grain of region 63 to the first
        // of 65 (across a word's edge).
        s.written(2, (64 << REGION_SHIFT) - 1, 65 << REGION_SHIFT);
        for r in [63u64, 64, 65] {
            assert!(!s.unchanged(r << REGION_SHIFT, 7, &[1, 2]), "region {r}");
            assert!(
                s.unchanged(r << REGION_SHIFT, 7, &[1]),
                "head 1, region {r}"
            );
        }
        assert!(s.unchanged(0, 7, &[1, 2]));
        assert!(s.unchanged(200 << REGION_SHIFT, 7, &[1, 2]));
        // Past the end of the bitmap, and a head with none.
        s.written(2, 1 << 40, (1 << 40) + 5);
        s.written(9, 0, 1 << 30);
        s.keep_heads(&[1]);
        assert!(!s.unchanged(0, 7, &[1, 2]), "head 2 forgotten");
        assert!(s.unchanged(0, 7, &[1]));
    }

    #[test]
    fn a_write_over_many_words_clears_every_region_in_it() {
        let s = Settled::default();
        for r in 0..300u64 {
            s.note(r << REGION_SHIFT, r, &[5]);
        }
        s.written(5, (10 << REGION_SHIFT) + 3, (250 << REGION_SHIFT) + 1);
        for r in 0..300u64 {
            let kept = !(10..=250).contains(&r);
            assert_eq!(s.unchanged(r << REGION_SHIFT, r, &[5]), kept, "region {r}");
        }
    }
}
