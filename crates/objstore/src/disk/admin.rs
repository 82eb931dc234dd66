//! Changes of the disk's record through its writer: snapshots, group
//! cuts, growth and I/O limits, each one committed manifest.

use super::*;
use crate::keys::keyring_of;
use strata_crypt::{disk_error as crypt_error, locked_error as locked};
use strata_crypt::{CryptError, KeyringRec, Unlocked};

impl ObjectDisk {
    /// An owner-only change of the manifest (snapshot, revert, delete a
    /// snapshot): takes the disk over if no live writer holds it, commits
    /// the unflushed writes, then commits `change(newest)`.
    pub(super) fn admin(
        &self,
        change: impl FnOnce(&Manifest) -> Result<Manifest>,
    ) -> Result<Manifest> {
        self.may_write()?;
        self.commit()?;
        let _c = self.lock_commit()?;
        self.admin_locked(change)
    }

    /// Before an owner-only change: refuse a snapshot, and take the disk
    /// over if no live writer holds it (§11.6).
    pub(super) fn may_write(&self) -> Result<()> {
        let disk = self.disk_name().to_string();
        if self.snapshot.is_some() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("'{}' is a snapshot, not a disk", self.name),
            ));
        }
        if !self.ownership().0 {
            let newest = newest_manifest(self.store(), self.id)?;
            self.ds.may_take_over(&disk, &newest)?;
            self.ensure_owner(false)?;
        }
        Ok(())
    }

    /// [`Self::admin`]'s change, with the commit lock held: commits
    /// `change(newest)` as the next manifest.
    pub(super) fn admin_locked(
        &self,
        change: impl FnOnce(&Manifest) -> Result<Manifest>,
    ) -> Result<Manifest> {
        let disk = self.disk_name().to_string();
        self.fold_now()?;
        let man = {
            let st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            st.man.clone()
        };
        let mut next = change(&man)?;
        next.seq = man.seq + 1;
        next.written_ms = now_ms();
        next.nonce = rand::random();
        if !commit_manifest(self.store(), &man, &mut next)? {
            let who = newest_manifest(self.store(), self.id)
                .map(|m| describe_owner(&m))
                .unwrap_or_else(|e| format!("another host ({e})"));
            let msg = format!("disk '{disk}' is fenced on this host: it was claimed by {who}");
            self.state.lock().unwrap().fence(&disk, &msg);
            return Err(Error::new(ErrorKind::Fenced, msg));
        }
        self.state.lock().unwrap().man = Arc::new(next.clone());
        Ok(next)
    }

    /// Take snapshot `snap` of the disk as it is now (unflushed writes
    /// included: they are committed first).
    pub fn snapshot_create(&self, snap: &str, description: &str) -> Result<SnapshotRec> {
        check_name("snapshot", snap)?;
        let m = self.admin(|man| self.with_snapshot(man, snap, description, None))?;
        Ok(m.snapshots.last().cloned().expect("just added"))
    }

    /// `man` with snapshot `snap` of its live state added (the current one).
    pub(super) fn with_snapshot(
        &self,
        man: &Manifest,
        snap: &str,
        description: &str,
        group: Option<GroupRef>,
    ) -> Result<Manifest> {
        if man.snapshots.iter().any(|s| s.name == snap) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("disk '{}' already has a snapshot '{snap}'", self.name),
            ));
        }
        let mut next = man.clone();
        next.snapshots.push(SnapshotRec {
            // The seq of the manifest that records it: never given to
            // another snapshot of the disk (FORMAT.md §11.5).
            id: man.seq + 1,
            name: snap.to_string(),
            description: description.to_string(),
            created_ms: now_ms(),
            size_bytes: man.size_bytes,
            levels: man.levels,
            root: man.root,
            parent: man.current,
            group,
        });
        next.current = next.snapshots.last().map(|s| s.id);
        Ok(next)
    }

    /// One snapshot `snap` of every disk of `members` at one instant
    /// (FORMAT.md §11.11): with every member's commit lock held, every
    /// member's state lock is taken and its acknowledged writes set apart
    /// (the cut: writes wait only while those locks are held), then each
    /// member's cut writes are committed and a manifest adds the snapshot
    /// (marked with `group`). Returns, per member in the order given, the
    /// seq of that manifest (= the snapshot's id), and how long writes
    /// were held. A failure leaves no group snapshot (the caller writes
    /// none); member records already written are incomplete (§11.11).
    pub fn group_cut(
        members: &[Arc<ObjectDisk>],
        snap: &str,
        description: &str,
        group: GroupRef,
    ) -> Result<(Vec<u64>, Duration)> {
        check_name("snapshot", snap)?;
        for d in members {
            d.may_write()?;
            d.commit()?;
            if d.manifest().snapshots.iter().any(|s| s.name == snap) {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "disk '{}' already has a snapshot named '{snap}': nothing was created (a \
                         group snapshot is taken on every member or on none)",
                        d.name
                    ),
                ));
            }
        }
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&i| members[i].id);
        let _commits: Vec<_> = order
            .iter()
            .map(|&i| members[i].lock_commit())
            .collect::<Result<_>>()?;
        let t0 = Instant::now();
        let mut taken: Vec<Option<Taken>> = (0..members.len()).map(|_| None).collect();
        {
            let mut states: Vec<_> = order
                .iter()
                .map(|&i| (i, members[i].state.lock().unwrap()))
                .collect();
            for (i, st) in states.iter_mut() {
                taken[*i] = members[*i].take_batch(st)?;
            }
        }
        let held = t0.elapsed();
        // Every member's cut writes are uploaded, also after one fails (a
        // commit registered in flight must be settled); then the records.
        let mut failed = None;
        for (d, t) in members.iter().zip(taken) {
            if let Some(t) = t {
                if let Err(e) = d.commit_taken(t) {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut seqs = Vec::new();
        for d in members {
            let m = d.admin_locked(|man| d.with_snapshot(man, snap, description, Some(group)))?;
            seqs.push(m.seq);
        }
        Ok((seqs, held))
    }

    /// Grow the disk to `size_bytes` (FORMAT.md §11.5: one manifest; the
    /// map grows with the first write past what it covers). Clients see
    /// the new size at once (`size_bytes`).
    pub fn extend(&self, size_bytes: u64) -> Result<Manifest> {
        check_size(size_bytes)?;
        self.admin(|man| {
            if size_bytes < man.size_bytes {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "'{}' is {}; extend only grows a disk",
                        self.name,
                        strata_api::units::human_exact(man.size_bytes)
                    ),
                ));
            }
            Ok(Manifest {
                size_bytes,
                ..man.clone()
            })
        })
    }

    /// Set the disk's I/O limits (`IoLimits::default()` clears them): one
    /// manifest, and at once for every handle of the disk in this process
    /// (another host's handles take them when they open the disk).
    pub fn set_limits(&self, limits: IoLimits) -> Result<Manifest> {
        limits
            .check()
            .map_err(|why| Error::new(ErrorKind::InvalidArgument, why))?;
        let m = self.admin(|man| {
            Ok(Manifest {
                limits,
                ..man.clone()
            })
        })?;
        self.throttle.set(limits);
        Ok(m)
    }

    /// Delete snapshot `snap` (its clones keep what they hold).
    pub fn snapshot_delete(&self, snap: &str) -> Result<()> {
        self.admin(|man| {
            let mut next = man.clone();
            let Some(gone) = next.snapshots.iter().find(|s| s.name == snap).cloned() else {
                return Err(self.no_snapshot(snap));
            };
            next.snapshots.retain(|s| s.id != gone.id);
            // Its children (and the live state) now descend from its parent.
            for s in &mut next.snapshots {
                if s.parent == Some(gone.id) {
                    s.parent = gone.parent;
                }
            }
            if next.current == Some(gone.id) {
                next.current = gone.parent;
            }
            Ok(next)
        })
        .map(|_| ())
    }

    /// Make the disk what snapshot `snap` holds (its size too); writes
    /// not yet flushed are dropped.
    pub fn snapshot_revert(&self, snap: &str) -> Result<()> {
        let _one = self.rmw.lock().unwrap();
        self.admin(|man| {
            let s = man
                .snapshots
                .iter()
                .find(|s| s.name == snap)
                .ok_or_else(|| self.no_snapshot(snap))?;
            Ok(Manifest {
                root: s.root,
                levels: s.levels,
                size_bytes: s.size_bytes,
                current: Some(s.id),
                ..man.clone()
            })
        })?;
        let mut st = self.state.lock().unwrap();
        st.dirty.clear();
        st.dirty_bytes = 0;
        st.sealed.clear();
        Ok(())
    }

    pub(super) fn no_snapshot(&self, snap: &str) -> Error {
        Error::new(
            ErrorKind::NotFound,
            format!("disk '{}' has no snapshot '{snap}'", self.name),
        )
    }
}

impl ObjectDisk {
    /// Change the disk's keyring with `f` (given the keys this process
    /// holds) as one owner commit (§16.7): the next manifest carries the
    /// new record, or none is written. `f` (a KDF: seconds for a
    /// passphrase) runs before the commit, on the newest record; the
    /// commit is refused if another change came in between.
    pub fn change_keyring<T>(
        &self,
        f: impl FnOnce(&mut KeyringRec, &Unlocked) -> std::result::Result<T, CryptError>,
    ) -> Result<T> {
        let disk = self.disk_name().to_string();
        let keys = self.ds.held_keys(self.id).ok_or_else(|| locked(&disk))?;
        let before = keyring_of(&disk, &self.ds.newest_manifest(self.id)?)?;
        let mut k = before.clone();
        let out = f(&mut k, &keys).map_err(|e| crypt_error(&disk, e))?;
        self.admin(|man| {
            if man.keyring.as_ref() != Some(&before) {
                return Err(Error::new(
                    ErrorKind::Refused,
                    format!("disk '{disk}': its keys changed meanwhile; try again"),
                ));
            }
            Ok(Manifest {
                keyring: Some(k),
                ..man.clone()
            })
        })?;
        Ok(out)
    }
}
