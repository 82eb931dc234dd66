//! Writes: grains collected in memory, sealed into 8 MiB segments and
//! uploaded between FLUSHes (§11.4a).

use super::*;

impl ObjectDisk {
    /// Put whole grains (`None`: zeros) into the unflushed writes.
    pub(super) fn put_grains(&self, grains: Vec<(u64, Option<Box<[u8]>>)>) -> Result<()> {
        let over = {
            let mut st = self.state.lock().unwrap();
            // A deep rekey's step takes no write into its region (§16.7).
            while st
                .rekey_region
                .as_ref()
                .is_some_and(|r| grains.iter().any(|(vg, _)| r.contains(vg)))
            {
                st = self.landed.wait(st).unwrap();
            }
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            if let Some(r) = &st.released {
                return Err(Error::new(ErrorKind::Released, r.clone()));
            }
            let cipher = self.cipher_of(&st.man)?;
            if cipher.is_some() {
                st.cipher = cipher;
            }
            st.client_bytes += (grains.len() * GRAIN) as u64;
            st.last_write = Instant::now();
            for (vg, d) in grains {
                if st.dirty.insert(vg, d).is_none() {
                    st.dirty_bytes += GRAIN;
                }
            }
            st.write_seq += 1;
            if st.dirty_bytes >= crate::SEGMENT_MAX_BYTES as usize && st.owner {
                st = self.seal(st)?;
            }
            st.dirty_bytes > DIRTY_LIMIT_BYTES || st.sealed.len() > SEALED_COMMIT
        };
        if over {
            self.commit()?;
        }
        Ok(())
    }

    /// Seal the data grains of `dirty` into segments and start their
    /// uploads (§11.4a, uploads between FLUSHes), waiting while
    /// [`UPLOADS_IN_FLIGHT`] are not in the store yet. Holes stay in
    /// `dirty` (they need no upload). An upload that failed is retried by
    /// the writer that waits for it, which fails with it (the store is
    /// out: the write fails, as it would at a FLUSH).
    ///
    /// A segment's grains are compressed or encrypted with the state let
    /// go (8 MiB of LZ4 or AES-XTS takes milliseconds that every other
    /// read and write of the disk would wait), from copies; one writer
    /// prepares at a time, and the others go on putting grains until
    /// they are two segments ahead.
    pub(super) fn seal<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
    ) -> Result<MutexGuard<'a, State>> {
        loop {
            st = self.room_to_upload(st)?;
            if st.fenced.is_some() || !st.owner || st.commits_waiting > 0 {
                return Ok(st);
            }
            if st.preparing_seal {
                // Back-pressure: a writer that runs two segments ahead of
                // the seal being prepared waits for it, so that `dirty`
                // does not reach the commit mark (a writer committing
                // 32 MiB inline: a 4x longer p99 of 512 KiB writes).
                if st.dirty_bytes < 2 * crate::SEGMENT_MAX_BYTES as usize {
                    return Ok(st);
                }
                st = self.uploaded.wait(st).unwrap();
                continue;
            }
            let chunk = chunk_to_seal(&st);
            if chunk.len() < SEGMENT_GRAINS / 2 {
                return Ok(st);
            }
            let taken_with = st.cipher.clone();
            let cipher = self.sealing_cipher(&taken_with)?;
            st.preparing_seal = true;
            drop(st);
            let (b, entries) = self.prepare_seal(&chunk, cipher.as_deref());
            st = self.state.lock().unwrap();
            st.preparing_seal = false;
            // A commit may wait for this seal.
            self.uploaded.notify_all();
            if st.fenced.is_some() || !st.owner || !same_cipher(&st.cipher, &taken_with) {
                return Ok(st);
            }
            // Nothing sealed (writes or a commit took the grains): the
            // next writer tries, not this one again, whose write waits.
            let Some((id, bytes)) = self.install_seal(&mut st, b, &chunk, entries) else {
                return Ok(st);
            };
            if !self.start_upload(&mut st, id, bytes) {
                return Ok(st);
            }
        }
    }

    /// With the state let go: `chunk`'s grains added to a new segment
    /// under `cipher` (compressed or encrypted), and their entries in
    /// `chunk`'s order. The segment's id is given at install (a manifest's
    /// `next_ctr` must not pass a segment that no manifest names yet and
    /// that is not uploaded: GC would take it for garbage, §11.7).
    fn prepare_seal(
        &self,
        chunk: &[(u64, Box<[u8]>)],
        cipher: Option<&strata_crypt::DataCipher>,
    ) -> (crate::layout::SegmentBuilder, Vec<Entry>) {
        // Should the preparation panic, the flag still goes (a commit
        // waiting for it would wait for ever).
        let _flag = PreparingSeal(self);
        let mut b = self.ds.data_segment(SegId {
            disk: self.id,
            gen: 0,
            ctr: 0,
        });
        let entries = chunk
            .iter()
            .map(|(vg, d)| b.add_data(*vg, d, cipher))
            .collect();
        (b, entries)
    }

    /// Start the upload of sealed segment `id` on a thread of its own (one
    /// that cannot start is noted as a failed upload, which the next
    /// writer or commit retries). False when the disk is being dropped.
    fn start_upload(&self, st: &mut State, id: SegId, bytes: Bytes) -> bool {
        let Some(me) = self.me.upgrade() else {
            return false;
        };
        let spawned = std::thread::Builder::new()
            .name("strata-upload".into())
            .spawn(move || me.upload_sealed(id, bytes));
        if let Err(e) = spawned {
            if let Some(s) = st.sealing.get_mut(&id) {
                s.in_flight = false;
                s.failed = Some(Error::new(
                    ErrorKind::Io,
                    format!("cannot start an upload thread: {e}"),
                ));
            }
        }
        true
    }

    /// Wait (state lock let go meanwhile) until fewer than
    /// [`UPLOADS_IN_FLIGHT`] sealed segments are not in the store yet,
    /// uploading again those whose upload failed (the writer fails with
    /// one that fails again).
    fn room_to_upload<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
    ) -> Result<MutexGuard<'a, State>> {
        while st.sealing.len() >= UPLOADS_IN_FLIGHT {
            let failed = st
                .sealing
                .iter_mut()
                .find_map(|(id, s)| Some((*id, s.retry()?)));
            match failed {
                Some((id, bytes)) => {
                    drop(st);
                    self.upload_sealed(id, bytes)?;
                    st = self.state.lock().unwrap();
                }
                None => st = self.uploaded.wait(st).unwrap(),
            }
        }
        Ok(st)
    }

    /// Move the grains of `chunk` that `dirty` still holds unchanged into
    /// segment `b`, prepared from them (`entries`, in `chunk`'s order),
    /// under the next counter; note where each went in `sealed`, and
    /// register the segment as being uploaded: its id and bytes. None
    /// (nothing sealed, nothing uploaded) when writes meanwhile replaced
    /// half the grains or more, or a commit took them: the segment would
    /// be mostly garbage, and they are sealed again or committed. A grain
    /// replaced since stays in the segment as garbage, as an overwritten
    /// one would.
    fn install_seal(
        &self,
        st: &mut State,
        mut b: crate::layout::SegmentBuilder,
        chunk: &[(u64, Box<[u8]>)],
        mut entries: Vec<Entry>,
    ) -> Option<(SegId, Bytes)> {
        let unchanged: Vec<usize> = (0..chunk.len())
            .filter(|&i| {
                let (vg, d) = &chunk[i];
                st.dirty.get(vg).and_then(|x| x.as_deref()) == Some(&d[..])
            })
            .collect();
        if unchanged.len() * 2 <= chunk.len() {
            return None;
        }
        let id = SegId {
            disk: self.id,
            gen: st.man.generation,
            ctr: st.next_ctr,
        };
        st.next_ctr += 1;
        st.seal_no += 1;
        let n = st.seal_no;
        b.id = id;
        for i in unchanged {
            let vg = chunk[i].0;
            st.dirty.remove(&vg);
            st.dirty_bytes -= GRAIN;
            entries[i].seg = id;
            st.sealed.insert(vg, (n, entries[i]));
        }
        let bytes = Bytes::from(b.seal(now_ms()));
        st.sealing.insert(
            id,
            Sealing {
                bytes: bytes.clone(),
                failed: None,
                in_flight: true,
            },
        );
        Some((id, bytes))
    }

    /// Upload sealed segment `id` (a thread of its own, or a commit
    /// retrying one that failed): on success its bytes go to the cache and
    /// reads take the grains from there.
    pub(super) fn upload_sealed(&self, id: SegId, bytes: Bytes) -> Result<()> {
        let r = self.put_segment(id, &bytes);
        if r.is_ok() {
            self.stats.lock().unwrap().uploaded_bytes += bytes.len() as u64;
        }
        let mut st = self.state.lock().unwrap();
        match &r {
            Ok(()) => {
                st.sealing.remove(&id);
            }
            Err(e) => {
                if let Some(s) = st.sealing.get_mut(&id) {
                    s.in_flight = false;
                    s.failed = Some(e.clone());
                }
            }
        }
        self.uploaded.notify_all();
        r
    }

    /// With the commit lock held: wait until the sealed segments `ids`
    /// are in the store, uploading again those whose upload failed.
    pub(super) fn wait_sealed(&self, ids: &std::collections::BTreeSet<SegId>) -> Result<()> {
        loop {
            let retry = {
                let mut st = self.state.lock().unwrap();
                while ids
                    .iter()
                    .any(|id| st.sealing.get(id).is_some_and(|s| s.in_flight))
                {
                    st = self.uploaded.wait(st).unwrap();
                }
                let failed = ids
                    .iter()
                    .find_map(|id| Some((*id, st.sealing.get_mut(id)?.retry()?)));
                match failed {
                    None => return Ok(()),
                    Some(f) => f,
                }
            };
            self.upload_sealed(retry.0, retry.1)?;
        }
    }

    /// Write `buf` at `offset` (any 512-byte alignment).
    pub(super) fn write_bytes(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.ensure_owner(false)?;
        let mut grains = Vec::new();
        let mut pos = 0usize;
        while pos < buf.len() {
            let at = offset + pos as u64;
            let vg = at / G;
            let within = (at % G) as usize;
            let take = (GRAIN - within).min(buf.len() - pos);
            if within == 0 && take == GRAIN {
                grains.push((vg, Some(buf[pos..pos + GRAIN].into())));
            } else {
                // Read, patch and put back under one lock, so two partial
                // writes to one grain do not lose each other.
                if !grains.is_empty() {
                    self.put_grains(std::mem::take(&mut grains))?;
                }
                let _one = self.rmw.lock().unwrap();
                let mut g = vec![0u8; GRAIN];
                self.read_grains(vg, &mut g)?;
                g[within..within + take].copy_from_slice(&buf[pos..pos + take]);
                self.put_grains(vec![(vg, Some(g.into_boxed_slice()))])?;
            }
            pos += take;
        }
        self.put_grains(grains)
    }

    /// Zero `len` bytes at `offset`: whole grains become holes; a partial
    /// grain is written with zeros only where it holds data (over a hole it
    /// reads as zeros already).
    pub(super) fn zero_bytes(&self, offset: u64, len: u64) -> Result<()> {
        self.ensure_owner(false)?;
        let end = offset + len;
        let mut at = offset;
        let mut holes = Vec::new();
        while at < end {
            let vg = at / G;
            let g_end = (vg + 1) * G;
            if at.is_multiple_of(G) && g_end <= end {
                holes.push((vg, None));
                at = g_end;
            } else {
                let upto = g_end.min(end);
                if self.holds_data(vg)? {
                    let zeros = vec![0u8; (upto - at) as usize];
                    self.write_bytes(&zeros, at)?;
                }
                at = upto;
            }
            if holes.len() >= 4096 {
                self.put_grains(std::mem::take(&mut holes))?;
            }
        }
        self.put_grains(holes)
    }

    /// Why zeroing `[offset, offset+len)` would write data (the work of a
    /// WRITE, which FAST_ZERO asks to refuse), or None when it only puts
    /// holes in the map: a partial grain that holds data.
    pub(super) fn slow_zeroing(&self, offset: u64, len: u64) -> Result<Option<String>> {
        if len == 0 {
            return Ok(None);
        }
        let end = offset + len;
        let last = (end - 1) / G;
        let mut partial = Vec::with_capacity(2);
        if !offset.is_multiple_of(G) {
            partial.push(offset / G);
        }
        if !end.is_multiple_of(G) && partial.last() != Some(&last) {
            partial.push(last);
        }
        for vg in partial {
            if self.holds_data(vg)? {
                return Ok(Some(format!(
                    "grain {vg} is zeroed in part and holds data, which takes a write"
                )));
            }
        }
        Ok(None)
    }

    /// Whether grain `vg` of this handle's version holds data, as block
    /// status reports it (written and not yet committed, the tail, or the
    /// map).
    pub(super) fn holds_data(&self, vg: u64) -> Result<bool> {
        let (overlay, man) = {
            let st = self.state.lock().unwrap();
            (self.overlay(&st, vg..vg + 1), st.man.clone())
        };
        if let Some(present) = overlay.get(&vg) {
            return Ok(*present);
        }
        let (root, levels) = self.root(&man);
        Ok(self.lookup(root, levels, vg)?.is_some())
    }

    /// PUT segment `id`, then keep it in the cache: a copy, so a cache
    /// that cannot keep it (a full or broken cache directory) is no error;
    /// reads then fetch it from the store.
    pub(super) fn put_segment(&self, id: SegId, bytes: &Bytes) -> Result<()> {
        self.store().put(&id.key(), bytes.clone())?;
        let _ = self.ds.cache.insert(id, bytes);
        Ok(())
    }

    /// Upload a segment a move made (compaction); the cache keeps the
    /// grains that were cached where they were (`hot`, their new slots),
    /// or all of it while it has room (`SegmentCache::insert_moved`).
    pub(super) fn put_moved(&self, id: SegId, bytes: &Bytes, hot: &[u32]) -> Result<()> {
        self.store().put(&id.key(), bytes.clone())?;
        let _ = self.ds.cache.insert_moved(id, bytes, hot);
        Ok(())
    }

    /// Upload sealed segments, two at a time, and keep them in the cache.
    pub(super) fn upload(&self, sealed: &[(SegId, Bytes)]) -> Result<()> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        std::thread::scope(|sc| {
            for _ in 0..sealed.len().min(2) {
                sc.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((id, bytes)) = sealed.get(i) else {
                        break;
                    };
                    if first_error.lock().unwrap().is_some() {
                        break;
                    }
                    if let Err(e) = self.put_segment(*id, bytes) {
                        first_error.lock().unwrap().get_or_insert(e);
                        break;
                    }
                });
            }
        });
        match first_error.into_inner().unwrap() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Copies of up to a segment's worth of `dirty`'s data grains (not holes,
/// not zeros), in virtual-grain order: what a seal prepares.
fn chunk_to_seal(st: &State) -> Vec<(u64, Box<[u8]>)> {
    st.dirty
        .iter()
        .filter_map(|(vg, d)| {
            let d = d.as_ref().filter(|d| d.iter().any(|&x| x != 0))?;
            Some((*vg, d.clone()))
        })
        .take(SEGMENT_GRAINS)
        .collect()
}

/// Whether two ciphers are the same one (or both none): a seal prepared
/// under one is installed only if the disk still writes under it.
fn same_cipher(
    a: &Option<Arc<strata_crypt::DataCipher>>,
    b: &Option<Arc<strata_crypt::DataCipher>>,
) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Held while a seal is prepared with the state let go: should the
/// preparation panic, `preparing_seal` is cleared as the guard goes and
/// whoever waits for it (a commit, writers ahead) is woken. (Done, the
/// writer clears it itself under the lock it installs the seal with, so
/// that no other writer starts on the same grains between.)
struct PreparingSeal<'a>(&'a ObjectDisk);

impl Drop for PreparingSeal<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut st = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
            st.preparing_seal = false;
            self.0.uploaded.notify_all();
        }
    }
}
