//! Encrypted disks of an object-store datastore (FORMAT.md §16.7), for
//! [`ObjectStoreDatastore`]'s `Datastore` methods: the keyring rides in
//! every manifest of its disk, key changes are owner commits through this
//! process's handle, and the keys this process holds are the shared
//! datastore's, by disk id.

use std::sync::Arc;

use strata_api::{Encryption, KeyGrant};
use strata_crypt::{locked_error as locked, KeyringRec};
use strata_engine::{deep_rekey_resumes, CarriedKeys, DeepRekeyReport, Pacer, SpaceWork};
use strata_objstore::layout::Manifest;

use crate::object_store::ObjectStoreDatastore;
use crate::{new_slot, Error, ErrorKind, Result};

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
            deep_rekey: k.deep_rekey.map(|r| strata_api::RekeyProgress {
                done_bytes: r.next_grain * strata_objstore::layout::GRAIN as u64,
                total_bytes: strata_objstore::rekey_end(m) * strata_objstore::layout::GRAIN as u64,
            }),
            own_key: !k.own.is_empty(),
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
        if rec.deep_rekey.is_some() {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "disk '{disk}': a deep rekey is under way; run 'strata rekey --deep {disk}' \
                     to its end first"
                ),
            ));
        }
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

    /// An own-key clone `name` of `disk@snap` (FORMAT.md §16.7): its
    /// first manifest carries §16.4's record for one, made from the
    /// source's record in the manifest its snapshot's root comes from;
    /// this process holds its keys at once.
    pub(crate) fn clone_own_keyed(
        &self,
        disk: &str,
        snap: &str,
        name: &str,
        key: &KeyGrant,
    ) -> Result<Manifest> {
        let id = self.encrypted_id(disk)?;
        let ds = self.shared();
        let keys = ds.held_keys(id).ok_or_else(|| locked(disk))?;
        let slot = new_slot(key);
        let mut made = None;
        let m = ds.clone_linked_keyed(disk, snap, name, |m| {
            let rec = strata_objstore::keys::keyring_of(disk, m)?;
            let (own, u) = rec
                .own_key_clone(&keys, &slot)
                .map_err(|e| strata_crypt::disk_error(disk, e))?;
            made = Some(Arc::new(u));
            Ok(Some(own))
        })?;
        let rec = m.keyring.as_ref().expect("made above");
        ds.hold_keys(name, m.disk, made.expect("made above"), rec)?;
        Ok(m)
    }

    /// `strata rekey --deep` (FORMAT.md §16.7): with `new`, the begin
    /// record (this process holds the new data key before it is
    /// committed, so no write of its own finds it missing); then the
    /// pass, region by region, from the newest manifest's cursor; then
    /// the end record. This process keeps the old data key in memory
    /// until `lock` or its end, for readers still on an older manifest.
    pub(crate) fn deep_rekey(
        &self,
        disk: &str,
        new: Option<&KeyGrant>,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DeepRekeyReport> {
        if disk.contains('@') {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("'{disk}' is a snapshot: rekey its disk; its snapshots follow"),
            ));
        }
        let m = self.current_manifest(disk)?;
        let rec = strata_objstore::keys::keyring_of(disk, &m)?;
        let resumed = deep_rekey_resumes(disk, rec.deep_rekey.is_some(), new.is_some())?;
        let d = self.disk(disk)?;
        let ds = self.shared().clone();
        if let (false, Some(new)) = (resumed, new) {
            let slot = new_slot(new);
            d.change_keyring(|k, keys| {
                let u = k.begin_deep(keys, &slot)?;
                ds.replace_keys(m.disk, Arc::new(u));
                Ok(())
            })?;
        }
        let rec = strata_objstore::keys::keyring_of(disk, &d.manifest())?;
        let keys = ds.held_keys(m.disk).ok_or_else(|| locked(disk))?;
        let Some(under_way) = rec.deep_rekey else {
            return Err(Error::new(
                ErrorKind::Gone,
                format!("'{disk}': the rekey ended"),
            ));
        };
        let to = keys.key(under_way.to).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::Refused,
                format!(
                    "disk '{disk}': data key {} of its deep rekey is not held by this \
                     process: unlock it again with its new secret",
                    under_way.to
                ),
            )
        })?;
        let mut pacer = Pacer::new(work.rate_bytes_per_sec, work.control.as_deref());
        // Clients first: the pass rests while they read or write the disk.
        let mut seen = d.client_grains();
        let moved = d.rekey_pass(&to, progress, &mut |n| {
            let now = d.client_grains();
            let busy = now != seen;
            seen = now;
            pacer.pace(n, busy)
        })?;
        let data_key = d.finish_rekey()?;
        Ok(DeepRekeyReport {
            resumed,
            reencrypted_bytes: moved,
            copied_bytes: 0,
            data_key,
        })
    }
}
