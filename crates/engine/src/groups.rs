//! Consistency groups (docs/BACKUP.md): disks snapshotted, deleted,
//! reverted and cloned together, each operation one catalog change under
//! the I/O gate, so one log batch carries it all (FORMAT.md §6).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use strata_api::{
    Consistency, GroupInfo, GroupMemberInfo, GroupSnapshotInfo, QuiesceReport, QuiesceResult,
};
use strata_format::GRAIN_BYTES;

use super::{add_snapshot, clone_locked, delete_snapshot_locked, Datastore, NewSnapshot};
use crate::catalog::{
    check_name, split_target, GroupMemberRec, GroupRec, GroupSnapRec, GROUP_DISKS_MAX,
};
use crate::error::{err, Error, ErrorKind, Result};
use crate::meta::Meta;
use crate::store::now_unix;

/// How a group snapshot is taken.
#[derive(Debug, Clone, Default)]
pub struct GroupSnapshotOptions {
    pub description: String,
    /// The hook's run before the cut (None: no hook).
    pub quiesce: Option<QuiesceReport>,
    /// Longest wait for the requests in flight to finish; past it nothing
    /// is created.
    pub max_pause: Option<Duration>,
}

impl Datastore {
    /// Create a group of `disks` (each in no other group).
    pub fn group_create(
        &self,
        name: &str,
        disks: &[String],
        quiesce_hook: Option<String>,
        quiesce_timeout_s: Option<u64>,
    ) -> Result<GroupInfo> {
        strata_format::check_group_name("group", name)?;
        check_group_size(disks.len())?;
        self.change(|m| {
            if m.catalog.group(name).is_ok() {
                return err(
                    ErrorKind::AlreadyExists,
                    format!("a group named '{name}' already exists"),
                );
            }
            let mut ids = Vec::new();
            for d in disks {
                let id = member_to_add(m, name, d)?;
                if ids.contains(&id) {
                    return err(
                        ErrorKind::InvalidArgument,
                        format!("disk '{d}' is named twice"),
                    );
                }
                ids.push(id);
            }
            let id = m.catalog.alloc_id();
            m.catalog.groups.push(GroupRec {
                id,
                name: name.to_string(),
                disks: ids,
                created_unix: now_unix(),
                quiesce_hook,
                quiesce_timeout_s,
                snapshots: Vec::new(),
            });
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.group_info(name)
    }

    /// Remove a group (its disks stay). Refused while it has snapshots.
    pub fn group_delete(&self, name: &str) -> Result<()> {
        self.change(|m| {
            let g = m.catalog.group(name)?;
            if let Some(s) = g.snapshots.first() {
                return err(
                    ErrorKind::Refused,
                    format!(
                        "group '{name}' has {} snapshot(s) ('{}' ...): delete them first \
                         ('strata group snapshot delete {name} SNAP')",
                        g.snapshots.len(),
                        s.name
                    ),
                );
            }
            m.catalog.groups.retain(|g| g.name != name);
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)
    }

    /// Add a disk to a group, or (`add` false) take one out. Group
    /// snapshots taken before keep their members; `group revert` of them
    /// is refused from now on.
    pub fn group_member(&self, name: &str, disk: &str, add: bool) -> Result<GroupInfo> {
        self.change(|m| {
            let g = m.catalog.group(name)?.clone();
            if add {
                if g.disks.len() >= GROUP_DISKS_MAX {
                    return Err(group_full(name));
                }
                let id = member_to_add(m, name, disk)?;
                group_mut(m, name).disks.push(id);
            } else {
                let id = m.catalog.disk(disk)?.id;
                if !g.disks.contains(&id) {
                    return err(
                        ErrorKind::NotFound,
                        format!("disk '{disk}' is not in group '{name}'"),
                    );
                }
                if g.disks.len() == 1 {
                    return Err(last_disk(name, disk));
                }
                group_mut(m, name).disks.retain(|d| *d != id);
            }
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.group_info(name)
    }

    pub fn groups(&self) -> Vec<GroupInfo> {
        let m = self.inner.meta.lock();
        let mut v: Vec<GroupInfo> = m.catalog.groups.iter().map(|g| info(&m, g)).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn group_info(&self, name: &str) -> Result<GroupInfo> {
        let m = self.inner.meta.lock();
        Ok(info(&m, m.catalog.group(name)?))
    }

    /// Snapshot every member of `group` at one instant: requests in
    /// flight finish, new ones wait, every member gets snapshot `snap` and
    /// the group its record in one change, then I/O goes on and the change
    /// is committed. All or nothing.
    pub fn group_snapshot_create(
        &self,
        group: &str,
        snap: &str,
        opts: &GroupSnapshotOptions,
    ) -> Result<GroupSnapshotInfo> {
        strata_format::check_group_name("group snapshot", snap)?;
        self.inner.check_writable()?;
        // Validated before the gate, so a refusal holds no I/O; again
        // under it, where it counts.
        {
            let m = self.inner.meta.lock();
            can_snapshot(&m, group, snap)?;
        }
        let t0 = Instant::now();
        let gate = match opts.max_pause {
            Some(d) => self.inner.gate.try_write_for(d).ok_or_else(|| {
                Error::new(
                    ErrorKind::Refused,
                    format!(
                        "the requests in flight on the datastore did not finish within the \
                         longest pause allowed ({} ms): nothing was created, I/O goes on",
                        d.as_millis()
                    ),
                )
            })?,
            None => self.inner.gate.write(),
        };
        let mut m = self.inner.meta.lock();
        self.inner.guarded(&mut m, |m| {
            let members = can_snapshot(m, group, snap)?;
            let mut recs = Vec::new();
            for d in members {
                let id = m.catalog.alloc_id();
                let new = NewSnapshot {
                    id,
                    name: snap.to_string(),
                    description: &opts.description,
                    parent: d.current_snapshot,
                };
                add_snapshot(m, &d, new)?;
                m.catalog.disk_mut(&d.name)?.current_snapshot = Some(id);
                recs.push(GroupMemberRec {
                    disk: d.id,
                    snapshot: id,
                });
            }
            let id = m.catalog.alloc_id();
            let consistency = match &opts.quiesce {
                Some(q) if q.result == QuiesceResult::Ok => Consistency::Application,
                _ => Consistency::Crash,
            };
            group_mut(m, group).snapshots.push(GroupSnapRec {
                id,
                name: snap.to_string(),
                description: opts.description.clone(),
                created_unix: now_unix(),
                members: recs,
                consistency,
                quiesce: opts.quiesce.clone(),
                pause_us: t0.elapsed().as_micros() as u64,
            });
            m.mark_catalog_dirty();
            Ok(())
        })?;
        drop(m);
        drop(gate);
        self.inner.commit(false)?;
        self.group_snapshots(group, false)?
            .into_iter()
            .find(|s| s.name == snap)
            .ok_or_else(|| Error::new(ErrorKind::Gone, "group snapshot vanished"))
    }

    /// A group's snapshots, oldest first; with `space`, what deleting each
    /// member's snapshot, and each group snapshot, would free.
    pub fn group_snapshots(&self, group: &str, space: bool) -> Result<Vec<GroupSnapshotInfo>> {
        let mut guard = self.inner.meta.lock();
        let m: &mut Meta = &mut guard;
        let g = m.catalog.group(group)?.clone();
        let base = if space {
            Some(m.drop_baseline()?)
        } else {
            None
        };
        let mut out = Vec::new();
        for gs in &g.snapshots {
            let mut members = Vec::new();
            let mut versions = Vec::new();
            for mr in &gs.members {
                let (d, s) = member(m, group, gs, mr)?;
                let disk = d.name.clone();
                let exclusive_bytes = match &base {
                    Some(b) => Some(m.exclusive_grains(b, &[s.version])? * GRAIN_BYTES),
                    None => None,
                };
                versions.push(s.version);
                members.push(GroupMemberInfo {
                    disk,
                    snapshot: s.name.clone(),
                    id: s.id,
                    size_bytes: s.size_bytes,
                    exclusive_bytes,
                });
            }
            let exclusive_bytes = match &base {
                Some(b) => Some(m.exclusive_grains(b, &versions)? * GRAIN_BYTES),
                None => None,
            };
            out.push(GroupSnapshotInfo {
                group: g.name.clone(),
                name: gs.name.clone(),
                id: gs.id,
                description: gs.description.clone(),
                created_unix: gs.created_unix,
                ready_to_use: true,
                consistency: gs.consistency,
                quiesce: gs.quiesce.clone(),
                pause_us: gs.pause_us,
                members,
                exclusive_bytes,
            });
        }
        Ok(out)
    }

    /// Delete a group snapshot: every member's snapshot, in one change.
    pub fn group_snapshot_delete(&self, group: &str, snap: &str) -> Result<()> {
        self.inner.check_writable()?;
        self.change(|m| {
            let gs = group_snapshot(m, group, snap)?;
            for mr in &gs.members {
                delete_snapshot_locked(m, mr.snapshot)?;
            }
            group_mut(m, group).snapshots.retain(|s| s.id != gs.id);
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)
    }

    /// Revert every member to the group snapshot, in one change. Refused
    /// when the membership changed since it was taken.
    pub fn group_snapshot_revert(&self, group: &str, snap: &str) -> Result<()> {
        self.inner.check_writable()?;
        self.change(|m| {
            let gs = group_snapshot(m, group, snap)?;
            let g = m.catalog.group(group)?;
            let then: HashSet<u64> = gs.members.iter().map(|x| x.disk).collect();
            let now: HashSet<u64> = g.disks.iter().copied().collect();
            if then != now {
                let names = |ids: Vec<&u64>| {
                    ids.into_iter()
                        .filter_map(|i| m.catalog.disk_by_id(*i).map(|d| d.name.clone()))
                        .collect()
                };
                return Err(membership_changed(
                    group,
                    snap,
                    names(now.difference(&then).collect()),
                    names(then.difference(&now).collect()),
                ));
            }
            for mr in &gs.members {
                let (d, s) = member(m, group, &gs, mr)?;
                m.replace_version(d.head, s.version)?;
                let dm = m.catalog.disk_mut(&d.name)?;
                dm.current_snapshot = Some(s.id);
                dm.size_bytes = s.size_bytes;
            }
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)
    }

    /// Linked clones of every member of `GROUP@SNAP` and a new group of
    /// them, in one change. `renames` (member -> clone) choose names; the
    /// rest follow [`clone_name`].
    pub fn group_clone(
        &self,
        source: &str,
        new_group: &str,
        renames: &[(String, String)],
    ) -> Result<GroupInfo> {
        let (group, Some(snap)) = split_target(source) else {
            return err(
                ErrorKind::InvalidArgument,
                format!("a group clone needs a group snapshot: use '{source}@SNAPSHOT'"),
            );
        };
        strata_format::check_group_name("group", new_group)?;
        self.inner.check_writable()?;
        self.change(|m| {
            if m.catalog.group(new_group).is_ok() {
                return err(
                    ErrorKind::AlreadyExists,
                    format!("a group named '{new_group}' already exists"),
                );
            }
            let g = m.catalog.group(group)?.clone();
            let gs = group_snapshot(m, group, snap)?;
            let members = gs
                .members
                .iter()
                .map(|mr| member(m, group, &gs, mr))
                .collect::<Result<Vec<_>>>()?;
            let names: Vec<String> = members.iter().map(|(d, _)| d.name.clone()).collect();
            let new = clone_plan(source, new_group, &names, renames, |n| {
                m.catalog.disk(n).is_ok()
            })?;
            let plan: Vec<_> = members
                .into_iter()
                .zip(new)
                .map(|((d, s), n)| (d, s, n))
                .collect();
            let mut ids = Vec::new();
            for (d, s, new) in &plan {
                ids.push(clone_locked(m, s, new, &format!("{}@{}", d.name, s.name))?);
            }
            let id = m.catalog.alloc_id();
            m.catalog.groups.push(GroupRec {
                id,
                name: new_group.to_string(),
                disks: ids,
                created_unix: now_unix(),
                quiesce_hook: g.quiesce_hook.clone(),
                quiesce_timeout_s: g.quiesce_timeout_s,
                snapshots: Vec::new(),
            });
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.group_info(new_group)
    }
}

/// The name of a member's clone in a group clone: the member's name with
/// the group's name replaced where it starts with it (`vm1-os` in `vm1`
/// cloned to `vm2`: `vm2-os`), else the new group's name, '-', the
/// member's name.
pub fn clone_name(group: &str, new_group: &str, member: &str) -> String {
    match member.strip_prefix(group) {
        Some(rest) if !rest.is_empty() => format!("{new_group}{rest}"),
        _ => format!("{new_group}-{member}"),
    }
}

/// The rules both kinds of datastore apply to groups, with one wording.
///
/// Ok if a group may have `n` disks.
pub fn check_group_size(n: usize) -> Result<()> {
    if n == 0 || n > GROUP_DISKS_MAX {
        return err(
            ErrorKind::InvalidArgument,
            format!("a group has 1 to {GROUP_DISKS_MAX} disks, not {n}"),
        );
    }
    Ok(())
}

/// Adding to a group that has the most disks a group has.
pub fn group_full(group: &str) -> Error {
    Error::new(
        ErrorKind::Refused,
        format!("group '{group}' has {GROUP_DISKS_MAX} disks, the most a group has"),
    )
}

/// Taking out a group's last disk.
pub fn last_disk(group: &str, disk: &str) -> Error {
    Error::new(
        ErrorKind::Refused,
        format!(
            "'{disk}' is the last disk of group '{group}': remove the group instead ('strata \
             group rm {group}')"
        ),
    )
}

/// A group revert refused: the disks `added` and `removed` since `snap`.
pub fn membership_changed(
    group: &str,
    snap: &str,
    mut added: Vec<String>,
    mut removed: Vec<String>,
) -> Error {
    added.sort();
    removed.sort();
    Error::new(
        ErrorKind::Refused,
        format!(
            "the disks of group '{group}' changed since '{snap}' was taken (added: [{}]; \
             removed: [{}]): revert the members one by one ('strata snapshot revert DISK \
             {snap}')",
            added.join(", "),
            removed.join(", ")
        ),
    )
}

/// The clone names of a group clone of `source` (`GROUP@SNAP`) into
/// `new_group`, one per member of `members`: the `renames` (member ->
/// clone) given, else [`clone_name`]; each a valid disk name that
/// `taken` says is free and no other clone takes; every rename names a
/// member.
pub fn clone_plan(
    source: &str,
    new_group: &str,
    members: &[String],
    renames: &[(String, String)],
    taken: impl Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let group = split_target(source).0;
    let mut out: Vec<String> = Vec::new();
    for d in members {
        let new = renames
            .iter()
            .find(|(from, _)| from == d)
            .map(|(_, to)| to.clone())
            .unwrap_or_else(|| clone_name(group, new_group, d));
        check_name("disk", &new)?;
        if taken(&new) || out.contains(&new) {
            return err(
                ErrorKind::AlreadyExists,
                format!(
                    "the clone of '{d}' would be named '{new}', which is taken: choose another \
                     with --rename {d}=NAME"
                ),
            );
        }
        out.push(new);
    }
    if let Some((from, _)) = renames.iter().find(|(from, _)| !members.contains(from)) {
        return err(
            ErrorKind::InvalidArgument,
            format!("--rename names '{from}', which is not a member of '{source}'"),
        );
    }
    Ok(out)
}

fn info(m: &Meta, g: &GroupRec) -> GroupInfo {
    GroupInfo {
        name: g.name.clone(),
        disks: g
            .disks
            .iter()
            .map(|id| {
                m.catalog
                    .disk_by_id(*id)
                    .map(|d| d.name.clone())
                    .unwrap_or_else(|| format!("(disk id {id})"))
            })
            .collect(),
        created_unix: g.created_unix,
        quiesce_hook: g.quiesce_hook.clone(),
        quiesce_timeout_s: g.quiesce_timeout_s,
        snapshots: g.snapshots.len(),
    }
}

/// A group snapshot member's disk and snapshot records (a missing one is
/// damage: `check` reports it too).
fn member(
    m: &Meta,
    group: &str,
    gs: &GroupSnapRec,
    mr: &GroupMemberRec,
) -> Result<(crate::catalog::DiskRec, crate::catalog::SnapshotRec)> {
    let missing = |what: &str, id: u64| {
        Error::new(
            ErrorKind::Corrupt,
            format!(
                "group snapshot '{group}@{}' names {what} id {id}, which does not exist",
                gs.name
            ),
        )
    };
    let d = m
        .catalog
        .disk_by_id(mr.disk)
        .cloned()
        .ok_or_else(|| missing("disk", mr.disk))?;
    let s = m
        .catalog
        .snapshots
        .iter()
        .find(|s| s.id == mr.snapshot)
        .cloned()
        .ok_or_else(|| missing("snapshot", mr.snapshot))?;
    Ok((d, s))
}

fn group_mut<'a>(m: &'a mut Meta, name: &str) -> &'a mut GroupRec {
    m.catalog
        .groups
        .iter_mut()
        .find(|g| g.name == name)
        .expect("group checked before the change")
}

/// The id of `disk`, refused if it is in a group already.
fn member_to_add(m: &Meta, group: &str, disk: &str) -> Result<u64> {
    let d = m.catalog.disk(disk)?;
    if let Some(other) = m.catalog.group_of(d.id) {
        return err(
            ErrorKind::Refused,
            format!(
                "disk '{disk}' is in group '{}' already (a disk is in one group at most){}",
                other.name,
                if other.name == group {
                    ""
                } else {
                    ": take it out there first"
                }
            ),
        );
    }
    Ok(d.id)
}

fn group_snapshot(m: &Meta, group: &str, snap: &str) -> Result<GroupSnapRec> {
    m.catalog
        .group(group)?
        .snapshots
        .iter()
        .find(|s| s.name == snap)
        .cloned()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("group '{group}' has no snapshot named '{snap}'"),
            )
        })
}

/// The members of `group`, if each can take snapshot `snap`.
fn can_snapshot(m: &Meta, group: &str, snap: &str) -> Result<Vec<crate::catalog::DiskRec>> {
    let g = m.catalog.group(group)?;
    if g.snapshots.iter().any(|s| s.name == snap) {
        return err(
            ErrorKind::AlreadyExists,
            format!("group '{group}' already has a snapshot named '{snap}'"),
        );
    }
    let mut out = Vec::new();
    for id in &g.disks {
        let d = m.catalog.disk_by_id(*id).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::Corrupt,
                format!("group '{group}': disk id {id} does not exist"),
            )
        })?;
        if m.catalog.snapshot(d.id, &d.name, snap).is_ok() {
            return err(
                ErrorKind::AlreadyExists,
                format!(
                    "disk '{}' already has a snapshot named '{snap}': nothing was created (a group \
                     snapshot is taken on every member or on none)",
                    d.name
                ),
            );
        }
        out.push(d);
    }
    Ok(out)
}
