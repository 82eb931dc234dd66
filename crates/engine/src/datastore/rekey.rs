//! `strata rekey --deep` (docs/FORMAT.md §16.4): a new keyring key and data
//! key, then every grain of the lineage re-encrypted online, a region per
//! step; an interrupted one resumes from its cursor.

use std::sync::Arc;

use strata_crypt::{DataCipher, KeyringRec, NewSlot};
use strata_format::{GRAIN_BYTES, INCOMPAT_DEEP_REKEY};

use super::keys::crypt_error;
use super::{Datastore, SpaceWork};
use crate::error::{err, Error, ErrorKind, Result};
use crate::rekey::{lineage_end, Rekeying};
use crate::work::Pacer;
use strata_crypt::locked_error;

/// What a deep rekey did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeepRekeyReport {
    /// It continued one that was interrupted.
    pub resumed: bool,
    /// Bytes of grains re-encrypted by this run.
    pub reencrypted_bytes: u64,
    /// Of them, bytes copied rather than moved: own-key clones made from
    /// the lineage still read the old grains under the old key, so these
    /// are stored twice from now on (FORMAT.md §16.4). 0 on an object
    /// store, where every grain is copied and GC frees the old ones no
    /// linked clone reaches (§16.7).
    pub copied_bytes: u64,
    /// The data key the lineage is under now.
    pub data_key: u32,
}

/// Whether `strata rekey --deep DISK` resumes a deep rekey under way
/// (`under_way`) or begins one (`new_secret` given): the same rules on
/// every datastore. Refused with neither, or with both.
pub fn deep_rekey_resumes(disk: &str, under_way: bool, new_secret: bool) -> Result<bool> {
    match (under_way, new_secret) {
        (false, false) => err(
            ErrorKind::InvalidArgument,
            format!(
                "'{disk}': a deep rekey needs the new secret (--new-key-file, \
                 --new-key-keyring, --new-key-helper or --new-key-prompt)"
            ),
        ),
        (true, true) => err(
            ErrorKind::Refused,
            format!(
                "'{disk}': a deep rekey is under way already; resume it with \
                 'strata rekey --deep {disk}' and no new secret"
            ),
        ),
        (false, true) => Ok(false),
        (true, false) => Ok(true),
    }
}

fn gone(disk: &str) -> Error {
    Error::new(ErrorKind::Gone, format!("disk '{disk}' was removed"))
}

impl Datastore {
    /// Deep rekey of `disk`'s lineage: with `new`, begin one (the keyslots
    /// are replaced by one for `new`, as a shallow rekey does); without,
    /// resume the one under way. Online, paced like defrag; the disk must
    /// be unlocked.
    pub fn rekey_deep(
        &self,
        disk: &str,
        new: Option<&NewSlot<'_>>,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DeepRekeyReport> {
        self.inner.check_writable()?;
        if disk.contains('@') {
            return err(
                ErrorKind::InvalidArgument,
                format!("'{disk}' is a snapshot: rekey its disk; its snapshots and clones follow"),
            );
        }
        let k = Self::keyring_of(&self.inner.meta.lock(), disk)?;
        let resumed = deep_rekey_resumes(disk, k.deep_rekey.is_some(), new.is_some())?;
        if let (false, Some(slot)) = (resumed, new) {
            self.begin_deep(disk, k, slot)?;
        }
        let job = self.rekeying(disk)?;
        let h = self.open_disk(disk)?;
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref())
            .resting(crate::work::LAYOUT_BUSY_REST);
        let mut clients = self.inner.client_watch();
        let (moved, copied) =
            h.rekey_pass(&job, progress, &mut |n| pacer.pace(n, clients.busy()))?;
        let data_key = self.end_deep(disk, &job)?;
        Ok(DeepRekeyReport {
            resumed,
            reencrypted_bytes: moved,
            copied_bytes: copied,
            data_key,
        })
    }

    /// The first step, one catalog record (FORMAT.md §16.5): new KK, the
    /// DEKs rewrapped under it, a new DEK, one keyslot, the cursor at 0.
    fn begin_deep(&self, disk: &str, mut k: KeyringRec, slot: &NewSlot<'_>) -> Result<()> {
        let keys = self.held_keys(disk, &k)?;
        let before = k.clone();
        // The KDF runs outside the lock.
        let u = k
            .begin_deep(&keys, slot)
            .map_err(|e| crypt_error(disk, e))?;
        let cipher = k.data_cipher(&u).map_err(|e| crypt_error(disk, e))?;
        let u = Arc::new(u);
        // A build that knows keyrings but not the cursor must refuse the
        // datastore before the first record with one is logged.
        self.inner.ensure_incompat(INCOMPAT_DEEP_REKEY)?;
        self.change(|m| {
            let cur = m.catalog.keyring_mut(k.id).ok_or_else(|| gone(disk))?;
            if *cur != before {
                return err(
                    ErrorKind::Refused,
                    format!("disk '{disk}': its keys changed meanwhile; try again"),
                );
            }
            let mut held = self.inner.keys.lock();
            let h = held.get_mut(&k.id).ok_or_else(|| locked_error(disk))?;
            *cur = k;
            m.mark_catalog_dirty();
            h.keys = u;
            *h.cipher.lock() = Arc::new(cipher);
            Ok(())
        })?;
        self.inner.commit(false)
    }

    /// The pass's keys and cell.
    fn rekeying(&self, disk: &str) -> Result<Rekeying> {
        let m = self.inner.meta.lock();
        let k = Self::keyring_of(&m, disk)?;
        let d = k
            .deep_rekey
            .ok_or_else(|| Error::new(ErrorKind::Gone, format!("'{disk}': the rekey ended")))?;
        let held = self.inner.keys.lock();
        let h = held.get(&k.id).ok_or_else(|| locked_error(disk))?;
        let key = |i: u32| {
            h.keys.key(i).cloned().ok_or_else(|| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("disk '{disk}': data key {i} of its deep rekey is missing"),
                )
            })
        };
        let mut own = k.own.clone();
        own.sort_by_key(|o| o.bits);
        let job = Rekeying {
            keyring: k.id,
            from: key(d.from)?,
            to: key(d.to)?,
            own: own.iter().map(|o| key(o.key)).collect::<Result<_>>()?,
            cell: h.cipher.clone(),
        };
        Ok(job)
    }

    /// The last step, one catalog record: the old DEK leaves the keyring
    /// once the cursor is past every version of the lineage.
    fn end_deep(&self, disk: &str, job: &Rekeying) -> Result<u32> {
        let index = self.change(|m| {
            let end = lineage_end(m, job.keyring);
            let k = m
                .catalog
                .keyring_mut(job.keyring)
                .ok_or_else(|| gone(disk))?;
            let at = k.deep_rekey.map_or(0, |d| d.next_grain);
            if at < end {
                return err(
                    ErrorKind::Unavailable,
                    format!(
                        "'{disk}': the lineage grew past the rekey's end ({} of {} bytes); \
                         run 'strata rekey --deep {disk}' again",
                        at * GRAIN_BYTES,
                        end * GRAIN_BYTES
                    ),
                );
            }
            let mut held = self.inner.keys.lock();
            let h = held
                .get_mut(&job.keyring)
                .ok_or_else(|| locked_error(disk))?;
            let mut rec = k.clone();
            let u = rec.finish_deep(&h.keys).map_err(|e| crypt_error(disk, e))?;
            let index = u.current_index();
            *k = rec;
            m.mark_catalog_dirty();
            *h.cipher.lock() = Arc::new(DataCipher::single(job.to.clone()));
            h.keys = Arc::new(u);
            Ok(index)
        })?;
        self.inner.commit(false)?;
        Ok(index)
    }
}
