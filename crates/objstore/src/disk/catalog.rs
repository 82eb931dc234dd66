//! Disks of the datastore by name: ids, creation, linked clones, removal,
//! and the holds that keep a disk's objects while a reader uses them.

use super::*;

impl ObjectStoreDatastore {
    /// The disk id a name stands for.
    pub fn disk_id(&self, name: &str) -> Result<u32> {
        let key = name_key(name);
        let obj = self.store.get_opt(&key)?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("no disk named '{name}' in {}", self.cfg.url),
            )
        })?;
        let n: NameObject = serde_json::from_slice(&obj)
            .map_err(|e| corrupt(format!("{key}: not a disk name object: {e}")))?;
        Ok(n.disk)
    }

    /// The newest manifest of disk `id`.
    pub fn newest_manifest(&self, id: u32) -> Result<Manifest> {
        newest_manifest(&self.store, id)
    }

    /// Disk names and their newest manifests, sorted by name.
    pub fn disks(&self) -> Result<Vec<(String, Manifest)>> {
        self.disk_ids()?
            .into_iter()
            .map(|(name, id)| Ok((name, self.newest_manifest(id)?)))
            .collect()
    }

    /// Disk names and their ids (no manifest read), sorted by name.
    pub fn disk_ids(&self) -> Result<Vec<(String, u32)>> {
        let mut out = Vec::new();
        for l in self.store.list(DIR_NAMES, None)? {
            let Some(name) = l.key.strip_prefix(DIR_NAMES) else {
                continue;
            };
            out.push((name.to_string(), self.disk_id(name)?));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Create a thin disk of `size` bytes. Its first manifest is written
    /// before its name, so a name always leads to a whole disk; of two
    /// hosts creating one name, one wins and the other removes its
    /// manifest and fails.
    pub fn create_disk(&self, name: &str, size: u64) -> Result<Manifest> {
        self.create_disk_keyed(name, size, None)
    }

    /// [`Self::create_disk`], encrypted under `keyring` when given (every
    /// manifest of the disk carries it, §16.7).
    pub fn create_disk_keyed(
        &self,
        name: &str,
        size: u64,
        keyring: Option<strata_crypt::KeyringRec>,
    ) -> Result<Manifest> {
        check_name("disk", name)?;
        check_size(size)?;
        if self.store.get_opt(&name_key(name))?.is_some() {
            return Err(self.exists(name));
        }
        let m = loop {
            let id = rand::random::<u32>();
            if id == 0 {
                continue;
            }
            let m = Manifest {
                keyring: keyring.clone(),
                ..Manifest::first(id, size, levels_for(size))
            };
            if self
                .store
                .put_create(&m.key(), Bytes::from(m.encode(&[])))?
                == Put::Created
            {
                break m;
            }
        };
        let body = serde_json::to_vec(&NameObject { disk: m.disk }).expect("json");
        if self.store.put_create(&name_key(name), Bytes::from(body))? == Put::Exists {
            let _ = self.store.delete(&m.key());
            return Err(self.exists(name));
        }
        Ok(m)
    }

    pub(super) fn exists(&self, name: &str) -> Error {
        Error::new(
            ErrorKind::AlreadyExists,
            format!("a disk named '{name}' already exists in {}", self.cfg.url),
        )
    }

    /// This process, as a manifest names its owner.
    pub fn me_as_owner(&self) -> Owner {
        Owner {
            host: self.cfg.me.host.clone(),
            name: self.cfg.me.name.clone(),
            pid: std::process::id(),
        }
    }

    /// This host, as a manifest names the host's own claim (§11.6): no
    /// process of it writes the disk.
    pub fn me_as_host(&self) -> Owner {
        Owner {
            pid: Owner::HOST_PID,
            ..self.me_as_owner()
        }
    }

    /// Whether `o` is this host's claim, or a process of this host that
    /// is this one or is gone: nobody on this host writes the disk but
    /// this process, and no other host may.
    pub(super) fn is_this_host_idle(&self, o: &Owner) -> bool {
        o.host == self.cfg.me.host
            && (o.is_host() || o.pid == std::process::id() || !pid_alive(o.pid))
    }

    /// Claim disk `name` for this process (a manifest with the next
    /// generation naming it): of claims from one generation exactly one
    /// succeeds.
    pub fn claim(&self, name: &str) -> Result<Manifest> {
        let id = self.disk_id(name)?;
        claim(&self.store, name, id, self.me_as_owner(), None).map(|c| c.man)
    }

    /// Claim disk `name` once its writer released it (waiting up to
    /// `wait`), never fencing a live one (§11.5a).
    pub fn claim_handover(&self, name: &str, wait: Duration) -> Result<Manifest> {
        let id = self.disk_id(name)?;
        wait_for_release(self, name, id, wait)?;
        claim(&self.store, name, id, self.me_as_owner(), None).map(|c| c.man)
    }

    /// Claim disk `name` for this host, not this process (§11.6, "The
    /// host's claim": `strata claim` with no server running): the claim
    /// outlives the process; the host's next server takes the disk over
    /// at its first write, and every other host is refused. With
    /// `handover`, only once the writer released the disk (waiting up to
    /// that long), as [`Self::claim_handover`].
    pub fn claim_for_host(&self, name: &str, handover: Option<Duration>) -> Result<Manifest> {
        let id = self.disk_id(name)?;
        if let Some(wait) = handover {
            wait_for_release(self, name, id, wait)?;
        }
        let c = claim(&self.store, name, id, self.me_as_host(), None)?;
        assert!(c.man.owner.as_ref().is_some_and(Owner::is_host));
        Ok(c.man)
    }

    /// Release disk `name` when no live process writes it (its writer on
    /// this host is gone): a manifest with no owner. A live writer
    /// releases through its server.
    pub fn release(&self, name: &str) -> Result<Manifest> {
        let id = self.disk_id(name)?;
        let m = self.newest_manifest(id)?;
        if m.owner.is_none() {
            return Ok(m);
        }
        self.may_take_over(name, &m)?;
        let mut next = Manifest {
            seq: m.seq + 1,
            owner: None,
            written_ms: now_ms(),
            nonce: rand::random(),
            ..m.clone()
        };
        if !commit_manifest(&self.store, &m, &mut next)? {
            return Err(Error::new(
                ErrorKind::Fenced,
                format!("disk '{name}' changed hands while it was released"),
            ));
        }
        Ok(next)
    }
}

/// A hold of a linked clone on its parent's snapshot (§11.6a), under
/// `holds/PARENT8/SNAP16/CLONE8`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub disk: u32,
    pub snapshot: u64,
    pub clone: u32,
    pub size_bytes: u64,
    pub levels: u8,
    pub root: Option<Entry>,
}

pub const DIR_HOLDS: &str = "holds/";

impl Hold {
    pub fn key(&self) -> String {
        format!(
            "{DIR_HOLDS}{:08x}/{:016x}/{:08x}",
            self.disk, self.snapshot, self.clone
        )
    }
}

pub(super) fn pid_alive(pid: u32) -> bool {
    // kill(0, 0) would check our own process group: pid 0 is the host's
    // claim, which no process holds.
    assert_ne!(pid, Owner::HOST_PID, "the host's claim has no process");
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl ObjectStoreDatastore {
    /// Whether this process may act as disk `name`'s owner without
    /// fencing a live writer: nobody owns it, this process does, this
    /// host claimed it (`strata claim` with no server running), or its
    /// owner is a process of this host that is gone (a server that
    /// crashed).
    /// Any other owner must hand it over first (`strata claim`).
    pub fn may_take_over(&self, name: &str, m: &Manifest) -> Result<()> {
        match &m.owner {
            None => Ok(()),
            Some(o) if self.is_this_host_idle(o) => Ok(()),
            Some(_) => Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "disk '{name}' is written by {}: do this there, or take the disk over with \
                     'strata claim {name}' first",
                    describe_owner(m)
                ),
            )),
        }
    }

    /// A linked clone `new` of `src@snap`, made on any host (§11.6a): a
    /// hold keeps the snapshot's map and grains while the clone lives.
    /// An encrypted source's clone starts with a copy of its keyring
    /// (§16.7: the same secrets open it, the same keys read what it
    /// inherits; from then on the two records are separate).
    pub fn clone_linked(&self, src: &str, snap: &str, new: &str) -> Result<Manifest> {
        self.clone_linked_keyed(src, snap, new, |m| Ok(m.keyring.clone()))
    }

    /// [`Self::clone_linked`], the clone's keyring made by `keyring` from
    /// the source's manifest that the snapshot's root is taken from (an
    /// own-key clone's record, §16.7).
    pub fn clone_linked_keyed(
        &self,
        src: &str,
        snap: &str,
        new: &str,
        keyring: impl FnOnce(&Manifest) -> Result<Option<strata_crypt::KeyringRec>>,
    ) -> Result<Manifest> {
        check_name("disk", new)?;
        if self.store.get_opt(&name_key(new))?.is_some() {
            return Err(self.exists(new));
        }
        let src_id = self.disk_id(src)?;
        let m = self.newest_manifest(src_id)?;
        let s = m.snapshots.iter().find(|r| r.name == snap).cloned();
        let s = s.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("disk '{src}' has no snapshot '{snap}'"),
            )
        })?;
        let rec = keyring(&m)?;
        loop {
            let c = rand::random::<u32>();
            if c == 0 || self.store.get_opt(&manifest_key(c, 1))?.is_some() {
                continue;
            }
            let Some(hold) = self.hold_snapshot((src, snap), src_id, &s, c)? else {
                continue;
            };
            let m1 = Manifest {
                root: s.root,
                parent: Some(ParentRef {
                    disk: src_id,
                    snapshot: s.id,
                    name: format!("{src}@{snap}"),
                }),
                keyring: rec.clone(),
                ..Manifest::first(c, s.size_bytes, s.levels)
            };
            if self
                .store
                .put_create(&m1.key(), Bytes::from(m1.encode(&[])))?
                == Put::Exists
            {
                let _ = self.store.delete(&hold.key());
                continue;
            }
            let body = serde_json::to_vec(&NameObject { disk: c }).expect("json");
            if self.store.put_create(&name_key(new), Bytes::from(body))? == Put::Exists {
                let _ = self.store.delete(&m1.key());
                let _ = self.store.delete(&hold.key());
                return Err(self.exists(new));
            }
            return Ok(m1);
        }
    }

    /// Steps 1 and 2 of a linked clone (§11.6a): hold snapshot `s`
    /// (`src@snap`, of disk `src_id`) for clone id `c`. None when a hold
    /// for that id exists already; NotFound (the hold deleted again) when
    /// the snapshot is gone from the newest manifest after it.
    fn hold_snapshot(
        &self,
        (src, snap): (&str, &str),
        src_id: u32,
        s: &SnapshotRec,
        c: u32,
    ) -> Result<Option<Hold>> {
        let hold = Hold {
            disk: src_id,
            snapshot: s.id,
            clone: c,
            size_bytes: s.size_bytes,
            levels: s.levels,
            root: s.root,
        };
        let body = Bytes::from(serde_json::to_vec(&hold).expect("json"));
        if self.store.put_create(&hold.key(), body)? == Put::Exists {
            return Ok(None);
        }
        // After the hold: if the snapshot is still there now, any GC that
        // missed the hold read a manifest that still had it.
        let newest = self.newest_manifest(src_id)?;
        if !newest
            .snapshots
            .iter()
            .any(|r| r.name == snap && r.id == s.id)
        {
            let _ = self.store.delete(&hold.key());
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("snapshot '{src}@{snap}' was deleted while the clone was made"),
            ));
        }
        Ok(Some(hold))
    }

    /// Remove disk `name`: a last manifest marks it removed (a claim, so
    /// a writer elsewhere is fenced), then its name and its hold go, and
    /// the keys this process held for it.
    /// Its objects are garbage collection's; its snapshots' clones keep
    /// what they hold.
    pub fn remove_disk(&self, name: &str) -> Result<()> {
        let id = self.disk_id(name)?;
        let m = self.newest_manifest(id)?;
        if !m.removed {
            self.may_take_over(name, &m)?;
            let mut next = Manifest {
                seq: m.seq + 1,
                generation: m.generation + 1,
                owner: Some(self.me_as_owner()),
                written_ms: now_ms(),
                nonce: rand::random(),
                removed: true,
                ..m.clone()
            };
            if !commit_manifest(&self.store, &m, &mut next)? {
                let now = self.newest_manifest(id)?;
                return Err(Error::new(
                    ErrorKind::Fenced,
                    format!(
                        "disk '{name}' changed hands while it was removed: {}",
                        describe_owner(&now)
                    ),
                ));
            }
        }
        self.store.delete(&name_key(name))?;
        self.forget_keys(id);
        if let Some(p) = &m.parent {
            let hold = format!("{DIR_HOLDS}{:08x}/{:016x}/{id:08x}", p.disk, p.snapshot);
            self.store.delete(&hold)?;
        }
        Ok(())
    }

    /// Every hold in the store.
    pub fn holds(&self) -> Result<Vec<Hold>> {
        let mut out = Vec::new();
        for l in self.store.list(DIR_HOLDS, None)? {
            let obj = self.store.get(&l.key)?;
            let h: Hold = serde_json::from_slice(&obj)
                .map_err(|e| corrupt(format!("{}: not a hold: {e}", l.key)))?;
            if h.key() != l.key {
                return Err(corrupt(format!(
                    "{}: the hold says it is {}",
                    l.key,
                    h.key()
                )));
            }
            out.push(h);
        }
        Ok(out)
    }
}
