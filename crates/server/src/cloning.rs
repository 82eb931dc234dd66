//! `clone --full` through the datastore trait: a point-in-time copy of a
//! disk or snapshot into a new, independent disk, in the same datastore
//! or another one of either kind (`--to DIR`). A local datastore cloning
//! into itself uses the engine's own copy (`ops`), which holds the source
//! in a hidden snapshot; here the instant is a snapshot taken through the
//! trait (`full-clone-NAME-XXXXXXXX`, deleted at the end; one a crash
//! leaves is an ordinary snapshot, removed with `snapshot delete`).

use strata_datastore::{capability, Capability, Datastore, DiskView};
use strata_engine::{stopped_clone, Error, ErrorKind, FullClone};

use crate::copier::{Copier, Pass};

/// `clone --full c.source c.name` from `src` into `dst` (None: `src`
/// itself): the kind's own copy within one datastore where it has one
/// (`Datastore::clone_full_within`), else [`clone_full`]; paced, paused and
/// cancelled by `c.work` either way.
pub fn run(
    src: &dyn Datastore,
    dst: Option<&dyn Datastore>,
    c: &FullClone<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DiskView, Error> {
    if dst.is_none() {
        if let Some(r) = src.clone_full_within(c, progress) {
            return r;
        }
    }
    let mut copier = Copier::new(c.work.control.clone(), c.work.rate_bytes_per_sec, progress);
    clone_full(src, dst.unwrap_or(src), c, &mut copier)
}

/// Copy `c.source` of `src` into a new disk `c.name` of `dst`, paced,
/// paused and cancelled through `copier`. A failed or cancelled clone
/// leaves no disk `c.name` behind.
pub(crate) fn clone_full(
    src: &dyn Datastore,
    dst: &dyn Datastore,
    c: &FullClone<'_>,
    copier: &mut Copier<'_>,
) -> Result<DiskView, Error> {
    let (source, name, provisioning) = (c.source, c.name, c.provisioning);
    if provisioning.is_thick() {
        capability::check(dst.kind(), Capability::Thick).map_err(|e| {
            Error::new(
                e.kind,
                format!("--type {}: {}", provisioning.as_str(), e.message),
            )
        })?;
    }
    if dst.exists(name) {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{} has a disk named '{name}' already", dst.dir().display()),
        ));
    }
    let (disk, snap) = strata_format::split_target(source);
    // The instant: the snapshot named, or one taken now.
    let held = match snap {
        Some(_) => None,
        None => {
            let s = format!("full-clone-{name}-{:08x}", rand::random::<u32>());
            src.snapshot_create(
                disk,
                &s,
                &format!("held while 'clone --full' copies {disk} into {name}"),
            )?;
            Some(s)
        }
    };
    let from = match (&held, snap) {
        (Some(h), _) => format!("{disk}@{h}"),
        (None, Some(s)) => format!("{disk}@{s}"),
        (None, None) => unreachable!("held when no snapshot is named"),
    };
    let mut r = copy(src, &from, dst, c, copier);
    if r.is_err() && dst.exists(name) {
        if let Err(e) = dst.remove(name) {
            tracing::warn!(
                "clone --full of {source}: the partial copy '{name}' stays: {}",
                e.message
            );
        }
    }
    if let (Err(e), Some(w)) = (&mut r, c.work.control.as_deref()) {
        if !dst.exists(name) {
            *e = w.stopped_leaving(e.clone(), &stopped_clone(c));
        }
    }
    if let Some(h) = held {
        let dropped = src.snapshot_delete(disk, &h);
        if r.is_ok() {
            dropped?;
        }
    }
    r
}

/// The disk a copy into another datastore lands in (`move`, `clone --full
/// --to`): `name` in `dst`, created like `src_disk` of `src`: encrypted
/// under the same keyring (the same keyslots and data keys, so the same
/// secrets open it and the data is written as the same ciphertext) when
/// the source is encrypted, which then must be unlocked here; plain
/// otherwise (FORMAT.md §16.3).
pub(crate) struct Landing<'a> {
    pub src_disk: &'a str,
    pub name: &'a str,
    pub size_bytes: u64,
    pub provisioning: strata_engine::Provisioning,
}

/// Create the landing disk of a copy (see [`Landing`]).
pub(crate) fn create_landing(
    src: &dyn Datastore,
    dst: &dyn Datastore,
    l: &Landing<'_>,
) -> Result<(), Error> {
    match src.carried_keys(l.src_disk)? {
        None => dst.create(l.name, l.size_bytes, l.provisioning, &mut |_, _| {})?,
        Some(keys) => {
            let spec = strata_datastore::CarriedDisk {
                disk: l.name,
                size_bytes: l.size_bytes,
                provisioning: l.provisioning,
                keys: &keys,
            };
            dst.create_carrying(&spec, &mut |_, _| {})?
        }
    };
    Ok(())
}

/// Copy version `from` of `src` into the new disk `c.name` of `dst`.
fn copy(
    src: &dyn Datastore,
    from: &str,
    dst: &dyn Datastore,
    c: &FullClone<'_>,
    copier: &mut Copier<'_>,
) -> Result<DiskView, Error> {
    let name = c.name;
    let source = src.open(from)?;
    let size = source.size_bytes();
    let ranges = src.changed_ranges(None, from)?;
    let landing = Landing {
        src_disk: strata_engine::split_target(from).0,
        name,
        size_bytes: size,
        provisioning: c.provisioning,
    };
    create_landing(src, dst, &landing)?;
    let target = dst.open(name)?;
    copier.total = ranges.iter().map(|r| r.len).sum();
    copier.copy(&*source, &*target, &ranges, Pass::Paced)?;
    target
        .flush()
        .map_err(|e| Error::new(ErrorKind::Io, format!("flush the clone '{name}': {e}")))?;
    drop(target);
    dst.disk_view(name, false)
}
