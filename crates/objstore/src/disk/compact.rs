//! Compaction (docs/FORMAT.md §11.7a): the writer rewrites the live
//! grains of its partly live objects into dense segments and commits
//! their new places, only where nothing moved them since; GC then frees
//! the old objects whole.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_api::store::CompactReport;
use strata_s3::Bytes;

use super::read::LeafCursor;
use super::{Batch, ObjectDisk, G, SEGMENT_GRAINS};
use crate::layout::{Entry, Manifest, SegId, GRAIN};
use crate::{now_ms, Error, ErrorKind, Result, DIR_DISKS};

/// A busy pass runs once this many client bytes were written since the
/// last pass ...
const BUSY_BYTES: u64 = 16 << 20;
/// ... and this long after it.
const BUSY_GAP: Duration = Duration::from_secs(3);
/// Thresholds (live share of an object's bytes) of the automatic passes.
const BUSY_BELOW: f64 = 0.5;
const IDLE_BELOW: f64 = 0.85;
/// A busy pass presses (takes fuller objects, within the same budget)
/// while the disk's objects hold more than this times its live bytes.
pub const PRESS_ABOVE: f64 = 1.4;
pub const PRESS_BELOW: f64 = 0.67;
/// An automatic pass that would give back less than this does nothing.
const MIN_RECLAIM: u64 = 4 << 20;

/// The compaction passes a disk's writer runs by itself (§11.7a): busy
/// passes while clients write, an idle pass once they stopped. A pass
/// that would give back less than 4 MiB does nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoCompact {
    /// Once clients wrote 16 MiB since the last pass and at least 3 s
    /// after it: a pass at 50 % live (67 % while the disk's objects hold
    /// more than [`PRESS_ABOVE`] times its live bytes), within the bytes
    /// they wrote.
    pub busy: bool,
    /// A pass at 85 % once the disk had no write for this long, after
    /// each burst of writes (None: no idle passes).
    pub idle_after: Option<Duration>,
}

impl AutoCompact {
    /// The idle delay unless told otherwise (`strata serve --compact-idle`).
    pub const IDLE_AFTER: Duration = Duration::from_secs(30);
    /// No automatic passes: `strata compact` alone compacts.
    pub const OFF: AutoCompact = AutoCompact {
        busy: false,
        idle_after: None,
    };

    /// Whether any pass runs by itself.
    pub fn any(&self) -> bool {
        self.busy || self.idle_after.is_some()
    }
}

impl Default for AutoCompact {
    fn default() -> Self {
        AutoCompact {
            busy: true,
            idle_after: Some(Self::IDLE_AFTER),
        }
    }
}

/// A grain compaction rewrote: it moves from `old` to `new` only if it is
/// still at `old` in the manifest the commit builds on.
#[derive(Debug, Clone, Copy)]
pub(in crate::disk) struct Relocation {
    vg: u64,
    old: Entry,
    new: Entry,
}

/// How a pass chooses and how much it may rewrite.
#[derive(Debug, Clone, Copy)]
pub struct CompactOptions {
    /// Rewrite objects whose live bytes are under this share of their
    /// size (0 < below <= 1).
    pub below: f64,
    /// At most this many bytes of grains rewritten (None: no bound).
    pub budget: Option<u64>,
    /// Only say what would be rewritten.
    pub dry_run: bool,
    /// Sleep after each step as long as it took.
    pub pace: bool,
    /// Do nothing unless the objects emptied hold at least this many
    /// bytes more than the grains rewritten.
    pub min_reclaim: u64,
    /// A busy pass: take objects up to [`PRESS_BELOW`] live when the
    /// disk's objects hold more than [`PRESS_ABOVE`] times its live bytes.
    pub press: bool,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            below: IDLE_BELOW,
            budget: None,
            dry_run: false,
            pace: false,
            min_reclaim: 0,
            press: false,
        }
    }
}

/// What compaction did on one handle, for `status` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct CompactStats {
    pub passes: u64,
    pub rewritten_bytes: u64,
    pub relocated_grains: u64,
    pub dropped_grains: u64,
    pub emptied_bytes: u64,
}

/// A handle's compaction: its thread, its figures, one pass at a time.
#[derive(Default)]
pub(super) struct Compactor {
    running: AtomicBool,
    /// One pass at a time (a deep rekey's steps take it too, §16.7).
    pub(super) pass: Mutex<()>,
    stats: Mutex<CompactStats>,
}

impl ObjectDisk {
    /// What compaction did on this handle.
    pub fn compact_stats(&self) -> CompactStats {
        *self.compactor.stats.lock().unwrap()
    }

    /// Bytes of grains clients wrote through this handle.
    pub fn client_bytes(&self) -> u64 {
        self.state.lock().unwrap().client_bytes
    }

    /// Grains clients read or wrote through this handle: it moves while
    /// they are busy.
    pub fn client_grains(&self) -> u64 {
        let st = self.state.lock().unwrap();
        st.client_bytes / G + st.client_reads
    }

    /// Start the automatic passes (§11.7a) the datastore's options ask
    /// for once this handle writes the disk: a thread that ends with the
    /// handle, a release or a fence.
    pub(super) fn start_compactor(&self) {
        let auto = self.ds.options().compact;
        if !auto.any() || self.compactor.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name("strata-compact".into())
            .spawn(move || auto_passes(me, auto));
        if spawned.is_err() {
            self.compactor.running.store(false, Ordering::Release);
        }
    }

    /// One compaction pass (§11.7a). The disk's writer only: a handle that
    /// does not write the disk yet claims it (as a write would).
    #[expect(clippy::too_many_lines)]
    pub fn compact(&self, opts: CompactOptions) -> Result<CompactReport> {
        if self.read_only {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "'{}' is read-only here: only its writer compacts it",
                    self.name
                ),
            ));
        }
        if !(opts.below > 0.0 && opts.below <= 1.0) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "a compaction threshold is a share in (0, 1], not {}",
                    opts.below
                ),
            ));
        }
        if !opts.dry_run {
            self.may_write()?;
        }
        let _one = self.compactor.pass.lock().unwrap();
        let t = Instant::now();
        let man = self.manifest();
        let mut rep = CompactReport {
            disk: self.disk_name().to_string(),
            dry_run: opts.dry_run,
            ..Default::default()
        };
        let chosen = self.candidates(&man, opts, &mut rep)?;
        let (todo, emptied, rewrite) = within_budget(chosen, opts.budget.unwrap_or(u64::MAX));
        if opts.dry_run || emptied.saturating_sub(rewrite) < opts.min_reclaim.max(1) {
            if opts.dry_run {
                rep.rewritten_grains = todo.len() as u64;
                rep.rewritten_bytes = rewrite;
                rep.emptied_bytes = emptied;
            }
            rep.ms = t.elapsed().as_millis() as u64;
            return Ok(rep);
        }
        let mut buf = vec![0u8; GRAIN];
        for step in todo.chunks(SEGMENT_GRAINS) {
            let t0 = Instant::now();
            let Some(id) = self.step_segment(man.generation) else {
                break;
            };
            let r = self.rewrite(step, id, &mut buf);
            let r = r.and_then(|moves| {
                rep.segments += 1;
                rep.rewritten_grains += moves.len() as u64;
                rep.rewritten_bytes += live_bytes(step);
                self.commit_relocated(moves)
            });
            self.state.lock().unwrap().compacting = None;
            let (applied, dropped) = r?;
            rep.relocated_grains += applied;
            rep.dropped_grains += dropped;
            if applied > 0 {
                // What this step emptied may go while the pass goes on.
                self.ds.want_gc();
            }
            if opts.pace {
                std::thread::sleep(t0.elapsed());
            }
        }
        // Emptied for sure only if every grain moved (else GC finds out).
        if rep.relocated_grains == todo.len() as u64 {
            rep.emptied_bytes = emptied;
        }
        rep.ms = t.elapsed().as_millis() as u64;
        let mut s = self.compactor.stats.lock().unwrap();
        s.passes += 1;
        s.rewritten_bytes += rep.rewritten_bytes;
        s.relocated_grains += rep.relocated_grains;
        s.dropped_grains += rep.dropped_grains;
        s.emptied_bytes += rep.emptied_bytes;
        Ok(rep)
    }

    /// The segment the next step of a pass begun at `generation` uploads
    /// (its counter taken, and noted as compacting), or None when the
    /// pass must end: this host no longer writes the disk, or another
    /// generation does.
    fn step_segment(&self, generation: u32) -> Option<SegId> {
        let mut st = self.state.lock().unwrap();
        if !st.owner || st.fenced.is_some() || st.released.is_some() {
            return None;
        }
        if st.man.generation != generation {
            return None;
        }
        let ctr = st.next_ctr;
        st.next_ctr += 1;
        st.compacting = Some(ctr);
        Some(SegId {
            disk: self.id,
            gen: generation,
            ctr,
        })
    }

    /// The head's grains (virtual grain, entry) by the object they are in:
    /// its map's, where the tail does not shadow them, and the tail's.
    fn head_by_object(&self, man: &Manifest) -> Result<HashMap<SegId, Vec<(u64, Entry)>>> {
        let mut by_object: HashMap<SegId, Vec<(u64, Entry)>> = HashMap::new();
        self.ds.walk_map(
            man.root,
            man.levels,
            Some(&man.tail),
            &mut |e, level, vg| {
                if level.is_none() {
                    by_object.entry(e.seg).or_default().push((vg, *e));
                }
                Ok(())
            },
        )?;
        for (vg, e) in man.tail.iter() {
            if let Some(e) = e {
                by_object.entry(e.seg).or_default().push((*vg, *e));
            }
        }
        Ok(by_object)
    }

    /// The objects of the head under the threshold that no snapshot
    /// reaches, fewest live bytes first.
    fn candidates(
        &self,
        man: &Manifest,
        opts: CompactOptions,
        rep: &mut CompactReport,
    ) -> Result<Vec<Candidate>> {
        let ds = &self.ds;
        let mut by_object = self.head_by_object(man)?;
        let mut pinned: HashSet<SegId> = HashSet::new();
        for s in &man.snapshots {
            ds.walk_map(s.root, s.levels, None, &mut |e, _, _| {
                pinned.insert(e.seg);
                Ok(())
            })?;
        }
        let newest = SegId::payload(self.id, man.seq);
        let mut chosen = Vec::new();
        for l in ds
            .store
            .list(&format!("{DIR_DISKS}{:08x}/", self.id), None)?
        {
            // A segment, or a manifest by its payload.
            let Some(id) = SegId::from_key(&l.key).or_else(|| SegId::payload_from_key(&l.key))
            else {
                continue;
            };
            let Some(grains) = by_object.remove(&id) else {
                continue;
            };
            let live = live_bytes(&grains);
            rep.objects += 1;
            rep.stored_bytes += l.size;
            rep.live_bytes += live;
            if id == newest || pinned.contains(&id) {
                continue;
            }
            chosen.push(Candidate {
                id,
                size: l.size,
                live,
                grains,
            });
        }
        // Pressed: the disk holds more than PRESS_ABOVE times its live
        // bytes (a churn that outruns the busy threshold).
        let below = match opts.press {
            true if rep.stored_bytes as f64 > PRESS_ABOVE * rep.live_bytes as f64 => {
                opts.below.max(PRESS_BELOW)
            }
            _ => opts.below,
        };
        rep.below_pct = (below * 100.0).round() as u32;
        chosen.retain(|c| (c.live as f64) < below * c.size as f64);
        for c in &chosen {
            rep.candidates += 1;
            rep.candidate_bytes += c.size;
        }
        chosen.sort_by_key(|c| (c.live * 1000 / c.size.max(1), c.id));
        for c in chosen.iter_mut() {
            c.grains.sort_by_key(|(_, e)| e.slot);
        }
        Ok(chosen)
    }

    /// Read `grains` from where they are and upload them as segment `id`:
    /// the moves a commit may make.
    fn rewrite(
        &self,
        grains: &[(u64, Entry)],
        id: SegId,
        buf: &mut [u8],
    ) -> Result<Vec<Relocation>> {
        let mut b = self.ds.data_segment(id);
        let mut moves = Vec::with_capacity(grains.len());
        // The new slots of grains the cache held (kept cached there), and
        // the object grains not cached are read from: one GET each, held
        // while its grains (in a row in `grains`) are moved. Through
        // memory, not the cache: objects about to be emptied would push
        // out what clients read.
        let mut hot = Vec::new();
        let mut from: Option<(SegId, Bytes)> = None;
        for (vg, old) in grains {
            let cached = self.stored_grain(old, &mut from, buf)?;
            // Into a version-2 segment a plain disk's grain is packed
            // where that saves an eighth, as at seal (LZ4 gives a packed
            // grain the same bytes again; a raw one, written before
            // compress-at-seal or by a host without it, packs now). An
            // encrypted disk's ciphertext moves as it is.
            let new = if b.is_placed() && !self.encrypted {
                b.add_grain(*vg, buf)
            } else {
                b.add_stored(*vg, buf, old.key)
            };
            if cached {
                // Pages in order; two grains may share one.
                for page in new.pages() {
                    if hot.last() != Some(&page) {
                        hot.push(page);
                    }
                }
            }
            moves.push(Relocation {
                vg: *vg,
                old: *old,
                new,
            });
        }
        self.put_moved(id, &Bytes::from(b.seal(now_ms())), &hot)?;
        Ok(moves)
    }

    /// The stored bytes of grain `old` into `buf`: from the cache if it
    /// holds them (true), else from its segment, fetched whole into
    /// `from` (kept there for the next grain of the same segment), checked
    /// against the CRC its entry holds. Through memory, not the cache: a
    /// move or a re-encryption is not a client's read.
    pub(super) fn stored_grain(
        &self,
        old: &Entry,
        from: &mut Option<(SegId, Bytes)>,
        buf: &mut [u8],
    ) -> Result<bool> {
        let ds = &self.ds;
        if ds.cache.peek_grain(old, buf) {
            return Ok(true);
        }
        if from.as_ref().is_none_or(|(s, _)| *s != old.seg) {
            *from = Some((old.seg, crate::cache::get_verified(&ds.store, old.seg)?.0));
        }
        let bytes = &from.as_ref().expect("just fetched").1;
        if old.unplace_from(bytes, buf) {
            Ok(false)
        } else {
            Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{}: grain {} does not match the checksum its map entry holds \
                     (read from the store to rewrite it)",
                    old.seg.key(),
                    old.slot
                ),
            ))
        }
    }

    /// Commit `moves` with whatever client writes are pending: (moves
    /// taken, moves dropped because the grain moved since).
    fn commit_relocated(&self, moves: Vec<Relocation>) -> Result<(u64, u64)> {
        let n = moves.len() as u64;
        let _c = self.lock_commit()?;
        let mut t = {
            let mut st = self.state.lock().unwrap();
            match self.take_batch(&mut st)? {
                Some(t) => t,
                None => self.take(&mut st, Arc::new(Batch::new())),
            }
        };
        t.relocate = moves;
        let applied = self.commit_taken(t)?;
        Ok((applied, n - applied))
    }

    /// In a commit on `man` (onto its map and its tail with the sealed
    /// grains set): set each move whose grain is still where the pass
    /// found it and that `batch` does not write. How many it set.
    pub(super) fn relocate(
        &self,
        man: &Manifest,
        onto: &mut super::commit::Onto,
        batch: &Batch,
        moves: Vec<Relocation>,
    ) -> Result<u64> {
        let (root, levels, tail) = (onto.root, onto.levels, &mut onto.tail);
        let mut applied = 0;
        let mut cur = LeafCursor::default();
        for m in moves {
            if m.new.seg.gen != man.generation || batch.contains_key(&m.vg) {
                continue;
            }
            let now = match tail.get(&m.vg) {
                Some(e) => *e,
                None => self.lookup_at(&mut cur, root, levels, m.vg)?,
            };
            if now == Some(m.old) {
                tail.insert(m.vg, Some(m.new));
                applied += 1;
            }
        }
        Ok(applied)
    }
}

/// The automatic passes of one handle (§11.7a), until it is dropped,
/// released or fenced.
fn auto_passes(me: std::sync::Weak<ObjectDisk>, auto: AutoCompact) {
    let mut last_pass = Instant::now();
    let mut bytes_then = 0u64;
    let mut idle_then = 0u64;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let Some(d) = me.upgrade() else { return };
        let (client, last_write) = {
            let st = d.state.lock().unwrap();
            if !st.owner || st.fenced.is_some() || st.released.is_some() {
                d.compactor.running.store(false, Ordering::Release);
                return;
            }
            (st.client_bytes, st.last_write)
        };
        let busy = client - bytes_then >= BUSY_BYTES && last_pass.elapsed() >= BUSY_GAP;
        let idle = auto
            .idle_after
            .is_some_and(|after| client != idle_then && last_write.elapsed() >= after);
        let (below, budget) = if auto.busy && busy {
            (BUSY_BELOW, Some(client - bytes_then))
        } else if idle {
            idle_then = client;
            (IDLE_BELOW, None)
        } else {
            continue;
        };
        bytes_then = client;
        last_pass = Instant::now();
        let r = d.compact(CompactOptions {
            below,
            budget,
            dry_run: false,
            pace: true,
            min_reclaim: MIN_RECLAIM,
            press: budget.is_some(),
        });
        if let Err(e) = r {
            if e.kind != ErrorKind::Fenced && e.kind != ErrorKind::Released {
                tracing::warn!("disk '{}': compaction: {e}", d.name);
            }
        }
    }
}

/// The bytes `grains` take in their object (§18.6: a packed grain less
/// than its 4 KiB).
fn live_bytes(grains: &[(u64, Entry)]) -> u64 {
    grains.iter().map(|(_, e)| e.kept_bytes()).sum()
}

/// An object a pass may empty: its size, the bytes its live grains take
/// and those grains (virtual grain, entry).
struct Candidate {
    id: SegId,
    size: u64,
    live: u64,
    grains: Vec<(u64, Entry)>,
}

/// The grains to rewrite of `chosen` (fewest live first): whole objects
/// while `budget` bytes of live grains last. With the bytes the objects
/// hold (emptied once every grain moved) and those to rewrite.
fn within_budget(chosen: Vec<Candidate>, budget: u64) -> (Vec<(u64, Entry)>, u64, u64) {
    let mut todo = Vec::new();
    let (mut emptied, mut rewrite) = (0, 0);
    for c in chosen {
        if rewrite + c.live > budget {
            break;
        }
        todo.extend(c.grains);
        emptied += c.size;
        rewrite += c.live;
    }
    (todo, emptied, rewrite)
}
