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

/// An encrypted disk does not leave its datastore yet: the copy would be
/// made through its keys into a plain disk, its data decrypted at the
/// destination (the keyring going along is FORMAT.md §16.3's design, not
/// built for another datastore).
pub(crate) fn refuse_encrypted(src: &dyn Datastore, disk: &str, what: &str) -> Result<(), Error> {
    if src.disk_info(disk)?.encryption.is_none() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Unsupported,
        format!(
            "'{what}' of the encrypted disk '{disk}' into another datastore is not built yet: \
             the copy would arrive decrypted (a full clone within the datastore keeps its keys)"
        ),
    ))
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
    refuse_encrypted(
        src,
        strata_engine::split_target(from).0,
        "clone --full --to",
    )?;
    dst.create(name, size, c.provisioning, &mut |_, _| {})?;
    let target = dst.open(name)?;
    copier.total = ranges.iter().map(|r| r.len).sum();
    copier.copy(&*source, &*target, &ranges, Pass::Paced)?;
    target
        .flush()
        .map_err(|e| Error::new(ErrorKind::Io, format!("flush the clone '{name}': {e}")))?;
    drop(target);
    dst.disk_view(name, false)
}
