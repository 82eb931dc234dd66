//! The deep rekey's pass (docs/FORMAT.md §16.4): every grain of a keyring's
//! lineage re-encrypted from the old data key to the new one, in virtual
//! order, one region per step, while clients read and write. Each step
//! moves the region's grains to new ones (every sharer's map follows, as
//! defrag's moves) and advances the keyring's cursor past the region in the
//! same change of the metadata, so one log batch holds both. A grain that
//! a disk of another keyring (an own-key clone) maps too is copied
//! instead: the lineage's maps, split from the other's first, name the
//! copy; the other keeps the old grain under the old key.

use std::sync::Arc;

use strata_crypt::{DataCipher, Xts, GRAIN_SECTORS};
use strata_format::{leaf_grain, leaf_key, GRAIN_BYTES, MAP_FANOUT_SHIFT};

use crate::disk::{DiskHandle, RegionWalk};
use crate::error::{err, ErrorKind, Result};
use crate::meta::{Meta, Moved, Place};
use crate::store::{CipherCell, SpaceRequest};

/// Allocation owner of the pass's new grains: a cursor of its own.
const REKEY_OWNER: u64 = u64::MAX - 2;
/// Times a region is tried again when a snapshot's removal or a new disk
/// changed it under the pass.
const REGION_TRIES: u32 = 8;

/// What the pass needs of the keyring: its id, the two keys, an own-key
/// clone's own keys (by key index from 1: their grains are re-encrypted
/// under `to` too, and their entries get index 0), and the cipher cell
/// that readers and writers take their key from.
pub(crate) struct Rekeying {
    pub keyring: u64,
    pub from: Arc<Xts>,
    pub to: Arc<Xts>,
    pub own: Vec<Arc<Xts>>,
    pub cell: Arc<CipherCell>,
}

impl Rekeying {
    /// The key the grains of leaf key index `bits` are under now.
    fn key_of(&self, bits: u8) -> Result<&Xts> {
        match bits {
            0 => Ok(&self.from),
            j => self
                .own
                .get(usize::from(j) - 1)
                .map(|x| &**x)
                .ok_or_else(|| {
                    crate::meta::corrupt(format!(
                        "the map names key index {j}, which the keyring does not have"
                    ))
                }),
        }
    }
}

/// The versions of a keyring's lineage (the heads and snapshots of every
/// disk under it) with their sizes in grains.
pub(crate) fn lineage(m: &Meta, keyring: u64) -> Vec<(u64, u64)> {
    let disks: Vec<&crate::catalog::DiskRec> = m
        .catalog
        .disks
        .iter()
        .filter(|d| d.keyring == Some(keyring))
        .collect();
    let mut out: Vec<(u64, u64)> = disks
        .iter()
        .map(|d| (d.head, d.size_bytes.div_ceil(GRAIN_BYTES)))
        .collect();
    out.extend(
        m.catalog
            .snapshots
            .iter()
            .filter(|s| disks.iter().any(|d| d.id == s.disk))
            .map(|s| (s.version, s.size_bytes.div_ceil(GRAIN_BYTES))),
    );
    out
}

/// The versions of every other keyring's disks (and of plain disks): the
/// maps a copy leaves as they are.
fn other_versions(m: &Meta, keyring: u64) -> std::collections::HashSet<u64> {
    let others: Vec<&crate::catalog::DiskRec> = m
        .catalog
        .disks
        .iter()
        .filter(|d| d.keyring != Some(keyring))
        .collect();
    let mut out: std::collections::HashSet<u64> = others.iter().map(|d| d.head).collect();
    out.extend(
        m.catalog
            .snapshots
            .iter()
            .filter(|s| others.iter().any(|d| d.id == s.disk))
            .map(|s| s.version),
    );
    out
}

/// The grain just past the largest version of the lineage.
pub(crate) fn lineage_end(m: &Meta, keyring: u64) -> u64 {
    lineage(m, keyring).iter().map(|l| l.1).max().unwrap_or(0)
}

/// The distinct (virtual grain, leaf entry) pairs the lineage maps in
/// `[first, last]`: the pool grain and the key index it is under.
fn region_pairs(m: &mut Meta, keyring: u64, first: u64, last: u64) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut grains = Vec::new();
    for (ver, size) in lineage(m, keyring) {
        let end = (last + 1).min(size);
        if end <= first {
            continue;
        }
        grains.clear();
        m.lookup_entries(ver, first, end - first, &mut grains)?;
        for (i, &g) in grains.iter().enumerate() {
            if g != 0 {
                out.push((first + i as u64, g));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl DiskHandle {
    /// Re-encrypt the lineage's grains from the keyring's cursor to the
    /// lineage's end, a region at a time; returns the bytes re-encrypted,
    /// and of them the bytes copied (other keyrings' disks keep the old).
    pub(crate) fn rekey_pass(
        &self,
        job: &Rekeying,
        progress: &mut dyn FnMut(u64, u64),
        pace: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<(u64, u64)> {
        let (mut moved, mut copied) = (0u64, 0u64);
        loop {
            // A disk of the lineage grown meanwhile is covered too.
            let (at, end) = {
                let m = self.inner.meta.lock();
                (cursor(&m, job.keyring)?, lineage_end(&m, job.keyring))
            };
            if at >= end {
                return Ok((moved, copied));
            }
            let walk = RegionWalk {
                offset: at * GRAIN_BYTES,
                len: (end - at) * GRAIN_BYTES,
                all_heads: true,
                progress,
                pace,
            };
            let mut new_heads = false;
            let r = self.in_regions(walk, &mut |first, last, _, held| match self
                .rekey_region(job, first, last, held)?
            {
                Some((n, c)) => {
                    moved += n;
                    copied += c;
                    Ok(())
                }
                None => {
                    new_heads = true;
                    err(ErrorKind::Unavailable, "a disk was made meanwhile")
                }
            });
            match r {
                // A disk made since the walk took its stripes (a clone)
                // could write where the pass goes: walk again from the
                // cursor, with its stripes held too.
                Err(_) if new_heads => continue,
                r => r?,
            }
        }
    }

    /// One region, tried again while the lineage changes under it; None
    /// when a disk was made since `held` was taken.
    fn rekey_region(
        &self,
        job: &Rekeying,
        first: u64,
        last: u64,
        held: &[u64],
    ) -> Result<Option<(u64, u64)>> {
        // `strata lock` stops the pass at the next region.
        if self.keys.as_ref().is_some_and(|k| k.strong_count() == 0) {
            return Err(strata_crypt::locked_error(&self.name));
        }
        for _ in 0..REGION_TRIES {
            let heads = self.inner.meta.lock().head_versions();
            if heads.iter().any(|h| !held.contains(h)) {
                return Ok(None);
            }
            if let Some(n) = self.rekey_region_once(job, first, last, held)? {
                return Ok(Some(n));
            }
        }
        err(
            ErrorKind::Unavailable,
            format!(
                "'{}': the grains of virtual grains {first}..={last} kept changing under the \
                 deep rekey; run it again",
                self.name
            ),
        )
    }

    /// Read the region's grains (without the gate, as defrag does), turn
    /// them from the old key to the new, write them to new grains, then,
    /// if the lineage still maps what was read, move every one and advance
    /// the cursor. None: the region changed meanwhile (nothing was changed).
    fn rekey_region_once(
        &self,
        job: &Rekeying,
        first: u64,
        last: u64,
        held: &[u64],
    ) -> Result<Option<(u64, u64)>> {
        let _fence = self.inner.fail_on_panic();
        let mapped = region_pairs(&mut self.inner.meta.lock(), job.keyring, first, last)?;
        let grains: Vec<(u64, u64)> = mapped.iter().map(|&(v, e)| (v, leaf_grain(e))).collect();
        let buf = self.reencrypted(job, &mapped, &grains)?;
        // As in defrag: the stripes are held already, so a recursive read
        // of the gate (it does not queue behind a waiting commit). What was
        // read is checked once, below, after the copy is written: the
        // metadata lock is let go for the write, so a check here would
        // have to be made again there.
        let _gate = self.inner.gate.read_recursive();
        let targets = self.rekey_targets(&mut self.inner.meta.lock(), mapped.len() as u64)?;
        if let Err(e) = self.write_grains(&targets, &buf) {
            self.give_back(&mut self.inner.meta.lock(), &targets)?;
            return Err(e);
        }
        let mut m = self.inner.meta.lock();
        let same = region_pairs(&mut m, job.keyring, first, last)? == mapped
            && m.head_versions().iter().all(|h| held.contains(h));
        if !same {
            self.give_back(&mut m, &targets)?;
            return Ok(None);
        }
        let memo = &mut crate::meta::SpanLeaves::default();
        for &(v, old) in &grains {
            if !m.can_move(memo, v, old)? {
                self.give_back(&mut m, &targets)?;
                return err(
                    ErrorKind::Corrupt,
                    format!(
                        "'{}': grain {old} at virtual grain {v} is shared in a way a move \
                         cannot follow (run 'strata check')",
                        self.name
                    ),
                );
            }
        }
        let mut copied = 0u64;
        self.inner.guarded(&mut m, |m| {
            let theirs = split_from_others(m, job.keyring, &mapped)?;
            for (&(v, old), &to) in grains.iter().zip(&targets) {
                match m.move_or_copy(v, old, to, &theirs)? {
                    Some(Moved::Whole) => {}
                    Some(Moved::Copied) => copied += GRAIN_BYTES,
                    None => {
                        return err(
                            ErrorKind::Corrupt,
                            format!("grain {old} at virtual grain {v} could not move"),
                        )
                    }
                }
            }
            advance(m, job, first, last + 1)
        })?;
        drop(m);
        self.inner
            .mutations
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(Some((targets.len() as u64 * GRAIN_BYTES, copied)))
    }

    /// The grains of `mapped` (their pool grains: `grains`) read and
    /// turned from the key each entry's index names to the new key.
    fn reencrypted(
        &self,
        job: &Rekeying,
        mapped: &[(u64, u64)],
        grains: &[(u64, u64)],
    ) -> Result<Vec<u8>> {
        let g = GRAIN_BYTES as usize;
        let mut buf = vec![0u8; mapped.len() * g];
        self.read_grains(grains, &mut buf)?;
        for (chunk, &(v, e)) in buf.chunks_mut(g).zip(mapped) {
            job.key_of(leaf_key(e))?.decrypt(chunk, v * GRAIN_SECTORS);
            job.to.encrypt(chunk, v * GRAIN_SECTORS);
        }
        Ok(buf)
    }

    /// `n` new grains for the region's copies, under the space rule; on
    /// error none stays allocated.
    fn rekey_targets(&self, m: &mut Meta, n: u64) -> Result<Vec<u64>> {
        self.inner.check_space(
            m,
            SpaceRequest {
                reserve: false,
                grains: n,
                own_reserved: 0,
            },
        )?;
        let cap = self.inner.capacity_grains(m);
        let mut targets: Vec<u64> = Vec::with_capacity(n as usize);
        for _ in 0..n {
            match m.alloc_grain(REKEY_OWNER, targets.last().copied(), cap, Place::Any) {
                Ok(g) => targets.push(g),
                Err(e) => {
                    self.give_back(m, &targets)?;
                    return Err(e);
                }
            }
        }
        Ok(targets)
    }
}

/// Give the lineage maps of its own wherever they lead to `mapped`'s
/// leaves through nodes another keyring's disks share, and return those
/// disks' nodes there (the leaves a copy leaves alone).
fn split_from_others(
    m: &mut Meta,
    keyring: u64,
    mapped: &[(u64, u64)],
) -> Result<std::collections::HashSet<u64>> {
    let others = other_versions(m, keyring);
    let list: Vec<u64> = others.iter().copied().collect();
    let mut leaves: Vec<u64> = mapped.iter().map(|&(v, _)| v >> MAP_FANOUT_SHIFT).collect();
    leaves.dedup();
    let mut theirs = std::collections::HashSet::new();
    for leaf in leaves {
        let v = leaf << MAP_FANOUT_SHIFT;
        let nodes = m.path_nodes(&list, v)?;
        m.split_path(&others, &nodes, v)?;
        theirs.extend(nodes);
    }
    Ok(theirs)
}

/// Where the keyring's deep rekey stands (its first grain not re-encrypted).
fn cursor(m: &Meta, keyring: u64) -> Result<u64> {
    match m.catalog.keyring(keyring).and_then(|k| k.deep_rekey) {
        Some(d) => Ok(d.next_grain),
        None => err(ErrorKind::Gone, "the deep rekey is no longer under way"),
    }
}

/// Move the cursor to `next` in the keyring record and in the cipher that
/// readers and writers take (the caller holds the metadata lock, so a
/// reader sees the cursor that goes with the map it looked up).
fn advance(m: &mut Meta, job: &Rekeying, first: u64, next: u64) -> Result<()> {
    let k = m.catalog.keyring_mut(job.keyring).ok_or_else(|| {
        crate::error::Error::new(ErrorKind::Gone, "the disk's keyring was removed")
    })?;
    let Some(d) = k.deep_rekey.as_mut() else {
        return err(
            ErrorKind::Corrupt,
            "the keyring has no deep rekey under way",
        );
    };
    if d.next_grain != first {
        return err(
            ErrorKind::Corrupt,
            format!(
                "the deep rekey's cursor is at grain {}, not {first}",
                d.next_grain
            ),
        );
    }
    d.next_grain = next;
    m.mark_catalog_dirty();
    *job.cell.lock() = Arc::new(
        DataCipher::split(job.to.clone(), job.from.clone(), next * GRAIN_SECTORS)
            .with_own(job.own.clone())
            .writing(0),
    );
    Ok(())
}
