//! The I/O path: a disk (or a snapshot of one) as a [`BlockDevice`].
//!
//! A write is done in three steps: (1) under the metadata lock, classify each
//! grain as *in place* (private to this version, see
//! `Meta::lookup_for_write`) or *new* and allocate the new ones; (2) without
//! the lock, write data, reading the old grain first for a sub-grain write to
//! a new grain; adjacent physical grains go out as one write; (3) under the
//! lock, point the map at the new grains. Readers never see a new grain
//! before its data is written, and a grain is only written in place when no
//! other version can see it.
//!
//! Zeroing (trim, WRITE_ZEROES, the eager zero fill, `punchzero`) is the
//! submodule `zero`.

mod packed;
mod zero;

use std::sync::Arc;

use strata_api::Provisioning;
use strata_block::{
    check_range, hold_read, BlockDevice, BlockError, BlockResult, Extent, FilePiece, Held, IoPlan,
    Planned, ZeroOptions,
};
use strata_format::{GRAIN_BYTES, GRAIN_SHIFT, MAP_FANOUT_SHIFT};

use crate::error::{err, Error, ErrorKind, Result};
use crate::meta::{grain_runs, DataSlot, Meta, Place};
use crate::store::{CipherCell, SpaceRequest, Store};
use strata_crypt::DataCipher;
pub(crate) use zero::RegionWalk;

/// Most grains a block-status call looks at (bounds the work per request).
const STATUS_GRAINS_MAX: u64 = 1 << 20;
/// Largest single zero-fill write.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// A trim, and zero detection's WRITE_ZEROES: the map may give the
/// grains back.
const UNMAP: ZeroOptions = ZeroOptions {
    may_unmap: true,
    fast_only: false,
    fua: false,
};

/// Bytes per unit of the data cipher (FORMAT.md §16.1).
const SECTOR: u64 = strata_crypt::SECTOR_BYTES as u64;

/// `f` given `buf`, written at `offset`, encrypted into a buffer of its
/// own (never in the client's or guest's memory). Sectors are independent, so a
/// sub-grain write's sectors are encrypted alone, and the write path
/// patches them into a grain as it would plaintext.
///
/// The buffer is the thread's own, kept between writes up to
/// [`SEAL_KEPT_BYTES`] (a fresh mapping per write cost a third of a
/// 1 MiB write's time); a larger write gets one of its own.
fn with_sealed<R>(x: &DataCipher, buf: &[u8], offset: u64, f: impl FnOnce(&[u8]) -> R) -> R {
    let x = x.writer();
    use std::cell::RefCell;
    use strata_block::AlignedBuf;
    thread_local! {
        static SEAL: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::zeroed(0));
    }
    if buf.len() > SEAL_KEPT_BYTES {
        let mut out = AlignedBuf::zeroed(buf.len());
        x.encrypt_to(buf, &mut out, offset / SECTOR);
        return f(&out);
    }
    SEAL.with(|cell| {
        let mut out = cell.borrow_mut();
        out.set_len(buf.len());
        x.encrypt_to(buf, &mut out, offset / SECTOR);
        f(&out)
    })
}

/// A planned read's step once its pieces are in (`IoPlan::after_read`):
/// decrypt each piece in place under its key index (`keys`, one per
/// piece, checked by `mapped_runs`); holes were filled with zeros and stay
/// so.
fn decrypt_after(
    x: Arc<DataCipher>,
    pieces: &[FilePiece],
    keys: Vec<u8>,
    offset: u64,
) -> strata_block::AfterRead {
    let runs: Vec<(usize, usize, u8)> = pieces
        .iter()
        .zip(keys)
        .map(|(p, k)| (p.buf_offset, p.len, k))
        .collect();
    Box::new(move |buf: &mut [u8], _: &[u8]| {
        for (at, len, k) in runs {
            let key = x.keyed(k).expect("mapped_runs checked every key index");
            key.decrypt(&mut buf[at..at + len], (offset + at as u64) / SECTOR);
        }
        Ok(())
    })
}

/// An encrypted disk's ciphertext of a planned write, in the plan's own
/// buffer (the request's, a guest's memory, is not touched). Called with
/// the write's stripes held (§16.4).
fn sealed_source(x: &DataCipher, buf: &[u8], offset: u64) -> strata_block::AlignedBuf {
    // From the process's pool: a fresh 1 MiB mapping per write and its
    // page faults halved direct 1 MiB writes (PERFORMANCE.md).
    let mut b = strata_block::AlignedBuf::recycled(buf.len());
    x.writer().encrypt_to(buf, &mut b, offset / SECTOR);
    b
}

/// Grain `g`, read from piece `p`'s old grain, from the key it was written
/// under to the key of the write it goes into (sectors are independent
/// and their tweak is virtual: only the key changes).
fn rekey_grain(x: &DataCipher, g: &mut [u8], p: &Piece) -> Result<()> {
    let sector = (p.v << GRAIN_SHIFT) / SECTOR;
    keyed_at(x, p.old_key, p.v)?.decrypt(g, sector);
    x.writer().encrypt(g, sector);
    Ok(())
}

/// The key of the grain at virtual grain `v`, whose entry carries key
/// index `bits`; a damaged-map error when the keyring has none.
pub(crate) fn keyed_at(x: &DataCipher, bits: u8, v: u64) -> Result<strata_crypt::Keyed<'_>> {
    x.keyed(bits).ok_or_else(|| {
        crate::meta::corrupt(format!(
            "virtual grain {v}: the map names key index {bits}, which the keyring does not have"
        ))
    })
}

/// Largest encrypted write whose buffer a thread keeps for the next.
const SEAL_KEPT_BYTES: usize = 4 << 20;

/// Whether `buf` is all zeros; stops at the first non-zero word.
pub(crate) fn is_zero(buf: &[u8]) -> bool {
    // SAFETY: u128 has no invalid bit patterns; align_to only splits.
    let (head, words, tail) = unsafe { buf.align_to::<u128>() };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

/// Built by `Datastore::open_disk` with named fields (three ids of the same
/// type must not be swappable by position).
pub struct DiskHandle {
    pub(crate) inner: Arc<Store>,
    /// The disk's I/O limits, shared by all its handles.
    pub(crate) throttle: Arc<crate::throttle::Throttle>,
    pub(crate) disk_id: u64,
    /// The snapshot exported read-only, or None for the live disk.
    pub(crate) snapshot_id: Option<u64>,
    /// The version whose map this handle reads and writes.
    pub(crate) version: u64,
    pub(crate) read_only: bool,
    pub(crate) name: String,
    /// The disk's data cipher when it is encrypted (FORMAT.md §16.1):
    /// every grain read is decrypted and every write encrypted with it,
    /// the sector's virtual number as tweak. Shared with the lineage's
    /// held keys; a deep rekey moves its split (§16.4), so a read takes it
    /// with its map lookup and a write while it holds its stripes.
    pub(crate) cipher: Option<Arc<CipherCell>>,
    /// The keys `cipher` came from, held by the datastore until `lock`
    /// drops them; the handle refuses its clients' I/O from then on (one
    /// atomic load per request).
    pub(crate) keys: Option<std::sync::Weak<()>>,
    /// Encrypted and opened without its keys (`open_keyless`): a client's
    /// read or write is refused.
    pub(crate) locked: bool,
}

/// One grain's part of a write.
struct Piece {
    v: u64,
    grain: u64,
    /// Old grain to read for a sub-grain write to a new grain (0 = zeros).
    old: u64,
    /// The key index the old grain was written under (FORMAT.md §16.4).
    old_key: u8,
    /// The old grain is a packed stream grain (§18.4).
    old_packed: bool,
    new: bool,
}

impl DiskHandle {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// (size, provisioning), or Gone if the disk or snapshot was deleted.
    fn state(&self, m: &Meta) -> Result<(u64, Provisioning)> {
        let d = m.catalog.disk_by_id(self.disk_id).ok_or_else(|| {
            Error::new(ErrorKind::Gone, format!("disk '{}' was removed", self.name))
        })?;
        match self.snapshot_id {
            None => Ok((d.size_bytes, d.provisioning)),
            Some(sid) => {
                let s = m
                    .catalog
                    .snapshots
                    .iter()
                    .find(|s| s.id == sid)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Gone,
                            format!("snapshot '{}' was deleted", self.name),
                        )
                    })?;
                Ok((s.size_bytes, d.provisioning))
            }
        }
    }

    fn begin(&self, offset: u64, len: u64, write: bool) -> Result<Provisioning> {
        if write {
            if self.read_only {
                return err(ErrorKind::Refused, format!("'{}' is read-only", self.name));
            }
            self.inner.check_writable()?;
        }
        let dropped = || self.keys.as_ref().is_some_and(|k| k.strong_count() == 0);
        if len > 0 && (self.locked || dropped()) {
            return Err(strata_crypt::locked_error(&self.name));
        }
        if len > 0 {
            // A client's command (a region of background work asks with 0).
            self.inner
                .client_ops
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let m = self.inner.meta.lock();
        let (size, prov) = self.state(&m)?;
        check_range(offset, len, size)?;
        Ok(prov)
    }

    // ------------------------------------------------------------ read

    /// The runs of `[offset, offset + len)` (`len` > 0) from one map
    /// lookup, in order: physically adjacent grains under one key index
    /// make one run, and so do adjacent holes. Every run's key index is
    /// one the disk has (else the map is damaged: an error, nothing
    /// read). The caller holds the gate.
    fn mapped_runs(&self, offset: u64, len: u64) -> Result<(Vec<Run>, Option<Arc<DataCipher>>)> {
        let first = offset >> GRAIN_SHIFT;
        let last = (offset + len - 1) >> GRAIN_SHIFT;
        let mut entries = Vec::with_capacity((last - first + 1) as usize);
        let m = &mut self.inner.meta.lock();
        m.lookup_entries(self.version, first, last - first + 1, &mut entries)?;
        // With the lookup, under the same lock: the key the grains found
        // were written under, even if a deep rekey moves them next.
        let cipher = self.data_cipher();
        let runs = runs_of(&entries, offset, len);
        for r in runs.iter().filter(|r| r.key != 0) {
            if cipher.as_ref().and_then(|x| x.keyed(r.key)).is_none() {
                return Err(crate::meta::corrupt(format!(
                    "'{}' at byte {}: the map names key index {}, which {} (a damaged map entry)",
                    self.name,
                    offset + r.buf.start as u64,
                    r.key,
                    if cipher.is_some() {
                        "its keyring does not have"
                    } else {
                        "a plain disk never has"
                    }
                )));
            }
        }
        Ok((runs, cipher))
    }

    /// The data cipher as it stands (None: a plain disk). A write calls it
    /// with its stripes held, a read with its map lookup (§16.4).
    pub(crate) fn data_cipher(&self) -> Option<Arc<DataCipher>> {
        self.cipher.as_ref().map(|c| c.lock().clone())
    }

    /// Read `buf` at `offset`; unmapped grains read as zeros and are
    /// reported as [`Fill::Zeros`], from the same lookup that finds the data.
    fn read_impl(&self, buf: &mut [u8], offset: u64) -> Result<strata_block::ReadFill> {
        use strata_block::{Fill, ReadFill};
        self.begin(offset, buf.len() as u64, false)?;
        let mut fill = ReadFill::new();
        if buf.is_empty() {
            return Ok(fill);
        }
        let _gate = self.inner.gate.read();
        let (runs, cipher) = self.mapped_runs(offset, buf.len() as u64)?;
        // Runs of physically adjacent grains become one read; when there
        // are several, all are announced to the pool first, so a
        // fragmented range's reads reach the device together rather than
        // one after another.
        if runs.iter().filter(|r| r.pool.is_some()).nth(1).is_some() {
            for r in &runs {
                if let Some(at) = r.pool {
                    self.inner.pool.will_need(at, r.buf.len() as u64);
                }
            }
        }
        let mut memo = crate::compress::Unpacked::default();
        for r in runs {
            let len = r.buf.len() as u64;
            let sector = (offset + r.buf.start as u64) / SECTOR;
            // (Taken before `r.buf` moves into the slice.)
            let place = r.packed.then(|| packed_place(&r, offset));
            let dst = &mut buf[r.buf];
            match (r.pool, place) {
                (None, _) => {
                    dst.fill(0);
                    fill.push(len, Fill::Zeros);
                }
                (Some(_), Some(place)) => {
                    self.read_packed(dst, place, cipher.is_some(), &mut memo)?;
                    fill.push(len, Fill::Data);
                }
                (Some(at), None) => {
                    self.inner.pool.read_at(dst, at)?;
                    if let Some(x) = &cipher {
                        let key = x.keyed(r.key).expect("mapped_runs checked every key index");
                        key.decrypt(dst, sector);
                    }
                    fill.push(len, Fill::Data);
                }
            }
        }
        Ok(fill)
    }

    /// Plan a read for the caller to carry out from the pool's
    /// descriptor `fd` (`BlockDevice::plan_read`): the same lookup as
    /// `read_impl`, holes filled here, data left as pieces, the gate held
    /// by the plan until the caller is done. A range with packed grains
    /// reads their stream grains into the plan's buffer and decompresses
    /// them when they are in (`packed::plan`).
    fn plan_read_impl(
        &self,
        fd: std::os::fd::RawFd,
        buf: &mut [u8],
        offset: u64,
        wait: bool,
    ) -> Result<Planned> {
        use strata_block::{Fill, ReadFill};
        let len = buf.len() as u64;
        self.begin(offset, len, false)?;
        let mut fill = ReadFill::new();
        let mut pieces = Vec::new();
        if buf.is_empty() {
            return Ok(Planned::Plan(IoPlan {
                fd,
                write: false,
                pieces,
                fill,
                holds: Vec::new(),
                source: None,
                after_read: None,
            }));
        }
        // Held until the caller's reads are in: the grains read must not be
        // freed and reused meanwhile.
        let Some(gate) = hold_read(&self.inner.gate, wait) else {
            return Ok(Planned::Busy);
        };
        let (runs, cipher) = self.mapped_runs(offset, len)?;
        if let Some(r) = runs.iter().find(|r| r.packed) {
            if cipher.is_some() {
                return Err(self.packed_on_encrypted(offset + r.buf.start as u64));
            }
            let gate = Box::new(Held(gate));
            return Ok(Planned::Plan(packed::plan(fd, buf, offset, &runs, gate)));
        }
        let mut keys = Vec::new();
        for r in runs {
            let n = r.buf.len();
            match r.pool {
                None => {
                    buf[r.buf].fill(0);
                    fill.push(n as u64, Fill::Zeros);
                }
                Some(at) => {
                    keys.push(r.key);
                    pieces.push(FilePiece {
                        buf_offset: r.buf.start,
                        file_offset: at,
                        len: n,
                    });
                    fill.push(n as u64, Fill::Data);
                }
            }
        }
        let after_read = cipher.map(|x| decrypt_after(x, &pieces, keys, offset));
        Ok(Planned::Plan(IoPlan {
            fd,
            write: false,
            pieces,
            fill,
            holds: vec![Box::new(Held(gate))],
            source: None,
            after_read,
        }))
    }

    /// Start reading the data of `[offset, offset + len)` into the host's
    /// page cache without waiting for it (a hint: errors are dropped, and
    /// a range past the end is cut). At most [`PREFETCH_MAX_BYTES`] per call.
    fn prefetch_impl(&self, offset: u64, len: u64) -> Result<()> {
        let size = {
            let m = self.inner.meta.lock();
            self.state(&m)?.0
        };
        let end = offset.saturating_add(len.min(PREFETCH_MAX_BYTES)).min(size);
        if offset >= end {
            return Ok(());
        }
        let first = offset >> GRAIN_SHIFT;
        let last = (end - 1) >> GRAIN_SHIFT;
        let mut grains = Vec::with_capacity((last - first + 1) as usize);
        self.inner
            .meta
            .lock()
            .lookup_range(self.version, first, last - first + 1, &mut grains)?;
        for (i, j, g0) in grain_runs(&grains) {
            if g0 != 0 {
                self.inner
                    .pool
                    .will_need(g0 << GRAIN_SHIFT, (j - i) as u64 * GRAIN_BYTES);
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ write

    /// Plan a write for the caller to carry out (`BlockDevice::plan_write`)
    /// into the pool's direct descriptor `fd`: in place where the grains
    /// are this version's alone, and to grains allocated now where they
    /// are not (a hole, a grain a snapshot shares), which the plan's
    /// finish step (`Install`) installs once the data is in. Zeros a thin
    /// disk would not store, a writer that must help with a checkpoint, a
    /// range another write holds and a datastore out of space are left to
    /// `write_impl`: None. The plan holds the gate and the range's stripes,
    /// as `write_impl` holds them for its call, and its finish step counts
    /// the write in `mutations`, so the next flush syncs it.
    fn plan_write_impl(
        &self,
        fd: std::os::fd::RawFd,
        buf: &[u8],
        offset: u64,
        wait: bool,
    ) -> Result<Option<Planned>> {
        use std::sync::atomic::Ordering::Relaxed;
        let len = buf.len() as u64;
        let prov = self.begin(offset, len, true)?;
        if buf.is_empty()
            || (prov == Provisioning::Thin
                && self.inner.detect_zeroes.load(Relaxed)
                && is_zero(buf))
            || self.inner.within_bounds().is_err()
        {
            return Ok(None);
        }
        let first = offset >> GRAIN_SHIFT;
        let last = (offset + len - 1) >> GRAIN_SHIFT;
        let Some(gate) = hold_read(&self.inner.gate, wait) else {
            return Ok(Some(Planned::Busy));
        };
        // A range another write holds (its own planned writes among them)
        // is left to `write_at` too: it waits for the stripes on the
        // caller's worker, where waiting here would stall the caller's
        // ring and every request behind it.
        let Some(stripes) = self.inner.hold_stripes(self.version, first, last, wait) else {
            return Ok(None);
        };
        // With the stripes held (§16.4): the key this write goes under.
        let cipher = self.data_cipher();
        let key = cipher.as_ref().map_or(0, |x| x.write_bits());
        let mut m = self.inner.meta.lock();
        // Planned writes are 4 KiB-aligned, so every grain they touch is
        // whole: a new grain needs nothing of the old one.
        let mut pieces = pieces_for_write(&mut m, self.version, (first, last), key)?;
        let allocates = pieces.iter().any(|p| p.new);
        if allocates {
            let _fence = self.inner.fail_on_panic();
            match self.allocate(&mut m, &mut pieces, prov) {
                Ok(()) => {}
                // The worker's path reclaims space and tries again.
                Err(e) if e.kind == ErrorKind::NoSpace => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        drop(m);
        let (finish, pieces) = self.write_plan_steps(pieces, allocates, (offset, len), key);
        let source = cipher.map(|x| sealed_source(&x, buf, offset));
        Ok(Some(Planned::Plan(IoPlan {
            fd,
            write: true,
            pieces,
            source,
            after_read: None,
            fill: strata_block::ReadFill::all_data(len),
            // Released in this order: the finish step (install, or count
            // an overwrite), then the stripes, then the gate.
            holds: vec![finish, Box::new(Held(stripes)), Box::new(Held(gate))],
        })))
    }

    /// A planned write's finish step (install the new grains, or count an
    /// overwrite) and the pieces of the pool file its data goes to.
    /// `key` is the key index the new grains are written under.
    fn write_plan_steps(
        &self,
        pieces: Vec<Piece>,
        allocates: bool,
        (offset, len): (u64, u64),
        key: u8,
    ) -> (Box<dyn strata_block::IoHold>, Vec<FilePiece>) {
        let grains: Vec<u64> = pieces.iter().map(|p| p.grain).collect();
        let finish: Box<dyn strata_block::IoHold> = if allocates {
            Box::new(Install {
                store: self.inner.clone(),
                version: self.version,
                pieces,
                key,
            })
        } else {
            Box::new(Counted(self.inner.clone()))
        };
        let pieces = runs_of(&grains, offset, len)
            .into_iter()
            .map(|r| FilePiece {
                buf_offset: r.buf.start,
                file_offset: r.pool.expect("every grain is mapped"),
                len: r.buf.len(),
            })
            .collect();
        (finish, pieces)
    }

    /// Write with the gate and stripes already held by the caller.
    fn write_locked(&self, buf: &[u8], offset: u64, prov: Provisioning) -> Result<()> {
        let _fence = self.inner.fail_on_panic();
        let first = offset >> GRAIN_SHIFT;
        let last = (offset + buf.len() as u64 - 1) >> GRAIN_SHIFT;
        let cipher = self.data_cipher();
        let key = cipher.as_ref().map_or(0, |x| x.write_bits());
        let pieces = {
            let mut m = self.inner.meta.lock();
            let mut pieces = pieces_for_write(&mut m, self.version, (first, last), key)?;
            self.allocate(&mut m, &mut pieces, prov)?;
            pieces
        };
        let written = match &cipher {
            Some(x) => with_sealed(x, buf, offset, |data| {
                self.write_data(data, offset, &pieces, Some(x))
            }),
            None => self.write_data(buf, offset, &pieces, None),
        };
        if let Err(e) = written {
            abort_pieces(&self.inner, &pieces)?;
            return Err(e);
        }
        install_pieces(&self.inner, self.version, &pieces, key)
    }

    /// Allocate the new pieces' grains (next to each other and to the grain
    /// before the first), under the datastore's space rule. On error none
    /// stays allocated.
    fn allocate(&self, m: &mut Meta, pieces: &mut [Piece], prov: Provisioning) -> Result<()> {
        let wanted = pieces.iter().filter(|p| p.new).count() as u64;
        if wanted == 0 {
            return Ok(());
        }
        let own = self.check_space(m, wanted, prov)?;
        // A thick disk filling its own reservation writes where the host
        // holds space for it (FORMAT.md §7.1).
        let place = if own { Place::Backed } else { Place::Any };
        let cap = self.inner.capacity_grains(m);
        let first = pieces[0].v;
        let mut prev: Option<u64> = if first > 0 {
            let (e, _) = m.lookup_for_write(self.version, first - 1)?;
            (e != 0).then_some(strata_format::leaf_grain(e))
        } else {
            None
        };
        for i in 0..pieces.len() {
            if pieces[i].new {
                let at = DataSlot {
                    owner: self.version,
                    v: pieces[i].v,
                    hint: prev,
                };
                match m.alloc_data_grain(at, cap, place) {
                    Ok(g) => pieces[i].grain = g,
                    Err(e) => {
                        for p in pieces[..i].iter().filter(|p| p.new) {
                            m.abort_alloc(p.grain)
                                .map_err(|e| self.inner.fail_stop(e))?;
                        }
                        return Err(e);
                    }
                }
            }
            prev = Some(pieces[i].grain);
        }
        if m.take_ready_wanted() {
            self.inner.readier.kick();
        }
        Ok(())
    }

    /// Apply the datastore's space rule to `wanted` new grains: a thick
    /// disk filling its own reservation adds nothing. Returns whether the
    /// grains fill the disk's own reservation.
    fn check_space(&self, m: &Meta, wanted: u64, prov: Provisioning) -> Result<bool> {
        // A live handle's version is its disk's head.
        let own_reserved = if prov.is_thick() && self.snapshot_id.is_none() {
            m.catalog
                .disk_by_id(self.disk_id)
                .map(|d| m.unwritten_grains(d))
                .unwrap_or(0)
        } else {
            0
        };
        self.inner.check_space(
            m,
            SpaceRequest {
                reserve: false,
                grains: wanted,
                own_reserved,
            },
        )?;
        Ok(own_reserved >= wanted)
    }

    /// What a sub-grain write to new piece `p` keeps of the grain it
    /// replaces, as stored under the write's key: the old grain's bytes,
    /// or (over a hole) zeros, encrypted on an encrypted disk (FORMAT.md
    /// §16.1: a written zero is data).
    fn rest_of_grain(&self, p: &Piece, cipher: Option<&DataCipher>) -> Result<Vec<u8>> {
        let mut g = vec![0u8; GRAIN_BYTES as usize];
        if p.old_packed {
            let mut memo = crate::compress::Unpacked::default();
            self.read_packed(&mut g, (p.old, p.v, 0), cipher.is_some(), &mut memo)?;
        } else if p.old != 0 {
            self.inner.pool.read_at(&mut g, p.old << GRAIN_SHIFT)?;
            if let Some(x) = cipher.filter(|x| x.write_bits() != p.old_key) {
                // The old grain is under another key (an own-key clone's
                // first write over what it inherited): its rest goes under
                // the key of this write.
                rekey_grain(x, &mut g, p)?;
            }
        } else if let Some(x) = cipher {
            x.writer().encrypt(&mut g, (p.v << GRAIN_SHIFT) / SECTOR);
        }
        Ok(g)
    }

    /// Write `buf` (ciphertext under `cipher`'s writer on an encrypted
    /// disk) into the pieces' grains.
    fn write_data(
        &self,
        buf: &[u8],
        offset: u64,
        pieces: &[Piece],
        cipher: Option<&DataCipher>,
    ) -> Result<()> {
        let end = offset + buf.len() as u64;
        // Each piece: physical byte offset and the bytes to put there.
        let mut segs: Vec<(u64, std::borrow::Cow<'_, [u8]>)> = Vec::with_capacity(pieces.len());
        for p in pieces {
            let gs = p.v << GRAIN_SHIFT;
            let s = offset.max(gs);
            let t = end.min(gs + GRAIN_BYTES);
            let src = &buf[(s - offset) as usize..(t - offset) as usize];
            let full = s == gs && t == gs + GRAIN_BYTES;
            if !p.new || full {
                segs.push((
                    (p.grain << GRAIN_SHIFT) + (s - gs),
                    std::borrow::Cow::Borrowed(src),
                ));
            } else {
                let mut g = self.rest_of_grain(p, cipher)?;
                g[(s - gs) as usize..(t - gs) as usize].copy_from_slice(src);
                segs.push((p.grain << GRAIN_SHIFT, std::borrow::Cow::Owned(g)));
            }
        }
        let mut i = 0;
        while i < segs.len() {
            let mut j = i + 1;
            let mut pos = segs[i].0 + segs[i].1.len() as u64;
            while j < segs.len() && segs[j].0 == pos {
                pos += segs[j].1.len() as u64;
                j += 1;
            }
            if j == i + 1 {
                self.inner.pool.write_at(&segs[i].1, segs[i].0)?;
            } else if segs[i..j]
                .iter()
                .all(|s| matches!(s.1, std::borrow::Cow::Borrowed(_)))
            {
                // Borrowed pieces are consecutive slices of `buf`: write it directly.
                let from = segs[i].1.as_ptr() as usize - buf.as_ptr() as usize;
                let len = (pos - segs[i].0) as usize;
                self.inner
                    .pool
                    .write_at(&buf[from..from + len], segs[i].0)?;
            } else {
                let mut run = Vec::with_capacity((pos - segs[i].0) as usize);
                for s in &segs[i..j] {
                    run.extend_from_slice(&s.1);
                }
                self.inner.pool.write_at(&run, segs[i].0)?;
            }
            i = j;
        }
        Ok(())
    }

    fn write_impl(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        let prov = self.begin(offset, buf.len() as u64, true)?;
        if buf.is_empty() {
            return Ok(());
        }
        // Zero detection (FORMAT.md §7.4): on a thin disk, zeros allocate
        // nothing and release what they overwrite. The check stops at the
        // first non-zero word, so other writes pay next to nothing.
        if prov == Provisioning::Thin
            && self
                .inner
                .detect_zeroes
                .load(std::sync::atomic::Ordering::Relaxed)
            && is_zero(buf)
        {
            let opts = ZeroOptions { fua, ..UNMAP };
            return self.zero_impl(offset, buf.len() as u64, prov, opts);
        }
        self.write_guarded(buf, offset, prov)?;
        if fua {
            self.inner.commit(false)?;
        }
        Ok(())
    }

    /// Write `buf` (not empty) at `offset` under the gate and the range's
    /// write stripes.
    fn write_guarded(&self, buf: &[u8], offset: u64, prov: Provisioning) -> Result<()> {
        self.inner.maybe_checkpoint()?;
        let first = offset >> GRAIN_SHIFT;
        let last = (offset + buf.len() as u64 - 1) >> GRAIN_SHIFT;
        let attempt = || {
            let _gate = self.inner.gate.read();
            let _stripes = self.inner.lock_stripes(self.version, first, last);
            self.write_locked(buf, offset, prov)
        };
        match attempt() {
            // Space freed by trims is reusable once their batch is durable,
            // and deleted snapshots may still hold some: reclaim and commit
            // (outside the gate), then try once more before saying ENOSPC.
            Err(e) if e.kind == ErrorKind::NoSpace && self.inner.space_to_come() => {
                self.inner.make_space()?;
                attempt()
            }
            r => r,
        }
    }

    // ------------------------------------------------------------ status

    fn status_impl(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.begin(offset, len, false)?;
        if len == 0 {
            return Ok(vec![]);
        }
        let _gate = self.inner.gate.read();
        let end = offset + len;
        let first = offset >> GRAIN_SHIFT;
        let last = ((end - 1) >> GRAIN_SHIFT).min(first + STATUS_GRAINS_MAX - 1);
        let mut out: Vec<Extent> = Vec::new();
        let stop = end.min((last + 1) << GRAIN_SHIFT);
        self.inner
            .meta
            .lock()
            .walk(self.version, first, last + 1, &mut |v, c, g| {
                let s = (v << GRAIN_SHIFT).max(offset);
                let t = ((v + c) << GRAIN_SHIFT).min(stop);
                if t <= s {
                    return;
                }
                let hole = g == 0;
                match out.last_mut() {
                    Some(x) if x.hole == hole => x.len_bytes += t - s,
                    _ => out.push(Extent {
                        len_bytes: t - s,
                        hole,
                        zero: hole,
                    }),
                }
            })?;
        Ok(out)
    }
}

/// Most bytes one [`DiskHandle::prefetch_impl`] call looks up.
const PREFETCH_MAX_BYTES: u64 = 64 << 20;

/// `grains` (physical grain numbers, 0 = unmapped) as runs `(i, j, g)`:
/// `grains[i..j]` are unmapped (`g == 0`) or physically adjacent from `g`.
/// A run of a request: where it lies in the request's buffer, at which
/// byte of the pool its data is (None: a hole), and the key index its
/// grains were written under (FORMAT.md §16.4).
struct Run {
    buf: std::ops::Range<usize>,
    pool: Option<u64>,
    key: u8,
    /// `pool` is a packed stream grain's first byte, and the run one
    /// virtual grain (FORMAT.md §18.4).
    packed: bool,
    /// A packed run whose fragment spills into the next stream grain
    /// (its entry's bit 42, §18.8).
    spills: bool,
}

/// Runs of `grains` (index range, first grain; 0 for a hole): physically
/// adjacent grains make one run, and so do adjacent holes. An iterator, so
/// the read path allocates only what it keeps.
/// The runs of `[offset, offset + len)` whose leaf entries, from the
/// first grain it touches on, are `entries` (see
/// `DiskHandle::mapped_runs`). Entries under different key indexes are
/// never adjacent, so a run has one.
fn runs_of(entries: &[u64], offset: u64, len: u64) -> Vec<Run> {
    let first = offset >> GRAIN_SHIFT;
    let end = offset + len;
    let run = |i: usize, j: usize, e0: u64| {
        let v0 = first + i as u64;
        let s = offset.max(v0 << GRAIN_SHIFT);
        let t = end.min((first + j as u64) << GRAIN_SHIFT);
        let g0 = strata_format::leaf_grain(e0);
        let packed = strata_format::leaf_packed(e0);
        let within = if packed { 0 } else { s - (v0 << GRAIN_SHIFT) };
        Run {
            buf: (s - offset) as usize..(t - offset) as usize,
            pool: (g0 != 0).then(|| (g0 << GRAIN_SHIFT) + within),
            key: strata_format::leaf_key(e0),
            packed,
            spills: packed && strata_format::leaf_spills(e0),
        }
    };
    let mut out = Vec::new();
    for (i, j, e0) in grain_runs(entries) {
        if strata_format::leaf_packed(e0) {
            // Packed entries are read grain by grain (adjacent stream
            // grains are no run of bytes).
            out.extend((i..j).map(|k| run(k, k + 1, entries[k])));
        } else {
            out.push(run(i, j, e0));
        }
    }
    out
}

/// A packed run's (stream grain, virtual grain, byte within it) for a
/// request at `offset`.
fn packed_place(r: &Run, offset: u64) -> (u64, u64, usize) {
    let at = offset + r.buf.start as u64;
    (
        r.pool.unwrap_or(0) >> GRAIN_SHIFT,
        at >> GRAIN_SHIFT,
        (at % GRAIN_BYTES) as usize,
    )
}

/// Whether `buf` at `offset` may be read or written with direct I/O as
/// it is (address, length and offset aligned).
fn direct_aligned(buf: &[u8], offset: u64) -> bool {
    (offset | buf.len() as u64 | buf.as_ptr() as u64)
        .is_multiple_of(strata_storage::DIRECT_ALIGN as u64)
}

/// Held by a planned write: counts it in `mutations` when the write is
/// over, whether or not every piece landed (some may have), so a flush
/// after it syncs the pool.
struct Counted(Arc<Store>);

/// The pieces of a write under key index `key` to virtual grains
/// `[first, last]` as `version`'s map stands: a grain the version holds
/// alone, under the same key index, is written in place; any other (a
/// hole, a grain a snapshot shares, one an own-key clone inherited)
/// needs a new one, for `DiskHandle::allocate`, and `old` names what it
/// held.
fn pieces_for_write(
    m: &mut Meta,
    version: u64,
    (first, last): (u64, u64),
    key: u8,
) -> Result<Vec<Piece>> {
    use strata_format::{leaf_grain, leaf_key};
    let mut found = Vec::with_capacity((last - first + 1) as usize);
    m.lookup_range_for_write(version, first, last - first + 1, &mut found)?;
    Ok((first..=last)
        .zip(found)
        .map(|(v, (e, exclusive))| {
            let in_place = exclusive && leaf_key(e) == key;
            Piece {
                v,
                grain: if in_place { leaf_grain(e) } else { 0 },
                old: leaf_grain(e),
                old_key: leaf_key(e),
                old_packed: strata_format::leaf_packed(e),
                new: !in_place,
            }
        })
        .collect())
}

/// Give back the grains allocated for `pieces`, whose data could not be
/// written.
fn abort_pieces(store: &Store, pieces: &[Piece]) -> Result<()> {
    let mut m = store.meta.lock();
    for p in pieces.iter().filter(|p| p.new) {
        m.abort_alloc(p.grain).map_err(|e| store.fail_stop(e))?;
    }
    Ok(())
}

/// Point `version`'s map at the new pieces' grains, whose data is written
/// under key index `key`, and count the write in `mutations`.
fn install_pieces(store: &Store, version: u64, pieces: &[Piece], key: u8) -> Result<()> {
    if pieces.iter().any(|p| p.new) {
        // From the first install on, an error leaves part of the write
        // in the map: fail-stop rather than log half a write.
        let _fence = store.fail_on_panic();
        let mut m = store.meta.lock();
        // By leaf: new pieces of consecutive virtual grains under one leaf
        // are installed (and logged) together. (The pieces of an eager
        // fill are the holes only: not always consecutive.)
        let mut i = 0;
        while i < pieces.len() {
            if !pieces[i].new {
                i += 1;
                continue;
            }
            let leaf = pieces[i].v >> MAP_FANOUT_SHIFT;
            let mut j = i + 1;
            while j < pieces.len()
                && pieces[j].new
                && pieces[j].v == pieces[j - 1].v + 1
                && pieces[j].v >> MAP_FANOUT_SHIFT == leaf
            {
                j += 1;
            }
            let grains: Vec<u64> = pieces[i..j]
                .iter()
                .map(|p| strata_format::leaf_entry(p.grain, key))
                .collect();
            m.install_run(version, pieces[i].v, &grains)
                .map_err(|e| store.fail_stop(e))?;
            i = j;
        }
    }
    store
        .mutations
        .fetch_add(1, std::sync::atomic::Ordering::Release);
    Ok(())
}

/// The finish step of a planned write that allocates: once its data is
/// written, install the new grains (as `write_locked` does after
/// `write_data`); if it failed, give them back. Held before the stripes
/// and the gate, so it runs while they still are.
struct Install {
    store: Arc<Store>,
    version: u64,
    pieces: Vec<Piece>,
    /// The key index the data went under.
    key: u8,
}

impl strata_block::IoHold for Install {
    fn done(self: Box<Self>, ok: bool) -> bool {
        if !ok {
            // Nothing points at the grains: a failed write's pieces that
            // did land there are overwritten whole by the next owner.
            let _ = abort_pieces(&self.store, &self.pieces);
            return false;
        }
        match install_pieces(&self.store, self.version, &self.pieces, self.key) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!("a planned write's install failed: {e}");
                false
            }
        }
    }

    fn lost(self: Box<Self>) {
        // The kernel may still write these grains: given back, they could
        // be another disk's by then. Stop instead; a restart recovers the
        // flushed state (the allocation was never logged).
        self.store.fail_stop(Error::new(
            ErrorKind::Io,
            format!(
                "a ring (io_uring or native AIO) failed with a write to {} new grain(s) in flight",
                self.pieces.iter().filter(|p| p.new).count()
            ),
        ));
    }
}

impl strata_block::IoHold for Counted {}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0
            .mutations
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

impl BlockDevice for DiskHandle {
    fn size_bytes(&self) -> u64 {
        let m = self.inner.meta.lock();
        self.state(&m).map(|s| s.0).unwrap_or(0)
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> BlockResult<strata_block::ReadFill> {
        self.throttle.admit(buf.len() as u64);
        self.read_impl(buf, offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> BlockResult<()> {
        self.throttle.admit(buf.len() as u64);
        self.write_impl(buf, offset_bytes, fua)
    }

    fn plan_read(
        &self,
        buf: &mut [u8],
        offset_bytes: u64,
        wait: bool,
    ) -> Option<BlockResult<Planned>> {
        // Only a pool the caller may read itself; with direct I/O, only
        // aligned requests (the others go through `read_at`, which
        // bounces them).
        let (fd, direct) = self.inner.pool.read_fd()?;
        if direct && !direct_aligned(buf, offset_bytes) {
            return None;
        }
        self.throttle.admit(buf.len() as u64);
        Some(self.plan_read_impl(fd, buf, offset_bytes, wait))
    }

    fn plan_write(
        &self,
        buf: &[u8],
        offset_bytes: u64,
        wait: bool,
    ) -> Option<BlockResult<Planned>> {
        // Only into a pool opened for direct I/O, aligned requests, and a
        // disk without I/O limits (`write_at` waits for those).
        let fd = self.inner.pool.direct_fd()?;
        if !direct_aligned(buf, offset_bytes) || self.throttle.is_active() {
            return None;
        }
        self.plan_write_impl(fd, buf, offset_bytes, wait)
            .transpose()
    }

    fn flush(&self) -> BlockResult<()> {
        self.inner.commit(false)
    }

    fn unmap(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<()> {
        self.throttle.admit(0);
        let prov = self.begin(offset_bytes, len_bytes, true)?;
        self.zero_impl(offset_bytes, len_bytes, prov, UNMAP)
    }

    /// Fast (FAST_ZERO) only where the map does the work; a zeroing that
    /// would write data blocks is then refused before anything changes.
    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        opts: ZeroOptions,
    ) -> BlockResult<()> {
        let prov = self.begin(offset_bytes, len_bytes, true)?;
        if opts.fast_only {
            let slow = self.slow_zeroing(offset_bytes, len_bytes, prov, opts)?;
            if let Some(why) = slow {
                return Err(BlockError::new(
                    strata_block::ErrorKind::Unsupported,
                    format!("'{}': no fast zeroing here: {why}", self.name),
                ));
            }
        }
        // Zeros written (NO_HOLE) count against the I/O limits as a WRITE.
        self.throttle
            .admit(if opts.may_unmap { 0 } else { len_bytes });
        self.zero_impl(offset_bytes, len_bytes, prov, opts)
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<Vec<Extent>> {
        self.status_impl(offset_bytes, len_bytes)
    }

    fn prefetch(&self, offset_bytes: u64, len_bytes: u64) {
        // Only a hint: a failure here is the next read's to report.
        let _ = self.prefetch_impl(offset_bytes, len_bytes);
    }
}

/// Copy every mapped range of `src` into `dst` (full clone).
pub(crate) fn copy_mapped(
    src: &DiskHandle,
    dst: &DiskHandle,
    progress: &mut dyn FnMut(u64, u64),
    pace: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<()> {
    let size = src.size_bytes();
    let total = {
        let m = src.inner.meta.lock();
        m.version_state(src.version)
            .map(|v| v.mapped_grains)
            .unwrap_or(0)
            * GRAIN_BYTES
    };
    let mut copied = 0u64;
    let mut offset = 0u64;
    let mut buf = vec![0u8; ZERO_CHUNK_BYTES];
    while offset < size {
        let len = (size - offset).min(64 << 20);
        let extents = src.block_status(offset, len)?;
        let mut pos = offset;
        for x in extents {
            if !x.hole {
                let mut p = pos;
                while p < pos + x.len_bytes {
                    let n = (pos + x.len_bytes - p).min(buf.len() as u64) as usize;
                    src.read_impl(&mut buf[..n], p)?;
                    dst.write_impl(&buf[..n], p, false)?;
                    p += n as u64;
                    copied += n as u64;
                    progress(copied.min(total), total);
                    pace(n as u64)?;
                }
            }
            pos += x.len_bytes;
        }
        if pos == offset {
            return err(ErrorKind::Corrupt, "block status made no progress");
        }
        offset = pos;
    }
    progress(total, total);
    Ok(())
}
