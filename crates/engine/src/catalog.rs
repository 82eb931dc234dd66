//! The catalog: disks, snapshots and versions (docs/FORMAT.md §6).

use serde::{Deserialize, Serialize};
use strata_format::VersionState;

use crate::error::{err, ErrorKind, Result};
use strata_api::alarm::{AlarmRule, ReportedAlarms};
use strata_api::{Consistency, Provisioning, QuiesceReport};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskRec {
    pub id: u64,
    pub name: String,
    pub size_bytes: u64,
    pub provisioning: Provisioning,
    /// The version holding the disk's live state.
    pub head: u64,
    /// The snapshot the live state descends from.
    pub current_snapshot: Option<u64>,
    pub created_unix: u64,
    /// `DISK@SNAP` this disk was linked-cloned from (display only).
    pub parent: Option<String>,
    /// I/O limits (`strata limit`); absent when there are none.
    #[serde(default, skip_serializing_if = "crate::IoLimits::is_none")]
    pub limits: crate::IoLimits,
    /// The keyring its data is encrypted under (FORMAT.md §16.3); absent
    /// for a plain disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyring: Option<u64>,
}

/// Names of implicit snapshots that hold a served disk still while a full
/// clone copies it. User names cannot start with '.', so they never clash;
/// such snapshots are hidden from lists and exports and dropped on open.
pub const HIDDEN_SNAPSHOT_PREFIX: &str = ".clone-";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRec {
    pub id: u64,
    pub disk: u64,
    pub name: String,
    pub description: String,
    pub created_unix: u64,
    /// Parent in the disk's snapshot tree.
    pub parent: Option<u64>,
    pub version: u64,
    pub size_bytes: u64,
}

impl SnapshotRec {
    /// An implicit snapshot (see [`HIDDEN_SNAPSHOT_PREFIX`]).
    pub fn is_hidden(&self) -> bool {
        self.name.starts_with('.')
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRec {
    pub id: u64,
    pub root: u64,
    pub levels: u8,
    pub mapped_grains: u64,
    pub nb: u64,
}

impl From<VersionState> for VersionRec {
    fn from(v: VersionState) -> Self {
        VersionRec {
            id: v.version,
            root: v.root,
            levels: v.levels,
            mapped_grains: v.mapped_grains,
            nb: v.nb,
        }
    }
}

impl From<VersionRec> for VersionState {
    fn from(v: VersionRec) -> Self {
        VersionState {
            version: v.id,
            root: v.root,
            levels: v.levels,
            mapped_grains: v.mapped_grains,
            nb: v.nb,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Catalog {
    pub format: u32,
    pub next_id: u64,
    pub disks: Vec<DiskRec>,
    pub snapshots: Vec<SnapshotRec>,
    pub versions: Vec<VersionRec>,
    /// Versions dropped (deleted snapshots, removed disks, reverted-away
    /// states) whose grains are still being given back, oldest first.
    #[serde(default)]
    pub orphans: Vec<u64>,
    /// Alarm thresholds the user set (`strata alarm set`); a kind not
    /// listed has its default. Absent in catalogs written before alarms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alarms: Vec<AlarmRule>,
    /// The state each alarm was in when a server last reported it (ok
    /// left out); absent when none is raised or none was reported.
    #[serde(default, skip_serializing_if = "ReportedAlarms::is_empty")]
    pub alarms_reported: ReportedAlarms,
    /// Consistency groups (docs/BACKUP.md); absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupRec>,
    /// Keyrings of encrypted disks (FORMAT.md §16.3); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyrings: Vec<strata_crypt::KeyringRec>,
}

/// Most disks in one consistency group (Kubernetes' VolumeGroupSnapshot
/// bound; a group snapshot holds every member's I/O at once).
pub const GROUP_DISKS_MAX: usize = 100;

/// A consistency group: disks snapshotted together (FORMAT.md §6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRec {
    pub id: u64,
    pub name: String,
    /// Member disk ids, in the order given; each disk in one group at most.
    pub disks: Vec<u64>,
    pub created_unix: u64,
    /// Command run as `HOOK quiesce` / `HOOK unquiesce` around a cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiesce_hook: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiesce_timeout_s: Option<u64>,
    #[serde(default)]
    pub snapshots: Vec<GroupSnapRec>,
}

/// One group snapshot: a snapshot of every member taken in one change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapRec {
    pub id: u64,
    pub name: String,
    pub description: String,
    pub created_unix: u64,
    pub members: Vec<GroupMemberRec>,
    pub consistency: Consistency,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiesce: Option<QuiesceReport>,
    /// How long client I/O was held for the cut.
    pub pause_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMemberRec {
    pub disk: u64,
    pub snapshot: u64,
}

impl Catalog {
    pub fn new() -> Self {
        Catalog {
            format: 1,
            next_id: 1,
            ..Default::default()
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let c: Catalog = serde_json::from_slice(bytes)
            .map_err(|e| crate::error::Error::new(ErrorKind::Corrupt, format!("catalog: {e}")))?;
        if c.format != 1 {
            return err(
                ErrorKind::Corrupt,
                format!("catalog format {} is not 1", c.format),
            );
        }
        c.check_keyrings()?;
        Ok(c)
    }

    /// Every keyring well formed, every disk's keyring present, and every
    /// keyring some disk's (FORMAT.md §16.3): checked without any key.
    fn check_keyrings(&self) -> Result<()> {
        let corrupt = |m: String| crate::error::Error::new(ErrorKind::Corrupt, m);
        for k in &self.keyrings {
            k.validate()
                .map_err(|e| corrupt(format!("catalog: keyring {}: {e}", k.id)))?;
            if self.keyrings.iter().filter(|o| o.id == k.id).count() > 1 {
                return Err(corrupt(format!(
                    "catalog: keyring id {} appears twice",
                    k.id
                )));
            }
            if !self.disks.iter().any(|d| d.keyring == Some(k.id)) {
                return Err(corrupt(format!(
                    "catalog: keyring {} belongs to no disk",
                    k.id
                )));
            }
        }
        for d in &self.disks {
            if let Some(id) = d.keyring {
                if self.keyring(id).is_none() {
                    return Err(corrupt(format!(
                        "catalog: disk '{}' names keyring {id}, which is not there",
                        d.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// The keyring with this id.
    pub fn keyring(&self, id: u64) -> Option<&strata_crypt::KeyringRec> {
        self.keyrings.iter().find(|k| k.id == id)
    }

    /// The keyring with this id, to change.
    pub fn keyring_mut(&mut self, id: u64) -> Option<&mut strata_crypt::KeyringRec> {
        self.keyrings.iter_mut().find(|k| k.id == id)
    }

    /// Drop keyrings that no disk names any more (after a disk's removal).
    pub fn drop_unused_keyrings(&mut self) {
        let used: Vec<u64> = self.disks.iter().filter_map(|d| d.keyring).collect();
        self.keyrings.retain(|k| used.contains(&k.id));
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("catalog serialises")
    }

    /// Move the versions out into a map by id (the engine keeps them apart
    /// from the catalog while open; `catalog.versions` stays empty).
    pub fn take_versions(&mut self) -> std::collections::HashMap<u64, VersionState> {
        self.versions
            .drain(..)
            .map(|v| (v.id, VersionState::from(v)))
            .collect()
    }

    pub fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub fn disk(&self, name: &str) -> Result<&DiskRec> {
        self.disks.iter().find(|d| d.name == name).ok_or_else(|| {
            crate::error::Error::new(ErrorKind::NotFound, format!("no disk named '{name}'"))
        })
    }

    /// Ok if no disk is named `name`, else the error every command that
    /// makes or renames a disk gives.
    pub fn name_free(&self, name: &str) -> Result<()> {
        if self.disks.iter().any(|d| d.name == name) {
            return Err(crate::error::Error::new(
                ErrorKind::AlreadyExists,
                format!("a disk named '{name}' already exists"),
            ));
        }
        Ok(())
    }

    pub fn disk_mut(&mut self, name: &str) -> Result<&mut DiskRec> {
        self.disks
            .iter_mut()
            .find(|d| d.name == name)
            .ok_or_else(|| {
                crate::error::Error::new(ErrorKind::NotFound, format!("no disk named '{name}'"))
            })
    }

    pub fn disk_by_id(&self, id: u64) -> Option<&DiskRec> {
        self.disks.iter().find(|d| d.id == id)
    }

    pub fn group(&self, name: &str) -> Result<&GroupRec> {
        self.groups.iter().find(|g| g.name == name).ok_or_else(|| {
            crate::error::Error::new(ErrorKind::NotFound, format!("no group named '{name}'"))
        })
    }

    /// The group a disk is a member of.
    pub fn group_of(&self, disk_id: u64) -> Option<&GroupRec> {
        self.groups.iter().find(|g| g.disks.contains(&disk_id))
    }

    /// The group snapshot a snapshot was taken for: (group, its snapshot).
    pub fn group_snapshot_of(&self, snapshot_id: u64) -> Option<(&GroupRec, &GroupSnapRec)> {
        self.groups.iter().find_map(|g| {
            g.snapshots
                .iter()
                .find(|gs| gs.members.iter().any(|m| m.snapshot == snapshot_id))
                .map(|gs| (g, gs))
        })
    }

    /// Resolve `DISK` or `DISK@SNAP` to the disk and, for the second, the snapshot.
    pub fn target(&self, target: &str) -> Result<(&DiskRec, Option<&SnapshotRec>)> {
        let (disk, snap) = split_target(target);
        let d = self.disk(disk)?;
        let s = match snap {
            Some(s) => Some(self.snapshot(d.id, disk, s)?),
            None => None,
        };
        Ok((d, s))
    }

    pub fn snapshot(&self, disk_id: u64, disk_name: &str, snap: &str) -> Result<&SnapshotRec> {
        self.snapshots
            .iter()
            .find(|s| s.disk == disk_id && s.name == snap)
            .ok_or_else(|| {
                crate::error::Error::new(
                    ErrorKind::NotFound,
                    format!("disk '{disk_name}' has no snapshot named '{snap}'"),
                )
            })
    }
}

pub use strata_format::split_target;

/// Names of disks and snapshots ([`strata_format::check_name`]).
pub fn check_name(what: &str, name: &str) -> Result<()> {
    strata_format::check_name(what, name)
}
