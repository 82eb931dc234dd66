//! Zeroing a disk: trim and WRITE_ZEROES (through the map, or by writing
//! zeros), the eager zero fill (create, extend and convert of an
//! eager-zeroed disk) and `punchzero`. The fill and `punchzero` run a
//! region at a time under its write stripes (`in_regions`), so a client
//! write waits for one region at most.

use strata_api::Provisioning;
use strata_block::{BlockDevice, ZeroOptions};
use strata_format::{GRAIN_BYTES, GRAIN_SHIFT, MAP_FANOUT, MAP_FANOUT_SHIFT};

use crate::error::{ErrorKind, Result};

use super::{abort_pieces, install_pieces, is_zero, DiskHandle, Piece, ZERO_CHUNK_BYTES};

static ZEROS: [u8; ZERO_CHUNK_BYTES] = [0; ZERO_CHUNK_BYTES];
/// Work unit of eager zeroing and of `punchzero`: one region's stripes are
/// held at a time, so a client write waits for one region at most.
const REGION_BYTES: u64 = 1 << 20;
/// Eager zeroing and `punchzero` commit this often.
const COMMIT_EVERY_BYTES: u64 = 64 << 20;

/// Work on one region: `(first grain, last grain, provisioning, versions
/// whose write stripes are held)`.
pub(crate) type RegionWork<'a> = dyn FnMut(u64, u64, Provisioning, &[u64]) -> Result<()> + 'a;

/// What [`DiskHandle::in_regions`] walks and how it reports: the byte
/// range, whose write stripes it holds, and the two callbacks it calls
/// between regions.
pub(crate) struct RegionWalk<'a> {
    /// First byte of the range (rounded down to a grain).
    pub offset: u64,
    /// Length of the range in bytes.
    pub len: u64,
    /// Hold the stripes of every disk's head (the versions a client may
    /// write), not only this version's; `each` gets their list, and the
    /// gate is `each`'s to take (defrag reads scattered grains first,
    /// without it, so a commit draining the gate does not wait for them).
    pub all_heads: bool,
    /// `(bytes done, bytes in all)`, after each region.
    pub progress: &'a mut dyn FnMut(u64, u64),
    /// Called with the bytes each region covered; may sleep or refuse.
    pub pace: &'a mut dyn FnMut(u64) -> Result<()>,
}

impl DiskHandle {
    /// Make `[offset, offset+len)` read as zeros on a disk of `prov` (the
    /// caller's `begin`). With `may_unmap` the map does the work: whole
    /// grains are given back (an eager-zeroed disk writes zeros into its
    /// private grains instead) and mapped partial grains are written with
    /// zeros. Without it (NBD's NO_HOLE) zeros are written through the
    /// write path, so every grain of the range ends up mapped and
    /// block status reports no hole there. `fast_only` is the caller's to
    /// check first ([`Self::slow_zeroing`]).
    pub(super) fn zero_impl(
        &self,
        offset: u64,
        len: u64,
        prov: Provisioning,
        opts: ZeroOptions,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if !opts.may_unmap {
            self.zero_by_writing(offset, len, prov)?;
        } else {
            self.zero_by_map(offset, len, prov)?;
        }
        if opts.fua {
            self.inner.commit(false)?;
        }
        Ok(())
    }

    /// Why zeroing `[offset, offset+len)` with `opts` on a disk of `prov`
    /// would write data blocks (the work of a WRITE, which FAST_ZERO asks
    /// to refuse), or None when it only changes the map. Looks without
    /// the stripes: a write racing with it can at worst make the zeroing
    /// write one more partial grain.
    pub(super) fn slow_zeroing(
        &self,
        offset: u64,
        len: u64,
        prov: Provisioning,
        opts: ZeroOptions,
    ) -> Result<Option<String>> {
        if !opts.may_unmap {
            return Ok(Some(
                "the range must stay allocated (NO_HOLE), which takes writing zeros into it".into(),
            ));
        }
        if prov == Provisioning::Eagerzeroedthick {
            return Ok(Some(
                "an eagerzeroedthick disk zeroes by writing zeros into its grains".into(),
            ));
        }
        if len == 0 {
            return Ok(None);
        }
        let end = offset + len;
        let last = (end - 1) >> GRAIN_SHIFT;
        let mut partial = Vec::with_capacity(2);
        if !offset.is_multiple_of(GRAIN_BYTES) {
            partial.push(offset >> GRAIN_SHIFT);
        }
        if !end.is_multiple_of(GRAIN_BYTES) && partial.last() != Some(&last) {
            partial.push(last);
        }
        let _gate = self.inner.gate.read();
        for v in partial {
            let mut g = Vec::with_capacity(1);
            self.inner
                .meta
                .lock()
                .lookup_range(self.version, v, 1, &mut g)?;
            if g.first().is_some_and(|&g| g != 0) {
                return Ok(Some(format!(
                    "grain {v} is zeroed in part and holds data, which takes a write"
                )));
            }
        }
        Ok(None)
    }

    /// Write zeros over `[offset, offset+len)` a chunk at a time through
    /// the write path: unmapped and shared grains get new grains, private
    /// ones are overwritten in place.
    fn zero_by_writing(&self, offset: u64, len: u64, prov: Provisioning) -> Result<()> {
        let chunk = ZERO_CHUNK_BYTES as u64;
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            // A long zeroing stops at a fail-stop as a run of writes would.
            self.inner.check_writable()?;
            let n = (end - pos).min(chunk - pos % chunk);
            self.write_guarded(&ZEROS[..n as usize], pos, prov)?;
            pos += n;
        }
        Ok(())
    }

    /// Zero `[offset, offset+len)` (not empty) through the map (see
    /// [`Self::zero_impl`]), under the gate and the range's write stripes.
    fn zero_by_map(&self, offset: u64, len: u64, prov: Provisioning) -> Result<()> {
        self.inner.maybe_checkpoint()?;
        {
            let _gate = self.inner.gate.read();
            let end = offset + len;
            let first = offset >> GRAIN_SHIFT;
            let last = (end - 1) >> GRAIN_SHIFT;
            let _stripes = self.inner.lock_stripes(self.version, first, last);
            // Whole grains in [a, b); partial grains at the edges are written with zeros.
            let a = offset.div_ceil(GRAIN_BYTES);
            let b = end >> GRAIN_SHIFT;
            if a >= b {
                self.zero_partial(offset, end, prov)?;
            } else {
                if offset < a << GRAIN_SHIFT {
                    self.zero_partial(offset, a << GRAIN_SHIFT, prov)?;
                }
                if end > b << GRAIN_SHIFT {
                    self.zero_partial(b << GRAIN_SHIFT, end, prov)?;
                }
                self.zero_grains(a, b, prov)?;
            }
            self.inner
                .mutations
                .fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    /// Zero `[s, t)` inside one or two grains: only mapped grains need work.
    fn zero_partial(&self, s: u64, t: u64, prov: Provisioning) -> Result<()> {
        let mut pos = s;
        while pos < t {
            let v = pos >> GRAIN_SHIFT;
            let stop = t.min((v + 1) << GRAIN_SHIFT);
            let (e, _) = self.inner.meta.lock().lookup_for_write(self.version, v)?;
            if e != 0 {
                self.write_locked(&ZEROS[..(stop - pos) as usize], pos, prov)?;
            }
            pos = stop;
        }
        Ok(())
    }

    /// Zero whole grains `[a, b)`. Thin and lazily zeroed disks give the
    /// grains back; an eager-zeroed disk keeps its private grains and writes
    /// zeros into them, so it stays fully allocated.
    fn zero_grains(&self, a: u64, b: u64, prov: Provisioning) -> Result<()> {
        let leaf_span = MAP_FANOUT as u64;
        let mut leaf = a >> MAP_FANOUT_SHIFT;
        while leaf << MAP_FANOUT_SHIFT < b {
            let ls = (leaf << MAP_FANOUT_SHIFT).max(a);
            let lt = ((leaf + 1) << MAP_FANOUT_SHIFT).min(b);
            if prov == Provisioning::Eagerzeroedthick {
                self.zero_in_place(ls, lt)?;
            } else if lt - ls == leaf_span {
                let mut m = self.inner.meta.lock();
                self.inner
                    .guarded(&mut m, |m| m.unmap_leaf(self.version, leaf))?;
            } else {
                let mut m = self.inner.meta.lock();
                self.inner.guarded(&mut m, |m| {
                    for v in m.mapped_in(self.version, ls, lt)? {
                        m.unmap_grain(self.version, v)?;
                    }
                    Ok(())
                })?;
            }
            leaf += 1;
        }
        Ok(())
    }

    fn zero_in_place(&self, ls: u64, lt: u64) -> Result<()> {
        let key = self.data_cipher().map_or(0, |x| x.write_bits());
        let mut writes = Vec::new();
        {
            let mut m = self.inner.meta.lock();
            self.inner.guarded(&mut m, |m| {
                for v in m.mapped_in(self.version, ls, lt)? {
                    let (e, exclusive) = m.lookup_for_write(self.version, v)?;
                    // In place only under the key zeros are written with
                    // (an own-key clone's inherited grain is not).
                    if exclusive && strata_format::leaf_key(e) == key {
                        writes.push((v, strata_format::leaf_grain(e)));
                    } else {
                        m.unmap_grain(self.version, v)?;
                    }
                }
                Ok(())
            })?;
        }
        for (v, g) in writes {
            let zeros = self.zeros_at(v, 1);
            self.inner.pool.write_at(&zeros, g << GRAIN_SHIFT)?;
        }
        Ok(())
    }

    /// `n` grains of zeros as stored at virtual grain `v`: the zeros
    /// themselves, or their encryption on an encrypted disk (FORMAT.md
    /// §16.1: a written zero is data, read back through the key).
    fn zeros_at(&self, v: u64, n: u64) -> std::borrow::Cow<'static, [u8]> {
        let len = (n * GRAIN_BYTES) as usize;
        match self.data_cipher() {
            None if len <= ZEROS.len() => std::borrow::Cow::Borrowed(&ZEROS[..len]),
            None => std::borrow::Cow::Owned(vec![0; len]),
            Some(x) => {
                let mut b = vec![0u8; len];
                x.writer()
                    .encrypt(&mut b, (v << GRAIN_SHIFT) / super::SECTOR);
                std::borrow::Cow::Owned(b)
            }
        }
    }

    /// Allocate every unmapped grain of `[offset, offset+len)` and write
    /// zeros into it for real (eager zeroing, FORMAT.md §7.2): the
    /// eager-zeroed create, extend and convert. Grains already mapped keep
    /// their data; which are unmapped is decided under the write stripes,
    /// so a client write racing with the fill is never overwritten.
    pub(crate) fn fill_zeros(
        &self,
        offset: u64,
        len: u64,
        progress: &mut dyn FnMut(u64, u64),
        pace: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        let walk = RegionWalk {
            offset,
            len,
            all_heads: false,
            progress,
            pace,
        };
        self.in_regions(walk, &mut |first, last, prov, _| {
            self.fill_locked(first, last, prov)
        })
    }

    /// Run `each(first, last, provisioning)` over the grains of `walk`'s
    /// range a region at a time, with the gate and the region's write
    /// stripes held (a client write waits for one region at most). Between
    /// regions: bounded metadata, a commit every `COMMIT_EVERY_BYTES`,
    /// `walk.progress`, `walk.pace` with the bytes covered; a commit at the
    /// end. A region that meets ENOSPC while freed space is on its way is
    /// tried once more after making room. (See [`RegionWalk::all_heads`].)
    pub(crate) fn in_regions(&self, walk: RegionWalk<'_>, each: &mut RegionWork<'_>) -> Result<()> {
        let RegionWalk {
            offset,
            len,
            all_heads,
            progress,
            pace,
        } = walk;
        let end = offset + len;
        let mut pos = offset >> GRAIN_SHIFT << GRAIN_SHIFT;
        let mut since_commit = 0u64;
        while pos < end {
            let prov = self.begin(0, 0, true)?;
            let region_end = end.min((pos / REGION_BYTES + 1) * REGION_BYTES);
            let first = pos >> GRAIN_SHIFT;
            let last = (region_end - 1) >> GRAIN_SHIFT;
            self.inner.maybe_checkpoint()?;
            let mut attempt = || {
                let _gate = (!all_heads).then(|| self.inner.gate.read());
                let held = if all_heads {
                    self.inner.meta.lock().head_versions()
                } else {
                    vec![self.version]
                };
                let _stripes = self.inner.lock_stripes_of(&held, first, last);
                for &h in &held {
                    self.inner.settled.written(h, first, last);
                }
                each(first, last, prov, &held)
            };
            match attempt() {
                Err(e) if e.kind == ErrorKind::NoSpace && self.inner.space_to_come() => {
                    self.inner.make_space()?;
                    attempt()?;
                }
                r => r?,
            }
            since_commit += region_end - pos;
            if since_commit >= COMMIT_EVERY_BYTES {
                self.inner.commit(false)?;
                since_commit = 0;
            }
            // The region is done (also for a pace that stops here).
            progress(region_end - offset, len);
            pace(region_end - pos)?;
            pos = region_end;
        }
        self.inner.commit(false)
    }

    fn fill_locked(&self, first: u64, last: u64, prov: Provisioning) -> Result<()> {
        let _fence = self.inner.fail_on_panic();
        let mut pieces = Vec::new();
        {
            let mut m = self.inner.meta.lock();
            let mut holes = Vec::new();
            m.walk(self.version, first, last + 1, &mut |v, c, g| {
                if g == 0 {
                    holes.push((v, c))
                }
            })?;
            for (v, c) in holes {
                for v in v..v + c {
                    pieces.push(Piece {
                        v,
                        grain: 0,
                        old: 0,
                        old_key: 0,
                        old_packed: false,
                        new: true,
                    });
                }
            }
            if pieces.is_empty() {
                return Ok(());
            }
            self.allocate(&mut m, &mut pieces, prov)?;
        }
        // Physically adjacent grains go out as one write.
        let mut i = 0;
        while i < pieces.len() {
            let mut j = i + 1;
            while j < pieces.len() && pieces[j].grain == pieces[j - 1].grain + 1 {
                j += 1;
            }
            let at = pieces[i].grain << GRAIN_SHIFT;
            let n = (j - i) as u64;
            let r = match self.cipher {
                None => self.inner.pool.write_zeros(at, n * GRAIN_BYTES),
                // Virtually adjacent too: the holes were filled in order.
                Some(_) if pieces[j - 1].v == pieces[i].v + n - 1 => {
                    self.inner.pool.write_at(&self.zeros_at(pieces[i].v, n), at)
                }
                Some(_) => (i..j).try_for_each(|k| {
                    let zeros = self.zeros_at(pieces[k].v, 1);
                    self.inner
                        .pool
                        .write_at(&zeros, pieces[k].grain << GRAIN_SHIFT)
                }),
            };
            if let Err(e) = r {
                abort_pieces(&self.inner, &pieces)?;
                return Err(e.into());
            }
            i = j;
        }
        let key = self.data_cipher().map_or(0, |x| x.write_bits());
        install_pieces(&self.inner, self.version, &pieces, key)
    }

    /// Release the head's grains that read all zeros (`punchzero`, FORMAT.md
    /// §7.4), a region at a time under its write stripes. Returns (bytes
    /// scanned, bytes released).
    pub(crate) fn punch_zero(
        &self,
        progress: &mut dyn FnMut(u64, u64),
        pace: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<(u64, u64)> {
        let size = self.size_bytes();
        let mut released = 0u64;
        let mut buf = vec![0u8; REGION_BYTES as usize];
        let walk = RegionWalk {
            offset: 0,
            len: size,
            all_heads: false,
            progress,
            pace,
        };
        self.in_regions(walk, &mut |first, last, _, _| {
            let zero = self.zero_grains_in(first, last, &mut buf)?;
            if !zero.is_empty() {
                let mut m = self.inner.meta.lock();
                self.inner.guarded(&mut m, |m| {
                    for &v in &zero {
                        m.unmap_grain(self.version, v)?;
                    }
                    Ok(())
                })?;
                released += zero.len() as u64 * GRAIN_BYTES;
                self.inner
                    .mutations
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
            }
            Ok(())
        })?;
        Ok((size, released))
    }

    /// The mapped grains of `[first, last]` that read all zeros; adjacent
    /// physical grains are read at once into `buf` (one region long).
    fn zero_grains_in(&self, first: u64, last: u64, buf: &mut [u8]) -> Result<Vec<u64>> {
        let mut grains = Vec::with_capacity((last - first + 1) as usize);
        self.inner.meta.lock().lookup_entries(
            self.version,
            first,
            last - first + 1,
            &mut grains,
        )?;
        let cipher = self.data_cipher();
        let mut zero = Vec::new();
        let mut i = 0;
        while i < grains.len() {
            // A packed entry is never a run of zeros on disk: the pack
            // pass leaves zero grains raw, for this scan (§18.8).
            if grains[i] == 0 || strata_format::leaf_packed(grains[i]) {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < grains.len() && grains[j] == grains[i] + (j - i) as u64 {
                j += 1;
            }
            // Leaf entries: a run is adjacent grains under one key index.
            let n = (j - i) * GRAIN_BYTES as usize;
            let at = strata_format::leaf_grain(grains[i]) << GRAIN_SHIFT;
            self.inner.pool.read_at(&mut buf[..n], at)?;
            // The region's stripes are held: a deep rekey cannot move it.
            if let Some(x) = &cipher {
                let v = first + i as u64;
                let key = super::keyed_at(x, strata_format::leaf_key(grains[i]), v)?;
                key.decrypt(&mut buf[..n], (v << GRAIN_SHIFT) / super::SECTOR);
            }
            for (k, g) in buf[..n].chunks(GRAIN_BYTES as usize).enumerate() {
                if is_zero(g) {
                    zero.push(first + (i + k) as u64);
                }
            }
            i = j;
        }
        Ok(zero)
    }
}
