//! Linked clones and the snapshot they came from (docs/INTERLOCKS.md):
//! deleting that snapshot, or removing its disk, is refused while clones
//! made from it exist, unless forced; a clone whose parent went keeps its
//! data (grains are reference counted) and shows its parent as deleted.
//! Nothing here is stored: a clone's parent is looked up when answering.

use std::collections::HashMap;

use strata_api::{DiskView, Request};
use strata_datastore::Datastore;
use strata_engine::{Error, ErrorKind};

/// Refuse `rm DISK` while linked clones were made from one of its
/// snapshots, and `snapshot delete DISK@SNAP` while clones were made from
/// it, naming them, unless the request is forced.
pub fn refuse(ds: &dyn Datastore, req: &Request) -> Result<(), Error> {
    let (from, what, doing, force) = match req {
        Request::Remove { name, force } => (
            Source::Disk(name),
            format!("'{name}' has snapshots that linked clones"),
            "removing it",
            *force,
        ),
        Request::SnapshotDelete {
            disk,
            snapshot,
            force,
        } => (
            Source::Snapshot(format!("{disk}@{snapshot}")),
            format!("linked clones of '{disk}@{snapshot}'"),
            "deleting it",
            *force,
        ),
        _ => return Ok(()),
    };
    // A name that does not exist gets the request's own error.
    let Ok(disks) = ds.list() else {
        return Ok(());
    };
    // A disk's snapshots now: a clone whose parent went already holds
    // nothing back.
    let live: Vec<String> = match &from {
        Source::Disk(d) => ds
            .snapshots(d)
            .map(|s| s.into_iter().map(|s| format!("{d}@{}", s.name)).collect())
            .unwrap_or_default(),
        Source::Snapshot(s) => vec![s.clone()],
    };
    let clones: Vec<String> = disks
        .iter()
        .filter(|d| d.info.parent.as_ref().is_some_and(|p| live.contains(p)))
        .map(|d| match &d.info.parent {
            Some(p) if matches!(from, Source::Disk(_)) => format!("{} (from {p})", d.info.name),
            _ => d.info.name.clone(),
        })
        .collect();
    if clones.is_empty() {
        return Ok(());
    }
    let list = clones.join(", ");
    if force {
        tracing::warn!(
            event = "interlock",
            "{doing} forced: {what} came from: {list} \
            keep their data; their parent shows as deleted"
        );
        return Ok(());
    }
    let subject = match from {
        Source::Disk(_) => format!("{what} were made from: {list}"),
        Source::Snapshot(_) => format!("{what} exist: {list}"),
    };
    Err(Error::new(
        ErrorKind::Refused,
        format!(
            "{subject}; they would keep their data, with their parent shown as deleted; \
             pass --force for {doing} anyway"
        ),
    ))
}

/// What a refusal is about: a disk (any of its snapshots) or one snapshot.
enum Source<'a> {
    Disk(&'a str),
    Snapshot(String),
}

/// What answering finds of a clone's parent disk.
enum ParentDisk {
    /// There, with these snapshots.
    Snapshots(Vec<String>),
    /// Removed.
    Gone,
    /// Not known now (a store that does not answer): nothing is marked.
    Unknown,
}

/// Mark each view whose parent snapshot (or its disk) no longer exists.
pub fn mark_deleted_parents(ds: &dyn Datastore, views: &mut [DiskView]) {
    let mut known: HashMap<String, ParentDisk> = HashMap::new();
    for v in views.iter_mut() {
        let Some(parent) = &v.info.parent else {
            continue;
        };
        let (disk, snap) = strata_format::split_target(parent);
        let found = known
            .entry(disk.to_string())
            .or_insert_with(|| match ds.snapshots(disk) {
                Ok(s) => ParentDisk::Snapshots(s.into_iter().map(|s| s.name).collect()),
                Err(e) if e.kind == ErrorKind::NotFound => ParentDisk::Gone,
                Err(_) => ParentDisk::Unknown,
            });
        v.info.parent_deleted = match (found, snap) {
            (ParentDisk::Snapshots(names), Some(snap)) => !names.iter().any(|n| n == snap),
            (ParentDisk::Gone, _) => true,
            _ => false,
        };
    }
}
