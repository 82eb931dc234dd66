//! Clones: a linked clone shares a snapshot's map (O(1)); a full clone
//! copies the mapped data of a disk or snapshot into a new disk, holding
//! the source still in a hidden snapshot while it copies.

use strata_api::Provisioning;

use crate::catalog::{check_name, split_target, DiskRec, SnapshotRec, HIDDEN_SNAPSHOT_PREFIX};
use crate::error::{err, Error, ErrorKind, Result};
use crate::meta::Meta;
use crate::store::now_unix;
use strata_crypt::NewSlot;

use crate::work::Pacer;

use super::disks::NewDisk;
use super::keys::NewKeys;
use super::{add_snapshot, Datastore, DiskInfo, NewSnapshot, SpaceWork};

/// A full clone to make: of `source` (`DISK` or `DISK@SNAP`), a new disk
/// `name` of type `provisioning`, copied as `work` paces and controls it.
#[derive(Clone)]
pub struct FullClone<'a> {
    pub source: &'a str,
    pub name: &'a str,
    pub provisioning: Provisioning,
    pub work: SpaceWork,
}

/// What a stopped full clone leaves: the source as it was, no new disk.
pub fn stopped_clone(c: &FullClone<'_>) -> String {
    format!(
        "no disk '{}' was made (the partial copy was removed); {} is as it was",
        c.name, c.source
    )
}

/// A linked clone of snapshot `s` named `new` within a change (its name
/// checked free by the caller); `parent` is what it shows as its origin.
/// Returns the new disk's id.
pub(super) fn clone_locked(m: &mut Meta, s: &SnapshotRec, new: &str, parent: &str) -> Result<u64> {
    let id = m.catalog.alloc_id();
    let head = m.catalog.alloc_id();
    m.new_version_from(head, s.version)?;
    m.catalog.disks.push(DiskRec {
        id,
        name: new.to_string(),
        size_bytes: s.size_bytes,
        provisioning: Provisioning::Thin,
        head,
        current_snapshot: None,
        created_unix: now_unix(),
        parent: Some(parent.to_string()),
        limits: Default::default(),
        // The lineage's keys, shared (FORMAT.md §16.3): nothing is copied.
        keyring: m.catalog.disk_by_id(s.disk).and_then(|d| d.keyring),
    });
    m.mark_catalog_dirty();
    Ok(id)
}

/// Within a change: `new` is free, and the disk and snapshot a linked
/// clone of `(disk, snap)` is made from.
fn clone_source(m: &Meta, (disk, snap): (&str, &str), new: &str) -> Result<(DiskRec, SnapshotRec)> {
    m.catalog.name_free(new)?;
    let d = m.catalog.disk(disk)?.clone();
    let s = m.catalog.snapshot(d.id, disk, snap)?.clone();
    Ok((d, s))
}

impl Datastore {
    /// A linked clone's source `src` split into `(disk, snapshot)`, with
    /// `new` checked as a name and the datastore as writable; `hint` ends
    /// the error of a source with no snapshot.
    fn linked_source<'a>(&self, src: &'a str, new: &str, hint: &str) -> Result<(&'a str, &'a str)> {
        check_name("disk", new)?;
        let (disk, Some(snap)) = split_target(src) else {
            return err(
                ErrorKind::InvalidArgument,
                format!("a linked clone needs a snapshot: use '{src}@SNAPSHOT'{hint}"),
            );
        };
        self.inner.check_writable()?;
        Ok((disk, snap))
    }

    /// Linked clone of `DISK@SNAP`: O(1); shares all data with the snapshot.
    pub fn clone_linked(&self, src: &str, new: &str) -> Result<DiskInfo> {
        let (disk, snap) = self.linked_source(src, new, " (or --full)")?;
        self.change(|m| {
            let (_, s) = clone_source(m, (disk, snap), new)?;
            clone_locked(m, &s, new, src)?;
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.disk_info(new)
    }

    /// A new thin disk `new` holding `base`'s state now (`DISK`: its live
    /// state; `DISK@SNAP`: the snapshot), every grain shared with it: a
    /// new version from the base's in one catalog change, nothing copied
    /// (FORMAT.md §17.2a). It records no parent (a disk of its own that
    /// shares, as after `dedup`); an encrypted base's new disk is of its
    /// lineage. Where `import --base` starts.
    pub fn share_from(&self, base: &str, new: &str) -> Result<DiskInfo> {
        check_name("disk", new)?;
        self.inner.check_writable()?;
        self.change(|m| {
            m.catalog.name_free(new)?;
            let (disk, snap) = split_target(base);
            let d = m.catalog.disk(disk)?.clone();
            let (version, size_bytes) = match snap {
                Some(snap) => {
                    let s = m.catalog.snapshot(d.id, disk, snap)?;
                    (s.version, s.size_bytes)
                }
                None => (d.head, d.size_bytes),
            };
            let id = m.catalog.alloc_id();
            let head = m.catalog.alloc_id();
            m.new_version_from(head, version)?;
            m.catalog.disks.push(DiskRec {
                id,
                name: new.to_string(),
                size_bytes,
                provisioning: Provisioning::Thin,
                head,
                current_snapshot: None,
                created_unix: now_unix(),
                parent: None,
                limits: Default::default(),
                keyring: d.keyring,
            });
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.disk_info(new)
    }

    /// Linked clone of `DISK@SNAP` with a key of its own (`clone --own-key`,
    /// FORMAT.md §16.4): still O(1), nothing copied; what it inherits
    /// stays under the source's key, its writes go under a new one, and
    /// only `slot`'s secret opens it. The source must be encrypted and
    /// unlocked; the clone is unlocked when this returns.
    pub fn clone_linked_own_key(
        &self,
        src: &str,
        new: &str,
        slot: &NewSlot<'_>,
    ) -> Result<DiskInfo> {
        let (disk, snap) = self.linked_source(src, new, "")?;
        let source = Self::keyring_of(&self.inner.meta.lock(), disk).map_err(|e| {
            if e.kind == ErrorKind::InvalidArgument {
                Error::new(
                    e.kind,
                    format!("{}: --own-key clones an encrypted disk", e.message),
                )
            } else {
                e
            }
        })?;
        // The KDF runs outside the lock.
        let mut keys = self.prepare_keys(NewKeys::OwnKeyOf(source.id, slot), new)?;
        let made = self.change(|m| {
            let (d, s) = clone_source(m, (disk, snap), new)?;
            // The data keys copied are the ones the source's grains are
            // under: refused if a deep rekey began meanwhile.
            let now = m.catalog.keyring(source.id);
            if d.keyring != Some(source.id) || now.is_none_or(|k| k.deep_rekey.is_some()) {
                return err(
                    ErrorKind::Refused,
                    format!("disk '{disk}': its keys changed meanwhile; try again"),
                );
            }
            let (k, u) = keys.take().expect("an own-key keyring was prepared");
            let id = clone_locked(m, &s, new, src)?;
            let ring = Self::install_keyring(m, k);
            if let Some(c) = m.catalog.disks.iter_mut().find(|c| c.id == id) {
                c.keyring = Some(ring);
            }
            Ok((ring, u))
        })?;
        self.hold_keys(new, made.0, made.1)?;
        self.inner.commit(false)?;
        self.disk_info(new)
    }

    /// Full clone `c.source` (`DISK` or `DISK@SNAP`) → `c.name`: an
    /// independent copy. Copies only mapped grains; time depends on data
    /// size, not on snapshot count. A live disk is copied as it was when
    /// the clone began (point in time), through an implicit snapshot held
    /// for the copy's duration. Paced, paused and cancelled by `c.work`;
    /// one that stops leaves no disk `c.name`.
    pub fn clone_full(
        &self,
        c: &FullClone<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskInfo> {
        let held = match split_target(c.source) {
            (disk, None) => Some((disk.to_string(), self.hold(disk)?)),
            (_, Some(_)) => None,
        };
        let from = match &held {
            Some((disk, snap)) => format!("{disk}@{snap}"),
            None => c.source.to_string(),
        };
        let r = self.copy_into_new(&from, c, progress);
        if let Some((disk, snap)) = held {
            let dropped = self.snapshot_delete(&disk, &snap);
            if r.is_ok() {
                dropped?;
            }
        }
        r
    }

    fn copy_into_new(
        &self,
        src: &str,
        c: &FullClone<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskInfo> {
        let new = c.name;
        let source = self.open_disk(src)?;
        let size = strata_block::BlockDevice::size_bytes(&*source);
        let keyring = {
            let m = self.inner.meta.lock();
            m.catalog.disk_by_id(source.disk_id).and_then(|d| d.keyring)
        };
        let spec = NewDisk {
            name: new,
            size_bytes: size,
            provisioning: c.provisioning,
            keys: keyring.map_or(NewKeys::Plain, NewKeys::CopyOf),
        };
        self.create_disk_with(&spec, &mut |_, _| {})?;
        let target = self.open_disk(new)?;
        let mut pacer = Pacer::new(c.work.rate_bytes_per_sec, c.work.control.as_deref());
        let mut clients = self.inner.client_watch();
        let mut pace = |n| pacer.pace(n, clients.busy());
        let r = crate::disk::copy_mapped(&source, &target, progress, &mut pace);
        if let Err(e) = r {
            drop(target);
            let _ = self.remove_disk(new);
            return Err(match c.work.control.as_deref() {
                Some(w) => w.stopped_leaving(e, &stopped_clone(c)),
                None => e,
            });
        }
        self.inner.commit(false)?;
        self.disk_info(new)
    }

    /// Hold `disk`'s live state still in an implicit snapshot (O(1)), hidden
    /// from lists, exports and the snapshot tree; returns its name.
    pub(super) fn hold(&self, disk: &str) -> Result<String> {
        let name = self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            let id = m.catalog.alloc_id();
            let name = format!("{HIDDEN_SNAPSHOT_PREFIX}{id}");
            let why = "held while a full clone copies the disk";
            let new = NewSnapshot {
                id,
                name: name.clone(),
                description: why,
                parent: None,
            };
            add_snapshot(m, &d, new)?;
            m.mark_catalog_dirty();
            Ok(name)
        })?;
        self.inner.commit(false)?;
        Ok(name)
    }

    /// Drop implicit snapshots left by full clones a crash interrupted.
    pub(super) fn drop_held(&self) -> Result<()> {
        let held: Vec<(String, String)> = {
            let m = self.inner.meta.lock();
            m.catalog
                .snapshots
                .iter()
                .filter(|s| s.is_hidden())
                .filter_map(|s| {
                    let d = m.catalog.disk_by_id(s.disk)?;
                    Some((d.name.clone(), s.name.clone()))
                })
                .collect()
        };
        for (disk, snap) in held {
            tracing::info!("dropping {disk}@{snap}, left by an interrupted full clone");
            self.snapshot_delete(&disk, &snap)?;
        }
        Ok(())
    }
}
