//! Layout (docs/FORMAT.md §10): how a disk's grains lie in the pool
//! (fragments), how the pool's free space lies (free extents), and moving a
//! data grain to another place while every map that shares it follows.

use strata_format::{
    leaf_entry, leaf_grain, leaf_key, leaf_packed, leaf_spills, leaf_target, BLOCK_GRAINS,
    MAP_FANOUT, MAP_FANOUT_SHIFT,
};

use strata_api::FREE_EXTENT_CLASSES;

use super::tree::Slot;
use super::Meta;
use crate::error::Result;

/// Running state of a fragments walk (FORMAT.md §10.1).
#[derive(Debug, Default, Clone, Copy)]
pub struct Fragments {
    /// The pool grain of the last mapped grain seen.
    last: Option<u64>,
    pub fragments: u64,
    pub mapped: u64,
    /// Of `mapped`, the grains held packed (FORMAT.md §18.8).
    pub packed: u64,
}

impl Fragments {
    /// Count mapped grain `g`, the next in logical order. A grain right
    /// after the last one continues its fragment, and so does the same
    /// grain again: the next packed fragment of one stream grain
    /// (FORMAT.md §18.8), which no raw entry of a version repeats.
    pub fn push(&mut self, g: u64) {
        if !self.last.is_some_and(|l| g == l || g == l + 1) {
            self.fragments += 1;
        }
        self.last = Some(g);
        self.mapped += 1;
    }
}

/// Running state of a free-extents scan (FORMAT.md §10.1).
#[derive(Debug, Default, Clone)]
pub struct FreeExtents {
    run: u64,
    pub extents: u64,
    pub free_grains: u64,
    /// Runs per class of [`FREE_EXTENT_CLASSES`].
    pub histogram: [u64; 5],
}

impl FreeExtents {
    fn grain(&mut self, free: bool) {
        if free {
            self.run += 1;
            self.free_grains += 1;
        } else {
            self.end_run();
        }
    }

    fn whole_block(&mut self) {
        self.run += BLOCK_GRAINS;
        self.free_grains += BLOCK_GRAINS;
    }

    /// Close the run in progress (at a used grain, or at the pool end).
    pub fn end_run(&mut self) {
        if self.run > 0 {
            self.extents += 1;
            let class = FREE_EXTENT_CLASSES
                .iter()
                .rposition(|&(_, min)| self.run >= min)
                .unwrap_or(0);
            self.histogram[class] += 1;
            self.run = 0;
        }
    }
}

impl Meta {
    /// Count the mapped grains of `[start, end)` of version `ver` into `acc`.
    pub fn fragments_step(
        &mut self,
        ver: u64,
        start: u64,
        end: u64,
        acc: &mut Fragments,
    ) -> Result<()> {
        self.walk_entries(ver, start, end, &mut |_, _, e| {
            if e != 0 {
                acc.packed += u64::from(strata_format::leaf_packed(e));
                acc.push(leaf_grain(e));
            }
        })
    }

    /// Scan blocks `[b0, b1)` of the pool (clamped to the pool end) into
    /// `acc`. Returns the block after the last one scanned.
    pub fn free_extents_step(&mut self, b0: u64, b1: u64, acc: &mut FreeExtents) -> Result<u64> {
        let end = b1.min(self.alloc.hwm / BLOCK_GRAINS);
        for b in b0..end {
            if b > 0 && u64::from(self.alloc.block_free[b as usize]) == BLOCK_GRAINS {
                acc.whole_block();
                continue;
            }
            for g in b * BLOCK_GRAINS..(b + 1) * BLOCK_GRAINS {
                // Grain 0 is never allocated, and never free either.
                acc.grain(g != 0 && self.ref_get(g)? == 0);
            }
        }
        Ok(end.max(b0))
    }

    /// Blocks in the pool.
    pub fn pool_blocks(&self) -> u64 {
        self.alloc.hwm / BLOCK_GRAINS
    }

    /// The distinct leaves, over every version (heads, snapshots, orphans),
    /// that cover virtual grain `v`: a walk of every version, so a pass
    /// that looks at many grains of one leaf's span keeps them in a
    /// [`SpanLeaves`].
    fn leaves_covering(&mut self, v: u64) -> Result<Vec<u64>> {
        let mut out: Vec<u64> = Vec::new();
        for ver in self.version_ids() {
            let st = self.version(ver)?;
            if st.root == 0 || v >> (MAP_FANOUT_SHIFT * st.levels as u32) != 0 {
                continue;
            }
            let mut node = st.root;
            for level in (1..st.levels).rev() {
                let idx = ((v >> (MAP_FANOUT_SHIFT * level as u32)) as usize) & (MAP_FANOUT - 1);
                node = self.node(node, level)?[idx];
                if node == 0 {
                    break;
                }
            }
            if node != 0 {
                out.push(node);
            }
        }
        // Versions share leaves (a snapshot's are its disk's until
        // written): sorted, not searched, as there may be thousands.
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// [`Meta::leaves_covering`] `v`, from `memo` when it holds `v`'s span.
    fn covering<'a>(&mut self, memo: &'a mut SpanLeaves, v: u64) -> Result<&'a [u64]> {
        let span = v >> MAP_FANOUT_SHIFT;
        if memo.span != Some(span) {
            memo.leaves = self.leaves_covering(v)?;
            memo.span = Some(span);
        }
        Ok(&memo.leaves)
    }

    /// The distinct leaves, over every version (heads, snapshots, orphans),
    /// whose entry for virtual grain `v` names grain `g`: (leaf grain,
    /// index, the entry's key index).
    pub(super) fn leaves_naming(&mut self, v: u64, g: u64) -> Result<Vec<(u64, usize, u8)>> {
        self.leaves_naming_in(&mut SpanLeaves::default(), v, g)
    }

    /// [`Meta::leaves_naming`], the leaves covering `v` taken from `memo`.
    pub(super) fn leaves_naming_in(
        &mut self,
        memo: &mut SpanLeaves,
        v: u64,
        g: u64,
    ) -> Result<Vec<(u64, usize, u8)>> {
        let idx = (v as usize) & (MAP_FANOUT - 1);
        let mut out = Vec::new();
        for &leaf in self.covering(memo, v)? {
            let e = self.node(leaf, 0)?[idx];
            if e != 0 && leaf_grain(e) == g {
                out.push((leaf, idx, leaf_key(e)));
            }
        }
        Ok(out)
    }

    /// Whether [`Meta::move_grain`] of `g` at `v` would move it (the leaves
    /// naming it there account for its whole count), changing nothing;
    /// the leaves covering `v` taken from `memo`.
    pub fn can_move(&mut self, memo: &mut SpanLeaves, v: u64, g: u64) -> Result<bool> {
        let count = self.ref_get(g)?;
        Ok(count != 0 && self.leaves_naming_in(memo, v, g)?.len() as u64 == u64::from(count))
    }

    /// Move data grain `g`, mapped at virtual grain `v`, to `to` (allocated
    /// by `alloc_grain`, its bytes already a copy of `g`'s): every leaf that
    /// names `g` names `to` instead, `to` takes `g`'s count and `g` is
    /// freed (FORMAT.md §10.2); each entry keeps its key index. Returns
    /// false, changing nothing, when the
    /// leaves found do not account for `g`'s whole count; the caller then
    /// gives `to` back.
    pub fn move_grain(&mut self, v: u64, g: u64, to: u64) -> Result<bool> {
        let count = self.ref_get(g)?;
        let leaves = self.leaves_naming(v, g)?;
        if count == 0 || leaves.len() as u64 != u64::from(count) {
            return Ok(false);
        }
        for &(leaf, idx, key) in &leaves {
            self.node_set(leaf, 0, idx, leaf_entry(to, key))?;
        }
        self.ref_set(to, count)?;
        if count > 1 {
            self.ref_set(g, 1)?;
        }
        self.decref(g, None)?;
        Ok(true)
    }

    /// For each `(v, from, into)` of `merges` (sorted by `v`; `from` and
    /// `into` leaf targets, [`strata_format::leaf_target`]): make every
    /// leaf entry that names `from` at virtual grain `v` name `into`
    /// instead (its bytes equal, under the same cipher: FORMAT.md §17.2,
    /// §17.2b), each keeping its key index, and move their references. A
    /// raw `from` must be named at `v` by its whole count, and is freed; a
    /// packed one (a fragment: its stream grain is named at other virtual
    /// grains too) gives up the references of the entries moved. A raw
    /// `into` must be named at `v` by its whole count too. A merge whose
    /// references do not add up is left, changing nothing. The leaves
    /// covering a leaf's span are found once for all its merges. Returns
    /// the merges made and those left.
    pub fn merge_grains(&mut self, merges: &[(u64, u64, u64)]) -> Result<(u64, u64)> {
        let (mut made, mut left) = (0, 0);
        let mut span = None;
        let mut leaves: Vec<(u64, Vec<u64>)> = Vec::new();
        for &(v, from, into) in merges {
            if span != Some(v >> MAP_FANOUT_SHIFT) {
                span = Some(v >> MAP_FANOUT_SHIFT);
                leaves.clear();
                for leaf in self.leaves_covering(v)? {
                    let entries = self.node(leaf, 0)?.to_vec();
                    leaves.push((leaf, entries));
                }
            }
            if self.merge_one(&mut leaves, v, from, into)? {
                made += 1;
            } else {
                left += 1;
            }
        }
        Ok((made, left))
    }

    /// One merge of [`Meta::merge_grains`] over `leaves`, the leaves
    /// covering `v` with a copy of their entries (kept up to date).
    fn merge_one(
        &mut self,
        leaves: &mut [(u64, Vec<u64>)],
        v: u64,
        from: u64,
        into: u64,
    ) -> Result<bool> {
        let idx = (v as usize) & (MAP_FANOUT - 1);
        let naming = |leaves: &[(u64, Vec<u64>)], t: u64| {
            leaves
                .iter()
                .filter(|(_, e)| e[idx] != 0 && leaf_target(e[idx]) == t)
                .count() as u64
        };
        let into_count = self.ref_get(leaf_grain(into))?;
        if from == into
            || into_count == 0
            || (!leaf_packed(into) && naming(leaves, into) != u64::from(into_count))
        {
            return Ok(false);
        }
        // The entries moved: a raw grain's must be all its references.
        let moved = naming(leaves, from);
        if moved == 0 || (!leaf_packed(from) && u64::from(self.ref_get(from)?) != moved) {
            return Ok(false);
        }
        let Ok(moved) = u32::try_from(moved) else {
            return Ok(false);
        };
        // Every grain `into`'s entries reference gains one per entry moved.
        let mut raised = vec![(leaf_grain(into), into_count)];
        if leaf_spills(into) {
            let next = leaf_grain(into) + 1;
            raised.push((next, self.ref_get(next)?));
        }
        let mut counts = Vec::with_capacity(raised.len());
        for &(g, c) in &raised {
            match c.checked_add(moved) {
                Some(n) if c != 0 => counts.push((g, n)),
                _ => return Ok(false),
            }
        }
        for (leaf, entries) in leaves.iter_mut() {
            let e = entries[idx];
            if e != 0 && leaf_target(e) == from {
                entries[idx] = into | (e & !leaf_target(e));
                self.node_set(*leaf, 0, idx, entries[idx])?;
            }
        }
        for (g, n) in counts {
            self.ref_set(g, n)?;
        }
        if leaf_packed(from) {
            for _ in 0..moved {
                self.decref(from, None)?;
            }
        } else {
            if moved > 1 {
                self.ref_set(from, 1)?;
            }
            self.decref(from, None)?;
        }
        Ok(true)
    }
}

/// The leaves covering one leaf's span (512 virtual grains), found once
/// for the many grains of it a pass looks at: valid while the caller
/// holds the metadata lock and changes no map's shape (entries set in
/// place are fine; a version made, dropped or copied-on-write is not).
#[derive(Default)]
pub struct SpanLeaves {
    span: Option<u64>,
    leaves: Vec<u64>,
}

/// A live grain in the zone being emptied (FORMAT.md §10.4), with where a
/// walk found it: a data grain at virtual grain `v`, or a map node of
/// `level` covering virtual grains from `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneGrain {
    Data { v: u64, g: u64 },
    Node { base: u64, level: u8, g: u64 },
}

impl ZoneGrain {
    pub fn grain(&self) -> u64 {
        match *self {
            ZoneGrain::Data { g, .. } | ZoneGrain::Node { g, .. } => g,
        }
    }
}

/// A scan for the live grains of the zone being emptied (FORMAT.md §10.4):
/// the zone's first grain, and the list the grains found are added to;
/// the virtual grains of packed entries naming a stream grain in the zone
/// (or spilling into one) go to `streams`, as their regions are repacked.
pub struct ZoneScan<'a> {
    pub zone: u64,
    pub found: &'a mut Vec<ZoneGrain>,
    pub streams: &'a mut Vec<u64>,
}

impl Meta {
    /// Record the grains at or above `scan.zone` that version `ver` reaches
    /// over virtual grains `[start, end)`: data grains, and map nodes (the
    /// root with the first step of a walk).
    pub fn zone_scan_step(
        &mut self,
        ver: u64,
        start: u64,
        end: u64,
        scan: &mut ZoneScan<'_>,
    ) -> Result<()> {
        let st = self.version(ver)?;
        let reach = 1u64 << (MAP_FANOUT_SHIFT * st.levels as u32);
        let end = end.min(reach);
        if st.root == 0 || start >= end {
            return Ok(());
        }
        if start == 0 && st.root >= scan.zone {
            scan.found.push(ZoneGrain::Node {
                base: 0,
                level: st.levels - 1,
                g: st.root,
            });
        }
        let at = Slot {
            level: st.levels - 1,
            base: 0,
        };
        self.zone_node(scan, st.root, at, start..end)
    }

    /// `zone_scan_step` below `node`, which sits at `at`, over `range`.
    fn zone_node(
        &mut self,
        scan: &mut ZoneScan<'_>,
        node: u64,
        at: Slot,
        range: std::ops::Range<u64>,
    ) -> Result<()> {
        let (start, end) = (range.start, range.end);
        let (level, base, span, zone) = (at.level, at.base, at.span(), scan.zone);
        let lo = ((start - base) / span) as usize;
        let hi = (((end - 1 - base) / span) as usize).min(MAP_FANOUT - 1);
        let entries: Vec<u64> = self.node(node, level)?[lo..=hi].to_vec();
        for (i, e) in entries.into_iter().enumerate() {
            if e == 0 {
                continue;
            }
            let child_base = base + (lo + i) as u64 * span;
            if level == 0 {
                if !leaf_packed(e) {
                    if leaf_grain(e) >= zone {
                        scan.found.push(ZoneGrain::Data {
                            v: child_base,
                            g: leaf_grain(e),
                        });
                    }
                } else if leaf_grain(e) + u64::from(leaf_spills(e)) >= zone {
                    // Stream grains move by repacking their region
                    // (§10.4, §18.8), not one by one.
                    scan.streams.push(child_base);
                }
                continue;
            }
            if e >= zone {
                scan.found.push(ZoneGrain::Node {
                    base: child_base,
                    level: level - 1,
                    g: e,
                });
            }
            let s = start.max(child_base);
            let t = end.min(child_base + span);
            let child = Slot {
                level: level - 1,
                base: child_base,
            };
            self.zone_node(scan, e, child, s..t)?;
        }
        Ok(())
    }

    /// Move map node `g` (of `level`, covering virtual grains from `base`)
    /// to `to` (allocated by `alloc_low`): its entries are written at `to`,
    /// every parent entry and version root naming `g` names `to`, `to`
    /// takes `g`'s count and `g` is freed without touching its children
    /// (they keep their counts: the copy holds them). Returns false,
    /// changing nothing, when the references found do not account for
    /// `g`'s count.
    pub fn move_node(&mut self, base: u64, level: u8, g: u64, to: u64) -> Result<bool> {
        let count = self.ref_get(g)?;
        if count == 0 {
            return Ok(false);
        }
        let mut parents: Vec<(u64, u8, usize)> = Vec::new();
        let mut roots: Vec<u64> = Vec::new();
        for ver in self.version_ids() {
            let st = self.version(ver)?;
            if st.root == 0 || st.levels <= level {
                continue;
            }
            if base >> (MAP_FANOUT_SHIFT * st.levels as u32) != 0 {
                continue;
            }
            if st.levels - 1 == level {
                if st.root == g && base == 0 {
                    roots.push(ver);
                }
                continue;
            }
            let mut node = st.root;
            for l in (level + 1..st.levels).rev() {
                let idx = ((base >> (MAP_FANOUT_SHIFT * l as u32)) as usize) & (MAP_FANOUT - 1);
                let e = self.node(node, l)?[idx];
                if l == level + 1 {
                    if e == g && !parents.contains(&(node, l, idx)) {
                        parents.push((node, l, idx));
                    }
                    break;
                }
                if e == 0 {
                    break;
                }
                node = e;
            }
        }
        if (parents.len() + roots.len()) as u64 != u64::from(count) {
            return Ok(false);
        }
        let entries = *self.node(g, level)?;
        self.create_node(to, level, &entries);
        for &(p, l, idx) in &parents {
            self.node_set(p, l, idx, to)?;
        }
        for ver in roots {
            let mut st = self.version(ver)?;
            st.root = to;
            self.put_version(st);
        }
        self.ref_set(to, count)?;
        self.ref_set(g, 0)?;
        self.freed(g);
        Ok(true)
    }

    /// Take the lowest allocatable grain at or above `*from` and below
    /// `below` (and the allocation limit), advancing `*from` past it; None
    /// when there is none. The grain has count 1 in memory, as from
    /// `alloc_grain`.
    pub fn alloc_low(&mut self, from: &mut u64, below: u64) -> Result<Option<u64>> {
        Ok(self.alloc_run_low(from, below, (1, 1))?.map(|(g, _)| g))
    }

    /// The lowest run of at least `min` allocatable grains at or above
    /// `*from` and below `below` (and the allocation limit): up to `want`
    /// of its grains taken, each with count 1 in memory as from
    /// `alloc_grain`; `*from` advanced past them. None when there is no
    /// such run (free-space consolidation's repacking, FORMAT.md §10.4: a
    /// fragment that spills needs two adjacent grains).
    pub fn alloc_run_low(
        &mut self,
        from: &mut u64,
        below: u64,
        (min, want): (u64, u64),
    ) -> Result<Option<(u64, u64)>> {
        let end = self
            .alloc
            .hwm
            .min(self.alloc.limit.unwrap_or(u64::MAX))
            .min(below);
        while *from < end {
            let b = *from / BLOCK_GRAINS;
            if self.alloc.block_free[b as usize] == 0 {
                *from = (b + 1) * BLOCK_GRAINS;
                continue;
            }
            let g0 = *from;
            let mut n = 0;
            while n < want && g0 + n < end && self.allocatable(g0 + n)? {
                n += 1;
            }
            if n >= min.max(1) {
                for g in g0..g0 + n {
                    self.take(g)?;
                }
                *from = g0 + n;
                return Ok(Some((g0, n)));
            }
            *from = g0 + n + 1;
        }
        Ok(None)
    }

    /// Allocate no grain at or above `limit` from now on (None: lift it).
    /// Returns whether a client's allocation lifted the previous limit.
    pub fn set_alloc_limit(&mut self, limit: Option<u64>) -> bool {
        self.alloc.limit = limit;
        std::mem::take(&mut self.alloc.limit_lifted)
    }

    /// Whether a client's allocation lifted the limit since it was set.
    pub fn alloc_limit_lifted(&self) -> bool {
        self.alloc.limit_lifted
    }

    /// Lower the pool end to `end` (a whole number of blocks) when every
    /// grain from there up is free and allocatable (none in use, none
    /// pending). Returns whether it did. The superblock takes the new end
    /// at the next checkpoint; until then a crash recovers the old one,
    /// whose grains above `end` are free.
    pub fn lower_pool_end(&mut self, end: u64) -> bool {
        assert!(
            end.is_multiple_of(BLOCK_GRAINS) && end > 0,
            "pool end {end}"
        );
        let (b0, b1) = (end / BLOCK_GRAINS, self.alloc.hwm / BLOCK_GRAINS);
        if b0 >= b1
            || (b0..b1).any(|b| u64::from(self.alloc.block_free[b as usize]) != BLOCK_GRAINS)
        {
            return false;
        }
        for b in b0..b1 {
            self.alloc.free_blocks.remove(&b);
            self.alloc.partial_blocks.remove(&b);
        }
        self.alloc.block_free.truncate(b0 as usize);
        self.alloc.backed.truncate(b0 as usize);
        self.alloc.cursors.retain(|_, (b, _)| *b < b0);
        self.alloc.hwm = end;
        self.alloc.tail_end = end;
        // The file is truncated there next: a readying in flight is not tail.
        self.alloc.ready.epoch += 1;
        true
    }

    /// Take the free grains of blocks `[b0, b1)` out of the allocator (as
    /// if pending) so they can be punched without racing a writer; append
    /// them, sorted, to `out`. Give them back with [`Meta::release`].
    /// Returns the block after the last one looked at.
    pub fn hold_free_step(&mut self, b0: u64, b1: u64, out: &mut Vec<u64>) -> Result<u64> {
        let end = b1.min(self.alloc.hwm / BLOCK_GRAINS);
        for b in b0..end {
            if self.alloc.block_free[b as usize] == 0 {
                continue;
            }
            for g in b * BLOCK_GRAINS..(b + 1) * BLOCK_GRAINS {
                if g != 0 && !self.pending_set.contains(&g) && self.ref_get(g)? == 0 {
                    self.pending_set.insert(g);
                    self.alloc.adjust(g, -1);
                    out.push(g);
                }
            }
        }
        Ok(end.max(b0))
    }
}
