//! Consistency groups of an object-store datastore (FORMAT.md §11.11),
//! for [`ObjectStoreDatastore`]'s `Datastore` methods: version 1, one
//! host writes every member; the cut is `ObjectDisk::group_cut` over this
//! process's handles; the group snapshot's create-only object is the
//! commit point, and a member record whose object does not exist is
//! incomplete (listed nowhere, cleaned at the group's next snapshot).

use std::collections::HashMap;
use std::sync::Arc;

use strata_engine::catalog::GROUP_DISKS_MAX;
use strata_engine::{
    check_group_size, clone_plan, group_full, last_disk, membership_changed, GroupMemberInfo,
};
use strata_objstore::groups::{GroupDef, GroupMember, GroupSnap};
use strata_objstore::layout::{GroupRef, Manifest, SnapshotRec};
use strata_objstore::ObjectDisk;

use crate::object_store::ObjectStoreDatastore;
use crate::{
    Consistency, Datastore, Error, ErrorKind, GroupInfo, GroupSnapshotInfo, GroupSnapshotOptions,
    QuiesceResult, Result,
};

fn refused(msg: String) -> Error {
    Error::new(ErrorKind::Refused, msg)
}

/// The name of member disk `id` (one the store no longer lists: gone).
fn name_of(names: &HashMap<u32, String>, id: u32) -> Result<String> {
    names
        .get(&id)
        .cloned()
        .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("disk {id:08x} is gone")))
}

impl ObjectStoreDatastore {
    /// Disk names by id, for the disks the store names (no manifest is
    /// read: members cannot be removed, so their names stand).
    fn names_by_id(&self) -> Result<HashMap<u32, String>> {
        Ok(self
            .shared()
            .disk_ids()?
            .into_iter()
            .map(|(n, id)| (id, n))
            .collect())
    }

    fn group_view(&self, def: &GroupDef, names: &HashMap<u32, String>) -> Result<GroupInfo> {
        Ok(GroupInfo {
            name: def.name.clone(),
            disks: def
                .disks
                .iter()
                .map(|id| {
                    names
                        .get(id)
                        .cloned()
                        .unwrap_or_else(|| format!("(disk {id:08x})"))
                })
                .collect(),
            created_unix: def.created_ms / 1000,
            quiesce_hook: def.quiesce_hook.clone(),
            quiesce_timeout_s: def.quiesce_timeout_s,
            snapshots: self.shared().group_snapshots(def.group)?.len(),
        })
    }

    fn def_of(&self, name: &str) -> Result<GroupDef> {
        let id = self.shared().group_id(name)?;
        self.shared().group_def(id)
    }

    /// Refuse `disk` (id) if a group holds it already.
    fn in_no_group(&self, disk: &str, id: u32) -> Result<()> {
        for g in self.shared().groups()? {
            if g.disks.contains(&id) {
                return Err(refused(format!(
                    "disk '{disk}' is in group '{}' already (a disk is in one group at most)",
                    g.name
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn og_create(
        &self,
        name: &str,
        disks: &[String],
        quiesce_hook: Option<String>,
        quiesce_timeout_s: Option<u64>,
    ) -> Result<GroupInfo> {
        check_group_size(disks.len())?;
        let mut ids = Vec::new();
        for d in disks {
            let id = self.shared().disk_id(d)?;
            if ids.contains(&id) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("disk '{d}' is named twice"),
                ));
            }
            self.in_no_group(d, id)?;
            ids.push(id);
        }
        let def = self
            .shared()
            .group_create(name, ids, quiesce_hook, quiesce_timeout_s)?;
        self.group_view(&def, &self.names_by_id()?)
    }

    pub(crate) fn og_delete(&self, name: &str) -> Result<()> {
        let def = self.def_of(name)?;
        let snaps = self.shared().group_snapshots(def.group)?;
        if let Some(s) = snaps.first() {
            return Err(refused(format!(
                "group '{name}' has {} snapshot(s) ('{}' ...): delete them first ('strata \
                 group snapshot delete {name} SNAP')",
                snaps.len(),
                s.name
            )));
        }
        self.shared().group_remove(name)
    }

    pub(crate) fn og_member(&self, name: &str, disk: &str, add: bool) -> Result<GroupInfo> {
        let def = self.def_of(name)?;
        let id = self.shared().disk_id(disk)?;
        if add {
            if def.disks.len() >= GROUP_DISKS_MAX {
                return Err(group_full(name));
            }
            self.in_no_group(disk, id)?;
        } else {
            if !def.disks.contains(&id) {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("disk '{disk}' is not in group '{name}'"),
                ));
            }
            if def.disks.len() == 1 {
                return Err(last_disk(name, disk));
            }
        }
        let def = self.shared().group_update(def.group, |d| {
            let mut next = d.clone();
            if add {
                next.disks.push(id);
            } else {
                next.disks.retain(|x| *x != id);
            }
            Ok(next)
        })?;
        self.group_view(&def, &self.names_by_id()?)
    }

    pub(crate) fn og_groups(&self) -> Result<Vec<GroupInfo>> {
        let names = self.names_by_id()?;
        self.shared()
            .groups()?
            .iter()
            .map(|d| self.group_view(d, &names))
            .collect()
    }

    pub(crate) fn og_info(&self, name: &str) -> Result<GroupInfo> {
        self.group_view(&self.def_of(name)?, &self.names_by_id()?)
    }

    /// The member handles of `def`, refusing members another live host
    /// writes (version 1: one writer for every member).
    fn members(
        &self,
        def: &GroupDef,
        names: &HashMap<u32, String>,
    ) -> Result<Vec<(String, Arc<ObjectDisk>)>> {
        let mut out = Vec::new();
        for id in &def.disks {
            let name = name_of(names, *id)?;
            let d = self.disk(&name)?;
            if !d.ownership().0 {
                let newest = self.shared().newest_manifest(*id)?;
                if let Err(e) = self.shared().may_take_over(&name, &newest) {
                    return Err(refused(format!(
                        "a group snapshot needs one writer for every member, and {}",
                        e.message
                    )));
                }
            }
            out.push((name, d));
        }
        Ok(out)
    }

    /// Delete the member records of `def`'s group snapshots that never
    /// got their group snapshot object (a crash before the commit point).
    fn drop_incomplete(&self, def: &GroupDef, members: &[(String, Arc<ObjectDisk>)]) -> Result<()> {
        for (name, d) in members {
            let stale: Vec<SnapshotRec> = d
                .manifest()
                .snapshots
                .iter()
                .filter(|s| s.group.is_some_and(|g| g.group == def.group))
                .cloned()
                .collect();
            for s in stale {
                let g = s.group.expect("filtered");
                if !self.shared().group_snapshot_exists(g.group, g.snapshot)? {
                    d.snapshot_delete(&s.name)?;
                    self.forget(&format!("{name}@{}", s.name));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn og_snapshot_create(
        &self,
        group: &str,
        snap: &str,
        opts: &GroupSnapshotOptions,
    ) -> Result<GroupSnapshotInfo> {
        strata_format::check_group_name("group snapshot", snap)?;
        let def = self.def_of(group)?;
        if self
            .shared()
            .group_snapshots(def.group)?
            .iter()
            .any(|s| s.name == snap)
        {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("group '{group}' already has a snapshot named '{snap}'"),
            ));
        }
        let names = self.names_by_id()?;
        let members = self.members(&def, &names)?;
        self.drop_incomplete(&def, &members)?;
        let id = loop {
            let id = rand::random::<u64>();
            if id != 0 {
                break id;
            }
        };
        let handles: Vec<Arc<ObjectDisk>> = members.iter().map(|(_, d)| d.clone()).collect();
        let (seqs, held) = ObjectDisk::group_cut(
            &handles,
            snap,
            &opts.description,
            GroupRef {
                group: def.group,
                snapshot: id,
            },
        )?;
        let consistency = match &opts.quiesce {
            Some(q) if q.result == QuiesceResult::Ok => Consistency::Application,
            _ => Consistency::Crash,
        };
        let gs = GroupSnap {
            group: def.group,
            id,
            name: snap.to_string(),
            description: opts.description.clone(),
            created_ms: now_ms(),
            consistency: consistency.as_str().to_string(),
            quiesce: opts
                .quiesce
                .as_ref()
                .and_then(|q| serde_json::to_value(q).ok()),
            pause_us: held.as_micros() as u64,
            members: def
                .disks
                .iter()
                .zip(&seqs)
                .map(|(disk, seq)| GroupMember {
                    disk: *disk,
                    snapshot: *seq,
                })
                .collect(),
        };
        self.shared().group_snapshot_put(&gs)?;
        self.info_of(&gs, &names)
    }

    fn info_of(&self, gs: &GroupSnap, names: &HashMap<u32, String>) -> Result<GroupSnapshotInfo> {
        let def = self.shared().group_def(gs.group)?;
        let mut members = Vec::new();
        for m in &gs.members {
            let disk = names.get(&m.disk).cloned().unwrap_or_default();
            let size_bytes = self
                .shared()
                .newest_manifest(m.disk)
                .ok()
                .and_then(|man: Manifest| {
                    man.snapshots
                        .iter()
                        .find(|s| s.id == m.snapshot)
                        .map(|s| s.size_bytes)
                })
                .unwrap_or(0);
            members.push(GroupMemberInfo {
                disk,
                snapshot: gs.name.clone(),
                id: m.snapshot,
                size_bytes,
                exclusive_bytes: None,
            });
        }
        Ok(GroupSnapshotInfo {
            group: def.name,
            name: gs.name.clone(),
            id: gs.id,
            description: gs.description.clone(),
            created_unix: gs.created_ms / 1000,
            ready_to_use: true,
            consistency: Consistency::parse(&gs.consistency).unwrap_or(Consistency::Crash),
            quiesce: gs
                .quiesce
                .clone()
                .and_then(|v| serde_json::from_value(v).ok()),
            pause_us: gs.pause_us,
            members,
            exclusive_bytes: None,
        })
    }

    pub(crate) fn og_snapshots(&self, group: &str) -> Result<Vec<GroupSnapshotInfo>> {
        let def = self.def_of(group)?;
        let names = self.names_by_id()?;
        self.shared()
            .group_snapshots(def.group)?
            .iter()
            .map(|gs| self.info_of(gs, &names))
            .collect()
    }

    fn group_snapshot(&self, def: &GroupDef, snap: &str) -> Result<GroupSnap> {
        self.shared()
            .group_snapshots(def.group)?
            .into_iter()
            .find(|s| s.name == snap)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("group '{}' has no snapshot named '{snap}'", def.name),
                )
            })
    }

    /// Every member's record goes (a manifest each), then the object; a
    /// crash between leaves an object whose records are gone, which this
    /// command finishes when repeated.
    pub(crate) fn og_snapshot_delete(&self, group: &str, snap: &str) -> Result<()> {
        let def = self.def_of(group)?;
        let gs = self.group_snapshot(&def, snap)?;
        let names = self.names_by_id()?;
        for m in &gs.members {
            let Some(name) = names.get(&m.disk) else {
                continue;
            };
            let d = self.disk(name)?;
            if d.manifest().snapshots.iter().any(|s| s.id == m.snapshot) {
                d.snapshot_delete(&gs.name)?;
            }
            self.forget(&format!("{name}@{}", gs.name));
        }
        self.shared().group_snapshot_drop(def.group, gs.id)
    }

    pub(crate) fn og_snapshot_revert(&self, group: &str, snap: &str) -> Result<()> {
        let def = self.def_of(group)?;
        let gs = self.group_snapshot(&def, snap)?;
        let names = self.names_by_id()?;
        let then: Vec<u32> = gs.members.iter().map(|m| m.disk).collect();
        let added: Vec<&u32> = def.disks.iter().filter(|d| !then.contains(d)).collect();
        let removed: Vec<&u32> = then.iter().filter(|d| !def.disks.contains(d)).collect();
        if !added.is_empty() || !removed.is_empty() {
            let names_of = |ids: Vec<&u32>| {
                ids.into_iter()
                    .filter_map(|i| names.get(i).cloned())
                    .collect()
            };
            return Err(membership_changed(
                group,
                snap,
                names_of(added),
                names_of(removed),
            ));
        }
        for m in &gs.members {
            self.disk(&name_of(&names, m.disk)?)?
                .snapshot_revert(&gs.name)?;
        }
        Ok(())
    }

    /// Linked clones of every member, then the new group of them (not one
    /// change here: a crash between leaves clones without their group).
    pub(crate) fn og_clone(
        &self,
        source: &str,
        new_group: &str,
        renames: &[(String, String)],
    ) -> Result<GroupInfo> {
        let (group, Some(snap)) = strata_format::split_target(source) else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("a group clone needs a group snapshot: use '{source}@SNAPSHOT'"),
            ));
        };
        if self.shared().group_id(new_group).is_ok() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("a group named '{new_group}' already exists"),
            ));
        }
        let def = self.def_of(group)?;
        let gs = self.group_snapshot(&def, snap)?;
        let names = self.names_by_id()?;
        let members = gs
            .members
            .iter()
            .map(|m| name_of(&names, m.disk))
            .collect::<Result<Vec<_>>>()?;
        let new = clone_plan(source, new_group, &members, renames, |n| self.exists(n))?;
        let plan: Vec<(String, String)> = members.into_iter().zip(new).collect();
        let mut ids = Vec::new();
        for (name, new) in &plan {
            let m = self.shared().clone_linked(name, snap, new)?;
            ids.push(m.disk);
        }
        let d = self.shared().group_create(
            new_group,
            ids,
            def.quiesce_hook.clone(),
            def.quiesce_timeout_s,
        )?;
        self.group_view(&d, &self.names_by_id()?)
    }

    /// Whether snapshot record `s` counts: not a member of a group
    /// snapshot whose object does not exist; with its group's name.
    pub(crate) fn visible(&self, s: &SnapshotRec) -> (bool, Option<String>) {
        match s.group {
            None => (true, None),
            Some(g) => match self.shared().group_snapshot_exists(g.group, g.snapshot) {
                Ok(true) => (true, self.shared().group_name(g.group).ok()),
                _ => (false, None),
            },
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
