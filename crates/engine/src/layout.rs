//! Layout work on a disk (docs/FORMAT.md §10): measuring its fragments in
//! bounded steps, and `defrag`, which lays its grains out in logical order
//! while every snapshot and clone that shares them follows. What they
//! report (`DefragReport`, `FreeSpaceReport`, `PoolLayout`) is strata-api's
//! vocabulary.

use strata_block::BlockDevice;
use strata_format::{BLOCK_GRAINS, GRAIN_BYTES, GRAIN_SHIFT, MAP_FANOUT};

use crate::disk::{DiskHandle, RegionWalk};
use crate::error::Result;
// The datastore crate names the classes through this path.
use crate::meta::{Fragments, Meta, Place};
use crate::store::SpaceRequest;
pub use strata_api::FREE_EXTENT_CLASSES;

/// Leaves walked per hold of the metadata lock when counting fragments.
const FRAGMENT_STEP_GRAINS: u64 = 64 * MAP_FANOUT as u64;
/// Pool blocks scanned per hold of the metadata lock for free extents.
pub(crate) const FREE_STEP_BLOCKS: u64 = 64;
/// Allocation owner of defragmentation's target grains: a cursor of its own.
const DEFRAG_OWNER: u64 = u64::MAX - 1;
/// Defragmentation's unit: 1 MiB of virtual grains (the stripes' region).
const REGION_GRAINS: u64 = 256;

#[derive(Default)]
pub(crate) struct Tally {
    pub moved: u64,
    pub regions_moved: u64,
    pub skipped: u64,
    pub kept: u64,
}

/// What a defrag pass carries from one region to the next.
struct DefragPass {
    /// The last grain of the region before, where it ended up: the next
    /// region should follow it.
    hint: Option<u64>,
    /// What the pass moved, kept and skipped so far.
    tally: Tally,
}

/// Number of physical runs in `grains` (in logical order).
fn runs(grains: impl Iterator<Item = u64>) -> u64 {
    let mut f = Fragments::default();
    grains.for_each(|g| f.push(g));
    f.fragments
}

impl DiskHandle {
    /// The head's fragments (FORMAT.md §10.1), walked a few leaves per
    /// hold of the metadata lock. Returns (fragments, mapped grains).
    pub fn fragments(&self) -> Result<(u64, u64)> {
        let f = self.head_layout()?;
        Ok((f.fragments, f.mapped))
    }

    /// The head's fragments, mapped grains and packed grains, in one walk
    /// (see [`Self::fragments`]).
    pub(crate) fn head_layout(&self) -> Result<Fragments> {
        let end = self.size_bytes().div_ceil(GRAIN_BYTES);
        let mut acc = Fragments::default();
        let mut v = 0;
        while v < end {
            let t = end.min(v + FRAGMENT_STEP_GRAINS);
            self.inner
                .meta
                .lock()
                .fragments_step(self.version, v, t, &mut acc)?;
            v = t;
        }
        Ok(acc)
    }

    /// Lay the head's grains out in logical order (FORMAT.md §10.3); with
    /// `dry_run`, only count what would move (no stripes, no writes).
    pub(crate) fn defrag(
        &self,
        dry_run: bool,
        progress: &mut dyn FnMut(u64, u64),
        pace: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<Tally> {
        let mut t = Tally::default();
        let size = self.size_bytes();
        if dry_run {
            let end = size.div_ceil(GRAIN_BYTES);
            let mut v = 0;
            while v < end {
                let last = end.min(v + REGION_GRAINS) - 1;
                let (mapped, before) = self.region_plan(&mut self.inner.meta.lock(), v, last)?;
                if before > 1 {
                    t.regions_moved += 1;
                    t.moved += mapped.len() as u64 * GRAIN_BYTES;
                }
                v = last + 1;
                progress((v * GRAIN_BYTES).min(size), size);
            }
            return Ok(t);
        }
        let mut pass = DefragPass {
            hint: None,
            tally: t,
        };
        let walk = RegionWalk {
            offset: 0,
            len: size,
            all_heads: true,
            progress,
            pace,
        };
        self.in_regions(walk, &mut |first, last, _, held| {
            self.defrag_region(first, last, held, &mut pass)
        })?;
        Ok(pass.tally)
    }

    /// The mapped grains of `[first, last]` as (virtual, pool) pairs, and
    /// the number of physical runs they form.
    fn region_plan(&self, m: &mut Meta, first: u64, last: u64) -> Result<(Vec<(u64, u64)>, u64)> {
        let mut entries = Vec::new();
        m.lookup_entries(self.version, first, last - first + 1, &mut entries)?;
        // Packed stream grains are not moved one by one (a grain and its
        // spill stay adjacent, FORMAT.md §18.8): defrag leaves them.
        let mapped: Vec<(u64, u64)> = entries
            .iter()
            .enumerate()
            .filter(|(_, &e)| e != 0 && !strata_format::leaf_packed(e))
            .map(|(i, &e)| (first + i as u64, strata_format::leaf_grain(e)))
            .collect();
        let before = runs(mapped.iter().map(|p| p.1));
        Ok((mapped, before))
    }

    /// Give back grains allocated for a move that will not happen.
    pub(crate) fn give_back(&self, m: &mut Meta, grains: &[u64]) -> Result<()> {
        for &g in grains {
            m.abort_alloc(g).map_err(|e| self.inner.fail_stop(e))?;
        }
        Ok(())
    }

    /// One region, with every head's stripes for it held (`held`): plan;
    /// read the grains without the gate (scattered 4 KiB reads are the slow
    /// part, and a commit draining the gate must not wait for them); then,
    /// with the gate, check the plan still holds, allocate, write the copy
    /// in runs and move each grain (FORMAT.md §10.2-10.3).
    #[expect(clippy::too_many_lines)]
    fn defrag_region(
        &self,
        first: u64,
        last: u64,
        held: &[u64],
        pass: &mut DefragPass,
    ) -> Result<()> {
        let _fence = self.inner.fail_on_panic();
        let (mapped, runs_in) = self.region_plan(&mut self.inner.meta.lock(), first, last)?;
        let (Some(&(_, first_g)), Some(&(_, last_g))) = (mapped.first(), mapped.last()) else {
            return Ok(()); // a hole: the runs around it may still join
        };
        // The region's share of the disk's fragments: breaks inside it, and
        // one where it does not follow the region before.
        let prev = pass.hint;
        let breaks =
            |first: u64, runs: u64| runs - 1 + u64::from(prev.is_some_and(|h| first != h + 1));
        let before = breaks(first_g, runs_in);
        // Where the region ends up staying, the next one follows it.
        pass.hint = Some(last_g);
        if before == 0 {
            return Ok(());
        }
        if runs_in == 1 {
            // In order but not next to the region before: move it only
            // where free space continues that region's run, and not when
            // the region after already follows it (the break would only
            // move there).
            let h = prev.expect("a break at the start needs a region before");
            let end = self.size_bytes().div_ceil(GRAIN_BYTES);
            let mut m = self.inner.meta.lock();
            if !m.run_can_continue(h + 1)? {
                return Ok(());
            }
            if last + 1 < end {
                let mut next = Vec::with_capacity(1);
                m.lookup_range(self.version, last + 1, 1, &mut next)?;
                if next.first() == Some(&(last_g + 1)) {
                    return Ok(());
                }
            }
        }
        let mut buf = vec![0u8; mapped.len() * GRAIN_BYTES as usize];
        self.read_grains(&mapped, &mut buf)?;
        // From here to the moves: no free is reused (gate), and no grain
        // is allocated and left uninstalled across a checkpoint's cut.
        // The stripes are already held, against the usual order (gate, then
        // stripes): a plain read would queue behind a commit waiting to
        // drain the gate, which waits for a client that holds the gate and
        // waits for these stripes. A recursive read does not queue behind
        // a waiting writer, and a writer that holds the gate never waits
        // for stripes (commit, checkpoint cut, consolidation), so it ends.
        let _gate = self.inner.gate.read_recursive();
        let mut m = self.inner.meta.lock();
        // The head still maps what was read, grain for grain: with every
        // head's stripes held, nothing wrote those grains meanwhile.
        if self.region_plan(&mut m, first, last)?.0 != mapped {
            pass.tally.skipped += 1;
            return Ok(());
        }
        let n = mapped.len() as u64;
        self.inner.check_space(
            &m,
            SpaceRequest {
                reserve: false,
                grains: n,
                own_reserved: 0,
            },
        )?;
        let cap = self.inner.capacity_grains(&m);
        let mut targets: Vec<u64> = Vec::with_capacity(mapped.len());
        for _ in 0..n {
            let prev = targets.last().copied().or(prev);
            // Across a block boundary, into the next block when it is free;
            // where the run cannot go on, a new one starts in the longest
            // stretch of free blocks.
            let next = match prev {
                Some(p) if (p + 1) % BLOCK_GRAINS == 0 => match m.alloc_block_start(p + 1, cap) {
                    Ok(None) => {
                        let g = m.run_start();
                        m.alloc_block_start(g, cap)
                    }
                    r => r,
                },
                // Inside a block alloc_grain takes the grain after `p`. (An
                // error reading the counts shows again there.)
                Some(p) if m.run_can_continue(p + 1).unwrap_or(true) => Ok(None),
                _ => {
                    let g = m.run_start();
                    m.alloc_block_start(g, cap)
                }
            };
            let got = match next {
                Ok(Some(g)) => Ok(g),
                Ok(None) => m.alloc_grain(DEFRAG_OWNER, prev, cap, Place::Any),
                Err(e) => Err(e),
            };
            match got {
                Ok(g) => targets.push(g),
                Err(e) => {
                    self.give_back(&mut m, &targets)?;
                    return Err(e);
                }
            }
        }
        if breaks(targets[0], runs(targets.iter().copied())) >= before {
            // No better place: free space lies in short runs (10.4 makes runs).
            self.give_back(&mut m, &targets)?;
            pass.tally.skipped += 1;
            return Ok(());
        }
        drop(m);
        if let Err(e) = self.write_grains(&targets, &buf) {
            self.give_back(&mut self.inner.meta.lock(), &targets)?;
            return Err(e);
        }
        let mut m = self.inner.meta.lock();
        // A disk created since the stripes were taken could write in place
        // what was read: leave the region for the next pass.
        if m.head_versions().iter().any(|h| !held.contains(h)) {
            self.give_back(&mut m, &targets)?;
            pass.tally.skipped += 1;
            return Ok(());
        }
        let mut kept = Vec::new();
        self.inner.guarded(&mut m, |m| {
            for (&(v, g), &to) in mapped.iter().zip(&targets) {
                if !m.move_grain(v, g, to)? {
                    kept.push(to);
                }
            }
            Ok(())
        })?;
        self.give_back(&mut m, &kept)?;
        drop(m);
        pass.tally.kept += kept.len() as u64;
        pass.tally.moved += (n - kept.len() as u64) * GRAIN_BYTES;
        pass.tally.regions_moved += 1;
        pass.hint = targets.last().copied();
        self.inner
            .mutations
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Read the grains `from[i].1` into `buf` in order; physically
    /// adjacent grains are one read. Every run is announced first, so a
    /// fragmented region's scattered reads go to the device at once rather
    /// than one after another.
    pub(crate) fn read_grains(&self, from: &[(u64, u64)], buf: &mut [u8]) -> Result<()> {
        let mut i = 0;
        while i < from.len() {
            let mut j = i + 1;
            while j < from.len() && from[j].1 == from[j - 1].1 + 1 {
                j += 1;
            }
            self.inner
                .pool
                .will_need(from[i].1 << GRAIN_SHIFT, (j - i) as u64 * GRAIN_BYTES);
            i = j;
        }
        let mut i = 0;
        while i < from.len() {
            let mut j = i + 1;
            while j < from.len() && from[j].1 == from[j - 1].1 + 1 {
                j += 1;
            }
            let chunk = &mut buf[i * GRAIN_BYTES as usize..j * GRAIN_BYTES as usize];
            self.inner.pool.read_at(chunk, from[i].1 << GRAIN_SHIFT)?;
            i = j;
        }
        Ok(())
    }

    /// Write `buf` to the grains `to[i]` in order, adjacent ones as one write.
    pub(crate) fn write_grains(&self, to: &[u64], buf: &[u8]) -> Result<()> {
        let mut i = 0;
        while i < to.len() {
            let mut j = i + 1;
            while j < to.len() && to[j] == to[j - 1] + 1 {
                j += 1;
            }
            let chunk = &buf[i * GRAIN_BYTES as usize..j * GRAIN_BYTES as usize];
            self.inner.pool.write_at(chunk, to[i] << GRAIN_SHIFT)?;
            i = j;
        }
        Ok(())
    }
}
