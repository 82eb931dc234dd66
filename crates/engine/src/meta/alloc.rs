//! Physical allocation: free grains per block, and a cursor per owner so a
//! disk's sequential writes land in sequential grains (DESIGN §4); and the
//! reserved tail that holds thick disks' reservations on the host file
//! system (docs/FORMAT.md §7.1).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use strata_format::BLOCK_GRAINS;

use super::Meta;
use crate::error::{err, ErrorKind, Result};

/// Owner id used for the allocation cursor of map nodes.
pub(super) const META_OWNER: u64 = u64::MAX;
/// Partially free blocks scanned whole by one allocation, at most.
const PARTIAL_SCAN_BLOCKS_MAX: usize = 64;
/// The reserved tail grows in steps of a quarter of its target, at least a
/// block and at most this many grains (64 MiB), and is truncated once it is
/// this far past its target.
pub const TAIL_STEP_GRAINS: u64 = 64 << 8;
/// Region anchors kept at most (FORMAT.md §10.5); past it the table is
/// dropped whole.
const ANCHORS_MAX: usize = 1 << 16;
/// The pool grows for a region's fresh block only while its end stays
/// within this many grains (64 MiB), or a quarter of the free capacity, of
/// the used grains.
const REGION_GAP_GRAINS: u64 = 64 << 8;

/// Where an allocation may take its grain from (FORMAT.md §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Thin data: any free grain; growing the pool must leave the reserved
    /// tail at its target (thin data cannot take what thick disks hold).
    Any,
    /// A thick disk filling its own reservation: only blocks backed on the
    /// host (carved from the tail since open, untouched by punches).
    Backed,
    /// Map nodes: backed blocks while reservations exist, else any; never
    /// fails for want of tail (a node is allocated mid-change).
    Node,
}

/// A data grain to place (FORMAT.md §10.5): virtual grain `v` of version
/// `owner`, and `hint`, the grain that maps `v - 1` (if any).
#[derive(Debug, Clone, Copy)]
pub struct DataSlot {
    pub owner: u64,
    pub v: u64,
    pub hint: Option<u64>,
}

/// Where one allocation may take its grain: below `capacity_grains`, in
/// blocks `place` allows, keeping the reserved tail free when `reserving`
/// (FORMAT.md §7.1).
#[derive(Debug, Clone, Copy)]
struct Bounds {
    capacity_grains: u64,
    place: Place,
    reserving: bool,
}

/// The smallest pool end (a whole number of blocks) that holds `grain`:
/// what replaying a record that names `grain` raises the pool end to.
pub fn pool_end_covering(grain: u64) -> u64 {
    (grain + 1).div_ceil(BLOCK_GRAINS) * BLOCK_GRAINS
}

/// Where a readying step of `amount` (at least 1) grains ends, for a pool
/// that needs `need` grains (used, and held for reservations) and is
/// readied up to `tail_end`; None while half of it or more is readied.
/// Always past `tail_end`.
fn ready_end(need: u64, tail_end: u64, amount: u64) -> Option<u64> {
    if tail_end >= need + amount / 2 {
        return None;
    }
    Some(pool_end_covering(need + amount - 1))
}

/// Free-space summary of the pool, rebuilt at open from the counts.
#[derive(Default)]
pub struct Allocator {
    /// Grains below this are in the pool; a multiple of BLOCK_GRAINS.
    pub(super) hwm: u64,
    pub(super) block_free: Vec<u16>,
    pub(super) free_blocks: BTreeSet<u64>,
    pub(super) partial_blocks: BTreeSet<u64>,
    pub(super) cursors: HashMap<u64, (u64, u64)>,
    /// Per block: held on the host (carved from the reserved tail since
    /// open, and no punch touched it since).
    pub(super) backed: Vec<bool>,
    /// End of the pool file in grains: the pool end plus the reserved tail.
    pub(super) tail_end: u64,
    /// While free space is consolidated (FORMAT.md §10.4): no grain at or
    /// above this is allocated (None: no limit). An allocation that finds
    /// nothing below it lifts it rather than fail a client.
    pub(super) limit: Option<u64>,
    /// Set when an allocation lifted `limit`.
    pub(super) limit_lifted: bool,
    /// Per (owner, virtual region of one block): the virtual grain and the
    /// pool grain of the owner's first allocation there (FORMAT.md §10.5).
    pub(super) anchors: HashMap<(u64, u64), (u64, u64)>,
    /// Placement off (`serve --placement arrival`): data grains by hint
    /// and cursor only, in the order writes arrive.
    pub(super) arrival_order: bool,
    /// Readied space (FORMAT.md §7.1).
    pub(super) ready: Ready,
}

/// Host space kept allocated past the pool end beyond the reserved tail's
/// target, so that a growing pool finds it ready (FORMAT.md §7.1,
/// "Readied space").
#[derive(Default)]
pub(super) struct Ready {
    /// The most readied at once, in grains (`serve --ready-ahead`); 0: off.
    pub(super) max: u64,
    /// The amount readied now (`R`): follows the rate the pool grows.
    pub(super) amount: u64,
    /// When the last amount was readied.
    pub(super) last: Option<Instant>,
    /// The end a readying in flight extends the tail to.
    pub(super) in_flight: Option<u64>,
    /// Bumped by every truncation of the pool file: a readying that
    /// started under an older epoch is not taken as tail.
    pub(super) epoch: u64,
    /// The pool grew close to the tail's end: the readier should run.
    pub(super) wanted: bool,
    /// After the host refused: not asked again before this.
    pub(super) retry: Option<Instant>,
}

/// Where the readied amount starts (64 MiB), and how soon it must have
/// been used up to double, or idle to fall back.
const READY_START_GRAINS: u64 = 64 << 8;
const READY_FAST: Duration = Duration::from_secs(1);
const READY_IDLE: Duration = Duration::from_secs(10);

/// A readying for the readier to carry out outside the metadata lock:
/// allocate grains `[from, to)` of the pool file, then report with
/// [`Meta::ready_done`].
#[derive(Debug, Clone, Copy)]
pub struct ReadyStep {
    pub from: u64,
    pub to: u64,
    epoch: u64,
}

impl Allocator {
    pub fn new(hwm: u64) -> Self {
        Allocator {
            hwm,
            ..Default::default()
        }
    }

    pub(super) fn set_block_free(&mut self, block: u64, free: u16) {
        assert!(
            free as u64 <= BLOCK_GRAINS,
            "block {block}: {free} free grains"
        );
        self.block_free[block as usize] = free;
        if free as u64 == BLOCK_GRAINS {
            self.free_blocks.insert(block);
            self.partial_blocks.remove(&block);
        } else if free > 0 {
            self.free_blocks.remove(&block);
            self.partial_blocks.insert(block);
        } else {
            self.free_blocks.remove(&block);
            self.partial_blocks.remove(&block);
        }
    }

    /// One grain of `grain`'s block became free (+1) or taken (-1).
    pub(super) fn adjust(&mut self, grain: u64, delta: i32) {
        let b = grain / BLOCK_GRAINS;
        let f = self.block_free[b as usize] as i32 + delta;
        assert!(
            (0..=BLOCK_GRAINS as i32).contains(&f),
            "block {b}: free grains would become {f}"
        );
        self.set_block_free(b, f as u16);
    }

    /// Forget the summary and size it for `hwm` (open, before the scan).
    pub(super) fn reset(&mut self) {
        self.block_free = vec![0; (self.hwm / BLOCK_GRAINS) as usize];
        self.backed = vec![false; (self.hwm / BLOCK_GRAINS) as usize];
        self.free_blocks.clear();
        self.partial_blocks.clear();
    }

    pub fn free_grains(&self) -> u64 {
        self.block_free.iter().map(|&f| f as u64).sum()
    }
}

impl Meta {
    pub(super) fn allocatable(&mut self, g: u64) -> Result<bool> {
        Ok(g != 0
            && g < self.alloc.hwm
            && g < self.alloc.limit.unwrap_or(u64::MAX)
            && !self.pending_set.contains(&g)
            && self.ref_get(g)? == 0)
    }

    pub(super) fn take(&mut self, g: u64) -> Result<()> {
        self.ref_put(g, 1)?;
        self.alloc.adjust(g, -1);
        self.used_grains += 1;
        Ok(())
    }

    /// Whether grains of `block` may serve an allocation at `place`.
    fn block_fits(&self, block: u64, place: Place, reserving: bool) -> bool {
        if self.alloc.limit.is_some_and(|l| block * BLOCK_GRAINS >= l) {
            return false;
        }
        match place {
            Place::Any => true,
            Place::Backed | Place::Node => {
                !reserving || self.alloc.backed.get(block as usize) == Some(&true)
            }
        }
    }

    // ------------------------------------------------------------ reservations

    /// Grains of `d`'s size its head does not map: what a thick disk holds
    /// reserved (FORMAT.md §7).
    pub fn unwritten_grains(&self, d: &crate::catalog::DiskRec) -> u64 {
        let mapped = self
            .version_state(d.head)
            .map(|v| v.mapped_grains)
            .unwrap_or(0);
        d.size_bytes
            .div_ceil(strata_format::GRAIN_BYTES)
            .saturating_sub(mapped)
    }

    /// Grains thick disks have reserved but not yet written (FORMAT.md §7).
    pub fn reserved_grains(&self) -> u64 {
        self.catalog
            .disks
            .iter()
            .filter(|d| d.provisioning.is_thick())
            .map(|d| self.unwritten_grains(d))
            .sum()
    }

    /// The reserved tail's target size in grains (FORMAT.md §7.1), with
    /// `extra` more grains reserved by `extra_disks` more thick disks.
    pub fn tail_target(&self, extra: u64, extra_disks: u64) -> u64 {
        let reserved = self.reserved_grains() + extra;
        if reserved == 0 {
            return 0;
        }
        let thick = self
            .catalog
            .disks
            .iter()
            .filter(|d| d.provisioning.is_thick())
            .count() as u64
            + extra_disks;
        reserved + BLOCK_GRAINS * (thick + 1) + reserved / 256
    }

    /// End of the pool file in grains (pool end plus reserved tail).
    pub fn tail_end(&self) -> u64 {
        self.alloc.tail_end.max(self.alloc.hwm)
    }

    /// Make the pool file's allocated length reach `end` grains, and the
    /// count pages that will cover them.
    fn extend_tail(&mut self, end: u64) -> std::io::Result<()> {
        let have = self.tail_end();
        if end <= have {
            return Ok(());
        }
        let g = strata_format::GRAIN_BYTES;
        self.pool.allocate(have * g, (end - have) * g, false)?;
        self.alloc.tail_end = end;
        let pages = end.div_ceil(strata_format::REFS_PER_PAGE as u64);
        let refs_len = self.refs.len()?;
        if pages * g > refs_len {
            self.refs.allocate(refs_len, pages * g - refs_len, true)?;
        }
        Ok(())
    }

    /// Hold the reserved tail at its target with `extra` more grains
    /// reserved by `extra_disks` more thick disks (before a reservation is
    /// taken); ENOSPC when the host file system cannot give it.
    pub fn hold_reservation(&mut self, extra: u64, extra_disks: u64) -> Result<()> {
        let target = self.tail_target(extra, extra_disks);
        if target == 0 {
            return Ok(());
        }
        let want = self.alloc.hwm + target;
        self.extend_tail(want).map_err(|e| {
            crate::error::Error::new(
                ErrorKind::NoSpace,
                format!(
                    "the host file system cannot hold the reservation ({} MiB more): {e}",
                    (want.saturating_sub(self.tail_end()) * strata_format::GRAIN_BYTES) >> 20
                ),
            )
        })
    }

    /// Truncate a tail that has grown more than a step past its target (a
    /// thick disk removed or converted to thin). Returns whether it did.
    pub fn trim_tail(&mut self) -> std::io::Result<bool> {
        let want = self.alloc.hwm + self.tail_target(0, 0) + self.alloc.ready.amount;
        if self.alloc.tail_end <= want + TAIL_STEP_GRAINS || self.alloc.ready.in_flight.is_some() {
            return Ok(false);
        }
        self.truncate_tail(want)?;
        Ok(true)
    }

    /// Truncate the pool file to `end` grains, which becomes the tail's
    /// end. Every truncation of the pool goes through here, so a readying
    /// in flight is never taken as tail past it.
    pub fn truncate_tail(&mut self, end: u64) -> std::io::Result<()> {
        self.alloc.ready.epoch += 1;
        self.pool.set_len(end * strata_format::GRAIN_BYTES)?;
        self.alloc.tail_end = end;
        Ok(())
    }

    /// Give readied space back to the host (free-space return): truncate
    /// the file to the pool end plus the reserved tail's target. Returns
    /// the bytes given back.
    pub fn drop_readied(&mut self) -> std::io::Result<u64> {
        let want = self.alloc.hwm + self.tail_target(0, 0);
        if self.alloc.tail_end <= want || self.alloc.ready.in_flight.is_some() {
            return Ok(0);
        }
        let given = self.alloc.tail_end - want;
        self.truncate_tail(want)?;
        self.alloc.ready.amount = 0;
        Ok(given * strata_format::GRAIN_BYTES)
    }

    /// Grains of the tail past its target: readied space.
    pub fn readied_grains(&self) -> u64 {
        (self.tail_end() - self.alloc.hwm).saturating_sub(self.tail_target(0, 0))
    }

    /// Keep at most `grains` of host space readied past the pool end and
    /// the reserved tail's target (FORMAT.md §7.1); 0 turns it off.
    pub fn set_ready_grains(&mut self, grains: u64) {
        let r = &mut self.alloc.ready;
        r.max = grains;
        r.amount = r.amount.min(grains);
    }

    /// Whether the readier should run (and forget the wish).
    pub fn take_ready_wanted(&mut self) -> bool {
        std::mem::take(&mut self.alloc.ready.wanted)
    }

    /// The next readying, if one is due at `now` (none in flight, the tail
    /// less than half the readied amount past its target, no refusal
    /// within the last second). Sizes the amount by how fast the last one
    /// was used up.
    pub fn ready_plan(&mut self, now: Instant) -> Option<ReadyStep> {
        let target = self.tail_target(0, 0);
        let (hwm, tail_end) = (self.alloc.hwm, self.tail_end());
        let r = &mut self.alloc.ready;
        if r.max == 0 || r.in_flight.is_some() || r.retry.is_some_and(|t| now < t) {
            return None;
        }
        let start = READY_START_GRAINS.min(r.max);
        // The step's size first, then whether it is due: an amount that
        // shrank after an idle spell must not plan a step that ends below
        // what is readied already.
        let amount = match r.last.map(|t| now.saturating_duration_since(t)) {
            _ if r.amount == 0 => start,
            Some(d) if d < READY_FAST => (2 * r.amount).min(r.max),
            Some(d) if d > READY_IDLE => start,
            _ => r.amount,
        };
        let to = ready_end(hwm + target, tail_end, amount)?;
        r.amount = amount;
        r.last = Some(now);
        r.in_flight = Some(to);
        Some(ReadyStep {
            from: tail_end,
            to,
            epoch: r.epoch,
        })
    }

    /// The readier's report on `step`: the host allocated it (the tail now
    /// reaches its end, unless a truncation came in between), or refused
    /// (retry in a second; never, when the file system has no
    /// `fallocate`).
    pub fn ready_done(&mut self, step: ReadyStep, outcome: &std::io::Result<()>, now: Instant) {
        let r = &mut self.alloc.ready;
        r.in_flight = None;
        match outcome {
            Ok(()) if r.epoch == step.epoch => {
                self.alloc.tail_end = self.alloc.tail_end.max(step.to);
            }
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                tracing::warn!(
                    "the host file system cannot allocate ahead (fallocate: {e}); \
                     first writes will wait for it to allocate"
                );
                r.max = 0;
            }
            Err(e) => {
                tracing::debug!("pool space not readied ahead: {e}");
                r.retry = Some(now + READY_FAST);
            }
        }
    }

    /// Take the tail as the pool file's length finds it (open).
    pub fn set_tail_end(&mut self, end: u64) {
        self.alloc.ready.epoch += 1;
        self.alloc.tail_end = end.max(self.alloc.hwm);
    }

    /// Blocks a punch touched are no longer held on the host.
    pub fn mark_unbacked(&mut self, first: u64, grains: u64) {
        if grains == 0 {
            return;
        }
        let b0 = first / BLOCK_GRAINS;
        let b1 = (first + grains - 1) / BLOCK_GRAINS;
        for b in b0..=b1 {
            if let Some(x) = self.alloc.backed.get_mut(b as usize) {
                *x = false;
            }
        }
    }

    /// Grow the pool by one block for an allocation at `place`; None when
    /// the capacity does not allow it.
    fn grow_pool(&mut self, capacity_grains: u64, place: Place) -> Result<Option<u64>> {
        if self.alloc.limit.is_some()
            || self.alloc.hwm + BLOCK_GRAINS > capacity_grains.max(BLOCK_GRAINS)
        {
            return Ok(None);
        }
        let old = self.alloc.hwm;
        let end = old + BLOCK_GRAINS;
        let target = self.tail_target(0, 0);
        if target > 0 && self.tail_end() < end + target {
            let step = (target / 4).clamp(BLOCK_GRAINS, TAIL_STEP_GRAINS);
            let r = self.extend_tail(end + target + step);
            if let Err(e) = r {
                let inside = self.tail_end() >= end;
                match place {
                    // Thin data may not eat into what thick disks hold.
                    Place::Any => {
                        return err(
                            ErrorKind::NoSpace,
                            format!(
                                "the host file system is full; the rest of the datastore's \
                                 file space is held for thick disks' reservations ({e})"
                            ),
                        )
                    }
                    Place::Backed if !inside => {
                        return err(
                            ErrorKind::NoSpace,
                            format!("the host file system is full ({e})"),
                        )
                    }
                    _ => tracing::warn!(
                        "the reserved tail could not be topped up ({e}); {} MiB of \
                         reservations are not held on the host",
                        ((end + target).saturating_sub(self.tail_end())
                            * strata_format::GRAIN_BYTES)
                            >> 20
                    ),
                }
            }
        }
        let r = &mut self.alloc.ready;
        if r.max > 0 && self.alloc.tail_end < end + target + r.amount.max(BLOCK_GRAINS) / 2 {
            r.wanted = true;
        }
        let b = old / BLOCK_GRAINS;
        let backed = self.tail_end() >= end;
        self.alloc.hwm = end;
        self.alloc.tail_end = self.alloc.tail_end.max(end);
        self.alloc.block_free.push(0);
        self.alloc.backed.push(backed);
        let free = if b == 0 {
            BLOCK_GRAINS - 1
        } else {
            BLOCK_GRAINS
        };
        self.alloc.set_block_free(b, free as u16);
        // Count pages covering the new grains are written by the next
        // checkpoint even if no count in them changes (FORMAT.md §4).
        self.materialize_ref_pages(old, self.alloc.hwm)?;
        Ok(Some(b))
    }

    fn new_block(
        &mut self,
        capacity_grains: u64,
        place: Place,
        reserving: bool,
    ) -> Result<Option<u64>> {
        let free = self
            .alloc
            .free_blocks
            .iter()
            .copied()
            .find(|&b| self.block_fits(b, place, reserving));
        if let Some(b) = free {
            return Ok(Some(b));
        }
        if let Some(b) = self.grow_pool(capacity_grains, place)? {
            return Ok(Some(b));
        }
        Ok(self
            .alloc
            .partial_blocks
            .iter()
            .copied()
            .find(|&b| self.block_fits(b, place, reserving)))
    }

    /// Allocate a data grain for virtual grain `v` of version `owner`
    /// (FORMAT.md §10.5): after `hint` (the grain mapping `v - 1`), else
    /// where the region's anchor puts it, else at `v`'s offset in a fresh
    /// block, else by the owner's cursor. As `alloc_grain` otherwise.
    pub fn alloc_data_grain(
        &mut self,
        at: DataSlot,
        capacity_grains: u64,
        place: Place,
    ) -> Result<u64> {
        let DataSlot { owner, v, hint } = at;
        if self.alloc.arrival_order {
            return self.alloc_grain(owner, hint, capacity_grains, place);
        }
        let reserving = place != Place::Any && self.tail_target(0, 0) > 0;
        let bounds = Bounds {
            capacity_grains,
            place,
            reserving,
        };
        let region = v / BLOCK_GRAINS;
        let anchor = self.alloc.anchors.get(&(owner, region)).copied();
        // The region's anchor first; the grain after the one mapping
        // `v - 1` only within its block, or starting a wholly free one
        // (across a block boundary it may be another region's block).
        let after = hint.map(|h| h + 1).filter(|&g| {
            !g.is_multiple_of(BLOCK_GRAINS) || self.alloc.free_blocks.contains(&(g / BLOCK_GRAINS))
        });
        let goals = [anchor.and_then(|(av, ag)| (ag + v).checked_sub(av)), after];
        for g in goals.into_iter().flatten() {
            if self.block_fits(g / BLOCK_GRAINS, place, reserving) && self.allocatable(g)? {
                self.take(g)?;
                if anchor.is_none() {
                    self.anchor(owner, region, v, g);
                }
                return Ok(g);
            }
        }
        if anchor.is_none() {
            let mut block = self.region_block(owner, region, bounds)?;
            if block.is_none() && self.alloc.limit.is_some() {
                // Consolidation's limit (FORMAT.md §10.4) gives way rather
                // than send a new region into the single free grains left
                // below it: slow to write one by one, and they fragment.
                self.alloc.limit = None;
                self.alloc.limit_lifted = true;
                block = self.region_block(owner, region, bounds)?;
            }
            if let Some(b) = block {
                let g = b * BLOCK_GRAINS + v % BLOCK_GRAINS;
                if self.allocatable(g)? {
                    self.take(g)?;
                    self.anchor(owner, region, v, g);
                    return Ok(g);
                }
            }
        }
        let g = self.alloc_grain(owner, None, capacity_grains, place)?;
        self.anchor(owner, region, v, g);
        Ok(g)
    }

    /// Place data grains by region (FORMAT.md §10.5) or, with `false`, in
    /// the order writes arrive (hint and cursor only).
    pub fn set_placement_regions(&mut self, on: bool) {
        self.alloc.arrival_order = !on;
        self.alloc.anchors.clear();
    }

    /// Record `g` as the anchor of `owner`'s `region` unless it has one.
    fn anchor(&mut self, owner: u64, region: u64, v: u64, g: u64) {
        if self.alloc.anchors.len() >= ANCHORS_MAX {
            self.alloc.anchors.clear();
        }
        self.alloc.anchors.entry((owner, region)).or_insert((v, g));
    }

    /// A wholly free block for a region without an anchor (FORMAT.md
    /// §10.5): the one after the previous region's block, the lowest, or
    /// one added at the pool's end within the bounds; None otherwise.
    fn region_block(&mut self, owner: u64, region: u64, bounds: Bounds) -> Result<Option<u64>> {
        let Bounds {
            capacity_grains,
            place,
            reserving,
        } = bounds;
        let after_prev = region
            .checked_sub(1)
            .and_then(|r| self.alloc.anchors.get(&(owner, r)))
            .map(|&(_, g)| g / BLOCK_GRAINS + 1);
        if let Some(b) = after_prev {
            if self.alloc.free_blocks.contains(&b) && self.block_fits(b, place, reserving) {
                return Ok(Some(b));
            }
        }
        let lowest = self
            .alloc
            .free_blocks
            .iter()
            .copied()
            .find(|&b| self.block_fits(b, place, reserving));
        if lowest.is_some() {
            return Ok(lowest);
        }
        let gap = (self.alloc.hwm + BLOCK_GRAINS).saturating_sub(self.used_grains);
        let free = capacity_grains.saturating_sub(self.used_grains);
        if place == Place::Any
            && self.alloc.limit.is_none()
            && gap <= REGION_GAP_GRAINS.max(free / 4)
            && self.tail_target(0, 0) == 0
        {
            return self.grow_pool(capacity_grains, place);
        }
        Ok(None)
    }

    /// Whether a run of data grains could continue at `g` (defrag, FORMAT.md
    /// §10.3): `g` is free inside its block, or starts a block that is
    /// wholly free or that the pool grows by next.
    pub fn run_can_continue(&mut self, g: u64) -> Result<bool> {
        let b = g / BLOCK_GRAINS;
        if !self.block_fits(b, Place::Any, false) {
            return Ok(false);
        }
        if g.is_multiple_of(BLOCK_GRAINS) {
            return Ok(g == self.alloc.hwm || self.alloc.free_blocks.contains(&b));
        }
        Ok(g < self.alloc.hwm && self.allocatable(g)?)
    }

    /// Where defrag starts a new run (FORMAT.md §10.3): the first grain of
    /// the longest run of wholly free blocks below the pool end (the
    /// lowest such run on a tie), or the pool end when there is none.
    /// Clients take the lowest free block for a new region (10.5), so a run
    /// started here meets them last.
    pub fn run_start(&self) -> u64 {
        let (mut best, mut best_len) = (self.alloc.hwm / BLOCK_GRAINS, 0u64);
        let (mut start, mut len, mut prev) = (0u64, 0u64, None::<u64>);
        for &b in &self.alloc.free_blocks {
            if b * BLOCK_GRAINS >= self.alloc.hwm {
                break;
            }
            if prev.is_some_and(|p| p + 1 == b) {
                len += 1;
            } else {
                (start, len) = (b, 1);
            }
            if len > best_len {
                (best, best_len) = (start, len);
            }
            prev = Some(b);
        }
        best * BLOCK_GRAINS
    }

    /// Continue a run into the next block (defrag, FORMAT.md §10.3): take
    /// `g`, the first grain of a block, when that block is wholly free or
    /// is the one the pool grows by next; None otherwise (also when the
    /// pool cannot grow). The grain has count 1, as from `alloc_grain`.
    pub fn alloc_block_start(&mut self, g: u64, capacity_grains: u64) -> Result<Option<u64>> {
        let b = g / BLOCK_GRAINS;
        if !g.is_multiple_of(BLOCK_GRAINS) || !self.block_fits(b, Place::Any, false) {
            return Ok(None);
        }
        if g == self.alloc.hwm {
            match self.grow_pool(capacity_grains, Place::Any) {
                Ok(Some(nb)) if nb == b => {}
                Ok(_) => return Ok(None),
                Err(e) if e.kind == ErrorKind::NoSpace => return Ok(None),
                Err(e) => return Err(e),
            }
        } else if !self.alloc.free_blocks.contains(&b) {
            return Ok(None);
        }
        if !self.allocatable(g)? {
            return Ok(None);
        }
        self.take(g)?;
        Ok(Some(g))
    }

    /// Allocate one grain for `owner`, next to `hint` when possible, at
    /// `place`. The grain has count 1 in memory and nothing in the log
    /// until it is installed.
    pub fn alloc_grain(
        &mut self,
        owner: u64,
        hint: Option<u64>,
        capacity_grains: u64,
        place: Place,
    ) -> Result<u64> {
        let reserving = place != Place::Any && self.tail_target(0, 0) > 0;
        let bounds = Bounds {
            capacity_grains,
            place,
            reserving,
        };
        let r = match self.alloc_at(owner, hint, bounds) {
            // A node goes anywhere rather than fail a change half made.
            Err(e) if place == Place::Node && reserving && e.kind == ErrorKind::NoSpace => {
                let anywhere = Bounds {
                    reserving: false,
                    ..bounds
                };
                self.alloc_at(owner, hint, anywhere)
            }
            r => r,
        };
        match r {
            // Consolidation gives way to clients (FORMAT.md §10.4).
            Err(e) if e.kind == ErrorKind::NoSpace && self.alloc.limit.is_some() => {
                self.alloc.limit = None;
                self.alloc.limit_lifted = true;
                self.alloc_grain(owner, hint, capacity_grains, place)
            }
            r => r,
        }
    }

    /// `alloc_grain` within `bounds`: after `hint`, else by the owner's
    /// cursor (a new block when it runs out), else in any partial block.
    fn alloc_at(&mut self, owner: u64, hint: Option<u64>, bounds: Bounds) -> Result<u64> {
        let Bounds {
            capacity_grains,
            place,
            reserving,
        } = bounds;
        if let Some(h) = hint {
            let g = h + 1;
            if g % BLOCK_GRAINS != 0
                && self.block_fits(g / BLOCK_GRAINS, place, reserving)
                && self.allocatable(g)?
            {
                self.take(g)?;
                return Ok(g);
            }
        }
        for _ in 0..4 {
            if let Some(&(b, next)) = self.alloc.cursors.get(&owner) {
                if (b as usize) < self.alloc.block_free.len()
                    && self.alloc.block_free[b as usize] > 0
                    && self.block_fits(b, place, reserving)
                {
                    for i in next..BLOCK_GRAINS {
                        let g = b * BLOCK_GRAINS + i;
                        if self.allocatable(g)? {
                            self.take(g)?;
                            self.alloc.cursors.insert(owner, (b, i + 1));
                            return Ok(g);
                        }
                    }
                }
            }
            let Some(b) = self.new_block(capacity_grains, place, reserving)? else {
                break;
            };
            self.alloc.cursors.insert(owner, (b, 0));
        }
        // Last resort: any partially free block, scanned whole.
        let partial: Vec<u64> = self
            .alloc
            .partial_blocks
            .iter()
            .copied()
            .filter(|&b| self.block_fits(b, place, reserving))
            .take(PARTIAL_SCAN_BLOCKS_MAX)
            .collect();
        for b in partial {
            for i in 0..BLOCK_GRAINS {
                let g = b * BLOCK_GRAINS + i;
                if self.allocatable(g)? {
                    self.take(g)?;
                    self.alloc.cursors.insert(owner, (b, i + 1));
                    return Ok(g);
                }
            }
        }
        err(ErrorKind::NoSpace, "no free grain left in the datastore")
    }

    /// Undo an allocation that was never installed (its write failed).
    pub fn abort_alloc(&mut self, g: u64) -> Result<()> {
        assert_eq!(
            self.ref_get(g)?,
            1,
            "grain {g}: an aborted allocation has count 1"
        );
        self.ref_put(g, 0)?;
        self.alloc.adjust(g, 1);
        self.used_grains -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step always ends past what is readied, whatever the amount did
    /// meanwhile (an idle spell brings it back to its start: a server
    /// panicked on the subtraction when a smaller amount planned a step
    /// ending below the readied end).
    #[test]
    fn a_readying_step_never_ends_below_what_is_readied() {
        for need in [0, 1, BLOCK_GRAINS - 1, 5 * BLOCK_GRAINS] {
            for amount in [
                1,
                2,
                3,
                255,
                256,
                READY_START_GRAINS,
                4 * READY_START_GRAINS,
            ] {
                for tail_end in need..need + 5 * amount + 2 * BLOCK_GRAINS {
                    if let Some(to) = ready_end(need, tail_end, amount) {
                        assert!(to > tail_end, "{need} {amount} {tail_end}: {to}");
                        assert!(to >= need + amount && to % BLOCK_GRAINS == 0);
                    } else {
                        assert!(tail_end >= need + amount / 2);
                    }
                }
            }
        }
    }
}
