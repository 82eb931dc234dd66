//! Commits (§11.4a, §11.4b): a FLUSH takes the batch, builds the next
//! manifest with its payload and lands it, up to two in flight, settled in
//! order.

use super::fold::Folder;
use super::read::LeafCursor;
use super::*;

/// A batch's grains that hold data: (virtual grain, its bytes).
type DataGrains<'b> = Vec<(u64, &'b [u8])>;

impl ObjectDisk {
    /// Upload every acknowledged write and commit the next manifest. A
    /// FLUSH whose writes a commit in flight covers waits for that one;
    /// otherwise its commit is issued at once, on top of one still in
    /// flight if there is one (§11.4b).
    pub fn commit(&self) -> Result<()> {
        let want = self.state.lock().unwrap().write_seq;
        loop {
            let c = self.commit.lock().unwrap();
            let mut st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            if st.durable_seq >= want {
                // A commit that took every write this one must cover
                // ended while this one waited for it.
                return Ok(());
            }
            if let Some(id) = st.inflight.iter().find(|f| f.covers >= want).map(|f| f.id) {
                drop(c);
                return self.joined(st, id, want);
            }
            let may_issue = st.inflight.is_empty()
                || (st.inflight.len() < PIPELINE
                    && st.pipeline_ok
                    && st.inflight.iter().all(|f| f.next.is_some()));
            if !may_issue {
                drop(c);
                drop(self.landed.wait(st).unwrap());
                continue;
            }
            if st.unsettled {
                drop(st);
                self.settle()?;
                continue;
            }
            if st
                .markers_listed
                .is_none_or(|t| t.elapsed() >= MARKER_LIST_EVERY)
            {
                let seen = st.marker_seen;
                drop(st);
                self.yield_to_claim(seen);
                // The next listing is due a period after this one ended,
                // not after it began: a listing slower than the period (a
                // distant store, or one that hangs until the timeout)
                // would otherwise be followed by another for ever, and no
                // commit would be issued.
                self.state.lock().unwrap().markers_listed = Some(Instant::now());
                continue;
            }
            // A seal being prepared holds copies of grains this batch
            // would take: wait for it (milliseconds) rather than take
            // them, which drops it, and compress them again; no writer
            // starts another meanwhile.
            if st.preparing_seal {
                drop(c);
                st.commits_waiting += 1;
                st = self.uploaded.wait(st).unwrap();
                st.commits_waiting -= 1;
                continue;
            }
            let Some(t) = self.take_batch(&mut st)? else {
                return Ok(());
            };
            let pipelined = st.inflight.len() > 1;
            drop(st);
            return self.run(t, Some(c), pipelined).map(|_| ());
        }
    }

    /// With the commit lock held: if a claim marker above `seen` (the
    /// highest one seen so far) is there, another host is claiming the
    /// disk: wait [`CLAIM_YIELD`], issuing nothing, so that its next
    /// attempt lands before this writer's next manifest (§11.4b). A
    /// writer that pipelines would otherwise always have its next
    /// manifest in flight before a claimer could learn the key to race it
    /// for.
    pub(super) fn yield_to_claim(&self, seen: u64) {
        let dir = format!("disks/{:08x}/c/", self.id);
        let after = claim_marker_key(self.id, seen);
        let Ok(found) = self.store().list(&dir, Some(&after)) else {
            return;
        };
        let newest = found
            .iter()
            .filter_map(|l| claim_marker_of_key(&l.key))
            .max();
        if let Some(m) = newest {
            self.state.lock().unwrap().marker_seen = m;
            std::thread::sleep(CLAIM_YIELD);
        }
    }

    /// The commit lock, once no commit is in flight and a failed one is
    /// settled: for the changes that build on the newest manifest alone
    /// (claims, snapshots, folds, compaction).
    pub(super) fn lock_commit(&self) -> Result<MutexGuard<'_, ()>> {
        let c = self.commit.lock().unwrap();
        let mut st = self.state.lock().unwrap();
        while !st.inflight.is_empty() {
            st = self.landed.wait(st).unwrap();
        }
        let unsettled = st.unsettled;
        drop(st);
        if unsettled {
            self.settle()?;
        }
        Ok(c)
    }

    /// After a commit failed without a verdict (§11.4b rule 3), with the
    /// commit lock held and nothing in flight: if the newest manifest is
    /// one this process issued (its `PUT` landed after all), build on it.
    pub(super) fn settle(&self) -> Result<()> {
        let newest = newest_manifest(self.store(), self.id)?;
        let mut st = self.state.lock().unwrap();
        if newest.seq > st.man.seq && st.mine.contains(&(newest.seq, newest.nonce)) {
            tracing::warn!(
                "disk '{}': manifest {} landed although its PUT failed; the next commit \
                 builds on it",
                self.name,
                newest.seq
            );
            self.ds.cache.seed_root(&newest);
            st.man = Arc::new(newest);
        }
        st.unsettled = false;
        Ok(())
    }

    /// A FLUSH that waits for commit `id` (which covers the writes it
    /// waits for, `want`): its outcome, once it is settled.
    pub(super) fn joined(&self, mut st: MutexGuard<'_, State>, id: u64, want: u64) -> Result<()> {
        while st.inflight.iter().any(|f| f.id == id) {
            st = self.landed.wait(st).unwrap();
        }
        if let Some(f) = &st.fenced {
            return Err(Error::new(ErrorKind::Fenced, f.clone()));
        }
        if st.durable_seq >= want {
            return Ok(());
        }
        Err(st.last_failure.clone().unwrap_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "the commit failed; the writes are kept",
            )
        }))
    }

    /// With the commit lock held: move the acknowledged writes into a
    /// commit in flight (None: there are none).
    pub(super) fn take_batch(&self, st: &mut State) -> Result<Option<Taken>> {
        if let Some(f) = &st.fenced {
            return Err(Error::new(ErrorKind::Fenced, f.clone()));
        }
        if st.dirty.is_empty() && st.sealed.is_empty() {
            return Ok(None);
        }
        if !st.owner {
            return Err(Error::new(
                ErrorKind::Fenced,
                format!("disk '{}': writes without a claim", self.name),
            ));
        }
        // Grains sealed up to here are named by the commit in flight.
        let after = st.inflight.back().and_then(|f| f.seal_upto).unwrap_or(0);
        let batch = Arc::new(std::mem::take(&mut st.dirty));
        st.dirty_bytes = 0;
        let mut t = self.take(st, batch);
        t.sealed = st
            .sealed
            .iter()
            .filter(|(_, (n, _))| *n > after)
            .map(|(vg, (_, e))| (*vg, *e))
            .collect();
        let f = st.inflight.back_mut().expect("take registers it");
        f.seal_upto = Some(st.seal_no);
        f.covers = st.write_seq;
        Ok(Some(t))
    }

    /// Register a commit of `batch` on top of the newest manifest (or
    /// the one in flight): its segment counters and a node segment's,
    /// and the fold state.
    pub(super) fn take(&self, st: &mut State, batch: Arc<Batch>) -> Taken {
        let ctrs = batch.len().div_ceil(SEGMENT_GRAINS) as u32 + 1;
        let ctr = st.next_ctr..st.next_ctr + ctrs;
        st.next_ctr += ctrs;
        st.commit_no += 1;
        let id = st.commit_no;
        let man = st
            .inflight
            .back()
            .and_then(|f| f.next.clone())
            .unwrap_or_else(|| st.man.clone());
        st.inflight.push_back(InFlight {
            id,
            batch: batch.clone(),
            at: st.seal_no,
            covers: st.durable_seq,
            seal_upto: None,
            next: None,
            outcome: None,
            fold: None,
        });
        Taken {
            id,
            batch,
            man,
            ctr,
            fold: st.fold.take(),
            folding: st.held(),
            tail_bound: if st.folding.is_some() {
                TAIL_MAX_FOLDING
            } else {
                TAIL_MAX
            },
            force_fold: false,
            sealed: Vec::new(),
            relocate: Vec::new(),
            cipher: st.cipher.clone(),
        }
    }

    /// With the commit lock held and nothing in flight: commit a batch
    /// [`Self::take_batch`] or [`Self::take`] registered; on failure its
    /// writes go back to the unflushed ones (or the disk is fenced). How
    /// many of its relocations (§11.7a) the manifest took.
    pub(super) fn commit_taken(&self, t: Taken) -> Result<u64> {
        self.run(t, None, false)
    }

    /// Build commit `t` (its uploads, with the commit lock `guard` held
    /// if given), then let the next commit be issued on top of it (the
    /// lock is released), `PUT` its manifest and wait until it is
    /// settled, in order (§11.4b). `pipelined`: a commit before it was
    /// still in flight when it was taken.
    pub(super) fn run(
        &self,
        t: Taken,
        guard: Option<MutexGuard<'_, ()>>,
        pipelined: bool,
    ) -> Result<u64> {
        let id = t.id;
        let t0 = Instant::now();
        let (built, fold) = self.build(t);
        let (r, fold, bytes) = match built {
            Err(e) => (Err(e), fold, 0),
            Ok(Built::Unchanged(base)) => (Ok((base, 0)), fold, 0),
            Ok(Built::Next(b)) => {
                {
                    let mut st = self.state.lock().unwrap();
                    if let Some(f) = st.inflight.iter_mut().find(|f| f.id == id) {
                        f.next = Some(Arc::new(b.next.clone()));
                    }
                    st.note_mine(&b.next);
                    self.landed.notify_all();
                }
                drop(guard);
                match self.land(b, pipelined) {
                    (Ok(c), _) => (Ok((c.man, c.relocated)), None, c.uploaded),
                    (Err(e), fold) => (Err(e), fold, 0),
                }
            }
        };
        {
            let mut c = self.stats.lock().unwrap();
            match &r {
                Ok(_) => {
                    let s = t0.elapsed().as_secs_f64();
                    c.commits += 1;
                    c.pipelined += u64::from(pipelined);
                    c.uploaded_bytes += bytes;
                    c.seconds_total += s;
                    c.seconds_max = c.seconds_max.max(s);
                }
                Err(_) => c.failed += 1,
            }
        }
        let mut st = self.state.lock().unwrap();
        match st.inflight.iter_mut().find(|f| f.id == id) {
            Some(f) => {
                f.outcome = Some(r);
                f.fold = fold;
            }
            // Failed with a commit before it meanwhile (settled later if
            // its manifest landed: §11.4b rule 3).
            None => {
                if st.fold.is_none() {
                    st.fold = fold;
                }
            }
        }
        self.settle_front(&mut st);
        self.landed.notify_all();
        loop {
            if let Some(r) = st.settled.remove(&id) {
                drop(st);
                if r.is_ok() {
                    self.maybe_fold();
                    self.maybe_record_hot_set();
                }
                return r;
            }
            st = self.landed.wait(st).unwrap();
        }
    }

    /// Settle the commits at the front of the queue whose `PUT`s are
    /// back, in order: a manifest counts only once every one before it
    /// is in (§11.4b rule 2). A failure fails every commit after it too:
    /// their writes go back to the unflushed ones, newest first so that
    /// newer writes win (or the disk is fenced).
    pub(super) fn settle_front(&self, st: &mut State) {
        while st.inflight.front().is_some_and(|f| f.outcome.is_some()) {
            let mut f = st.inflight.pop_front().expect("checked");
            match f.outcome.take().expect("checked") {
                Ok((next, relocated)) => {
                    st.man = next;
                    st.durable_seq = st.durable_seq.max(f.covers);
                    // Committed: in the tail or the map now.
                    if let Some(upto) = f.seal_upto {
                        st.sealed.retain(|_, (n, _)| *n > upto);
                    }
                    st.pipeline_ok = true;
                    st.settled.insert(f.id, Ok(relocated));
                }
                Err(e) => {
                    let mut failed: Vec<InFlight> = st.inflight.drain(..).collect();
                    failed.insert(0, f);
                    if e.kind == ErrorKind::Fenced {
                        st.fence(&self.name, &e.message);
                    } else {
                        st.unsettled = true;
                    }
                    st.pipeline_ok = false;
                    for g in failed.iter_mut() {
                        // A fold not named yet still applies to the
                        // manifest that is still the newest.
                        if st.fold.is_none() {
                            st.fold = g.fold.take();
                        }
                        st.settled.insert(g.id, Err(e.clone()));
                    }
                    if st.fenced.is_none() {
                        // Keep them: the next FLUSH uploads them again.
                        // Newer writes made meanwhile win (unsealed or
                        // sealed).
                        for g in failed.iter().rev() {
                            for (vg, d) in g.batch.iter() {
                                if st.sealed.get(vg).is_some_and(|(n, _)| *n > g.at) {
                                    continue;
                                }
                                if let std::collections::btree_map::Entry::Vacant(v) =
                                    st.dirty.entry(*vg)
                                {
                                    v.insert(d.clone());
                                    st.dirty_bytes += GRAIN;
                                }
                            }
                        }
                    }
                    st.last_failure = Some(e);
                }
            }
        }
    }

    /// With the commit lock held: fold the newest manifest's whole tail
    /// into its map now and commit that (§11.4a: the changes only an owner
    /// makes start from an empty tail).
    pub(super) fn fold_now(&self) -> Result<()> {
        let t = {
            let mut st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            if st.man.tail.is_empty() || !st.owner {
                return Ok(());
            }
            let mut t = self.take(&mut st, Arc::new(Batch::new()));
            t.force_fold = true;
            t
        };
        self.commit_taken(t).map(|_| ())
    }

    /// Build commit `t` (§11.4a): wait for the sealed segments it names,
    /// then its grains as the next manifest's payload (the ones past one
    /// payload in segments first, two uploads at a time) and its tail
    /// extended with them; or, when `force_fold` or the tail would grow
    /// past [`TAIL_MAX`] ([`TAIL_MAX_FOLDING`] while a background fold is
    /// on its way), its grains in segments and the whole tail folded into
    /// map nodes (one more segment) under a manifest with an empty tail.
    /// A finished background fold that still applies is named. On
    /// failure, the fold taken if it was not used.
    pub(super) fn build(&self, t: Taken) -> (Result<Built>, Option<Fold>) {
        // Rule 3: what the manifest names is in the store first.
        let ids = t.sealed.iter().map(|(_, e)| e.seg).collect();
        if let Err(e) = self.wait_sealed(&ids) {
            return (Err(e), t.fold);
        }
        let Taken {
            id: _,
            batch,
            man,
            ctr: ctrs,
            fold: ready,
            folding,
            tail_bound,
            force_fold,
            sealed,
            relocate,
            cipher,
        } = t;
        let mut tail: Tail = (*man.tail).clone();
        let (mut root, mut levels) = (man.root, man.levels);
        let ready = match ready {
            Some(f) if f.applies_to(&man, &tail) => {
                root = f.root;
                levels = f.levels;
                tail.retain(|vg, e| f.folded.get(vg) != Some(e));
                Some(f)
            }
            // Overtaken (a revert, an inline fold): its nodes are garbage.
            _ => None,
        };
        let named = ready.is_some() || !sealed.is_empty();
        // Sealed grains are older than the batch: set first.
        for (vg, e) in sealed {
            tail.insert(vg, Some(e));
        }
        let mut onto = Onto {
            root,
            levels,
            tail,
            named,
        };
        // Then compaction's, where nothing moved them since (§11.7a).
        let relocated = match self.relocate(&man, &mut onto, &batch, relocate) {
            Ok(n) => n,
            Err(e) => return (Err(e), ready),
        };
        onto.named |= relocated > 0;
        let plan = Plan {
            man: &man,
            batch,
            ctrs,
            folding,
            force_fold,
            tail_bound,
            cipher,
        };
        let r = self.commit_on(plan, onto);
        match r {
            Ok(Some(mut b)) => {
                b.relocated = relocated;
                b.ready = ready;
                (Ok(Built::Next(b)), None)
            }
            Ok(None) => (Ok(Built::Unchanged(man)), ready),
            Err(e) => (Err(e), ready),
        }
    }

    /// `PUT` a built manifest create-only on top of its base, one key
    /// higher past an orphan (§11.4b; its payload is made again for the
    /// new key). The manifest, the relocations it took and the bytes
    /// uploaded; on failure, the fold it named.
    pub(super) fn land(
        &self,
        b: Box<NextManifest>,
        pipelined: bool,
    ) -> (Result<Committed>, Option<Fold>) {
        let NextManifest {
            base,
            mut next,
            mut payload,
            batch,
            payload_grains,
            mut uploaded,
            relocated,
            ready,
            cipher,
        } = *b;
        for _ in 0..8 {
            let body = payload.as_ref().map(|(_, b)| &b[..]).unwrap_or(&[]);
            match put_manifest(self.store(), &base, &mut next, body, pipelined) {
                Err(e) => return (Err(e), ready),
                Ok(Landed::Created) => {
                    uploaded += body.len() as u64;
                    if let Some((id, b)) = &payload {
                        // Kept as any segment this host wrote, once the
                        // FLUSH is answered; a cache that cannot keep it
                        // reads it from the store later.
                        self.ds.cache.insert_later(*id, b.clone());
                    }
                    let man = Arc::new(next);
                    return (
                        Ok(Committed {
                            man,
                            relocated,
                            uploaded,
                        }),
                        None,
                    );
                }
                Ok(Landed::Orphan) => {
                    next.seq += 1;
                    next.nonce = rand::random();
                    next.written_ms = now_ms();
                    let tail = Arc::make_mut(&mut next.tail);
                    let grains = (&*batch, &payload_grains[..]);
                    payload = self.payload(next.seq, grains, tail, cipher.as_deref());
                    self.state.lock().unwrap().note_mine(&next);
                }
                Ok(Landed::Taken) => break,
            }
        }
        let disk = self.disk_name();
        let who = match newest_manifest(self.store(), self.id) {
            Ok(m) => describe_owner(&m),
            Err(e) => format!("another host ({e})"),
        };
        (
            Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "disk '{disk}' is fenced on this host: it was claimed by {who}; this host's \
                     generation {} acknowledges no more writes (its unflushed writes are dropped)",
                    base.generation
                ),
            )),
            ready,
        )
    }

    /// The payload of manifest `seq` (§11.4a): `grains` of `batch` (all
    /// holding data) in a segment named after the manifest's key, each
    /// set in `tail` where it lands; None without grains.
    pub(super) fn payload(
        &self,
        seq: u64,
        (batch, grains): (&Batch, &[u64]),
        tail: &mut Tail,
        cipher: Option<&strata_crypt::DataCipher>,
    ) -> Option<(SegId, Bytes)> {
        if grains.is_empty() {
            return None;
        }
        let mut b = self.ds.data_segment(SegId::payload(self.id, seq));
        for vg in grains {
            let d = batch[vg].as_deref().expect("payload grains hold data");
            tail.insert(*vg, Some(b.add_data(*vg, d, cipher)));
        }
        Some((b.id, Bytes::from(b.seal(now_ms()))))
    }

    /// The batch's grains that hold data, and those that become holes.
    /// Zeros are holes: they need no grain. A hole where the map (at `root`,
    /// `levels` deep) has one already, and `tail` says nothing of it,
    /// changes nothing and is left out.
    fn data_and_holes<'b>(
        &self,
        batch: &'b Batch,
        tail: &Tail,
        root: Option<Entry>,
        levels: u8,
    ) -> Result<(DataGrains<'b>, Vec<u64>)> {
        let mut data = Vec::new();
        let mut holes = Vec::new();
        let mut cur = LeafCursor::default();
        for (vg, d) in batch.iter() {
            match d.as_deref().filter(|d| d.iter().any(|&x| x != 0)) {
                Some(d) => data.push((*vg, d)),
                None if tail.contains_key(vg) => holes.push(*vg),
                None if self.lookup_at(&mut cur, root, levels, *vg)?.is_some() => holes.push(*vg),
                None => {}
            }
        }
        Ok((data, holes))
    }

    /// [`Self::build`] once the base map and tail are known: the uploads,
    /// then the manifest (not yet `PUT`; None: nothing changed).
    pub(super) fn commit_on(&self, plan: Plan, onto: Onto) -> Result<Option<Box<NextManifest>>> {
        let Plan {
            man,
            batch,
            ctrs,
            folding,
            force_fold: fold,
            tail_bound,
            cipher,
        } = plan;
        let Onto {
            root,
            levels,
            mut tail,
            named,
        } = onto;
        let seg = |ctr| SegId {
            disk: self.id,
            gen: man.generation,
            ctr,
        };
        let (data, holes) = self.data_and_holes(&batch, &tail, root, levels)?;
        if !data.is_empty() {
            self.sealing_cipher(&cipher)?;
        }
        let fold = folds(fold, tail_bound, &tail, &data, &holes);
        let changed = named || fold || !data.is_empty() || !holes.is_empty();
        if !changed {
            return Ok(None);
        }
        // The last (up to) 8 MiB ride in the manifest; the rest, or all
        // of them when folding, in segments.
        let spill = if fold {
            data.len()
        } else {
            data.len().saturating_sub(SEGMENT_GRAINS)
        };
        let c = cipher.as_deref();
        let mut sealed = self.seal_grains(seg(ctrs.start), &data[..spill], &mut tail, c);
        for vg in holes {
            tail.insert(vg, None);
        }
        let (mut root, mut levels) = (root, levels);
        let mut nodes = Vec::new();
        if fold {
            let node_ctr = ctrs.start + sealed.len() as u32;
            debug_assert!(node_ctr < ctrs.end);
            let folded = self.fold_segment(man, seg(node_ctr), (root, levels), &tail)?;
            (root, levels, nodes) = (folded.root, folded.levels, folded.nodes);
            sealed.extend(folded.segment);
            tail.clear();
        }
        let uploaded = self.upload_with_nodes(&sealed, nodes)?;
        // The payload names the manifest's key (made again one key higher
        // past an orphan, in `land`).
        let next_seq = man.seq + 1;
        let payload_grains: Vec<u64> = data[spill..].iter().map(|(vg, _)| *vg).collect();
        drop(data);
        let payload = self.payload(next_seq, (&batch, &payload_grains), &mut tail, c);
        // A fold still being made keeps its counter "in flight" (§11.7).
        let next_ctr = folding.map_or(ctrs.end, |f| f.min(ctrs.end));
        let next = self.next_manifest(man, (root, levels), next_ctr, tail);
        Ok(Some(Box::new(NextManifest {
            base: man.clone(),
            next,
            payload,
            batch,
            payload_grains,
            uploaded,
            relocated: 0,
            ready: None,
            cipher,
        })))
    }
}

/// A tail folded into the map (`ObjectDisk::fold_segment`).
struct Folded {
    root: Option<Entry>,
    levels: u8,
    /// The nodes made, for the cache once their segment is uploaded.
    nodes: Vec<(Entry, MapNode)>,
    /// Their segment; None when the fold made no node.
    segment: Option<(SegId, Bytes)>,
}

impl ObjectDisk {
    /// Fold `tail` into the map at `(root, levels)` of `man`, the new
    /// nodes in a segment with id `id`.
    fn fold_segment(
        &self,
        man: &Manifest,
        id: SegId,
        (root, levels): (Option<Entry>, u8),
        tail: &Tail,
    ) -> Result<Folded> {
        let mut nodes = Vec::new();
        let mut b = SegmentBuilder::new(id);
        let (root, levels) =
            Folder::new(self, man, &mut b, &mut nodes).fold_tail(root, levels, tail)?;
        let segment = (!nodes.is_empty()).then(|| (b.id, Bytes::from(b.seal(now_ms()))));
        Ok(Folded {
            root,
            levels,
            nodes,
            segment,
        })
    }

    /// Upload `sealed`, then put the map `nodes` they hold into the
    /// cache; the bytes uploaded.
    fn upload_with_nodes(
        &self,
        sealed: &[(SegId, Bytes)],
        nodes: Vec<(Entry, MapNode)>,
    ) -> Result<u64> {
        if sealed.is_empty() {
            return Ok(0);
        }
        self.upload(sealed)?;
        for (e, n) in nodes {
            self.ds.cache.insert_node(&e, n);
        }
        Ok(sealed.iter().map(|(_, b)| b.len() as u64).sum())
    }

    /// The manifest after `man` with map `(root, levels)`, segment counter
    /// `next_ctr` and `tail`, written now (a fresh nonce), with a copy of
    /// its root node when the cache has it (§11.5; an unchanged root keeps
    /// the copy `man` carries).
    fn next_manifest(
        &self,
        man: &Manifest,
        (root, levels): (Option<Entry>, u8),
        next_ctr: u32,
        tail: Tail,
    ) -> Manifest {
        let mut next = Manifest {
            seq: man.seq + 1,
            written_ms: now_ms(),
            nonce: rand::random(),
            root,
            levels,
            next_ctr,
            tail: Arc::new(tail),
            ..man.clone()
        };
        self.copy_root_node(&mut next);
        next
    }

    /// Give `next` a copy of its root node when the cache holds it (§11.5:
    /// a copy that does not match its root is left out when encoded).
    pub(super) fn copy_root_node(&self, next: &mut Manifest) {
        if let Some(n) = next.root.and_then(|e| self.ds.cache.cached_node(&e)) {
            next.set_root_node(&n);
        }
    }
}

/// Whether a commit folds its tail into the map: asked to (`force`), or
/// the grains and holes it writes would grow the tail past `bound`
/// entries.
fn folds(force: bool, bound: usize, tail: &Tail, data: &DataGrains, holes: &[u64]) -> bool {
    force || {
        let new = data
            .iter()
            .map(|(vg, _)| vg)
            .chain(holes)
            .filter(|vg| !tail.contains_key(vg))
            .count();
        tail.len() + new > bound
    }
}

impl ObjectDisk {
    /// Seal `grains` into segments of up to [`SEGMENT_GRAINS`], the first
    /// with id `first` and each next one the next counter, naming every
    /// grain in `tail`.
    fn seal_grains(
        &self,
        first: SegId,
        grains: &[(u64, &[u8])],
        tail: &mut Tail,
        cipher: Option<&strata_crypt::DataCipher>,
    ) -> Vec<(SegId, Bytes)> {
        let mut sealed = Vec::new();
        for (j, chunk) in grains.chunks(SEGMENT_GRAINS).enumerate() {
            let mut b = self.ds.data_segment(SegId {
                ctr: first.ctr + j as u32,
                ..first
            });
            for (vg, d) in chunk {
                tail.insert(*vg, Some(b.add_data(*vg, d, cipher)));
            }
            sealed.push((b.id, Bytes::from(b.seal(now_ms()))));
        }
        sealed
    }
}

/// What a commit is made of: its base manifest, the batch, the segment
/// counters it may use, and when it folds.
pub(super) struct Plan<'a> {
    pub(super) man: &'a Arc<Manifest>,
    pub(super) batch: Arc<Batch>,
    pub(super) ctrs: std::ops::Range<u32>,
    /// The counter of a fold still being made, held "in flight" (§11.7).
    pub(super) folding: Option<u32>,
    /// Fold the tail into the map in this commit.
    pub(super) force_fold: bool,
    /// Fold when the tail would grow past this many entries.
    pub(super) tail_bound: usize,
    /// The cipher the batch's grains are sealed under (§16.7).
    pub(super) cipher: Option<Arc<strata_crypt::DataCipher>>,
}

/// The map and tail a commit builds on: the base manifest's, with a
/// finished fold, sealed grains and compaction's moves applied.
pub(super) struct Onto {
    pub(super) root: Option<Entry>,
    pub(super) levels: u8,
    pub(super) tail: Tail,
    /// Something already changed (a fold or sealed grains to name): a
    /// manifest is written even with an empty batch.
    pub(super) named: bool,
}
