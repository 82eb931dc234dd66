//! Opening a disk and reading it: the overlay of unflushed writes, the
//! tail, then the map walk (§11.4a).

use super::*;

impl ObjectDisk {
    /// Open `name` (a disk, or `DISK@SNAP`: read-only). Reads nothing but
    /// the name and the newest manifest; claims nothing.
    pub fn open(
        ds: Arc<ObjectStoreDatastore>,
        name: &str,
        read_only: bool,
    ) -> Result<Arc<ObjectDisk>> {
        let (disk, snap) = split_target(name);
        let id = ds.disk_id(disk)?;
        let man = ds.newest_manifest(id)?;
        if man.removed {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("disk '{disk}' was removed"),
            ));
        }
        let snapshot = match snap {
            None => None,
            Some(s) => Some(
                man.snapshots
                    .iter()
                    .find(|r| r.name == s)
                    .cloned()
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::NotFound,
                            format!("disk '{disk}' has no snapshot '{s}'"),
                        )
                    })?,
            ),
        };
        let throttle = ds.throttle(id, man.limits);
        ds.cache.seed_root(&man);
        let reads = crate::hot::Reads::new(man.size_bytes.div_ceil(G));
        Ok(Arc::new_cyclic(|me| ObjectDisk {
            compactor: Default::default(),
            me: me.clone(),
            ds,
            name: name.to_string(),
            id,
            read_only: read_only || snapshot.is_some(),
            encrypted: man.keyring.is_some(),
            snapshot,
            state: Mutex::new(State::new(man)),
            uploaded: Condvar::new(),
            landed: Condvar::new(),
            commit: Mutex::new(()),
            rmw: Mutex::new(()),
            stats: Mutex::new(CommitStats::default()),
            throttle,
            reads,
        }))
    }

    /// The cipher of the grains `man` names (§16.7: its keyring's cursor
    /// during a deep rekey): None for a plain disk, a refusal when it is
    /// encrypted and this process holds no keys for it.
    pub(super) fn cipher_of(
        &self,
        man: &Manifest,
    ) -> Result<Option<Arc<strata_crypt::DataCipher>>> {
        let Some(rec) = man.keyring.as_ref().filter(|_| self.encrypted) else {
            return Ok(None);
        };
        match self.ds.cipher_for(self.disk_name(), self.id, rec)? {
            Some(c) => Ok(Some(c)),
            None => Err(strata_crypt::locked_error(self.disk_name())),
        }
    }

    /// Refused when the disk is encrypted and this process holds no keys
    /// for it (what its reads and writes would be refused with).
    pub fn check_unlocked(&self) -> Result<()> {
        let man = self.state.lock().unwrap().man.clone();
        self.cipher_of(&man).map(|_| ())
    }

    /// The cipher grains taken with `c` are sealed under: an encrypted
    /// disk's writes always carry one, so its absence is a bug here, and
    /// the seal is refused rather than store plaintext.
    pub(super) fn sealing_cipher(
        &self,
        c: &Option<Arc<strata_crypt::DataCipher>>,
    ) -> Result<Option<Arc<strata_crypt::DataCipher>>> {
        if self.encrypted && c.is_none() {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "disk '{}': grains to seal without the cipher they were written under \
                     (a bug: nothing was stored)",
                    self.name
                ),
            ));
        }
        Ok(c.clone())
    }

    pub(super) fn store(&self) -> &ObjectStore {
        &self.ds.store
    }

    /// The disk's name (without `@SNAP`).
    pub(super) fn disk_name(&self) -> &str {
        split_target(&self.name).0
    }

    /// The manifest this disk reads from now.
    pub fn manifest(&self) -> Arc<Manifest> {
        self.state.lock().unwrap().man.clone()
    }

    /// Whether this process owns the disk, and the fencing message if it
    /// lost it.
    pub fn ownership(&self) -> (bool, Option<String>) {
        let st = self.state.lock().unwrap();
        (st.owner, st.fenced.clone())
    }

    pub fn commit_stats(&self) -> CommitStats {
        *self.stats.lock().unwrap()
    }

    /// Bytes acknowledged to writers and not yet committed to the store.
    pub fn unflushed_bytes(&self) -> u64 {
        let st = self.state.lock().unwrap();
        let flushing: usize = st.inflight.iter().map(|f| f.batch.len()).sum();
        (st.dirty.len() + flushing + st.sealed.len()) as u64 * G
    }

    pub(super) fn root(&self, man: &Manifest) -> (Option<Entry>, u8) {
        match &self.snapshot {
            Some(s) => (s.root, s.levels),
            None => (man.root, man.levels),
        }
    }

    /// The grains in `grains` that this handle's version holds outside
    /// its map: the head's tail (§11.4a), then the acknowledged writes not
    /// yet committed (the batch being committed, then the newer one over
    /// it), with whether each holds data.
    pub(super) fn overlay(&self, st: &State, grains: std::ops::Range<u64>) -> BTreeMap<u64, bool> {
        let mut v: BTreeMap<u64, bool> = BTreeMap::new();
        if self.snapshot.is_none() {
            v.extend(
                st.man
                    .tail
                    .range(grains.clone())
                    .map(|(k, e)| (*k, e.is_some())),
            );
        }
        v.extend(st.sealed.range(grains.clone()).map(|(k, _)| (*k, true)));
        // Batches in flight, oldest first; a grain sealed after a batch
        // was taken is newer than it.
        for f in &st.inflight {
            for (k, d) in f.batch.range(grains.clone()) {
                if st.sealed.get(k).is_none_or(|(n, _)| *n <= f.at) {
                    v.insert(*k, d.is_some());
                }
            }
        }
        v.extend(st.dirty.range(grains).map(|(k, d)| (*k, d.is_some())));
        v
    }

    /// Where grain `vg` of this handle's version lives in the newest
    /// manifest it knows (its writes not yet committed left out): its
    /// segment, slot, CRC and key index; None for a hole.
    pub fn entry_of(&self, vg: u64) -> Result<Option<Entry>> {
        self.locate(&self.manifest(), vg, &mut Vec::new())
    }

    /// Where grain `vg` of this handle's version (at `man`) lives: the
    /// head's tail, else its map (the segments of the nodes walked go to
    /// `used`).
    pub(super) fn locate(
        &self,
        man: &Manifest,
        vg: u64,
        used: &mut Vec<SegId>,
    ) -> Result<Option<Entry>> {
        if let Some(e) = self.in_tail(man, vg) {
            return Ok(e);
        }
        let (root, levels) = self.root(man);
        self.lookup_noting(root, levels, vg, used)
    }

    /// Grain `vg`'s entry in the head's tail at `man`, if it is there (a
    /// snapshot has none: its map holds everything).
    fn in_tail(&self, man: &Manifest, vg: u64) -> Option<Option<Entry>> {
        match self.snapshot {
            None => man.tail.get(&vg).copied(),
            Some(_) => None,
        }
    }

    /// [`ObjectDisk::locate`] for a run of grains read at one manifest:
    /// the grains of one leaf walk the map once between them (`cur`).
    fn locate_at(&self, man: &Manifest, cur: &mut LeafCursor, vg: u64) -> Result<Option<Entry>> {
        if let Some(e) = self.in_tail(man, vg) {
            return Ok(e);
        }
        let (root, levels) = self.root(man);
        self.lookup_at(cur, root, levels, vg)
    }

    /// [`ObjectDisk::lookup`] through `cur`, for a run of lookups in one
    /// map (`root`, `levels`): a grain of the leaf it holds is read from
    /// that leaf, any other walks the map and its leaf is held instead.
    pub(super) fn lookup_at(
        &self,
        cur: &mut LeafCursor,
        root: Option<Entry>,
        levels: u8,
        vg: u64,
    ) -> Result<Option<Entry>> {
        let first = vg - vg % FANOUT as u64;
        if cur.held.as_ref().is_none_or(|(f, _)| *f != first) {
            let leaf = self.leaf_noting(root, levels, vg, &mut Vec::new())?;
            cur.held = Some((first, leaf));
        }
        let leaf = cur.held.as_ref().and_then(|(_, l)| l.as_ref());
        Ok(leaf.and_then(|n| n.entries[(vg % FANOUT as u64) as usize]))
    }

    /// Walk the map to grain `vg`'s entry.
    pub(super) fn lookup(&self, root: Option<Entry>, levels: u8, vg: u64) -> Result<Option<Entry>> {
        self.lookup_noting(root, levels, vg, &mut Vec::new())
    }

    /// [`Self::lookup`], adding to `used` the segments of the nodes it
    /// walked (a read's hot set counts them, §11.5b).
    pub(super) fn lookup_noting(
        &self,
        root: Option<Entry>,
        levels: u8,
        vg: u64,
        used: &mut Vec<SegId>,
    ) -> Result<Option<Entry>> {
        let leaf = self.leaf_noting(root, levels, vg, used)?;
        Ok(leaf.and_then(|n| n.entries[(vg % FANOUT as u64) as usize]))
    }

    /// The leaf of the map at `root` (`levels` levels) that covers grain
    /// `vg`, if the map has one there, adding to `used` the segments of
    /// the nodes walked.
    pub(super) fn leaf_noting(
        &self,
        root: Option<Entry>,
        levels: u8,
        vg: u64,
        used: &mut Vec<SegId>,
    ) -> Result<Option<Arc<MapNode>>> {
        if !maps(levels, vg) {
            // Extended since anything was written here (FORMAT.md §11.5).
            return Ok(None);
        }
        let mut e = root;
        let mut first = 0u64;
        for level in (0..levels).rev() {
            let Some(here) = e else { return Ok(None) };
            let node = self.ds.cache.node(&self.ds.store, &here, level, first)?;
            if used.last() != Some(&here.seg) {
                used.push(here.seg);
            }
            if level == 0 {
                return Ok(Some(node));
            }
            let span = MapNode::span_of_entry(level);
            let idx = ((vg - first) / span) as usize;
            if idx >= FANOUT {
                return Err(corrupt(format!(
                    "disk '{}': grain {vg} lies outside its map",
                    self.name
                )));
            }
            first += idx as u64 * span;
            e = node.entries[idx];
        }
        Ok(None)
    }

    /// The grains where this handle's version differs from `base`'s (None:
    /// an empty disk), ascending, with whether this version maps each
    /// (docs/BACKUP.md): a walk of the two maps that skips what they
    /// share, then the acknowledged writes not yet committed (either
    /// handle's overlay; a snapshot has none).
    pub fn changes_since(&self, base: Option<&ObjectDisk>) -> Result<Vec<(u64, bool)>> {
        let end = self.size_bytes().div_ceil(G);
        let (mine, man) = {
            let st = self.state.lock().unwrap();
            (self.overlay(&st, 0..end), st.man.clone())
        };
        let (theirs, their_root) = match base {
            Some(b) => {
                let (ov, m) = {
                    let st = b.state.lock().unwrap();
                    (b.overlay(&st, 0..end), st.man.clone())
                };
                (ov, b.root(&m))
            }
            None => (BTreeMap::new(), (None, 0)),
        };
        let mut walked = Vec::new();
        diff::diff_maps(
            their_root,
            self.root(&man),
            end,
            &mut |e, level, first| self.ds.cache.node(&self.ds.store, e, level, first),
            &mut |g, present| walked.push((g, present)),
        )?;
        if mine.is_empty() && theirs.is_empty() {
            return Ok(walked);
        }
        // Overlay grains count as changed whatever they hold.
        let (root, levels) = self.root(&man);
        let mut all: BTreeMap<u64, bool> = walked.into_iter().collect();
        for &g in theirs.keys() {
            if !all.contains_key(&g) && !mine.contains_key(&g) {
                let present = self.lookup(root, levels, g)?.is_some();
                all.insert(g, present);
            }
        }
        all.extend(mine);
        Ok(all.into_iter().collect())
    }

    /// Read the newest manifest now, if the disk is not ours; whether it
    /// changed.
    pub(super) fn refresh_now(&self) -> bool {
        if self.snapshot.is_some() || self.state.lock().unwrap().owner {
            return false;
        }
        let newest = newest_manifest(self.store(), self.id);
        let mut st = self.state.lock().unwrap();
        st.refreshed = Instant::now();
        match newest {
            Ok(m) if !st.owner && m.seq > st.man.seq => {
                self.ds.cache.seed_root(&m);
                st.man = Arc::new(m);
                true
            }
            _ => false,
        }
    }

    /// A disk that is not ours follows its owner's commits: at most a
    /// second behind, except an incoming disk whose writer has not released
    /// it yet (§11.6b), which reads the newest manifest before every read:
    /// a migrated guest that resumes here must read what it wrote on the
    /// source, which flushed it just before it stopped.
    pub(super) fn refresh_if_stale(&self) {
        {
            let st = self.state.lock().unwrap();
            let handing_over = st.incoming.is_some() && st.man.owner.is_some();
            if st.owner
                || self.snapshot.is_some()
                || (st.refreshed.elapsed() < REFRESH && !handing_over)
            {
                return;
            }
        }
        self.refresh_now();
    }

    /// Where grain `vg` of a read comes from when this handle holds
    /// writes outside its map (`st`): newest first, the unsealed writes,
    /// then the newest batch in flight that holds the grain unless it was
    /// sealed after that batch was taken, then the seal. Data found in
    /// memory is copied into `g` (a sealed segment's decrypted).
    fn overlay_source(
        &self,
        st: &State,
        vg: u64,
        g: &mut [u8],
        cipher: Option<&strata_crypt::DataCipher>,
    ) -> Result<Source> {
        let sealed = st.sealed.get(&vg);
        let hit = match st.dirty.get(&vg) {
            Some(d) => Some(d),
            None => st
                .inflight
                .iter()
                .rev()
                .find_map(|f| f.batch.get(&vg).map(|d| (f.at, d)))
                .filter(|(at, _)| sealed.is_none_or(|(n, _)| n <= at))
                .map(|(_, d)| d),
        };
        Ok(match (hit, sealed) {
            (Some(Some(d)), _) => {
                g.copy_from_slice(d);
                Source::Data
            }
            (Some(None), _) => Source::Zero,
            (None, Some((_, e))) => match st.sealing.get(&e.seg) {
                Some(s) => {
                    if !e.unplace_from(&s.bytes, g) {
                        return Err(corrupt(format!(
                            "disk '{}': grain {vg} does not match its checksum in {} being sealed",
                            self.name,
                            e.seg.key()
                        )));
                    }
                    self.decrypt_grain(cipher, e, vg, g)?;
                    Source::Data
                }
                None => Source::Sealed(*e),
            },
            (None, None) => Source::Map,
        })
    }

    /// Decrypt grain `vg`, read from `e`, under the key its entry's key
    /// index names (§16.7); nothing for a plain disk. An index the
    /// record has no key for is damage: refused, naming the grain.
    pub(super) fn decrypt_grain(
        &self,
        cipher: Option<&strata_crypt::DataCipher>,
        e: &Entry,
        vg: u64,
        g: &mut [u8],
    ) -> Result<()> {
        let Some(c) = cipher else { return Ok(()) };
        let Some(k) = c.keyed(e.key) else {
            return Err(corrupt(format!(
                "disk '{}': grain {vg} ({} slot {}) is under key index {}, which its keyring \
                 does not have (damaged map)",
                self.name,
                e.seg.key(),
                e.slot,
                e.key
            )));
        };
        k.decrypt(g, vg * SECTORS);
        Ok(())
    }

    /// Read whole grains from `first`, `n` of them, into `out`.
    pub(super) fn read_grains(&self, first: u64, out: &mut [u8]) -> Result<()> {
        let n = out.len() / GRAIN;
        let mut sources = Vec::with_capacity(n);
        let (man, cipher) = {
            let mut st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            st.client_reads += n as u64;
            // The cursor of the manifest this read walks (§16.7); the
            // grains held in memory are under it too (a deep rekey's
            // region takes no writes until its manifest is the newest).
            let cipher = self.cipher_of(&st.man)?;
            let overlay = !st.dirty.is_empty() || !st.inflight.is_empty() || !st.sealed.is_empty();
            for i in 0..n as u64 {
                if !overlay {
                    sources.push(Source::Map);
                    continue;
                }
                let at = i as usize * GRAIN;
                let g = &mut out[at..at + GRAIN];
                sources.push(self.overlay_source(&st, first + i, g, cipher.as_deref())?);
            }
            (st.man.clone(), cipher)
        };
        self.reads.count(first, n as u64);
        let mut cur = LeafCursor::default();
        for (i, s) in sources.into_iter().enumerate() {
            let at = i * GRAIN;
            let e = match s {
                Source::Data => continue,
                Source::Zero => None,
                Source::Sealed(e) => Some(e),
                Source::Map => self.locate_at(&man, &mut cur, first + i as u64)?,
            };
            match e {
                None => out[at..at + GRAIN].fill(0),
                Some(e) => {
                    let vg = first + i as u64;
                    let g = &mut out[at..at + GRAIN];
                    self.ds.cache.read_grain(&self.ds.store, &e, vg, g)?;
                    self.decrypt_grain(cipher.as_deref(), &e, vg, g)?;
                }
            }
        }
        Ok(())
    }
}

/// The leaf a run of lookups in one map last walked to (a read's grains,
/// a block status's range): consecutive grains of one leaf, FANOUT of
/// them, walk the map and hash the node cache's keys once between them.
#[derive(Default)]
pub(super) struct LeafCursor {
    /// The first grain of the leaf held, and that leaf (None: the map has
    /// none there).
    held: Option<(u64, Option<Arc<MapNode>>)>,
}
