//! `clone --full` through the datastore trait: a point-in-time copy of a
//! disk or snapshot into a new, independent disk, in the same datastore
//! or another one of either kind (`--to DIR`). A local datastore cloning
//! into itself uses the engine's own copy (`ops`), which holds the source
//! in a hidden snapshot; here the instant is a snapshot taken through the
//! trait (`full-clone-NAME-XXXXXXXX`, deleted at the end; one a crash
//! leaves is an ordinary snapshot, removed with `snapshot delete`).

use std::sync::Arc;

use strata_datastore::{capability, Capability, Datastore, DiskView};
use strata_engine::{Error, ErrorKind, Provisioning, WorkControl};

use crate::copier::Copier;

/// `clone --full source name` from `src` into `dst` (None: `src` itself):
/// the kind's own copy within one datastore where it has one
/// (`Datastore::clone_full_within`), else [`clone_full`].
#[expect(clippy::too_many_arguments)]
pub fn run(
    src: &dyn Datastore,
    dst: Option<&dyn Datastore>,
    source: &str,
    name: &str,
    provisioning: Provisioning,
    control: Option<Arc<WorkControl>>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DiskView, Error> {
    if dst.is_none() {
        if let Some(r) = src.clone_full_within(source, name, provisioning, progress) {
            return r;
        }
    }
    clone_full(
        src,
        source,
        dst.unwrap_or(src),
        name,
        provisioning,
        control,
        progress,
    )
}

/// Copy `source` (`DISK` or `DISK@SNAP` of `src`) into a new disk `name`
/// of `dst` with `provisioning`; pause and cancel through `control`. A
/// failed or cancelled clone leaves no disk `name` behind.
#[expect(clippy::too_many_arguments)]
pub fn clone_full(
    src: &dyn Datastore,
    source: &str,
    dst: &dyn Datastore,
    name: &str,
    provisioning: Provisioning,
    control: Option<Arc<WorkControl>>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DiskView, Error> {
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
    let r = copy(src, &from, dst, name, provisioning, control, progress);
    if r.is_err() && dst.exists(name) {
        if let Err(e) = dst.remove(name) {
            tracing::warn!(
                "clone --full of {source}: the partial copy '{name}' stays: {}",
                e.message
            );
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

#[expect(clippy::too_many_arguments)]
fn copy(
    src: &dyn Datastore,
    from: &str,
    dst: &dyn Datastore,
    name: &str,
    provisioning: Provisioning,
    control: Option<Arc<WorkControl>>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DiskView, Error> {
    let source = src.open(from)?;
    let size = source.size_bytes();
    let ranges = src.changed_ranges(None, from)?;
    dst.create(name, size, provisioning, &mut |_, _| {})?;
    let target = dst.open(name)?;
    let mut copier = Copier::new(control, None, progress);
    copier.total = ranges.iter().map(|r| r.len).sum();
    copier.copy(&*source, &*target, &ranges, true, None)?;
    target
        .flush()
        .map_err(|e| Error::new(ErrorKind::Io, format!("flush the clone '{name}': {e}")))?;
    drop(target);
    dst.disk_view(name, false)
}
