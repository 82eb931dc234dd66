//! Space, garbage collection and checking of an object-store datastore
//! (docs/FORMAT.md §11.7): there are no reference counts, so everything
//! is found by marking from the live roots: every disk's newest manifest
//! (its root and its snapshots' roots) and every hold.
//!
//! `gc` claims a run (`gc/SEQ16`, create-only), marks, and deletes a
//! segment only if nothing marked lies in it and it cannot be an upload in
//! flight (its generation is fenced, or its counter is below the newest
//! manifest's `next_ctr`); before deleting it checks that no newer run
//! claimed, so a paused GC deletes nothing. `check` walks the same roots
//! and reads every node and grain they reach against the CRCs the map
//! holds.

use std::collections::{BTreeMap, HashMap, HashSet};

use strata_api::store::{CheckReport, DiskSpace, GcReport};
use strata_s3::{Bytes, Put};

use crate::disk::Hold;
use crate::layout::{manifest_of_key, Entry, Manifest, MapNode, SegId, Tail, GRAIN, NODE_BYTES};
use crate::{now_ms, Error, ErrorKind, ObjectStoreDatastore, Result, DIR_DISKS};

const DIR_GC: &str = "gc/";

/// Where each reached grain or node is, and which roots reached it.
#[derive(Default)]
struct Marks {
    /// (segment, is a node, slot, stored bytes of a placed grain) → the
    /// owner that reached it, or None if
    /// more than one did.
    reached: HashMap<(SegId, bool, u32, u16), Option<u32>>,
}

impl Marks {
    fn note(&mut self, e: &Entry, node: bool, owner: u32) -> bool {
        let at = (e.seg, node, e.slot, e.stored);
        match self.reached.get_mut(&at) {
            None => {
                self.reached.insert(at, Some(owner));
                true
            }
            // Reached by this owner already, or shared (and so is
            // everything under it).
            Some(o) if *o == Some(owner) || o.is_none() => false,
            Some(o) => {
                // First reached by another owner: walk it again to mark
                // everything under it shared.
                *o = None;
                true
            }
        }
    }

    fn segments(&self) -> HashSet<SegId> {
        self.reached.keys().map(|k| k.0).collect()
    }

    /// The bytes what was reached takes: in all (and what that would be
    /// uncompressed), in each object, and reached by one owner alone
    /// (what removing it would free).
    fn bytes(&self) -> ((u64, u64), HashMap<SegId, u64>, HashMap<u32, u64>) {
        let (mut live_bytes, mut plain) = (0, 0);
        let mut live_in: HashMap<SegId, u64> = HashMap::new();
        let mut exclusive: HashMap<u32, u64> = HashMap::new();
        for ((seg, node, _, stored), owner) in &self.reached {
            let bytes = bytes_of(*node, *stored);
            live_bytes += bytes;
            plain += if *node { bytes } else { GRAIN as u64 };
            *live_in.entry(*seg).or_default() += bytes;
            if let Some(o) = owner {
                *exclusive.entry(*o).or_default() += bytes;
            }
        }
        ((live_bytes, plain), live_in, exclusive)
    }
}

/// Bytes a node, or a grain stored in `stored` bytes (0: a 4 KiB slot),
/// takes in its segment (§18.6: a placed grain is padded to 16).
fn bytes_of(node: bool, stored: u16) -> u64 {
    if node {
        NODE_BYTES as u64
    } else {
        crate::layout::kept_bytes(stored)
    }
}

/// What a walk shows each node (`Some(level)`) and grain (`None`, with
/// its virtual grain) it reaches.
type Visit<'a> = dyn FnMut(&Entry, Option<u8>, u64) -> Result<()> + 'a;

/// A tree `check` walks: what it is, root, levels, owner, and the tail
/// that shadows its map (the head's).
type Tree<'a> = (String, Reach<'a>);

/// A map walked for an owner: its root and depth, the disk it is walked
/// for, and the tail that shadows it (the head's, §11.4a).
#[derive(Clone, Copy)]
struct Reach<'a> {
    root: Option<Entry>,
    levels: u8,
    owner: u32,
    shadow: Option<&'a Tail>,
}

impl<'a> Reach<'a> {
    fn new(root: Option<Entry>, levels: u8, owner: u32, shadow: Option<&'a Tail>) -> Self {
        Reach {
            root,
            levels,
            owner,
            shadow,
        }
    }
}

/// The live roots of the store at one moment.
struct Roots {
    /// (name or `None` for a nameless id, newest manifest) per disk id.
    disks: BTreeMap<u32, (Option<String>, Manifest)>,
    holds: Vec<Hold>,
}

/// What a run's listing of `disks/` found beside the live segments.
#[derive(Default)]
struct Listing {
    /// Segments nothing marked lies in that no writer may still name.
    doomed: Vec<String>,
    /// Every manifest, (key, sequence, size), by disk id.
    manifests: BTreeMap<u32, Vec<(String, u64, u64)>>,
    /// Claim markers, (disk id, sequence).
    markers: HashSet<(u32, u64)>,
    /// Hot sets, (sequence, key, size), by disk id.
    hot: BTreeMap<u32, Vec<(u64, String, u64)>>,
}

/// The keys a run deletes, in the order it deletes them.
struct Doomed {
    segments: Vec<String>,
    manifests: Vec<String>,
    hot: Vec<String>,
}

/// How live an object holding reached data is (`size` from the listing;
/// a manifest's includes its tail and body), into `rep`'s histogram and
/// sparse-object counts.
fn note_share(rep: &mut GcReport, live_in: &HashMap<SegId, u64>, seg: &SegId, size: u64) {
    let Some(&live) = live_in.get(seg) else {
        return;
    };
    let size = size.max(live);
    rep.live_share[((live * 10 / size) as usize).min(9)] += 1;
    if live * 2 < size {
        rep.sparse_objects += 1;
        rep.sparse_dead_bytes += size - live;
    }
}

/// Hot sets that may go (§11.5b): all but a disk's newest (the one
/// read), and all of a disk that is gone.
fn doomed_hot(
    roots: &Roots,
    hot: BTreeMap<u32, Vec<(u64, String, u64)>>,
    rep: &mut GcReport,
) -> Vec<String> {
    let mut doomed = Vec::new();
    for (id, mut sets) in hot {
        sets.sort();
        let keep = usize::from(roots.disks.contains_key(&id));
        for (_, key, size) in sets.into_iter().rev().skip(keep) {
            rep.garbage_bytes += size;
            doomed.push(key);
        }
    }
    doomed
}

impl ObjectStoreDatastore {
    /// Whether manifest `key` (`size` bytes) is a proven orphan (§11.4b);
    /// one that cannot be read is not (it is kept).
    fn orphan(&self, key: &str, size: u64) -> bool {
        crate::disk::read_manifest(&self.store, key, size)
            .and_then(|m| crate::disk::is_orphan(&self.store, &m))
            .unwrap_or(false)
    }

    /// Every disk id with manifests (named or not), its newest manifest,
    /// then every hold (read after the manifests: §11.6a).
    fn roots(&self) -> Result<Roots> {
        // Named disks (with their newest manifests), then ids without a
        // name: each manifest read once.
        let mut disks: BTreeMap<u32, (Option<String>, Manifest)> = self
            .disks()?
            .into_iter()
            .map(|(name, m)| (m.disk, (Some(name), m)))
            .collect();
        let ids: std::collections::BTreeSet<u32> = self
            .store
            .list(DIR_DISKS, None)?
            .iter()
            .filter_map(|l| disk_of_key(&l.key))
            .collect();
        for id in ids {
            if disks.contains_key(&id) {
                continue;
            }
            match self.newest_manifest(id) {
                Ok(m) => {
                    disks.insert(id, (None, m));
                }
                // Segments without a manifest: a disk whose manifests GC
                // removed, or never finished; nothing is live there.
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let holds = self.holds()?;
        Ok(Roots { disks, holds })
    }

    /// Walk the tree at `root` (`levels` levels), noting what it reaches
    /// for `owner`; `visit` sees every node and grain entry reached. A
    /// grain `shadow` (the head's tail) holds is not reached through the
    /// map: the tail wins, so that map entry is never read (§11.4a).
    fn walk(&self, r: Reach, marks: &mut Marks, visit: &mut Visit) -> Result<()> {
        let Reach {
            root,
            levels,
            owner,
            shadow,
        } = r;
        let Some(root) = root else { return Ok(()) };
        let mut stack: Vec<(Entry, u8, u64)> = vec![(root, levels - 1, 0)];
        while let Some((e, level, first)) = stack.pop() {
            if !marks.note(&e, true, owner) {
                continue;
            }
            visit(&e, Some(level), first)?;
            let node: std::sync::Arc<MapNode> = self.cache.node(&self.store, &e, level, first)?;
            let span = MapNode::span_of_entry(level);
            for (i, c) in node.entries.iter().enumerate() {
                let Some(c) = c else { continue };
                if level == 0 {
                    let vg = first + i as u64;
                    if shadow.is_some_and(|t| t.contains_key(&vg)) {
                        continue;
                    }
                    if marks.note(c, false, owner) {
                        visit(c, None, vg)?;
                    }
                } else {
                    stack.push((*c, level - 1, first + i as u64 * span));
                }
            }
        }
        Ok(())
    }

    /// Walk the tree at `root` once: `visit` sees each node and each grain
    /// `shadow` does not hold.
    pub(crate) fn walk_map(
        &self,
        root: Option<Entry>,
        levels: u8,
        shadow: Option<&Tail>,
        visit: &mut Visit,
    ) -> Result<()> {
        self.walk(
            Reach::new(root, levels, 0, shadow),
            &mut Marks::default(),
            visit,
        )
    }

    /// Walk everything disk `m` (id `id`) reaches: its map, its
    /// snapshots' maps and its tail's grains (§11.4a).
    fn walk_disk(&self, m: &Manifest, id: u32, marks: &mut Marks, visit: &mut Visit) -> Result<()> {
        self.walk(
            Reach::new(m.root, m.levels, id, Some(&m.tail)),
            marks,
            visit,
        )?;
        for s in &m.snapshots {
            self.walk(Reach::new(s.root, s.levels, id, None), marks, visit)?;
        }
        for (vg, e) in m.tail.iter() {
            if let Some(e) = e {
                if marks.note(e, false, id) {
                    visit(e, None, *vg)?;
                }
            }
        }
        Ok(())
    }

    fn mark(&self, roots: &Roots, marks: &mut Marks) -> Result<()> {
        for (id, (_, m)) in &roots.disks {
            if m.removed {
                continue;
            }
            self.walk_disk(m, *id, marks, &mut |_, _, _| Ok(()))?;
        }
        for h in &roots.holds {
            // A hold keeps its snapshot for the clone.
            self.walk(
                Reach::new(h.root, h.levels, h.clone, None),
                marks,
                &mut |_, _, _| Ok(()),
            )?;
        }
        Ok(())
    }

    /// Mark from every live root and (unless `dry_run`) delete what
    /// nothing reaches and no writer may still name.
    pub fn gc(&self, dry_run: bool) -> Result<GcReport> {
        let t = std::time::Instant::now();
        let claim = if dry_run {
            None
        } else {
            Some(self.claim_gc()?)
        };
        let roots = self.roots()?;
        let mut marks = Marks::default();
        self.mark(&roots, &mut marks)?;
        let live = marks.segments();
        let ((live_bytes, live_plain_bytes), live_in, exclusive) = marks.bytes();
        let mut rep = GcReport {
            dry_run,
            claim: claim.clone(),
            stored_bytes: 0,
            segments: 0,
            live_bytes,
            live_plain_bytes,
            garbage_segments: 0,
            garbage_bytes: 0,
            in_flight_segments: 0,
            deleted_segments: 0,
            deleted_manifests: 0,
            disks: self.disk_space(&roots, &exclusive)?,
            holds: roots.holds.len() as u64,
            ms: 0,
            live_share: vec![0; 10],
            sparse_objects: 0,
            sparse_dead_bytes: 0,
        };
        let listing = self.list_objects(&roots, (&live, &live_in), &mut rep)?;
        let doomed = Doomed {
            manifests: self.doomed_manifests(&roots, &live, &listing, &mut rep),
            hot: doomed_hot(&roots, listing.hot, &mut rep),
            segments: listing.doomed,
        };
        if let Some(claim) = &claim {
            self.delete_doomed(claim, &doomed, &mut rep)?;
        }
        rep.ms = t.elapsed().as_millis() as u64;
        Ok(rep)
    }

    /// Each named disk's space: the bytes its roots reach, and those no
    /// other root reaches (`exclusive`, by disk id); by name.
    fn disk_space(&self, roots: &Roots, exclusive: &HashMap<u32, u64>) -> Result<Vec<DiskSpace>> {
        let mut disks = Vec::new();
        for (id, (name, m)) in &roots.disks {
            if let Some(name) = name {
                let mut refd = Marks::default();
                let mut referenced = 0u64;
                let mut count = |e: &Entry, level: Option<u8>, _: u64| {
                    referenced += bytes_of(level.is_some(), e.stored);
                    Ok(())
                };
                self.walk_disk(m, *id, &mut refd, &mut count)?;
                disks.push(DiskSpace {
                    name: name.clone(),
                    id: format!("{id:08x}"),
                    exclusive_bytes: exclusive.get(id).copied().unwrap_or(0),
                    referenced_bytes: referenced,
                });
            }
        }
        disks.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(disks)
    }

    /// The objects under `disks/`, counted into `rep` (stored bytes,
    /// segments, how live each object is; segments nothing marked lies in,
    /// which may go or are uploads in flight), and sorted for the sweep.
    fn list_objects(
        &self,
        roots: &Roots,
        (live, live_in): (&HashSet<SegId>, &HashMap<SegId, u64>),
        rep: &mut GcReport,
    ) -> Result<Listing> {
        let mut out = Listing::default();
        for l in self.store.list(DIR_DISKS, None)? {
            if let Some(seg) = SegId::from_key(&l.key) {
                rep.segments += 1;
                rep.stored_bytes += l.size;
                note_share(rep, live_in, &seg, l.size);
                if live.contains(&seg) {
                    continue;
                }
                let may_go = match roots.disks.get(&seg.disk) {
                    Some((_, m)) => {
                        seg.gen < m.generation || (seg.gen == m.generation && seg.ctr < m.next_ctr)
                    }
                    None => true,
                };
                if may_go {
                    rep.garbage_segments += 1;
                    rep.garbage_bytes += l.size;
                    out.doomed.push(l.key);
                } else {
                    rep.in_flight_segments += 1;
                }
            } else if let Some((id, seq)) = manifest_of_key(&l.key) {
                // Manifests hold payloads (§11.4a): stored data too.
                rep.stored_bytes += l.size;
                note_share(rep, live_in, &SegId::payload(id, seq), l.size);
                out.manifests
                    .entry(id)
                    .or_default()
                    .push((l.key, seq, l.size));
            } else if let Some((id, seq)) = crate::hot::hot_of_key(&l.key) {
                rep.stored_bytes += l.size;
                out.hot.entry(id).or_default().push((seq, l.key, l.size));
            } else if let Some(id) = disk_of_key(&l.key) {
                if let Some(seq) = crate::disk::claim_marker_of_key(&l.key) {
                    out.markers.insert((id, seq));
                }
            }
        }
        Ok(out)
    }

    /// Manifests that may go: older than the one marked from (a newer
    /// one was committed during the mark: its payload is live), not the
    /// first (it keeps the id taken), not a claim (it fences stale
    /// writers only while it exists, §11.5), not the predecessor a
    /// pipelined newest is checked against, no payload grain reached.
    /// And proven orphans (§11.4b), wherever they are: an orphan sits
    /// one key above a claim (the manifest that took its predecessor's
    /// key), so only manifests right above a claim marker are read.
    fn doomed_manifests(
        &self,
        roots: &Roots,
        live: &HashSet<SegId>,
        listing: &Listing,
        rep: &mut GcReport,
    ) -> Vec<String> {
        let mut doomed = Vec::new();
        for (id, keys) in &listing.manifests {
            let Some((_, m)) = roots.disks.get(id) else {
                continue;
            };
            let checked = m.pipelined_on().map(|p| p.seq);
            for (key, seq, size) in keys {
                let (seq, size) = (*seq, *size);
                let suspect = seq != m.seq && listing.markers.contains(&(*id, seq - 1));
                if suspect && self.orphan(key, size) {
                    rep.garbage_bytes += size;
                    doomed.push(key.clone());
                    continue;
                }
                if seq >= m.seq
                    || seq == 1
                    || listing.markers.contains(&(*id, seq))
                    || Some(seq) == checked
                    || live.contains(&SegId::payload(*id, seq))
                {
                    continue;
                }
                rep.garbage_bytes += size;
                doomed.push(key.clone());
            }
        }
        doomed
    }

    /// Delete what a run under `claim` found doomed, unless a newer run
    /// claimed while this one marked (it knows better: this one deletes
    /// nothing); then older claims, which are history.
    fn delete_doomed(&self, claim: &str, doomed: &Doomed, rep: &mut GcReport) -> Result<()> {
        if !self.store.list(DIR_GC, Some(claim))?.is_empty() {
            return Err(Error::new(
                ErrorKind::Fenced,
                format!("a newer garbage collection run claimed after {claim}: this one deletes nothing"),
            ));
        }
        for key in &doomed.segments {
            self.store.delete(key)?;
            rep.deleted_segments += 1;
        }
        for key in &doomed.manifests {
            self.store.delete(key)?;
            rep.deleted_manifests += 1;
        }
        for key in &doomed.hot {
            self.store.delete(key)?;
        }
        let claims = self.store.list(DIR_GC, None)?;
        for l in claims.iter().filter(|l| l.key.as_str() < claim) {
            let _ = self.store.delete(&l.key);
        }
        Ok(())
    }

    /// `gc/SEQ16` at the next sequence, create-only.
    fn claim_gc(&self) -> Result<String> {
        let last = self
            .store
            .list(DIR_GC, None)?
            .into_iter()
            .filter_map(|l| u64::from_str_radix(l.key.strip_prefix(DIR_GC)?, 16).ok())
            .max()
            .unwrap_or(0);
        let key = format!("{DIR_GC}{:016x}", last + 1);
        let body = serde_json::json!({
            "host": self.cfg.me.host, "name": self.cfg.me.name,
            "pid": std::process::id(), "started_ms": now_ms(),
        });
        match self.store.put_create(&key, Bytes::from(body.to_string()))? {
            Put::Created => Ok(key),
            Put::Exists => Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("another garbage collection run claimed {key} at the same time"),
            )),
        }
    }

    /// Every grain `tail` names read against its CRC, its key index at
    /// most `max`: the first that fails (one error per disk, as a map
    /// walk stops at its first).
    fn check_tail(
        &self,
        tail: &Tail,
        max: u8,
        buf: &mut [u8],
    ) -> std::result::Result<(), (u64, Error)> {
        for (vg, e) in tail.iter() {
            let Some(e) = e else { continue };
            key_index_ok(e, None, *vg, max)
                .and_then(|()| self.cache.fetch(&self.store, e.seg))
                .and_then(|()| self.cache.read_grain(&self.store, e, *vg, buf))
                .map_err(|err| (*vg, err))?;
        }
        Ok(())
    }

    /// Read every node and grain every live root reaches, checking each
    /// against the CRC its map entry holds.
    pub fn check(&self) -> Result<CheckReport> {
        let roots = self.roots()?;
        let mut rep = CheckReport {
            disks: 0,
            snapshots: 0,
            holds: roots.holds.len() as u64,
            nodes: 0,
            grains: 0,
            errors: Vec::new(),
        };
        let max_key = key_limits(&roots);
        let mut marks = Marks::default();
        let mut buf = vec![0u8; GRAIN];
        // (what, root, levels, owner, the tail that shadows the map).
        let mut trees: Vec<Tree> = Vec::new();
        for (id, (name, m)) in &roots.disks {
            if m.removed {
                continue;
            }
            let name = name
                .clone()
                .unwrap_or_else(|| format!("(unnamed disk {id:08x})"));
            rep.disks += 1;
            for s in &m.snapshots {
                rep.snapshots += 1;
                trees.push((
                    format!("{name}@{}", s.name),
                    Reach::new(s.root, s.levels, *id, None),
                ));
            }
            // After its snapshots: a grain it skips (shadowed) that they
            // reach is checked through them.
            trees.push((
                name.clone(),
                Reach::new(m.root, m.levels, *id, Some(&m.tail)),
            ));
            // Its tail (§11.4a): every grain it names, against its CRC.
            let max = max_key.get(id).copied().unwrap_or(0);
            rep.grains += m.tail.values().flatten().count() as u64;
            if let Err((vg, err)) = self.check_tail(&m.tail, max, &mut buf) {
                rep.errors
                    .push(format!("{name}: grain {vg} of its tail: {err}"));
            }
        }
        for h in &roots.holds {
            trees.push((h.key(), Reach::new(h.root, h.levels, h.clone, None)));
        }
        for (what, reach) in trees {
            let mut nodes = 0u64;
            let mut grains = 0u64;
            let max = max_key.get(&reach.owner).copied().unwrap_or(0);
            // A map named after a fold (or a compaction) may hold entries
            // its tail shadows: never read, maybe collected (§11.4a).
            let r = self.walk(reach, &mut marks, &mut |e, level, vg| {
                key_index_ok(e, level, vg, max)?;
                match level {
                    Some(_) => nodes += 1,
                    None => {
                        grains += 1;
                        // Whole segments: verified end to end, and one GET
                        // each rather than one per grain.
                        self.cache.fetch(&self.store, e.seg)?;
                        self.cache.read_grain(&self.store, e, vg, &mut buf)?;
                    }
                }
                Ok(())
            });
            rep.nodes += nodes;
            rep.grains += grains;
            if let Err(e) = r {
                rep.errors.push(format!("{what}: {e}"));
            }
        }
        Ok(rep)
    }
}

/// The highest key index a grain of each disk's maps may carry (§16.7:
/// its own keys'; a hold's grains are read through its clone's record).
fn key_limits(roots: &Roots) -> HashMap<u32, u8> {
    roots
        .disks
        .iter()
        .map(|(id, (_, m))| {
            let own = m
                .keyring
                .as_ref()
                .and_then(|k| k.own.iter().map(|o| o.bits).max());
            (*id, own.unwrap_or(0))
        })
        .collect()
}

/// Refused: a node entry (`level` Some) with a key index, or a grain's
/// above `max`.
fn key_index_ok(e: &Entry, level: Option<u8>, vg: u64, max: u8) -> Result<()> {
    let node = level.is_some();
    if e.key <= max && !(node && e.key != 0) {
        return Ok(());
    }
    Err(crate::corrupt(format!(
        "{} at grain {vg} carries key index {}, which {} (damaged map)",
        if node { "a node entry" } else { "the entry" },
        e.key,
        if node {
            "only a leaf's grains have"
        } else {
            "its keyring has no key for"
        }
    )))
}

/// The disk id of a key under `disks/`.
fn disk_of_key(key: &str) -> Option<u32> {
    let rest = key.strip_prefix(DIR_DISKS)?;
    let (id, _) = rest.split_once('/')?;
    if id.len() != 8 {
        return None;
    }
    u32::from_str_radix(id, 16).ok()
}
