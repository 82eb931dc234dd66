//! Encrypted disks' keys (FORMAT.md §16): keyrings in the catalog, the
//! keys this process holds unwrapped, and the commands that change
//! keyslots. No data grain is read or written here.

use std::sync::{Arc, Weak};

use strata_api::{Encryption, KeySlotInfo};
use strata_crypt::{CryptError, KdfRec, KeyringRec, NewSlot, Unlocked};
use strata_format::{GRAIN_BYTES, INCOMPAT_ENCRYPTION, INCOMPAT_KEY_INDEX};

use crate::catalog::DiskRec;
use crate::error::{err, Error, ErrorKind, Result};
use crate::meta::Meta;
use crate::store::{CipherCell, HeldKeys};
use strata_crypt::locked_error;

use super::Datastore;

/// How a new disk's data is keyed.
#[derive(Clone, Copy)]
pub enum NewKeys<'a> {
    /// Not encrypted.
    Plain,
    /// A new keyring with one keyslot for this secret.
    Fresh(&'a NewSlot<'a>),
    /// A keyring of its own for a linked clone of a disk under keyring `id`
    /// (FORMAT.md §16.4): one keyslot for this secret, the source's data
    /// keys for what it inherits, and a new one for its writes.
    OwnKeyOf(u64, &'a NewSlot<'a>),
    /// A copy of keyring `id` (a full clone of an encrypted disk: the same
    /// keys, still wrapped, under a new id; FORMAT.md §16.3).
    CopyOf(u64),
    /// Another datastore's keyring, carried with its disk (`move`, `clone
    /// --full --to`): the same keyslots and wrapped keys under a new id.
    Adopt(&'a CarriedKeys),
}

/// An encrypted disk's keyring on its way to another datastore: the
/// record as stored (keyslots and keys, wrapped) and its unlocked keys, so
/// the copy is written under the same data key and opens with the same
/// secrets ([`Datastore::carried_keys`]).
#[derive(Clone)]
pub struct CarriedKeys {
    rec: KeyringRec,
    keys: Arc<Unlocked>,
}

/// A crypt error as the engine's (the same mapping on both kinds of
/// datastore).
pub(crate) use strata_crypt::disk_error as crypt_error;

/// A copy of the data (a full clone, a move) copies ciphertext, which
/// during a deep rekey is under two keys split at a cursor that moves: it
/// waits for the rekey's end.
fn settled(disk: &str, k: &KeyringRec) -> Result<()> {
    match k.deep_rekey {
        None => Ok(()),
        Some(_) => err(
            ErrorKind::Refused,
            format!(
                "disk '{disk}': a deep rekey of its keys is under way; copy it when that \
                 ends ('strata rekey --deep {disk}' resumes one that was interrupted)"
            ),
        ),
    }
}

impl CarriedKeys {
    /// A keyring `rec` and the keys that open it, to carry (a kind of
    /// datastore that keeps its records elsewhere, FORMAT.md §16.7).
    pub fn new(rec: KeyringRec, keys: Arc<Unlocked>) -> CarriedKeys {
        CarriedKeys { rec, keys }
    }

    /// The record as stored (keyslots and data keys, wrapped).
    pub fn record(&self) -> &KeyringRec {
        &self.rec
    }

    /// The unlocked keys.
    pub fn keys(&self) -> &Arc<Unlocked> {
        &self.keys
    }
}

/// What `info` shows of keyring `k`'s keyslots (never a key).
pub fn slot_info(k: &KeyringRec) -> Vec<KeySlotInfo> {
    k.slots
        .iter()
        .map(|s| KeySlotInfo {
            slot: s.slot,
            source: s.source.clone(),
            label: s.label.clone(),
            kdf: match s.kdf {
                KdfRec::HkdfSha256 { .. } => "hkdf-sha256".into(),
                KdfRec::Argon2id { .. } => "argon2id".into(),
            },
            created_unix: s.created_unix,
        })
        .collect()
}

impl Datastore {
    /// What `info` shows of disk `d`'s encryption.
    pub(super) fn encryption_of(&self, m: &Meta, d: &DiskRec) -> Option<Encryption> {
        let k = m.catalog.keyring(d.keyring?)?;
        Some(Encryption {
            cipher: k.cipher.clone(),
            locked: !self.inner.keys.lock().contains_key(&k.id),
            keyring: k.id,
            slots: slot_info(k),
            data_key: k.keys.iter().map(|w| w.index).max().unwrap_or(0),
            deep_rekey: k.deep_rekey.map(|r| strata_api::RekeyProgress {
                done_bytes: r.next_grain * GRAIN_BYTES,
                total_bytes: crate::rekey::lineage_end(m, k.id) * GRAIN_BYTES,
            }),
            own_key: !k.own.is_empty(),
        })
    }

    /// The cipher a handle of disk `d` reads and writes through, with the
    /// keys it came from (weakly: `lock` drops them, and the handle then
    /// refuses): None for a plain disk, an error naming the disk when it
    /// is locked.
    pub(super) fn cipher_of(&self, d: &DiskRec) -> Result<Option<(Arc<CipherCell>, Weak<()>)>> {
        let Some(id) = d.keyring else {
            return Ok(None);
        };
        match self.inner.keys.lock().get(&id) {
            Some(h) => Ok(Some((h.cipher.clone(), Arc::downgrade(&h.token)))),
            None => Err(locked_error(&d.name)),
        }
    }

    /// The keyring record of `disk` (an error if the disk is plain).
    pub(super) fn keyring_of(m: &Meta, disk: &str) -> Result<KeyringRec> {
        let d = m.catalog.disk(disk)?;
        let Some(id) = d.keyring else {
            return err(
                ErrorKind::InvalidArgument,
                format!("disk '{disk}' is not encrypted"),
            );
        };
        m.catalog.keyring(id).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::Corrupt,
                format!("disk '{disk}': keyring {id} is missing"),
            )
        })
    }

    /// Open `disk`'s keys with `secret` and hold them in this process, so
    /// its data can be read and written until the datastore is closed.
    /// Returns the keyslot that opened. A wrong secret changes nothing.
    pub fn unlock(&self, disk: &str, secret: &[u8]) -> Result<u32> {
        let k = Self::keyring_of(&self.inner.meta.lock(), disk)?;
        // Outside the metadata lock: a passphrase's KDF takes seconds.
        let (slot, keys) = k.unlock_slot(secret).map_err(|e| crypt_error(disk, e))?;
        let held = HeldKeys::new(Arc::new(keys), &k).map_err(|e| crypt_error(disk, e))?;
        // Keys already held stay: the handles opened with them keep working
        // (a handle is refused once the keys it was opened with are dropped).
        self.inner.keys.lock().entry(k.id).or_insert(held);
        Ok(slot)
    }

    /// The disks that share `disk`'s keyring (its lineage: the disk and
    /// the linked clones made from it or from what it was cloned from), by
    /// name; an error when `disk` is plain.
    pub fn keyring_disks(&self, disk: &str) -> Result<Vec<String>> {
        Ok(Self::lineage(&self.inner.meta.lock(), disk)?.1)
    }

    /// `disk`'s keyring id and the names of the disks sharing it.
    fn lineage(m: &Meta, disk: &str) -> Result<(u64, Vec<String>)> {
        let id = Self::keyring_of(m, disk)?.id;
        let disks = m
            .catalog
            .disks
            .iter()
            .filter(|d| d.keyring == Some(id))
            .map(|d| d.name.clone())
            .collect();
        Ok((id, disks))
    }

    /// Forget `disk`'s keys in this process (`strata lock`): every disk
    /// sharing its keyring reads as locked again, and open handles of them
    /// refuse their next read or write. The keys are wiped once the last
    /// handle that still holds their cipher closes. Returns those disks
    /// and whether keys were held.
    pub fn lock(&self, disk: &str) -> Result<(Vec<String>, bool)> {
        let (id, disks) = Self::lineage(&self.inner.meta.lock(), disk)?;
        let held = self.inner.keys.lock().remove(&id).is_some();
        Ok((disks, held))
    }

    /// Whether `disk` is encrypted and its keys are not held here.
    pub fn is_locked(&self, disk: &str) -> Result<bool> {
        let m = self.inner.meta.lock();
        let d = m.catalog.disk(disk)?;
        Ok(d.keyring
            .is_some_and(|id| !self.inner.keys.lock().contains_key(&id)))
    }

    /// The keys of `disk`'s keyring, which must be unlocked.
    pub(super) fn held_keys(&self, disk: &str, k: &KeyringRec) -> Result<Arc<Unlocked>> {
        self.inner
            .keys
            .lock()
            .get(&k.id)
            .map(|h| h.keys.clone())
            .ok_or_else(|| locked_error(disk))
    }

    /// Change `disk`'s keyring with `f` (given the unlocked keys), as one
    /// CATALOG record, durable when this returns (FORMAT.md §16.5).
    fn change_keyring<T>(
        &self,
        disk: &str,
        f: impl FnOnce(&mut KeyringRec, &Unlocked) -> std::result::Result<T, CryptError>,
    ) -> Result<T> {
        self.inner.check_writable()?;
        let mut k = Self::keyring_of(&self.inner.meta.lock(), disk)?;
        let keys = self.held_keys(disk, &k)?;
        // The KDF runs outside the lock; the record goes in only if no
        // other change of the keyring came in between.
        let before = k.clone();
        let out = f(&mut k, &keys).map_err(|e| crypt_error(disk, e))?;
        self.change(|m| {
            let cur = m
                .catalog
                .keyring_mut(k.id)
                .ok_or_else(|| Error::new(ErrorKind::Gone, format!("disk '{disk}' was removed")))?;
            if *cur != before {
                return err(
                    ErrorKind::Refused,
                    format!("disk '{disk}': its keys changed meanwhile; try again"),
                );
            }
            *cur = k;
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        Ok(out)
    }

    /// Add a keyslot for another secret (`strata key add`); the disk must be
    /// unlocked. Returns the new slot's number.
    pub fn key_add(&self, disk: &str, new: &NewSlot<'_>) -> Result<u32> {
        self.change_keyring(disk, |k, keys| k.add_slot(keys, new))
    }

    /// Remove keyslot `slot` (`strata key remove`); the last is refused.
    pub fn key_remove(&self, disk: &str, slot: u32) -> Result<()> {
        self.change_keyring(disk, |k, _| k.remove_slot(slot))
    }

    /// `disk`'s keyring and keys to carry into another datastore: None
    /// for a plain disk; refused while it is locked here.
    pub fn carried_keys(&self, disk: &str) -> Result<Option<CarriedKeys>> {
        let m = self.inner.meta.lock();
        if m.catalog.disk(disk)?.keyring.is_none() {
            return Ok(None);
        }
        let rec = Self::keyring_of(&m, disk)?;
        drop(m);
        settled(disk, &rec)?;
        let keys = self.held_keys(disk, &rec)?;
        Ok(Some(CarriedKeys { rec, keys }))
    }

    /// The keyslot `secret` opens (for `key remove --key-file`).
    pub fn key_slot_of(&self, disk: &str, secret: &[u8]) -> Result<u32> {
        let k = Self::keyring_of(&self.inner.meta.lock(), disk)?;
        k.slot_of(secret).map_err(|e| crypt_error(disk, e))
    }

    /// Shallow rekey (`strata rekey`): every keyslot replaced by one for
    /// `new`; the data keys and every grain stay as they are, so it costs
    /// the same with any number of snapshots (FORMAT.md §16.5).
    pub fn rekey_shallow(&self, disk: &str, new: &NewSlot<'_>) -> Result<()> {
        self.change_keyring(disk, |k, keys| k.rekey_shallow(keys, new))
    }

    /// The keyring a new disk gets, made or copied before the catalog
    /// change that adds the disk (a KDF takes time; the lock is not held),
    /// with the keys to hold once it is in.
    pub(super) fn prepare_keys(
        &self,
        keys: NewKeys<'_>,
        name: &str,
    ) -> Result<Option<(KeyringRec, Arc<Unlocked>)>> {
        let made = match keys {
            NewKeys::Plain => return Ok(None),
            NewKeys::Fresh(slot) => {
                let (k, u) = KeyringRec::create(0, slot).map_err(|e| crypt_error(name, e))?;
                (k, Arc::new(u))
            }
            NewKeys::CopyOf(id) => {
                let k = self.inner.meta.lock().catalog.keyring(id).cloned();
                let k = k.ok_or_else(|| {
                    Error::new(ErrorKind::NotFound, format!("no keyring {id} to copy"))
                })?;
                settled(name, &k)?;
                let u = self.inner.keys.lock().get(&id).map(|h| h.keys.clone());
                let u = u.ok_or_else(|| locked_error(name))?;
                (k, u)
            }
            NewKeys::Adopt(c) => (c.rec.clone(), c.keys.clone()),
            NewKeys::OwnKeyOf(id, slot) => {
                let k = self.inner.meta.lock().catalog.keyring(id).cloned();
                let k = k.ok_or_else(|| {
                    Error::new(ErrorKind::NotFound, format!("no keyring {id} to clone"))
                })?;
                let u = self.inner.keys.lock().get(&id).map(|h| h.keys.clone());
                let u = u.ok_or_else(|| locked_error(name))?;
                let (k, u) = k
                    .own_key_clone(&u, slot)
                    .map_err(|e| crypt_error(name, e))?;
                (k, Arc::new(u))
            }
        };
        // Before the first keyring with own keys is logged (an own-key
        // clone's, or one carried in from another datastore), the
        // superblock says leaf entries may carry key indexes.
        if !made.0.own.is_empty() {
            self.inner.ensure_incompat(INCOMPAT_KEY_INDEX)?;
        }
        // Before the first keyring is logged, the superblock says the
        // datastore may hold keyrings (FORMAT.md §16.3).
        self.inner.ensure_incompat(INCOMPAT_ENCRYPTION)?;
        Ok(Some(made))
    }

    /// Put a prepared keyring into the catalog under a new id, for the
    /// disk being added in the same change; returns the id.
    pub(super) fn install_keyring(m: &mut Meta, mut k: KeyringRec) -> u64 {
        k.id = m.catalog.alloc_id();
        let id = k.id;
        m.catalog.keyrings.push(k);
        id
    }

    /// Hold a new disk's keys once its keyring is in the catalog.
    pub(super) fn hold_keys(&self, name: &str, id: u64, keys: Arc<Unlocked>) -> Result<()> {
        let rec = self.inner.meta.lock().catalog.keyring(id).cloned();
        let rec =
            rec.ok_or_else(|| Error::new(ErrorKind::Gone, format!("keyring {id} is gone")))?;
        let held = HeldKeys::new(keys, &rec).map_err(|e| crypt_error(name, e))?;
        self.inner.keys.lock().insert(id, held);
        Ok(())
    }

    /// Forget the keys of keyrings no disk names any more.
    pub(super) fn forget_unused_keys(&self) {
        let m = self.inner.meta.lock();
        self.inner
            .keys
            .lock()
            .retain(|id, _| m.catalog.keyring(*id).is_some());
    }
}
