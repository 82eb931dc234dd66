//! Claims and fencing (§11.6): taking a disk for this host, handing it
//! over, releasing it, and refusing I/O once another host holds it.

use super::*;

/// A claim that landed: the claiming manifest, and the owner of the
/// manifest it was written on (whom the disk was taken from).
pub(super) struct Claimed {
    pub(super) man: Manifest,
    pub(super) from: Option<Owner>,
}

/// Claim disk `name` (id `id`) for `me`. With `unless_live`, only if no
/// live writer elsewhere holds it (a first write's claim, §11.6): a host
/// that comes back after a crash must not take a disk another host
/// claimed meanwhile; an explicit `claim` passes None.
pub(super) fn claim(
    store: &ObjectStore,
    name: &str,
    id: u32,
    me: Owner,
    unless_live: Option<&ObjectStoreDatastore>,
) -> Result<Claimed> {
    let mut newest = newest_manifest(store, id)?;
    let first_gen = newest.generation;
    for _ in 0..64 {
        if newest.removed {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("disk '{name}' was removed"),
            ));
        }
        if let Some(ds) = unless_live {
            ds.may_take_over(name, &newest)?;
        }
        let mut next = Manifest {
            seq: newest.seq + 1,
            generation: newest.generation + 1,
            owner: Some(me.clone()),
            written_ms: now_ms(),
            nonce: rand::random(),
            next_ctr: 0,
            ..newest.clone()
        };
        if commit_manifest(store, &newest, &mut next)? {
            tracing::info!(
                event = "claim",
                disk = name,
                generation = next.generation,
                previous = %describe_owner(&newest),
                "disk '{name}' claimed by this host (generation {})",
                next.generation
            );
            return Ok(Claimed {
                man: next,
                from: newest.owner,
            });
        }
        // Only the keys from the one lost on (a busy writer's disk has
        // thousands of manifests until GC runs).
        newest = newest_manifest_from(store, id, next.seq.saturating_sub(1))?;
        if newest.generation != first_gen {
            return Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "disk '{name}' was claimed by {} at the same time",
                    describe_owner(&newest)
                ),
            ));
        }
        // The owner committed meanwhile: claim on top of its newest.
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        format!("disk '{name}': its owner kept committing; the claim gave up after 64 tries"),
    ))
}

/// Wait up to `wait` until disk `name` may be taken without fencing a
/// live writer (released, or its writer gone; §11.5a).
pub(super) fn wait_for_release(
    ds: &ObjectStoreDatastore,
    name: &str,
    id: u32,
    wait: Duration,
) -> Result<()> {
    let t = Instant::now();
    loop {
        let newest = newest_manifest(&ds.store, id)?;
        match ds.may_take_over(name, &newest) {
            Ok(()) => return Ok(()),
            Err(_) if t.elapsed() < wait => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "disk '{name}' is still written by {}: an incoming disk is taken only \
                         once its writer releases it ('strata release {name}' there); waited {} s",
                        describe_owner(&newest),
                        wait.as_secs()
                    ),
                ))
            }
        }
    }
}

impl ObjectDisk {
    /// A handle opened read-only here never claims the disk.
    fn claimable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("'{}' is read-only here", self.name),
            ));
        }
        Ok(())
    }

    /// Make this process the disk's writer now (`strata claim` through a
    /// server), fencing the previous one (also after a release here).
    pub fn claim(&self) -> Result<()> {
        self.claimable()?;
        {
            let mut st = self.state.lock().unwrap();
            st.released = None;
            st.incoming = None;
        }
        self.ensure_owner(true)
    }

    /// Make this process the disk's writer, if it is not yet; an
    /// incoming disk waits for its writer's release first. Unless
    /// `explicit` (`strata claim`, a hand-over), only if no live writer
    /// elsewhere holds the disk (a first write's claim).
    pub(super) fn ensure_owner(&self, explicit: bool) -> Result<()> {
        {
            let st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            if st.owner {
                return Ok(());
            }
            if let Some(r) = &st.released {
                return Err(Error::new(ErrorKind::Released, r.clone()));
            }
        }
        let _c = self.lock_commit()?;
        let incoming = {
            let st = self.state.lock().unwrap();
            if st.owner {
                return Ok(());
            }
            st.incoming
        };
        let disk = self.disk_name();
        if let Some(wait) = incoming {
            wait_for_release(&self.ds, disk, self.id, wait)?;
        }
        let guard = (!explicit && incoming.is_none()).then_some(&*self.ds);
        let c = match claim(self.store(), disk, self.id, self.ds.me_as_owner(), guard) {
            Err(e) if guard.is_some() && e.kind == ErrorKind::Fenced => {
                self.log_refusal(&e);
                return Err(e);
            }
            r => r?,
        };
        let m = c.man;
        self.ds.cache.seed_root(&m);
        let mut st = self.state.lock().unwrap();
        st.marker_seen = m.seq;
        st.man = Arc::new(m);
        st.owner = true;
        st.from_host = c.from.is_some_and(|o| self.ds.is_this_host_idle(&o));
        // The first commit after a claim may pass over an orphan: none
        // is issued on top of it (§11.4b rule 2).
        st.pipeline_ok = false;
        st.incoming = None;
        st.next_ctr = 0;
        st.fold = None;
        drop(st);
        self.start_compactor();
        Ok(())
    }

    /// A client's write could not claim the disk: another host writes it
    /// (§11.6). Said once per refusal text (it names the writer and its
    /// generation), as an error event: the client sees only EIO.
    pub(super) fn log_refusal(&self, e: &Error) {
        let mut st = self.state.lock().unwrap();
        if st.refusal_logged.as_deref() != Some(e.message.as_str()) {
            tracing::error!(
                event = "writer_elsewhere",
                disk = self.disk_name(),
                "writes refused: {}",
                e.message
            );
            st.refusal_logged = Some(e.message.clone());
        }
    }

    /// Mark the disk incoming (§11.5a): until this host writes it, its
    /// first write (or `claim_handover`) waits up to `wait` for the
    /// writer's release rather than fencing it. None: claim as usual.
    pub fn set_incoming(&self, wait: Option<Duration>) {
        let mut st = self.state.lock().unwrap();
        if !st.owner {
            st.incoming = wait;
        }
    }

    /// Become the writer once the current one has released the disk
    /// (waiting up to `wait`); never fences a live writer.
    pub fn claim_handover(&self, wait: Duration) -> Result<()> {
        self.claimable()?;
        {
            let mut st = self.state.lock().unwrap();
            st.released = None;
            if !st.owner {
                st.incoming = Some(wait);
            }
        }
        self.ensure_owner(true)
    }

    /// Hand the disk over (§11.5a): commit every acknowledged write, then
    /// a manifest with no owner. From then on this host refuses writes (an
    /// error saying so, not a fence) and reads what the next writer
    /// commits; `claim` takes it back.
    pub fn release(&self) -> Result<Manifest> {
        self.let_go(None)
    }

    /// A command's end (§11.6, "What a command gives back"): commit, then
    /// give the disk back to whom this process took it from: its host
    /// (the host's claim) if it took it from its own host, else nobody
    /// (as [`Self::release`]).
    pub fn give_back(&self) -> Result<Manifest> {
        let from_host = self.state.lock().unwrap().from_host;
        self.let_go(from_host.then(|| self.ds.me_as_host()))
    }

    /// Before [`Self::let_go`]: the manifest if this host released the
    /// disk already (nothing to do), an error if it does not write it.
    pub(super) fn released_already(&self, disk: &str) -> Result<Option<Manifest>> {
        let st = self.state.lock().unwrap();
        if st.released.is_some() {
            return Ok(Some((*st.man).clone()));
        }
        if let Some(f) = &st.fenced {
            return Err(Error::new(ErrorKind::Fenced, f.clone()));
        }
        if !st.owner {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "this host does not write disk '{disk}' ({}): there is nothing to release",
                    describe_owner(&st.man)
                ),
            ));
        }
        Ok(None)
    }

    /// [`Self::release`] to `to` instead of nobody (only the host's claim).
    pub(super) fn let_go(&self, to: Option<Owner>) -> Result<Manifest> {
        assert!(to.as_ref().is_none_or(Owner::is_host));
        let disk = self.disk_name().to_string();
        if let Some(m) = self.released_already(&disk)? {
            return Ok(m);
        }
        // The next writer starts from what this one read (§11.5b).
        if let Err(e) = self.record_hot_set() {
            tracing::warn!("recording the hot set of '{disk}': {e}");
        }
        loop {
            self.commit()?;
            let _c = self.lock_commit()?;
            let man = {
                let mut st = self.state.lock().unwrap();
                if let Some(f) = &st.fenced {
                    return Err(Error::new(ErrorKind::Fenced, f.clone()));
                }
                if !st.dirty.is_empty() || !st.sealed.is_empty() {
                    // Writes acknowledged since: commit them too.
                    continue;
                }
                st.released = Some(format!(
                    "disk '{disk}' was released on this host for a hand-over: it takes no more \
                     writes here ('strata claim {disk}' takes it back)"
                ));
                st.man.clone()
            };
            let mut next = Manifest {
                seq: man.seq + 1,
                owner: to.clone(),
                written_ms: now_ms(),
                nonce: rand::random(),
                ..(*man).clone()
            };
            let r = commit_manifest(self.store(), &man, &mut next);
            let mut st = self.state.lock().unwrap();
            return match r {
                Ok(true) => {
                    st.owner = false;
                    st.man = Arc::new(next.clone());
                    st.refreshed = Instant::now();
                    let what = match to {
                        Some(_) => "given back to this host (its claim, no process)",
                        None => "released by this host for a hand-over",
                    };
                    tracing::info!(
                        event = "release",
                        disk = %disk,
                        generation = next.generation,
                        "disk '{disk}' {what}"
                    );
                    Ok(next)
                }
                Ok(false) => {
                    let msg = format!(
                        "disk '{disk}' is fenced on this host: it was claimed before the release"
                    );
                    st.fence(&disk, &msg);
                    Err(Error::new(ErrorKind::Fenced, msg))
                }
                Err(e) => {
                    st.released = None;
                    Err(e)
                }
            };
        }
    }

    /// Whether this host released the disk.
    pub fn is_released(&self) -> bool {
        self.state.lock().unwrap().released.is_some()
    }
}
