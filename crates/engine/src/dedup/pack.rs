//! `strata compress DISK...` (docs/FORMAT.md §18.5, §18.8): the named
//! disks' raw grains packed into compressed streams, online, a region at
//! a time.
//!
//! Per region, with every head's write stripes held: the named versions'
//! distinct raw grains that may move (not thick, not encrypted, every
//! reference to them a leaf entry at their virtual grain) are listed
//! under the metadata lock, then read and compressed without it (with
//! zstd an aligned quad or pair together where that pays, §18.9; else
//! each grain alone when that saves an eighth; zero grains stay raw for
//! zero reclaim). Then,
//! under the gate and the lock, if the list is still what it was, the
//! fragments are laid out as streams over consecutive free grains (one
//! stream per layer: a virtual grain is in a stream once), written, and
//! in one batch the entries point at them, the stream grains get their
//! counts and the raw grains are freed.

use strata_api::{CompressReport, PackCodec};
use strata_format::packed::{encode_stream, Codec, Piece, Stream};
use strata_format::{GRAIN_BYTES, GRAIN_SHIFT, INCOMPAT_PACKED, LEAF_SPILLS};

use super::repack::add_moved;
use super::{fixed_in_region, region_entries, versions_of, window_end, Mapped, REGION};
use crate::compress::fragment;
use crate::datastore::{Datastore, SpaceWork};
use crate::error::{err, Error, ErrorKind, Result};
use crate::meta::{Meta, Packing, SpanLeaves};
use crate::store::SpaceRequest;

use std::cell::Cell;

const GRAIN: usize = GRAIN_BYTES as usize;

/// A region's candidates: the named versions' distinct raw grains that
/// may move, sorted by virtual grain, and each one's count; the stream
/// grains their packed entries name, each with its count (§18.10); the
/// named disks' heads.
#[derive(PartialEq, Eq, Hash)]
struct Plan {
    mapped: Vec<Mapped>,
    counts: Vec<u32>,
    streams: Vec<(u64, u32)>,
    heads: Vec<u64>,
}

impl Plan {
    /// What a pass that found nothing to pack notes of the region with
    /// `codec` (`crate::settled`): the same plan packs the same.
    fn fingerprint(&self, codec: Codec) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        codec.hash(&mut h);
        self.hash(&mut h);
        h.finish()
    }
}

/// A compressed fragment to lay out: its virtual grain (the first of a
/// run), how many it holds, its codec, compressed length and bytes (the
/// compressed bytes, or a moved fragment's stored bytes), and what it
/// replaces.
pub(super) struct Frag {
    pub v: u64,
    pub span: u8,
    pub codec: Codec,
    pub len: usize,
    pub bytes: Vec<u8>,
    pub from: Source,
}

/// What a fragment replaces.
pub(super) enum Source {
    /// The raw grains of its virtual grains, one each.
    Raw(Vec<u64>),
    /// The fragment as it lies in a half-dead stream grain, starting in
    /// this one (§18.10).
    Stream(u64),
}

impl Frag {
    /// A fragment of raw grains `from` (one per virtual grain from `v`).
    fn raw(v: u64, from: Vec<u64>, codec: Codec, bytes: Vec<u8>) -> Frag {
        Frag {
            v,
            span: from.len() as u8,
            codec,
            len: bytes.len(),
            bytes,
            from: Source::Raw(from),
        }
    }
}

/// What a region step does.
#[derive(Clone, Copy)]
enum Work<'a> {
    /// Pack the raw candidates with this codec, and repack half-dead
    /// stream grains (§18.5, §18.10).
    Pack(Codec),
    /// Only repack: half-dead stream grains, and every stream grain at or
    /// above `zone` whatever its live bytes (free-space consolidation,
    /// §10.4); nothing raw is packed. The new streams go into the lowest
    /// runs of free grains below `zone`: runs of [`RUN_LONG`] grains or
    /// more first, then shorter ones (the cursors the whole step shares,
    /// where the search for each starts).
    Evacuate { zone: u64, low: &'a [Cell<u64>; 2] },
}

impl Work<'_> {
    /// Whether raw grains are packed (else only streams repacked).
    fn packs_raw(&self) -> bool {
        matches!(self, Work::Pack(_))
    }

    /// What a pass that finds nothing to do in a region notes of it
    /// (`crate::settled`): only packing notes.
    fn fingerprint(&self, plan: &Plan) -> Option<u64> {
        match self {
            Work::Pack(codec) => Some(plan.fingerprint(*codec)),
            Work::Evacuate { .. } => None,
        }
    }

    /// Where new streams go when they must stay below a zone.
    fn below(&self) -> Option<Below<'_>> {
        match self {
            Work::Pack(_) => None,
            Work::Evacuate { zone, low } => Some((*zone, low)),
        }
    }
}

/// A stream placed in the pool: its first grain, its layout, and the
/// fragments of its layer it holds.
struct Placed {
    first: u64,
    stream: Stream,
    layer: usize,
    frags: std::ops::Range<usize>,
}

impl Datastore {
    /// Pack the raw grains of `names` (every disk when empty) that shrink
    /// by an eighth: see [`CompressReport`]. With LZ4 each grain is
    /// compressed alone; with zstd an aligned quad, else an aligned pair,
    /// also together, kept when smaller (§18.8, §18.9: a run costs a read
    /// of any of its grains the whole run's decompression, which zstd's
    /// savings pay for and LZ4's do not).
    /// Paced, pausable and cancellable as the other space work;
    /// `progress(done, total)` in bytes of the largest version.
    pub fn compress(
        &self,
        names: &[String],
        codec: PackCodec,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CompressReport> {
        self.inner.check_writable()?;
        let name = codec.as_str();
        let codec = match codec {
            PackCodec::Lz4 => Codec::Lz4,
            PackCodec::Zstd => Codec::Zstd,
        };
        let (disks, versions) = versions_of(&self.inner.meta.lock(), names)?;
        let heads = self.inner.meta.lock().head_versions();
        self.inner.settled.keep_heads(&heads);
        if self.inner.meta.lock().hwm() >= LEAF_SPILLS {
            return err(
                ErrorKind::Unsupported,
                "compress: the pool is past 2^42 grains (16 PiB), which packed entries cannot name",
            );
        }
        let end = versions.iter().map(|v| v.grains).max().unwrap_or(0);
        let mut rep = CompressReport {
            disks,
            versions: versions.len() as u64,
            codec: name.into(),
            used_bytes_before: self.inner.meta.lock().used_grains() * GRAIN_BYTES,
            ..CompressReport::default()
        };
        if end > 0 {
            // Before the first packed entry is logged (§18.1).
            self.inner.ensure_incompat(INCOMPAT_PACKED)?;
        }
        (rep.regions, rep.read_bytes) = self.over_regions(end, opts, progress, &mut |first| {
            self.pack_region(names, Work::Pack(codec), first, &mut rep)
        })?;
        rep.used_bytes_after = self.inner.meta.lock().used_grains() * GRAIN_BYTES;
        Ok(rep)
    }

    /// Repack the region of virtual grains from `first` (every disk's
    /// versions) so that none of its stream grains is left at or above
    /// `zone` (free-space consolidation, FORMAT.md §10.4; the allocation
    /// limit places the new streams below it). Returns the stored bytes
    /// of the fragments moved and the bytes read.
    /// `low` is where the searches for long and short runs of free grains
    /// start, and move on.
    pub(crate) fn repack_region_below(
        &self,
        first: u64,
        zone: u64,
        low: &[Cell<u64>; 2],
    ) -> Result<(u64, u64)> {
        let mut rep = CompressReport::default();
        let work = Work::Evacuate { zone, low };
        let (read, _) = self.pack_region(&[], work, first, &mut rep)?;
        Ok((rep.repacked_bytes, read))
    }

    /// One region; returns the bytes read and the end of the largest
    /// named version now.
    fn pack_region(
        &self,
        names: &[String],
        work: Work,
        first: u64,
        rep: &mut CompressReport,
    ) -> Result<(u64, u64)> {
        let _fence = self.inner.fail_on_panic();
        let held = self.inner.meta.lock().head_versions();
        let _stripes = self.inner.lock_stripes_of(&held, first, first + REGION - 1);
        let raw = work.packs_raw();
        let (plan, end) = pack_plan(names, first, raw, &mut self.inner.meta.lock())?;
        if plan.mapped.is_empty() && plan.streams.is_empty() {
            return Ok((0, end));
        }
        // Nothing written there since a pass found nothing to pack in it.
        let print = work.fingerprint(&plan);
        if print.is_some_and(|p| self.inner.settled.unchanged(first, p, &plan.heads)) {
            rep.unchanged_bytes += plan.mapped.len() as u64 * GRAIN_BYTES;
            return Ok((0, end));
        }
        let Some((layers, read)) = self.region_fragments(names, (work, first), &plan, rep)? else {
            rep.regions_skipped += 1;
            return Ok((plan.mapped.len() as u64 * GRAIN_BYTES, end));
        };
        if layers.iter().all(|l| l.is_empty()) {
            if let Some(p) = print {
                self.inner.settled.note(first, p, &plan.heads);
            }
            return Ok((read, end));
        }
        // As defrag and dedup: the stripes are held already, so a
        // recursive read of the gate.
        let _gate = self.inner.gate.read_recursive();
        let mut m = self.inner.meta.lock();
        if m.head_versions() != held || pack_plan(names, first, raw, &mut m)?.0 != plan {
            rep.regions_skipped += 1;
            return Ok((read, end));
        }
        let placed = self.place_layers(&mut m, &layers, work.below())?;
        drop(m);
        if let Err(e) = self.write_streams(&placed) {
            self.give_back_streams(&mut self.inner.meta.lock(), &placed)?;
            return Err(e);
        }
        let mut m = self.inner.meta.lock();
        if m.head_versions() != held {
            self.give_back_streams(&mut m, &placed)?;
            rep.regions_skipped += 1;
            return Ok((read, end));
        }
        let left = self
            .inner
            .guarded(&mut m, |m| install(m, &placed, &layers))?;
        let (kept, left): (Vec<&Placed>, Vec<&Placed>) =
            placed.iter().partition(|p| !left.contains(&p.first));
        self.give_back_streams(&mut m, left)?;
        drop(m);
        tally(rep, &kept, &layers);
        self.inner
            .mutations
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok((read, end))
    }

    /// The region's fragments by layer, and the bytes read for them: its
    /// raw candidates compressed, and the live fragments of its half-dead
    /// stream grains (§18.10). None when a stream grain read without the
    /// lock does not decode and the region changed since `plan` (a
    /// snapshot deleted meanwhile may have freed it): the region is
    /// skipped. If the region is as it was, that is damage.
    fn region_fragments(
        &self,
        names: &[String],
        (work, first): (Work, u64),
        plan: &Plan,
        rep: &mut CompressReport,
    ) -> Result<Option<(Vec<Vec<Frag>>, u64)>> {
        let (mut layers, zone, raw) = match work {
            Work::Pack(codec) => (self.compress_plan(&plan.mapped, codec, rep)?, None, true),
            Work::Evacuate { zone, .. } => (Vec::new(), Some(zone), false),
        };
        let streams: Vec<u64> = plan.streams.iter().map(|s| s.0).collect();
        let (moved, stream_read) = match self.half_dead(&streams, zone) {
            Ok(got) => got,
            Err(e) if e.kind == ErrorKind::Corrupt => {
                if pack_plan(names, first, raw, &mut self.inner.meta.lock())?.0 == *plan {
                    return Err(e);
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        add_moved(&mut layers, moved);
        let read = plan.mapped.len() as u64 * GRAIN_BYTES + stream_read;
        Ok(Some((layers, read)))
    }

    /// Read the plan's grains a window at a time and compress them into
    /// fragments, by layer ([`by_layer`]), each layer's as
    /// [`compress_layer`] makes them. What stays raw is counted in `rep`.
    fn compress_plan(
        &self,
        mapped: &[Mapped],
        codec: Codec,
        rep: &mut CompressReport,
    ) -> Result<Vec<Vec<Frag>>> {
        let mut layers: Vec<Vec<Frag>> = Vec::new();
        let mut buf = Vec::new();
        let mut at = 0;
        while at < mapped.len() {
            let to = window_end(mapped, at);
            let slot = self.read_window(&mapped[at..to], &mut buf)?;
            let by_layer = by_layer((at..to).map(|i| {
                let b = &buf[slot[i - at] * GRAIN..(slot[i - at] + 1) * GRAIN];
                (mapped[i].v, mapped[i].grain, b)
            }));
            let done = compress_window(&by_layer, codec, pack_threads());
            for (k, (frags, raw)) in done.into_iter().enumerate() {
                if layers.len() <= k {
                    layers.push(Vec::new());
                }
                layers[k].extend(frags);
                rep.raw_bytes += raw;
            }
            at = to;
        }
        Ok(layers)
    }

    /// Lay each layer's fragments out as streams over consecutive free
    /// grains (a layer the allocator cannot give one run for becomes
    /// several streams); with `below`, in the lowest runs of free grains
    /// under it. On error nothing stays allocated.
    fn place_layers(
        &self,
        m: &mut Meta,
        layers: &[Vec<Frag>],
        below: Option<Below<'_>>,
    ) -> Result<Vec<Placed>> {
        let want: u64 = layers
            .iter()
            .flatten()
            .map(|f| f.bytes.len() as u64 + 16)
            .sum::<u64>()
            .div_ceil(GRAIN_BYTES - 16)
            + layers.len() as u64;
        self.inner.check_space(
            m,
            SpaceRequest {
                reserve: false,
                grains: want,
                own_reserved: 0,
            },
        )?;
        let cap = self.inner.capacity_grains(m);
        let mut out = Vec::new();
        for (layer, frags) in layers.iter().enumerate() {
            if let Err(e) = place_layer(m, (layer, frags), (cap, below), &mut out) {
                self.give_back_streams(m, &out)?;
                return Err(e);
            }
        }
        Ok(out)
    }

    /// Write the placed streams' grains.
    fn write_streams(&self, placed: &[Placed]) -> Result<()> {
        for p in placed {
            self.inner
                .pool
                .write_at(&p.stream.grains, p.first << GRAIN_SHIFT)?;
        }
        Ok(())
    }

    /// Give back the grains of streams that will not be installed.
    fn give_back_streams<'a>(
        &self,
        m: &mut Meta,
        placed: impl IntoIterator<Item = &'a Placed>,
    ) -> Result<()> {
        for p in placed {
            give_back(m, p.first, p.stream.len()).map_err(|e| self.inner.fail_stop(e))?;
        }
        Ok(())
    }
}

/// The region's candidates over the named disks' versions now, and the
/// end of the largest of them: distinct raw grains of plain (unencrypted,
/// not thick) versions whose every reference is a leaf entry at their
/// virtual grain, and which no thick disk or deep rekey maps (none unless
/// `raw`: a step that only repacks); the stream grains their packed
/// entries name.
fn pack_plan(names: &[String], first: u64, raw: bool, m: &mut Meta) -> Result<(Plan, u64)> {
    let (disks, versions) = versions_of(m, names)?;
    // versions_of lists the disks' heads first.
    let heads = versions[..disks.len()].iter().map(|v| v.id).collect();
    let end = versions.iter().map(|v| v.grains).max().unwrap_or(0);
    let region = region_entries(m, &versions, first)?;
    let mut streams = Vec::with_capacity(region.stream_grains.len());
    for &g in &region.stream_grains {
        streams.push((g, m.ref_get(g)?));
    }
    let mapped = if raw { region.raw } else { Vec::new() };
    // Left raw whoever else names them: a thick or an encrypted disk.
    let fixed = fixed_in_region(m, first, |v| v.thick.is_some() || v.keyring.is_some())?;
    let mut kept = Vec::new();
    let mut counts = Vec::new();
    let memo = &mut SpanLeaves::default();
    for e in mapped {
        if e.class != 0 || fixed.binary_search(&(e.v, e.grain)).is_ok() {
            continue;
        }
        if m.can_move(memo, e.v, e.grain)? {
            counts.push(m.ref_get(e.grain)?);
            kept.push(e);
        }
    }
    Ok((
        Plan {
            mapped: kept,
            counts,
            streams,
            heads,
        },
        end,
    ))
}

/// A grain of a window to compress: its virtual grain, its raw grain
/// and its bytes.
pub(super) type Member<'a> = (u64, u64, &'a [u8]);

/// `members` (in virtual-grain order) by layer: layer `k` holds the
/// `k`-th distinct grain of each virtual grain (a stream names a virtual
/// grain once).
pub(super) fn by_layer<'a>(members: impl Iterator<Item = Member<'a>>) -> Vec<Vec<Member<'a>>> {
    let mut out: Vec<Vec<Member<'a>>> = Vec::new();
    let (mut last, mut k) = (None, 0);
    for m in members {
        k = if last == Some(m.0) { k + 1 } else { 0 };
        last = Some(m.0);
        if out.len() <= k {
            out.push(Vec::new());
        }
        out[k].push(m);
    }
    out
}

/// Threads a window's grains are compressed on: the host's cores, at
/// most four. Each compresses runs of a layer cut where a virtual grain
/// is a multiple of four, so no quad or pair spans two runs and the
/// fragments are those one thread makes, in the same order.
fn pack_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Fewest grains a thread is started for: a small region's few grains
/// are compressed on the pass's own thread (starting one costs some tens
/// of microseconds, LZ4 a grain some ten).
const RUN_MIN: usize = 64;

/// Compress each layer of a window (`by_layer[k]`: the window's `k`-th
/// grains, in virtual-grain order) into its fragments, and the bytes left
/// raw, by layer. The layers' runs are shared out over `threads`, as
/// far as each has [`RUN_MIN`] grains.
fn compress_window(
    by_layer: &[Vec<Member<'_>>],
    codec: Codec,
    threads: usize,
) -> Vec<(Vec<Frag>, u64)> {
    let grains: usize = by_layer.iter().map(Vec::len).sum();
    let threads = threads.min(grains / RUN_MIN).max(1);
    let jobs: Vec<(usize, &[Member<'_>])> = by_layer
        .iter()
        .enumerate()
        .flat_map(|(k, members)| runs(members, threads).map(move |r| (k, r)))
        .collect();
    let mut done: Vec<(usize, Vec<Frag>, u64)> = if threads == 1 || jobs.len() == 1 {
        jobs.iter()
            .enumerate()
            .map(|(i, &(_, run))| compress_run(i, run, codec))
            .collect()
    } else {
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads.min(jobs.len()))
                .map(|_| {
                    scope.spawn(|| {
                        let mut out = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(&(_, run)) = jobs.get(i) else {
                                break out;
                            };
                            out.push(compress_run(i, run, codec));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    };
    done.sort_unstable_by_key(|d| d.0);
    let mut out: Vec<(Vec<Frag>, u64)> = by_layer.iter().map(|_| (Vec::new(), 0)).collect();
    for (i, frags, raw) in done {
        let layer = &mut out[jobs[i].0];
        layer.0.extend(frags);
        layer.1 += raw;
    }
    out
}

/// Job `i`, a run of one layer: its fragments and the bytes it leaves raw.
fn compress_run(i: usize, run: &[Member<'_>], codec: Codec) -> (usize, Vec<Frag>, u64) {
    let mut frags = Vec::new();
    let raw = compress_layer(run, codec, &mut frags);
    (i, frags, raw)
}

/// `members` in at most `n` runs of about equal length, each cut before
/// a virtual grain that is a multiple of four (an aligned quad or pair
/// starts there, none spans the cut).
fn runs<'m, 'a>(members: &'m [Member<'a>], n: usize) -> impl Iterator<Item = &'m [Member<'a>]> {
    let mut cuts = vec![0];
    for i in 1..n {
        let mut at = (members.len() * i / n).max(cuts[cuts.len() - 1]);
        while at < members.len() && !members[at].0.is_multiple_of(4) {
            at += 1;
        }
        if at > cuts[cuts.len() - 1] && at < members.len() {
            cuts.push(at);
        }
    }
    cuts.push(members.len());
    (0..cuts.len() - 1).map(move |i| &members[cuts[i]..cuts[i + 1]])
}

/// Compress one layer's grains of a window (virtual grain, raw grain,
/// bytes; in virtual-grain order) onto `out` (FORMAT.md §18.9). With
/// zstd, an aligned quad of grains none of which is zeros is compressed
/// together first, and kept when it fits a fragment (7,168 bytes);
/// else an aligned pair whose grains both keep alone, kept when smaller
/// than the two; else each grain alone, kept when it saves an eighth.
/// Grains are compressed alone only where no quad is kept: most of a
/// compressible disk is compressed once. Returns the bytes left raw.
pub(super) fn compress_layer(members: &[Member<'_>], codec: Codec, out: &mut Vec<Frag>) -> u64 {
    let mut raw = 0;
    let mut single = Singles {
        members,
        codec,
        got: vec![None; members.len()],
    };
    // Runs with zstd only: LZ4 saves next to nothing by them (0.1% on
    // the Debian image of PERFORMANCE.md) and 4 KiB random reads of pairs
    // decompress twice the bytes (0.78x raw against 0.90x).
    let zstd = codec == Codec::Zstd;
    let mut j = 0;
    while j < members.len() {
        let run = zstd
            .then(|| quad_at(members, j, codec).or_else(|| pair_at(&mut single, j)))
            .flatten();
        if let Some(f) = run {
            j += usize::from(f.span);
            out.push(f);
            continue;
        }
        let (v, g, _) = members[j];
        match single.get(j) {
            Some(c) => out.push(Frag::raw(v, vec![g], codec, c.to_vec())),
            None => raw += GRAIN_BYTES,
        }
        j += 1;
    }
    raw
}

/// A layer's grains compressed alone, each when first asked for: none for
/// a grain of zeros (left for zero reclaim, which finds raw zeros only)
/// or one that does not save an eighth.
struct Singles<'a> {
    members: &'a [Member<'a>],
    codec: Codec,
    got: Vec<Option<Option<Vec<u8>>>>,
}

impl Singles<'_> {
    fn get(&mut self, j: usize) -> Option<&[u8]> {
        let (codec, b) = (self.codec, self.members[j].2);
        self.got[j]
            .get_or_insert_with(|| {
                (!crate::disk::is_zero(b))
                    .then(|| fragment(codec, b))
                    .flatten()
            })
            .as_deref()
    }
}

/// Members `j .. j + span` when the first's `v` is a multiple of `span`
/// and the others follow it grain by grain.
fn aligned_run<'a>(members: &'a [Member<'a>], j: usize, span: usize) -> Option<&'a [Member<'a>]> {
    let run = members.get(j..j + span)?;
    let v = run[0].0;
    (v.is_multiple_of(span as u64) && run.iter().zip(v..).all(|(m, w)| m.0 == w)).then_some(run)
}

/// `run`'s grains as one fragment of compressed `bytes`.
fn run_fragment(run: &[Member<'_>], codec: Codec, bytes: Vec<u8>) -> Frag {
    Frag::raw(run[0].0, run.iter().map(|m| m.1).collect(), codec, bytes)
}

/// The quad from member `j`, kept when none of its grains is zeros and
/// it compresses to a fragment.
fn quad_at(members: &[Member<'_>], j: usize, codec: Codec) -> Option<Frag> {
    let run = aligned_run(members, j, 4)?;
    if run.iter().any(|m| crate::disk::is_zero(m.2)) {
        return None;
    }
    let plain: Vec<u8> = run.iter().flat_map(|m| m.2.iter().copied()).collect();
    let c = fragment(codec, &plain)?;
    Some(run_fragment(run, codec, c))
}

/// The pair from member `j`, kept when both its grains keep alone and
/// together they take less.
fn pair_at(single: &mut Singles<'_>, j: usize) -> Option<Frag> {
    let run = aligned_run(single.members, j, 2)?;
    let alone = single.get(j)?.len() + single.get(j + 1)?.len();
    let plain = [run[0].2, run[1].2].concat();
    let c = fragment(single.codec, &plain).filter(|c| c.len() + 16 < alone)?;
    Some(run_fragment(run, single.codec, c))
}

/// Count into `rep` what the installed streams `kept` hold: their
/// grains, the virtual grains packed (pairs and quads apart) and the
/// stored bytes repacked.
fn tally(rep: &mut CompressReport, kept: &[&Placed], layers: &[Vec<Frag>]) {
    for p in kept {
        rep.stream_bytes += p.stream.len() as u64 * GRAIN_BYTES;
        for f in &layers[p.layer][p.frags.clone()] {
            if let Source::Stream(_) = f.from {
                rep.repacked_bytes += f.bytes.len() as u64;
                continue;
            }
            let bytes = u64::from(f.span) * GRAIN_BYTES;
            rep.packed_bytes += bytes;
            match f.span {
                2 => rep.pair_bytes += bytes,
                4 => rep.quad_bytes += bytes,
                _ => {}
            }
        }
    }
}

/// The pieces of `frags` for the layout.
fn pieces_of(frags: &[Frag]) -> Vec<Piece<'_>> {
    frags
        .iter()
        .map(|f| Piece {
            v: f.v,
            span: f.span,
            codec: f.codec,
            len: f.len,
            stored: &f.bytes,
        })
        .collect()
}

/// A layout refused by the format: the pass's own mistake, named.
fn layout_error(e: strata_format::FormatError) -> Error {
    Error::new(ErrorKind::Io, format!("compress: laying out a stream: {e}"))
}

/// Grains stream `s` needs for its first `k` pieces alone: up to the
/// grain where piece `k - 1` starts, and the next one if it spills.
fn grains_for(s: &Stream, k: usize) -> usize {
    let at = s.starts[k - 1];
    let last_here = k == s.starts.len() || s.starts[k] != at;
    at + 1 + usize::from(last_here && s.spills[at])
}

/// Place one layer's fragments as one or more streams onto `out`: a
/// stream over as many consecutive grains as the allocator gives; where
/// it gives fewer than the layout needs, the longest prefix that fits
/// them is laid out alone and the rest starts another stream. A run of
/// one grain where the first fragment spills is passed over (a hole
/// freed grains left) for the next, a few times; fragments no run can
/// take stay where they are (raw, or in their old stream).
fn place_layer(
    m: &mut Meta,
    (layer, frags): (usize, &[Frag]),
    (cap, below): (u64, Option<Below<'_>>),
    out: &mut Vec<Placed>,
) -> Result<()> {
    const HOLES_PASSED: usize = 4;
    let mut at = 0;
    let mut hint = None;
    let mut passed = 0;
    while at < frags.len() {
        let pieces = pieces_of(&frags[at..]);
        let s = encode_stream(&pieces).map_err(layout_error)?;
        let (g0, got) = match below {
            None => m.alloc_stream(s.len() as u64, hint, cap)?,
            Some(below) => match alloc_below(m, &s, below)? {
                Some(run) => run,
                // No run below the zone: the fragment stays where it is
                // (and the pool end with it).
                None => {
                    at += 1;
                    continue;
                }
            },
        };
        let got = got as usize;
        let fit = (1..=pieces.len()).rev().find(|&k| grains_for(&s, k) <= got);
        let Some(k) = fit else {
            give_back(m, g0, got)?;
            if passed < HOLES_PASSED {
                passed += 1;
                hint = Some(g0 + got as u64);
            } else {
                passed = 0;
                at += 1;
            }
            continue;
        };
        passed = 0;
        let s = if k == pieces.len() {
            s
        } else {
            encode_stream(&pieces[..k]).map_err(layout_error)?
        };
        give_back(m, g0 + s.len() as u64, got - s.len())?;
        hint = Some(g0 + s.len() as u64 - 1);
        if let Some((_, low)) = below {
            for cursor in low {
                cursor.set(cursor.get().min(g0 + s.len() as u64));
            }
        }
        out.push(Placed {
            first: g0,
            stream: s,
            layer,
            frags: at..at + k,
        });
        at += k;
    }
    Ok(())
}

/// Grains for stream `s` below the zone free-space consolidation empties:
/// the lowest run the first fragment fits in, up to the whole stream. A
/// long run keeps the stream whole; in single free grains each holds
/// what fits whole (a fragment cannot spill), so those come last.
fn alloc_below(m: &mut Meta, s: &Stream, (zone, low): Below<'_>) -> Result<Option<(u64, u64)>> {
    let want = s.len() as u64;
    let need = grains_for(s, 1) as u64;
    for (cursor, min) in low.iter().zip([want.min(RUN_LONG), need]) {
        let mut from = cursor.get();
        let run = m.alloc_run_low(&mut from, zone, (min, want))?;
        cursor.set(from);
        if run.is_some() {
            return Ok(run);
        }
    }
    Ok(None)
}

/// Where streams go when free-space consolidation repacks: below this
/// zone, in runs searched for from these cursors (long runs, short).
type Below<'a> = (u64, &'a [Cell<u64>; 2]);

/// Free grains in a row that make a long run for a stream placed below
/// the zone free-space consolidation empties (32 KiB).
const RUN_LONG: u64 = 8;

/// Give back `n` grains from `first`, allocated and never installed.
fn give_back(m: &mut Meta, first: u64, n: usize) -> Result<()> {
    for g in first..first + n as u64 {
        m.abort_alloc(g)?;
    }
    Ok(())
}

/// Install every placed stream (FORMAT.md §18.8): its grains' counts
/// (the entries that will reference each: those naming it, and those of
/// a fragment spilling into it from the grain before), its fragments'
/// entries, the raw grains freed and the repacked fragments' old stream
/// grains released (§18.10). Returns the first grains of streams that
/// could not be installed (a reference not accounted for, or a repacked
/// fragment no entry names any more: nothing of them changed).
fn install(m: &mut Meta, placed: &[Placed], layers: &[Vec<Frag>]) -> Result<Vec<u64>> {
    let mut left = Vec::new();
    let memo = &mut SpanLeaves::default();
    'stream: for p in placed {
        let s = &p.stream;
        let mut counts = vec![0u32; s.len()];
        let mut packs = Vec::new();
        for (j, f) in layers[p.layer][p.frags.clone()].iter().enumerate() {
            let at = s.starts[j];
            let last_here = j + 1 == s.starts.len() || s.starts[j + 1] != at;
            let spills = last_here && s.spills[at];
            let into = p.first + at as u64;
            let mut named = 0;
            for k in 0..u64::from(f.span) {
                let (from, n, repack) = match &f.from {
                    Source::Raw(from) => (from[k as usize], m.ref_get(from[k as usize])?, false),
                    // A dead part of a moved run: no entry to point.
                    Source::Stream(g) => match m.packed_naming(memo, f.v + k, *g)? {
                        0 => continue,
                        n => (*g, n, true),
                    },
                };
                named += n;
                packs.push(Packing {
                    v: f.v + k,
                    from,
                    into,
                    spills,
                    repack,
                });
            }
            if named == 0 {
                left.push(p.first);
                continue 'stream;
            }
            counts[at] += named;
            if spills {
                counts[at + 1] += named;
            }
        }
        if !m.install_packed(p.first, &counts, &packs)? {
            left.push(p.first);
        }
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grains of text, noise and zeros, some runs broken by a missing
    /// virtual grain: quads, pairs, singles and raw grains all occur.
    fn grains(n: u64) -> Vec<(u64, Vec<u8>)> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut out = Vec::new();
        for v in (0..n).filter(|v| v % 23 != 7) {
            let b = match v % 11 {
                0 => vec![0; GRAIN],
                1 | 2 => (0..GRAIN)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect(),
                _ => format!("grain {v} of the text, and again {}. ", v / 3)
                    .bytes()
                    .cycle()
                    .take(GRAIN)
                    .collect(),
            };
            out.push((v, b));
        }
        out
    }

    #[test]
    fn runs_cut_only_before_a_multiple_of_four_and_cover_every_member() {
        let g = grains(300);
        let members: Vec<Member<'_>> = g.iter().map(|(v, b)| (*v, *v + 1000, &b[..])).collect();
        for n in [1, 2, 3, 4, 7, 400] {
            let runs: Vec<&[Member<'_>]> = runs(&members, n).collect();
            assert!(runs.len() <= n, "{n} threads, {} runs", runs.len());
            assert_eq!(runs.iter().map(|r| r.len()).sum::<usize>(), members.len());
            for r in &runs[1..] {
                assert_eq!(r[0].0 % 4, 0, "{n} threads: a cut before {}", r[0].0);
            }
        }
        assert_eq!(runs(&[], 4).count(), 1);
    }

    #[test]
    fn a_window_packs_the_same_on_any_number_of_threads() {
        let g = grains(700);
        let one: Vec<Member<'_>> = g.iter().map(|(v, b)| (*v, *v + 1000, &b[..])).collect();
        let two: Vec<Member<'_>> = g
            .iter()
            .step_by(3)
            .map(|(v, b)| (*v, *v + 5000, &b[..]))
            .collect();
        let by_layer = vec![one, two];
        for codec in [Codec::Lz4, Codec::Zstd] {
            let shape = |threads| {
                compress_window(&by_layer, codec, threads)
                    .into_iter()
                    .map(|(frags, raw)| {
                        let f: Vec<_> = frags
                            .into_iter()
                            .map(|f| match f.from {
                                Source::Raw(from) => (f.v, f.span, f.len, f.bytes, from),
                                Source::Stream(_) => unreachable!("raw grains only"),
                            })
                            .collect();
                        (f, raw)
                    })
                    .collect::<Vec<_>>()
            };
            let alone = shape(1);
            let spans: Vec<u8> = alone[0].0.iter().map(|f| f.1).collect();
            assert!(alone[0].1 > 0, "{codec:?}: some grains stay raw");
            if codec == Codec::Zstd {
                assert!(
                    spans.contains(&4) && spans.contains(&1),
                    "{codec:?}: {spans:?}"
                );
            }
            for threads in [2, 3, 4] {
                assert!(shape(threads) == alone, "{codec:?} on {threads} threads");
            }
        }
    }
}
