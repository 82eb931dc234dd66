//! Encrypted disks of an object-store datastore (FORMAT.md §16.7), for
//! [`ObjectStoreDatastore`]'s `Datastore` methods: the keyring rides in
//! every manifest of its disk, key changes are owner commits through this
//! process's handle, and the keys this process holds are the shared
//! datastore's, by disk id.

use std::sync::Arc;

use strata_api::{Encryption, KeyGrant};
use strata_crypt::{locked_error as locked, KeyringRec};
use strata_engine::CarriedKeys;
use strata_objstore::layout::Manifest;

use crate::object_store::ObjectStoreDatastore;
use crate::{new_slot, Result};

impl ObjectStoreDatastore {
    /// What `info` shows of the encryption of the disk whose manifest is
    /// `m` (None: plain). `keyring` is the disk's id: on an object store
    /// each disk has its own record.
    pub(crate) fn encryption_of(&self, m: &Manifest) -> Option<Encryption> {
        let k = m.keyring.as_ref()?;
        Some(Encryption {
            cipher: k.cipher.clone(),
            locked: self.shared().held_keys(m.disk).is_none(),
            keyring: u64::from(m.disk),
            slots: strata_engine::slot_info(k),
            data_key: k.keys.iter().map(|w| w.index).max().unwrap_or(0),
            deep_rekey: None,
            own_key: false,
        })
    }

    /// Create `disk` encrypted under `rec` (its `id` is not used here),
    /// holding `keys` in this process.
    pub(crate) fn create_keyed(
        &self,
        disk: &str,
        size_bytes: u64,
        mut rec: KeyringRec,
        keys: Arc<strata_crypt::Unlocked>,
    ) -> Result<Manifest> {
        rec.id = 0;
        let ds = self.shared();
        let m = ds.create_disk_keyed(disk, size_bytes, Some(rec.clone()))?;
        ds.hold_keys(disk, m.disk, keys, &rec)?;
        Ok(m)
    }

    /// A new encrypted disk with one keyslot for `key`.
    pub(crate) fn create_fresh(
        &self,
        disk: &str,
        size_bytes: u64,
        key: &KeyGrant,
    ) -> Result<Manifest> {
        let (rec, keys) =
            KeyringRec::create(0, &new_slot(key)).map_err(|e| strata_crypt::disk_error(disk, e))?;
        self.create_keyed(disk, size_bytes, rec, Arc::new(keys))
    }

    /// `disk`'s id (as this process sees its newest manifest); an error
    /// when it is plain.
    fn encrypted_id(&self, disk: &str) -> Result<u32> {
        let m = self.current_manifest(disk)?;
        strata_objstore::keys::keyring_of(disk, &m)?;
        Ok(m.disk)
    }

    /// `disk`'s keys to carry into another datastore (None: plain).
    pub(crate) fn carry(&self, disk: &str) -> Result<Option<CarriedKeys>> {
        let m = self.current_manifest(disk)?;
        let Some(rec) = m.keyring else {
            return Ok(None);
        };
        let keys = self
            .shared()
            .held_keys(m.disk)
            .ok_or_else(|| locked(disk))?;
        Ok(Some(CarriedKeys::new(rec, keys)))
    }

    /// `strata lock`: forget `disk`'s keys here (on an object store no
    /// other disk shares them); the disks that are locked now, and whether
    /// keys were held.
    pub(crate) fn lock_keys(&self, disk: &str) -> Result<(Vec<String>, bool)> {
        let id = self.encrypted_id(disk)?;
        Ok((vec![disk.to_string()], self.shared().forget_keys(id)))
    }

    /// The disks sharing `disk`'s record: itself.
    pub(crate) fn keyring_members(&self, disk: &str) -> Result<Vec<String>> {
        self.encrypted_id(disk)?;
        Ok(vec![disk.to_string()])
    }

    /// A linked clone `clone` (its first manifest `m`, which names its
    /// parent) of an encrypted disk whose keys this process holds gets
    /// them too: its record is a copy.
    pub(crate) fn hold_for_clone(&self, clone: &str, m: &Manifest) -> Result<()> {
        let Some(rec) = &m.keyring else {
            return Ok(());
        };
        let Some(parent) = &m.parent else {
            return Ok(());
        };
        match self.shared().held_keys(parent.disk) {
            Some(keys) => self.shared().hold_keys(clone, m.disk, keys, rec),
            None => Ok(()),
        }
    }
}
