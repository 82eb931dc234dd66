//! Snapshots: take, list, revert and delete. Taking one is O(1): a new
//! version shares the head's map. Deleting one drops its version and hands
//! its children to its parent; nothing is moved.

use std::collections::{HashMap, HashSet};

use strata_format::GRAIN_BYTES;

use crate::catalog::{check_name, DiskRec, SnapshotRec};
use crate::error::{err, Error, ErrorKind, Result};
use crate::meta::Meta;
use crate::store::now_unix;

use super::{Datastore, SnapshotInfo};

/// A snapshot to record: its catalog id, name and description, and its
/// parent in the disk's snapshot tree.
pub(super) struct NewSnapshot<'a> {
    pub id: u64,
    pub name: String,
    pub description: &'a str,
    pub parent: Option<u64>,
}

/// Record snapshot `s` of `d`'s live state: a new version sharing the
/// head's map (O(1)), and its catalog entry under `s.parent` in the tree.
pub(super) fn add_snapshot(m: &mut Meta, d: &DiskRec, s: NewSnapshot<'_>) -> Result<()> {
    let version = m.catalog.alloc_id();
    m.new_version_from(version, d.head)?;
    m.catalog.snapshots.push(SnapshotRec {
        id: s.id,
        disk: d.id,
        name: s.name,
        description: s.description.to_string(),
        created_unix: now_unix(),
        parent: s.parent,
        version,
        size_bytes: d.size_bytes,
    });
    Ok(())
}

/// Delete snapshot `id` within a change: drop its version, hand its
/// children to its parent.
pub(super) fn delete_snapshot_locked(m: &mut Meta, id: u64) -> Result<()> {
    let s = m
        .catalog
        .snapshots
        .iter()
        .find(|s| s.id == id)
        .cloned()
        .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no snapshot with id {id}")))?;
    m.drop_version(s.version)?;
    for c in m
        .catalog
        .snapshots
        .iter_mut()
        .filter(|c| c.parent == Some(s.id))
    {
        c.parent = s.parent;
    }
    m.catalog.snapshots.retain(|x| x.id != s.id);
    if let Some(dm) = m.catalog.disks.iter_mut().find(|d| d.id == s.disk) {
        if dm.current_snapshot == Some(s.id) {
            dm.current_snapshot = s.parent;
        }
    }
    m.mark_catalog_dirty();
    Ok(())
}

impl Datastore {
    /// Take a snapshot: O(1), whatever the disk holds.
    pub fn snapshot_create(
        &self,
        disk: &str,
        snap: &str,
        description: &str,
    ) -> Result<SnapshotInfo> {
        check_name("snapshot", snap)?;
        self.inner.check_writable()?;
        self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            if m.catalog.snapshot(d.id, disk, snap).is_ok() {
                return err(
                    ErrorKind::AlreadyExists,
                    format!("disk '{disk}' already has a snapshot named '{snap}'"),
                );
            }
            let id = m.catalog.alloc_id();
            let new = NewSnapshot {
                id,
                name: snap.to_string(),
                description,
                parent: d.current_snapshot,
            };
            add_snapshot(m, &d, new)?;
            m.catalog.disk_mut(disk)?.current_snapshot = Some(id);
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.snapshots_of(disk, false)?
            .into_iter()
            .find(|s| s.name == snap)
            .ok_or_else(|| Error::new(ErrorKind::Gone, "snapshot vanished"))
    }

    /// Snapshots of a disk, parents before children (a tree by `parent`).
    /// Each with `exclusive_bytes`: what deleting it would free (a read-only
    /// simulation per snapshot, whose cost follows its exclusive data).
    pub fn snapshot_list(&self, disk: &str) -> Result<Vec<SnapshotInfo>> {
        self.snapshots_of(disk, true)
    }

    /// Snapshots of `disk`; `exclusive_bytes` is computed when `space`
    /// (else 0, true of a snapshot just taken: it shares the head's root).
    fn snapshots_of(&self, disk: &str, space: bool) -> Result<Vec<SnapshotInfo>> {
        let mut guard = self.inner.meta.lock();
        let m: &mut Meta = &mut guard;
        let d = m.catalog.disk(disk)?.clone();
        let exclusive = match space {
            true => exclusive_by_version(m, d.id)?,
            false => HashMap::new(),
        };
        let snaps: Vec<&SnapshotRec> = m
            .catalog
            .snapshots
            .iter()
            .filter(|s| s.disk == d.id && !s.is_hidden())
            .collect();
        let name_of = |id: Option<u64>| {
            id.and_then(|i| snaps.iter().find(|s| s.id == i))
                .map(|s| s.name.clone())
        };
        let info = |s: &SnapshotRec| SnapshotInfo {
            id: s.id,
            name: s.name.clone(),
            description: s.description.clone(),
            created_unix: s.created_unix,
            parent: name_of(s.parent),
            size_bytes: s.size_bytes,
            mapped_bytes: Some(
                m.version_state(s.version).unwrap_or_default().mapped_grains * GRAIN_BYTES,
            ),
            exclusive_bytes: Some(exclusive.get(&s.version).copied().unwrap_or(0)),
            current: d.current_snapshot == Some(s.id),
            group: m
                .catalog
                .group_snapshot_of(s.id)
                .map(|(g, _)| g.name.clone()),
        };
        Ok(tree_order(&snaps).into_iter().map(info).collect())
    }

    /// Make the disk's live state equal to the snapshot again. The live
    /// state's changes since are discarded.
    pub fn snapshot_revert(&self, disk: &str, snap: &str) -> Result<()> {
        self.inner.check_writable()?;
        self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            let s = m.catalog.snapshot(d.id, disk, snap)?.clone();
            m.replace_version(d.head, s.version)?;
            let dm = m.catalog.disk_mut(disk)?;
            dm.current_snapshot = Some(s.id);
            dm.size_bytes = s.size_bytes;
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)
    }

    /// Delete a snapshot. Moves no data: what others still share stays.
    /// Refused for a member of a group snapshot (deleted with the group
    /// snapshot, as one).
    /// Rename snapshot `disk@old` to `disk@new`, also while it is
    /// served (handles hold it by id). Linked clones made from it show the
    /// new name in their parent. A member of a group snapshot keeps the
    /// group snapshot's name. One catalog change.
    pub fn snapshot_rename(&self, disk: &str, old: &str, new: &str) -> Result<()> {
        check_name("snapshot", new)?;
        self.inner.check_writable()?;
        self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            let s = m.catalog.snapshot(d.id, disk, old)?.clone();
            if let Some((g, gs)) = m.catalog.group_snapshot_of(s.id) {
                return err(
                    ErrorKind::Refused,
                    format!(
                        "snapshot '{disk}@{old}' is a member of group snapshot '{}@{}', whose \
                         members bear its name",
                        g.name, gs.name
                    ),
                );
            }
            if old != new && m.catalog.snapshot(d.id, disk, new).is_ok() {
                return err(
                    ErrorKind::AlreadyExists,
                    format!("disk '{disk}' has a snapshot named '{new}' already"),
                );
            }
            let (was, now) = (format!("{disk}@{old}"), format!("{disk}@{new}"));
            for r in &mut m.catalog.snapshots {
                if r.id == s.id {
                    r.name = new.to_string();
                }
            }
            for c in &mut m.catalog.disks {
                if c.parent.as_deref() == Some(was.as_str()) {
                    c.parent = Some(now.clone());
                }
            }
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)
    }

    pub fn snapshot_delete(&self, disk: &str, snap: &str) -> Result<()> {
        self.inner.check_writable()?;
        self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            let s = m.catalog.snapshot(d.id, disk, snap)?.clone();
            if let Some((g, gs)) = m.catalog.group_snapshot_of(s.id) {
                return err(
                    ErrorKind::Refused,
                    format!(
                        "snapshot '{disk}@{snap}' is a member of group snapshot '{}@{}': delete \
                         the group snapshot ('strata group snapshot delete {} {}')",
                        g.name, gs.name, g.name, gs.name
                    ),
                );
            }
            delete_snapshot_locked(m, s.id)
        })?;
        self.inner.commit(false)
    }
}

/// What deleting each of the disk's (visible) snapshots alone would free,
/// in bytes, by the snapshot's version.
fn exclusive_by_version(m: &mut Meta, disk_id: u64) -> Result<HashMap<u64, u64>> {
    let base = m.drop_baseline()?;
    let versions: Vec<u64> = m
        .catalog
        .snapshots
        .iter()
        .filter(|s| s.disk == disk_id && !s.is_hidden())
        .map(|s| s.version)
        .collect();
    let mut out = HashMap::new();
    for v in versions {
        out.insert(v, m.exclusive_grains(&base, &[v])? * GRAIN_BYTES);
    }
    Ok(out)
}

/// `snaps` in the order `snapshot list` shows them: depth-first from the
/// roots, each one's children in order of creation.
fn tree_order<'a>(snaps: &[&'a SnapshotRec]) -> Vec<&'a SnapshotRec> {
    let children = |parent: Option<u64>| {
        let mut c: Vec<&'a SnapshotRec> = snaps
            .iter()
            .copied()
            .filter(|s| s.parent == parent)
            .collect();
        c.sort_by_key(|s| std::cmp::Reverse(s.id));
        c
    };
    let mut out = Vec::new();
    let mut visited = HashSet::new();
    let mut stack: Vec<Option<&'a SnapshotRec>> = vec![None];
    while let Some(p) = stack.pop() {
        if let Some(s) = p {
            if !visited.insert(s.id) {
                continue;
            }
            out.push(s);
        }
        stack.extend(children(p.map(|s| s.id)).into_iter().map(Some));
    }
    out
}
