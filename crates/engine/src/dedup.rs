//! `strata dedup --estimate` (docs/FORMAT.md §17.3): what re-sharing equal
//! grains would free, read-only and keyless, in bounded memory.
//!
//! The named disks' heads and snapshots are walked a region (256 virtual
//! grains) at a time. Under the I/O gate (so no grain looked up is freed
//! and reused before it is read) and the metadata lock, each version's
//! entries of the region are collected; then, without the lock, every
//! distinct grain is read once. Equal grains at the same virtual grain
//! under the same cipher are found by hash and confirmed byte for byte;
//! a hash sample estimates sharing at any offset; a sample of the
//! unencrypted grains is compressed with LZ4.

use std::collections::HashMap;

use strata_api::DedupEstimate;
use strata_format::packed::{encode_stream, Codec};
use strata_format::{leaf_grain, leaf_key, GRAIN_BYTES};

use crate::compress::room;
use crate::error::{err, ErrorKind, Result};
use crate::meta::Meta;
use crate::work::Pacer;

use crate::datastore::{Datastore, SpaceWork};

mod pack;
mod repack;
mod reshare;

/// Virtual grains walked at a time.
const REGION: u64 = 256;
// What a pass notes of a region (`crate::settled`) is kept by the same unit.
const _: () = assert!(REGION == 1 << crate::settled::REGION_SHIFT);
/// The passes commit after this many regions (64 MiB of virtual grains).
const COMMIT_EVERY_REGIONS: u64 = 64;
/// Most grains read into memory at once (16 MiB); a region with more
/// distinct grains is read in windows that end where a virtual grain ends.
const WINDOW: usize = 4096;
/// Most hashes the any-offset sample keeps: past it, the sampling rate
/// halves and the entries it no longer takes are dropped.
const SAMPLE_MAX: usize = 1 << 20;
/// The compression sample takes one aligned quad of virtual grains in
/// this many (so, of each layer, a grain in as many)...
const COMPRESS_EVERY: u64 = 64;
/// ...up to this many grains: past it, it keeps one in two of those
/// quads, then one in four, and so on (picked by a keyed hash, the others
/// dropped), so that it spans the whole walk in bounded memory and work.
const COMPRESS_MAX: u64 = 16_384;

/// A version to walk, with what decides its grains' cipher.
struct Version {
    id: u64,
    grains: u64,
    /// The keyring of its disk, and where a deep rekey of it stands.
    keyring: Option<u64>,
    cursor: Option<u64>,
    /// Its disk's id when the disk is thick: its grains stay where its
    /// reservation put them (§17.1), so they are never counted as
    /// shareable, not even with each other.
    thick: Option<u64>,
}

/// One distinct mapped grain of a region: its virtual grain, cipher class
/// (equal bytes of two classes say nothing) and pool grain; for a packed
/// entry (FORMAT.md §17.2b) the stream grain its fragment starts in, and
/// `flags` its packed flag and spill bit (0 for a raw grain).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Mapped {
    v: u64,
    class: u64,
    grain: u64,
    flags: u64,
}

impl Mapped {
    fn packed(&self) -> bool {
        self.flags != 0
    }

    /// What the leaf entries naming it hold, their key index left out
    /// ([`strata_format::leaf_target`]).
    fn target(&self) -> u64 {
        self.grain | self.flags
    }
}

impl Version {
    /// The cipher class of leaf entry `e` at `v`: 0 unencrypted, else the
    /// keyring, the entry's key index and the side of a deep rekey's
    /// cursor (§16.4), folded into one number; a thick disk's grains a
    /// class of their own.
    fn class(&self, v: u64, e: u64) -> u64 {
        if let Some(disk) = self.thick {
            return 1 << 63 | disk;
        }
        match self.keyring {
            None => 0,
            Some(k) => {
                let past = self.cursor.is_some_and(|c| v < c);
                (k + 1) << 9 | u64::from(leaf_key(e)) << 1 | u64::from(past)
            }
        }
    }
}

/// The figures as they add up.
struct Tally {
    est: DedupEstimate,
    hasher: ahash::RandomState,
    sample: HashMap<u64, u32>,
    sample_every: u64,
    /// The compression sample: each sampled quad of each layer, in the
    /// order walked, as packed.
    quads: Vec<SampledQuad>,
    /// Its grains; of the quads at [`COMPRESS_EVERY`], one in `thin`
    /// is kept (a power of two); its bound in grains.
    quad_grains: u64,
    thin: u64,
    compress_max: u64,
}

/// One quad of the compression sample: its layer and pick, its grains,
/// and for each codec (zstd, LZ4) the bytes of its grains left raw and
/// its fragments (virtual grain, span, compressed length), which is all
/// their layout in a stream depends on.
struct SampledQuad {
    layer: usize,
    pick: u64,
    grains: u64,
    raw: [u64; 2],
    frags: [Vec<(u64, u8, usize)>; 2],
}

impl Datastore {
    /// What re-sharing would free across `names` (every disk when empty):
    /// see [`DedupEstimate`]. Paced and cancellable as the other space
    /// work; `progress(done, total)` in bytes of the largest version.
    pub fn dedup_estimate(
        &self,
        names: &[String],
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DedupEstimate> {
        let (disks, versions) = versions_of(&self.inner.meta.lock(), names)?;
        let mut end = versions.iter().map(|v| v.grains).max().unwrap_or(0);
        let mut t = Tally {
            est: DedupEstimate {
                disks,
                versions: versions.len() as u64,
                ..DedupEstimate::default()
            },
            hasher: ahash::RandomState::new(),
            sample: HashMap::new(),
            sample_every: 1,
            quads: Vec::new(),
            quad_grains: 0,
            thin: 1,
            compress_max: COMPRESS_MAX,
        };
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref());
        let mut clients = self.inner.client_watch();
        let mut first = 0;
        while first < end {
            // The versions are taken again for each region: a snapshot
            // deleted, a disk reverted, extended or cloned meanwhile is
            // followed (the figures of each region are of its moment).
            let (read, now_end) = self.estimate_region(names, first, &mut t)?;
            t.est.read_bytes += read;
            end = now_end;
            first = (first + REGION).min(end);
            progress(first * GRAIN_BYTES, end * GRAIN_BYTES);
            pacer.pace(read, clients.busy())?;
        }
        Ok(t.finish())
    }

    /// One region's figures; returns the bytes read and the end of the
    /// largest version now.
    fn estimate_region(&self, names: &[String], first: u64, t: &mut Tally) -> Result<(u64, u64)> {
        let _gate = self.inner.gate.read();
        let (mapped, end) = {
            let mut m = self.inner.meta.lock();
            let (_, versions) = versions_of(&m, names)?;
            let end = versions.iter().map(|v| v.grains).max().unwrap_or(0);
            let r = region_entries(&mut m, &versions, first)?;
            t.est.logical_bytes += r.logical * GRAIN_BYTES;
            let packed = r.packed.len() as u64 * GRAIN_BYTES;
            t.est.stored_bytes += r.raw.len() as u64 * GRAIN_BYTES + packed;
            t.est.packed_bytes += packed;
            t.est.packed_stored_bytes += r.streams * GRAIN_BYTES;
            (comparable(r.raw, r.packed), end)
        };
        Ok((self.estimate_mapped(&mapped, t)?, end))
    }

    /// Read and count a region's distinct raw grains and the packed ones
    /// compared with them; returns the bytes read.
    fn estimate_mapped(&self, mapped: &[Mapped], t: &mut Tally) -> Result<u64> {
        let mut read = 0;
        let mut at = 0;
        let mut buf = Vec::new();
        while at < mapped.len() {
            let end = window_end(mapped, at);
            let window = &mapped[at..end];
            let slot = self.read_window(window, &mut buf)?;
            read += (window.len() as u64) * GRAIN_BYTES;
            t.window(window, &buf, &slot);
            at = end;
        }
        Ok(read)
    }

    /// Walk regions of virtual grains from 0 to `end`, the end of the
    /// largest named version, which each `step(first)` returns again
    /// with the bytes it read (disks made, reverted or extended meanwhile
    /// are followed): a checkpoint when one is due, a commit every
    /// [`COMMIT_EVERY_REGIONS`] and at the end, progress in bytes, paced
    /// as space work that rests while clients are busy. Returns the
    /// regions walked and the bytes read.
    fn over_regions(
        &self,
        mut end: u64,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
        step: &mut dyn FnMut(u64) -> Result<(u64, u64)>,
    ) -> Result<(u64, u64)> {
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref())
            .resting(crate::work::DEDUP_BUSY_REST);
        let mut clients = self.inner.client_watch();
        let (mut regions, mut read_bytes) = (0u64, 0u64);
        let mut first = 0;
        while first < end {
            self.inner.maybe_checkpoint()?;
            let (read, now_end) = step(first)?;
            regions += 1;
            read_bytes += read;
            if regions.is_multiple_of(COMMIT_EVERY_REGIONS) {
                self.inner.commit(false)?;
            }
            end = now_end;
            first = (first + REGION).min(end);
            progress(first * GRAIN_BYTES, end * GRAIN_BYTES);
            pacer.pace(read, clients.busy())?;
        }
        self.inner.commit(false)?;
        Ok((regions, read_bytes))
    }

    /// The bytes of `window`'s grains into `buf`: raw grains in pool
    /// order, adjacent ones read as one; then packed ones decompressed
    /// (FORMAT.md §18.4), by stream grain, so that the grains of a pair or
    /// quad decompress once. Returns where each grain of `window` is (its
    /// index in `buf`, in grains).
    fn read_window(&self, window: &[Mapped], buf: &mut Vec<u8>) -> Result<Vec<usize>> {
        let g = GRAIN_BYTES as usize;
        buf.resize(window.len() * g, 0);
        let mut order: Vec<usize> = (0..window.len()).collect();
        order.sort_unstable_by_key(|&i| (window[i].packed(), window[i].grain, window[i].v));
        let raw = order.iter().take_while(|&&i| !window[i].packed()).count();
        let mut i = 0;
        while i < raw {
            let mut j = i + 1;
            while j < raw && window[order[j]].grain == window[order[j - 1]].grain + 1 {
                j += 1;
            }
            self.inner
                .pool
                .read_at(&mut buf[i * g..j * g], window[order[i]].grain * GRAIN_BYTES)?;
            i = j;
        }
        let mut memo = crate::compress::Unpacked::default();
        for (at, &i) in order.iter().enumerate().skip(raw) {
            let Mapped { v, grain, .. } = window[i];
            if memo.bytes(grain, v).is_none() {
                memo = self.inner.unpack(grain, v)?;
            }
            let bytes = memo.bytes(grain, v).expect("just unpacked");
            buf[at * g..(at + 1) * g].copy_from_slice(bytes);
        }
        let mut slot = vec![0; window.len()];
        for (at, &i) in order.iter().enumerate() {
            slot[i] = at;
        }
        Ok(slot)
    }
}

/// Where the window of `mapped` that starts at `at` ends. A window ends
/// where a virtual grain ends (its grains are compared together): after
/// at most WINDOW grains, unless one virtual grain alone has more.
fn window_end(mapped: &[Mapped], at: usize) -> usize {
    let mut end = (at + WINDOW).min(mapped.len());
    if end < mapped.len() {
        let cut = end;
        while end > at && mapped[end].v == mapped[end - 1].v {
            end -= 1;
        }
        if end == at {
            end = cut;
            while end < mapped.len() && mapped[end].v == mapped[end - 1].v {
                end += 1;
            }
        }
    }
    end
}

/// The names of `names`' disks (every disk when empty) and their
/// versions: heads, then every snapshot.
fn versions_of(m: &Meta, names: &[String]) -> Result<(Vec<String>, Vec<Version>)> {
    let disks: Vec<&crate::catalog::DiskRec> = if names.is_empty() {
        m.catalog.disks.iter().collect()
    } else {
        let mut out = Vec::new();
        for n in names {
            if n.contains('@') {
                return err(
                    ErrorKind::InvalidArgument,
                    format!(
                        "'{n}' is a snapshot: name its disk, whose snapshots are counted with it"
                    ),
                );
            }
            let d = m.catalog.disk(n)?;
            if !out.iter().any(|o: &&crate::catalog::DiskRec| o.id == d.id) {
                out.push(d);
            }
        }
        out
    };
    let version = |d: &crate::catalog::DiskRec, id: u64, size: u64| Version {
        id,
        grains: size.div_ceil(GRAIN_BYTES),
        keyring: d.keyring,
        thick: d.provisioning.is_thick().then_some(d.id),
        cursor: d
            .keyring
            .and_then(|k| m.catalog.keyring(k))
            .and_then(|k| k.deep_rekey.map(|r| r.next_grain)),
    };
    let mut versions: Vec<Version> = disks
        .iter()
        .map(|d| version(d, d.head, d.size_bytes))
        .collect();
    for s in &m.catalog.snapshots {
        if let Some(d) = disks.iter().find(|d| d.id == s.disk) {
            versions.push(version(d, s.version, s.size_bytes));
        }
    }
    Ok((disks.iter().map(|d| d.name.clone()).collect(), versions))
}

/// The (virtual grain, grain) pairs that the versions of every disk for
/// which `fixed` holds map in `[first, first + REGION)`, sorted: grains a
/// pass must leave where they are, whoever else names them.
fn fixed_in_region(
    m: &mut Meta,
    first: u64,
    fixed: impl Fn(&Version) -> bool,
) -> Result<Vec<(u64, u64)>> {
    let (_, all) = versions_of(m, &[])?;
    let all: Vec<Version> = all.into_iter().filter(|v| fixed(v)).collect();
    let mut out: Vec<(u64, u64)> = region_entries(m, &all, first)?
        .raw
        .iter()
        .map(|e| (e.v, e.grain))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// A region's raw grains, and of its packed ones those at a (virtual
/// grain, class) where another grain is mapped (raw or packed: the others
/// have nothing to be compared with), sorted.
fn comparable(raw: Vec<Mapped>, packed: Vec<Mapped>) -> Vec<Mapped> {
    if packed.is_empty() {
        return raw;
    }
    let mut all = raw;
    all.extend(packed);
    all.sort_unstable();
    let keep: Vec<bool> = (0..all.len())
        .map(|i| !all[i].packed() || !alone(&all, i))
        .collect();
    all.into_iter()
        .zip(keep)
        .filter_map(|(m, k)| k.then_some(m))
        .collect()
}

/// Whether `list[i]` (a list sorted by virtual grain and class) is the
/// only one of its (virtual grain, class): nothing to compare it with.
fn alone(list: &[Mapped], i: usize) -> bool {
    let key = |m: &Mapped| (m.v, m.class);
    (i == 0 || key(&list[i - 1]) != key(&list[i]))
        && list.get(i + 1).is_none_or(|n| key(n) != key(&list[i]))
}

/// What [`region_entries`] finds in a region.
struct Region {
    /// Its distinct raw grains, sorted by virtual grain.
    raw: Vec<Mapped>,
    /// Entries naming a grain, raw or packed (the logical grains).
    logical: u64,
    /// Its distinct packed grains (the fragment of a virtual grain in the
    /// stream grain it starts in), sorted by virtual grain, and the
    /// number of distinct stream grains they lie in (a spilling
    /// fragment's next grain too). A stream holds one region's fragments
    /// (FORMAT.md §18.8), so distinct per region is distinct.
    packed: Vec<Mapped>,
    streams: u64,
    /// Those stream grains, sorted: where the packed entries' fragments
    /// start, and where spilling ones end (a grain may hold nothing live
    /// but a carry).
    stream_grains: Vec<u64>,
}

/// The entries of `[first, first + REGION)` over `versions`.
fn region_entries(m: &mut Meta, versions: &[Version], first: u64) -> Result<Region> {
    let mut logical = 0;
    // The distinct entries of each virtual grain, raw and packed: a few
    // at most, however many versions (a disk's snapshots share its
    // grains), so looked up where they are rather than all sorted once
    // (with hundreds of snapshots that sort was most of a pass).
    let mut seen: Vec<Vec<Mapped>> = vec![Vec::new(); REGION as usize];
    let mut streams = Vec::new();
    let mut entries = Vec::new();
    for ver in versions {
        let end = (first + REGION).min(ver.grains);
        if end <= first {
            continue;
        }
        m.lookup_entries(ver.id, first, end - first, &mut entries)?;
        for (i, &e) in entries.iter().enumerate() {
            if e == 0 {
                continue;
            }
            let v = first + i as u64;
            logical += 1;
            let grain = leaf_grain(e);
            let m = Mapped {
                v,
                class: ver.class(v, e),
                grain,
                flags: strata_format::leaf_target(e) & !grain,
            };
            if seen[i].contains(&m) {
                continue;
            }
            seen[i].push(m);
            if m.packed() {
                streams.push(grain);
                if strata_format::leaf_spills(e) {
                    streams.push(grain + 1);
                }
            }
        }
    }
    let (mut raw, mut packed) = (Vec::new(), Vec::new());
    for mut at in seen {
        at.sort_unstable();
        for m in at {
            if m.packed() {
                packed.push(m);
            } else {
                raw.push(m);
            }
        }
    }
    streams.sort_unstable();
    streams.dedup();
    Ok(Region {
        raw,
        logical,
        packed,
        streams: streams.len() as u64,
        stream_grains: streams,
    })
}

impl Tally {
    /// Count one window's grains, grain `i` of it at `slot[i]` of `bytes`.
    fn window(&mut self, window: &[Mapped], bytes: &[u8], slot: &[usize]) {
        let g = GRAIN_BYTES as usize;
        let grain = |i: usize| &bytes[slot[i] * g..(slot[i] + 1) * g];
        let hashes: Vec<u64> = (0..window.len())
            .map(|i| self.hasher.hash_one((window[i].class, grain(i))))
            .collect();
        // Packed grains are here to be compared only (they are counted
        // from the maps, and packed already).
        for (i, m) in window.iter().enumerate().filter(|(_, m)| !m.packed()) {
            self.one(m.class, grain(i), hashes[i]);
        }
        // The compression sample: the unencrypted grains of the aligned
        // quads of virtual grains it takes, by layer, each quad packed as
        // the pass would pack it.
        let sampled = pack::by_layer(
            (0..window.len())
                .filter(|&i| {
                    window[i].class == 0 && !window[i].packed() && self.sampled(window[i].v)
                })
                .map(|i| (window[i].v, window[i].grain, grain(i))),
        );
        for (k, layer) in sampled.iter().enumerate() {
            for quad in layer.chunk_by(|a, b| a.0 / 4 == b.0 / 4) {
                self.pack_sample(k, quad);
            }
        }
        // Same-offset: within each (virtual grain, class), the sets of
        // equal grains, as the pass merges them.
        let mut at = 0;
        while at < window.len() {
            let mut end = at + 1;
            while end < window.len()
                && window[end].v == window[at].v
                && window[end].class == window[at].class
            {
                end += 1;
            }
            if end - at > 1 && window[at].class >> 63 == 0 {
                // Each grain's set, named by its first member.
                let first: Vec<usize> = (at..end)
                    .map(|i| {
                        (at..i)
                            .find(|&j| hashes[j] == hashes[i] && grain(j) == grain(i))
                            .unwrap_or(i)
                    })
                    .collect();
                for set in (at..end).filter(|&i| first[i - at] == i) {
                    let members = (at..end).filter(|&i| first[i - at] == set);
                    let (packed, raw): (Vec<usize>, Vec<usize>) =
                        members.partition(|&i| window[i].packed());
                    let (freed, moved) = set_merges(raw.len(), packed.len());
                    self.est.same_offset_bytes += freed * GRAIN_BYTES;
                    self.est.same_offset_packed_bytes += moved * GRAIN_BYTES;
                }
            }
            at = end;
        }
    }

    /// Count one distinct grain: zeros, the key, the samples.
    fn one(&mut self, class: u64, bytes: &[u8], hash: u64) {
        if class >> 63 == 1 {
            // A thick disk's grain: counted in stored bytes only.
            return;
        }
        if class != 0 {
            self.est.encrypted_bytes += GRAIN_BYTES;
        } else if crate::disk::is_zero(bytes) {
            self.est.zero_bytes += GRAIN_BYTES;
        }
        if hash.is_multiple_of(self.sample_every) {
            *self.sample.entry(hash).or_insert(0) += 1;
            if self.sample.len() > SAMPLE_MAX {
                self.sample_every *= 2;
                let every = self.sample_every;
                self.sample.retain(|h, _| h.is_multiple_of(every));
            }
        }
    }

    /// Whether the compression sample takes the quad of virtual grain
    /// `v`: one in [`COMPRESS_EVERY`], and of those one in `thin` by
    /// their [`pick`](Self::pick).
    fn sampled(&self, v: u64) -> bool {
        (v / 4).is_multiple_of(COMPRESS_EVERY) && self.pick(v).is_multiple_of(self.thin)
    }

    /// The pick of the quad holding virtual grain `v`, keyed per run as
    /// the hash sample is: the quads kept once the sample thins are not
    /// every n-th, which a file system's regular layout could line up
    /// with (ext4 starts a block group, its bitmaps and inode table every
    /// 128 MiB).
    fn pick(&self, v: u64) -> u64 {
        self.hasher.hash_one(v / 4)
    }

    /// Pack one sampled quad's grains of layer `k` with each codec, as
    /// `strata compress` would (FORMAT.md §18.9: zeros and grains that
    /// save no eighth stay raw; with zstd a quad or pair together where
    /// that pays), and keep what their layout needs; past the sample's
    /// bound, halve its rate.
    fn pack_sample(&mut self, k: usize, quad: &[pack::Member<'_>]) {
        let mut q = SampledQuad {
            layer: k,
            pick: self.pick(quad[0].0),
            grains: quad.len() as u64,
            raw: [0; 2],
            frags: [Vec::new(), Vec::new()],
        };
        for (c, codec) in [Codec::Zstd, Codec::Lz4].into_iter().enumerate() {
            let mut frags = Vec::new();
            q.raw[c] = pack::compress_layer(quad, codec, &mut frags);
            q.frags[c] = frags.iter().map(|f| (f.v, f.span, f.len)).collect();
        }
        self.quad_grains += q.grains;
        self.quads.push(q);
        while self.quad_grains > self.compress_max {
            self.thin *= 2;
            let thin = self.thin;
            self.quads.retain(|q| q.pick.is_multiple_of(thin));
            self.quad_grains = self.quads.iter().map(|q| q.grains).sum();
        }
    }

    /// The compression sample's figures: each codec's raw grains, and
    /// each layer's fragments laid out as streams (§18.8) a region's
    /// worth at a time, as the pass lays out a region's, counted in
    /// stream grains.
    fn count_sample(&mut self) {
        let est = &mut self.est;
        est.compress_sampled_grains = self.quad_grains;
        est.compress_sample_every = COMPRESS_EVERY * self.thin;
        let layers = self.quads.iter().map(|q| q.layer + 1).max().unwrap_or(0);
        for c in 0..2 {
            let mut after: u64 = self.quads.iter().map(|q| q.raw[c]).sum();
            for k in 0..layers {
                let mut pending: Vec<(u64, u8, usize)> = Vec::new();
                let mut span = 0u64;
                for q in self.quads.iter().filter(|q| q.layer == k) {
                    pending.extend_from_slice(&q.frags[c]);
                    span += q.frags[c].iter().map(|f| u64::from(f.1)).sum::<u64>();
                    if span >= REGION {
                        after += stream_bytes(&pending, c);
                        pending.clear();
                        span = 0;
                    }
                }
                after += stream_bytes(&pending, c);
            }
            match c {
                0 => est.compress_sampled_bytes_after = after,
                _ => est.lz4_sampled_bytes_after = after,
            }
        }
        est.packable_grains = self
            .quads
            .iter()
            .flat_map(|q| &q.frags[0])
            .map(|f| u64::from(f.1))
            .sum();
    }

    fn finish(mut self) -> DedupEstimate {
        self.count_sample();
        let taken: u64 = self.sample.values().map(|&n| u64::from(n)).sum();
        let repeats = taken - self.sample.len() as u64;
        self.est.any_offset_bytes = (repeats * self.sample_every * GRAIN_BYTES)
            .max(self.est.same_offset_bytes)
            .min(self.est.stored_bytes);
        self.est.sample_grains = taken;
        self.est.sample_every = self.sample_every;
        self.est.shared_bytes = self.est.logical_bytes - self.est.stored_bytes;
        self.est
    }
}

/// What the pass does with a set of equal grains at one virtual grain,
/// `raw` of them raw and `packed` packed (FORMAT.md §17.2b): the raw
/// grains it frees and the packed ones it points elsewhere. The winner is
/// packed when one is.
fn set_merges(raw: usize, packed: usize) -> (u64, u64) {
    if packed == 0 {
        (raw.saturating_sub(1) as u64, 0)
    } else {
        (raw as u64, packed as u64 - 1)
    }
}

/// The bytes of a stream laid out from fragments `frags` (virtual grain,
/// span, compressed length) of codec `c` (0 zstd, 1 LZ4): its grains, as
/// [`encode_stream`] lays them out (their bytes do not move the layout).
fn stream_bytes(frags: &[(u64, u8, usize)], c: usize) -> u64 {
    static ZEROS: [u8; strata_format::packed::PAIR_BYTES_MAX] =
        [0; strata_format::packed::PAIR_BYTES_MAX];
    if frags.is_empty() {
        return 0;
    }
    let codec = [Codec::Zstd, Codec::Lz4][c];
    let pieces: Vec<strata_format::packed::Piece<'_>> = frags
        .iter()
        .map(|&(v, span, len)| strata_format::packed::Piece {
            v,
            span,
            codec,
            len,
            stored: &ZEROS[..len.min(ZEROS.len())],
        })
        .collect();
    // The pass's own fragments always lay out; should one not, their
    // bytes with their directory entries are the figure.
    encode_stream(&pieces).map_or_else(
        |_| frags.iter().map(|f| room(f.2) as u64).sum(),
        |s| s.len() as u64 * GRAIN_BYTES,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grain of text (packs) or, when `noise`, of bytes that do not.
    fn grain(v: u64, noise: bool) -> Vec<u8> {
        let mut x = v.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut out = Vec::with_capacity(GRAIN_BYTES as usize + 32);
        while out.len() < GRAIN_BYTES as usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if noise {
                out.extend_from_slice(&x.to_le_bytes());
            } else {
                out.extend_from_slice(format!("line {} of grain {v}; ", x % 1000).as_bytes());
            }
        }
        out.truncate(GRAIN_BYTES as usize);
        out
    }

    #[test]
    fn the_compression_sample_spans_the_whole_walk_in_its_bound() {
        // 128 regions, the first half noise and the second text; the
        // sample at its first rate would take 512 grains, past a bound of
        // 64. It used to stop at the bound (the first 16 regions: noise
        // only, 1.0x); it must keep quads from both halves, within it.
        let mut t = Tally {
            est: DedupEstimate::default(),
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
            sample: HashMap::new(),
            sample_every: 1,
            quads: Vec::new(),
            quad_grains: 0,
            thin: 1,
            compress_max: 64,
        };
        let regions = 128u64;
        for r in 0..regions {
            let window: Vec<Mapped> = (r * REGION..(r + 1) * REGION)
                .map(|v| Mapped {
                    v,
                    class: 0,
                    grain: v,
                    flags: 0,
                })
                .collect();
            let bytes: Vec<u8> = window
                .iter()
                .flat_map(|m| grain(m.v, r < regions / 2))
                .collect();
            let slot: Vec<usize> = (0..window.len()).collect();
            t.window(&window, &bytes, &slot);
        }
        let half = regions / 2 * REGION;
        assert!(
            t.quads.iter().any(|q| q.frags[1].is_empty()),
            "no noise quad kept"
        );
        assert!(
            t.quads
                .iter()
                .any(|q| q.frags[1].iter().any(|f| f.0 >= half)),
            "no text quad kept"
        );
        let e = t.finish();
        assert!(e.compress_sampled_grains <= 64, "{e:#?}");
        assert!(e.compress_sampled_grains >= 16, "{e:#?}");
        assert!(e.compress_sample_every >= 4 * COMPRESS_EVERY, "{e:#?}");
        let lz4 =
            (e.compress_sampled_grains * GRAIN_BYTES) as f64 / e.lz4_sampled_bytes_after as f64;
        assert!(lz4 > 1.1, "the text half counts: {lz4:.2}x\n{e:#?}");
    }
}
