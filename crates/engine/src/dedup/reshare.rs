//! `strata dedup DISK...` (docs/FORMAT.md §17.2): equal grains at the same
//! virtual grain of the named disks made one, online, a region at a time.
//!
//! Per region, with every head's write stripes held: the named versions'
//! distinct grains are listed under the metadata lock, grouped by virtual
//! grain and cipher class; those of groups with two or more are read
//! (without the lock and the gate) and sorted by their bytes, so equal
//! ones lie side by side. Then, under the gate and the lock, if the list is still
//! what it was, each loser's sharers are pointed at its winner and the
//! loser is freed, all in one batch. Packed grains take part (§17.2b):
//! decompressed to be compared, a packed one wins its set, and a packed
//! loser's entries give up their references to its stream. No index is
//! kept: memory is one window of grains whatever the disks' sizes.

use strata_api::DedupReport;
use strata_format::GRAIN_BYTES;

use super::{
    alone, comparable, fixed_in_region, region_entries, versions_of, window_end, Mapped, REGION,
};
use crate::datastore::{Datastore, SpaceWork};
use crate::error::Result;
use crate::meta::Meta;

/// One loser and its winner at a virtual grain: (v, loser, winner), each
/// as the leaf entries naming it hold it ([`Mapped::target`]).
type Merge = (u64, u64, u64);

/// A region's candidates: the named versions' distinct grains that share
/// their (virtual grain, class) with another, sorted, and each one's count.
#[derive(PartialEq, Eq)]
struct Plan {
    mapped: Vec<Mapped>,
    counts: Vec<u32>,
}

impl Datastore {
    /// Re-share equal grains across `names` (every disk when empty): see
    /// [`DedupReport`]. Paced, pausable and cancellable as the other space
    /// work; `progress(done, total)` in bytes of the largest version.
    pub fn dedup(
        &self,
        names: &[String],
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DedupReport> {
        self.inner.check_writable()?;
        let (disks, versions) = versions_of(&self.inner.meta.lock(), names)?;
        let end = versions.iter().map(|v| v.grains).max().unwrap_or(0);
        let mut rep = DedupReport {
            disks,
            versions: versions.len() as u64,
            used_bytes_before: self.inner.meta.lock().used_grains() * GRAIN_BYTES,
            ..DedupReport::default()
        };
        // The window's bytes, kept from region to region.
        let mut buf = Vec::new();
        (rep.regions, rep.read_bytes) = self.over_regions(end, opts, progress, &mut |first| {
            self.reshare_region(names, first, &mut rep, &mut buf)
        })?;
        rep.used_bytes_after = self.inner.meta.lock().used_grains() * GRAIN_BYTES;
        Ok(rep)
    }

    /// One region (FORMAT.md §17.2 steps 1 and 2); returns the bytes read
    /// and the end of the largest named version now.
    fn reshare_region(
        &self,
        names: &[String],
        first: u64,
        rep: &mut DedupReport,
        buf: &mut Vec<u8>,
    ) -> Result<(u64, u64)> {
        let _fence = self.inner.fail_on_panic();
        let held = self.inner.meta.lock().head_versions();
        let _stripes = self.inner.lock_stripes_of(&held, first, first + REGION - 1);
        let (plan, end) = self.reshare_plan(names, first, &mut self.inner.meta.lock())?;
        if plan.mapped.is_empty() {
            return Ok((0, end));
        }
        let mut merges = Vec::new();
        let mut at = 0;
        while at < plan.mapped.len() {
            let to = window_end(&plan.mapped, at);
            let window = &plan.mapped[at..to];
            let slot = self.read_window(window, buf)?;
            let bytes = Window {
                mapped: window,
                counts: &plan.counts[at..to],
                buf,
                slot: &slot,
            };
            bytes.merges(&mut merges);
            at = to;
        }
        let read = plan.mapped.len() as u64 * GRAIN_BYTES;
        if merges.is_empty() {
            return Ok((read, end));
        }
        // As defrag: the stripes are held already, so a recursive read of
        // the gate (it does not queue behind a commit waiting to drain it).
        let _gate = self.inner.gate.read_recursive();
        let mut m = self.inner.meta.lock();
        if m.head_versions() != held
            || self.reshare_plan(names, first, &mut m)?.0.mapped != plan.mapped
        {
            rep.regions_skipped += 1;
            return Ok((read, end));
        }
        let used = m.used_grains();
        let (_, kept) = self.inner.guarded(&mut m, |m| m.merge_grains(&merges))?;
        let freed = used.saturating_sub(m.used_grains());
        drop(m);
        rep.freed_bytes += freed * GRAIN_BYTES;
        rep.grains_kept += kept;
        let packed = merges.iter().filter(|m| strata_format::leaf_packed(m.1));
        rep.packed_merged_bytes += packed.count() as u64 * GRAIN_BYTES;
        self.inner
            .mutations
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok((read, end))
    }

    /// The region's candidates over the named disks' versions now, and
    /// the end of the largest of them.
    fn reshare_plan(&self, names: &[String], first: u64, m: &mut Meta) -> Result<(Plan, u64)> {
        let (_, versions) = versions_of(m, names)?;
        let end = versions.iter().map(|v| v.grains).max().unwrap_or(0);
        let region = region_entries(m, &versions, first)?;
        let mapped = comparable(region.raw, region.packed);
        // Left alone whoever else names them (§17.1): grains a thick disk
        // or a keyring under a deep rekey maps here, over every disk.
        let fixed = fixed_in_region(m, first, |v| v.thick.is_some() || v.cursor.is_some())?;
        let mapped = candidates(mapped, &fixed);
        let counts = mapped
            .iter()
            .map(|e| m.ref_get(e.grain))
            .collect::<Result<Vec<u32>>>()?;
        Ok((Plan { mapped, counts }, end))
    }
}

/// Of a region's distinct grains (sorted by virtual grain, class, grain),
/// those that may merge: not in `fixed`, not seen under two classes at
/// one virtual grain (an own-key clone's entry naming its parent's grain),
/// and in a (virtual grain, class) group of two or more.
fn candidates(mapped: Vec<Mapped>, fixed: &[(u64, u64)]) -> Vec<Mapped> {
    // Sorted (v, grain) pairs: one seen twice is under two classes.
    let mut pairs: Vec<(u64, u64)> = mapped.iter().map(|e| (e.v, e.grain)).collect();
    pairs.sort_unstable();
    let twice: Vec<(u64, u64)> = pairs
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    let kept: Vec<Mapped> = mapped
        .into_iter()
        .filter(|e| {
            let p = (e.v, e.grain);
            fixed.binary_search(&p).is_err() && twice.binary_search(&p).is_err()
        })
        .collect();
    (0..kept.len())
        .filter(|&i| !alone(&kept, i))
        .map(|i| kept[i])
        .collect()
}

/// A window of candidates with their bytes: grain `i` of `mapped` (count
/// `counts[i]`) at `slot[i]` of `buf`, in grains.
struct Window<'a> {
    mapped: &'a [Mapped],
    counts: &'a [u32],
    buf: &'a [u8],
    slot: &'a [usize],
}

impl Window<'_> {
    fn bytes(&self, i: usize) -> &[u8] {
        let g = GRAIN_BYTES as usize;
        &self.buf[self.slot[i] * g..(self.slot[i] + 1) * g]
    }

    /// Within each (virtual grain, class) group, the sets of equal grains:
    /// the group sorted by its bytes puts equal grains side by side (a
    /// comparison stops at the first byte that differs, so unequal grains
    /// cost little, and no hash is needed whose collisions a guest could
    /// aim at). Each set's winner is the packed grain in the oldest stream
    /// when one is packed, else the grain with the highest count, then the
    /// lowest number; the others merge into it.
    fn merges(&self, out: &mut Vec<Merge>) {
        let mut at = 0;
        while at < self.mapped.len() {
            let (v, class) = (self.mapped[at].v, self.mapped[at].class);
            let mut end = at + 1;
            while end < self.mapped.len()
                && (self.mapped[end].v, self.mapped[end].class) == (v, class)
            {
                end += 1;
            }
            let mut order: Vec<usize> = (at..end).collect();
            // Copies of one image are the common case: all equal to the
            // first is one comparison each.
            if !order.iter().all(|&i| self.bytes(i) == self.bytes(at)) {
                order.sort_unstable_by(|&i, &j| self.bytes(i).cmp(self.bytes(j)));
            }
            for set in order.chunk_by(|&i, &j| self.bytes(i) == self.bytes(j)) {
                if set.len() < 2 {
                    continue;
                }
                let win = *set
                    .iter()
                    .max_by_key(|&&i| {
                        // A packed grain's count is its stream grain's,
                        // named at other virtual grains too: the oldest
                        // stream wins, so a region's losing streams die
                        // whole (and are freed) rather than in part.
                        let m = &self.mapped[i];
                        let count = if m.packed() { 0 } else { self.counts[i] };
                        (m.packed(), count, std::cmp::Reverse(m.grain))
                    })
                    .expect("a set of two or more");
                let into = self.mapped[win].target();
                out.extend(
                    set.iter()
                        .filter(|&&i| i != win)
                        .map(|&i| (v, self.mapped[i].target(), into)),
                );
            }
            at = end;
        }
    }
}
