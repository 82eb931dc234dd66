//! Encrypted disks of an object-store datastore (FORMAT.md §16.7): every
//! manifest of a disk carries its keyring; this process holds the keys of
//! the disks it unlocked, by disk id. No grain is read or written here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use strata_crypt::{disk_error as crypt_error, DataCipher, DeepRekey, KeyringRec, Unlocked};

use crate::layout::Manifest;
use crate::{Error, ErrorKind, ObjectStoreDatastore, Result};

/// One disk's unwrapped keys and the cipher of the record state they
/// were last asked for.
struct Held {
    keys: Arc<Unlocked>,
    cipher: Arc<DataCipher>,
    /// What `cipher` was made for: a deep rekey's cursor and the base key.
    made_for: (Option<DeepRekey>, u32),
}

/// The keys this process holds, by disk id.
#[derive(Default)]
pub(crate) struct HeldKeys(Mutex<HashMap<u32, Held>>);

/// The keyring of `disk`'s manifest `m` (an error for a plain disk).
pub fn keyring_of(disk: &str, m: &Manifest) -> Result<KeyringRec> {
    m.keyring.clone().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("disk '{disk}' is not encrypted"),
        )
    })
}

impl ObjectStoreDatastore {
    /// Hold `keys` (which open `rec`) for disk `id` in this process. Keys
    /// already held stay (the same keys: a record's data keys never change
    /// on an object store).
    pub fn hold_keys(
        &self,
        disk: &str,
        id: u32,
        keys: Arc<Unlocked>,
        rec: &KeyringRec,
    ) -> Result<()> {
        let cipher = Arc::new(rec.data_cipher(&keys).map_err(|e| crypt_error(disk, e))?);
        let made_for = (rec.deep_rekey, rec.base_index());
        let mut held = self.keys.0.lock().unwrap();
        held.entry(id).or_insert(Held {
            keys,
            cipher,
            made_for,
        });
        Ok(())
    }

    /// Hold `keys` for disk `id` instead of the ones held: a deep rekey's
    /// keys (every old data key and the new one) as it begins. False if
    /// none were held.
    pub fn replace_keys(&self, id: u32, keys: Arc<Unlocked>) -> bool {
        match self.keys.0.lock().unwrap().get_mut(&id) {
            Some(h) => {
                h.keys = keys;
                h.made_for = (None, u32::MAX);
                true
            }
            None => false,
        }
    }

    /// The cipher of the grains of disk `id` that a manifest with keyring
    /// `rec` names (§16.7: a reader takes the cursor of the manifest it
    /// walks); None if this process holds no keys for it. Refused when
    /// `rec` needs a data key not held here (a deep rekey that began on
    /// another host).
    pub(crate) fn cipher_for(
        &self,
        disk: &str,
        id: u32,
        rec: &KeyringRec,
    ) -> Result<Option<Arc<DataCipher>>> {
        let mut held = self.keys.0.lock().unwrap();
        let Some(h) = held.get_mut(&id) else {
            return Ok(None);
        };
        let want = (rec.deep_rekey, rec.base_index());
        if h.made_for != want {
            let c = rec.data_cipher(&h.keys).map_err(|_| {
                Error::new(
                    ErrorKind::Refused,
                    format!(
                        "disk '{disk}': its data key {} is not held by this process (a deep \
                         rekey began elsewhere): unlock it again with its new secret",
                        want.1
                    ),
                )
            })?;
            h.cipher = Arc::new(c);
            h.made_for = want;
        }
        Ok(Some(h.cipher.clone()))
    }

    /// Forget disk `id`'s keys (`strata lock`); whether they were held.
    /// Handles refuse their next read or write; writes they acknowledged
    /// before still reach the store under the cipher they were made with.
    pub fn forget_keys(&self, id: u32) -> bool {
        self.keys.0.lock().unwrap().remove(&id).is_some()
    }

    /// Disk `id`'s keys, if this process holds them.
    pub fn held_keys(&self, id: u32) -> Option<Arc<Unlocked>> {
        self.keys.0.lock().unwrap().get(&id).map(|h| h.keys.clone())
    }

    /// Open `disk`'s keys with `secret` (the record of its newest
    /// manifest) and hold them; the keyslot that opened. A wrong secret
    /// changes nothing.
    pub fn unlock(&self, disk: &str, secret: &[u8]) -> Result<u32> {
        let id = self.disk_id(disk)?;
        let rec = keyring_of(disk, &self.newest_manifest(id)?)?;
        let (slot, keys) = rec.unlock_slot(secret).map_err(|e| crypt_error(disk, e))?;
        self.hold_keys(disk, id, Arc::new(keys), &rec)?;
        Ok(slot)
    }
}
