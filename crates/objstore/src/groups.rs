//! Consistency groups in the store (FORMAT.md §11.11): a group's
//! definition in create-only versions, its name, and its group snapshots,
//! whose create-only object is the commit point of one.

use serde::{Deserialize, Serialize};
use strata_s3::{Bytes, Put};

use crate::envelope;
use crate::{corrupt, now_ms, Error, ErrorKind, ObjectStoreDatastore, Result};

const DIR_GNAMES: &str = "gnames/";
const MAGIC_DEF: &[u8; 8] = b"STRGRPD1";
const MAGIC_SNAP: &[u8; 8] = b"STRGRPS1";

/// A group's definition, version `seq` (`groups/GID8/d/SEQ16`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDef {
    pub group: u32,
    pub seq: u64,
    pub name: String,
    /// Member disk ids.
    pub disks: Vec<u32>,
    pub created_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiesce_hook: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiesce_timeout_s: Option<u64>,
    #[serde(default)]
    pub removed: bool,
    /// Random per version: a retried create-only PUT recognises its own.
    pub nonce: u64,
}

/// A group snapshot (`groups/GID8/s/SNAP16`): its object exists once
/// every member's snapshot record does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupSnap {
    pub group: u32,
    pub id: u64,
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub created_ms: u64,
    /// "crash" or "application".
    pub consistency: String,
    /// The quiesce hook's run, as the caller reports it.
    #[serde(default)]
    pub quiesce: Option<serde_json::Value>,
    pub pause_us: u64,
    pub members: Vec<GroupMember>,
}

/// One member of a group snapshot: the manifest that records its
/// snapshot, whose id is that manifest's seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    pub disk: u32,
    pub snapshot: u64,
}

#[derive(Serialize, Deserialize)]
struct GroupName {
    group: u32,
}

fn defs_dir(group: u32) -> String {
    format!("groups/{group:08x}/d/")
}

fn snaps_dir(group: u32) -> String {
    format!("groups/{group:08x}/s/")
}

fn snap_key(group: u32, id: u64) -> String {
    format!("{}{id:016x}", snaps_dir(group))
}

/// A group snapshot object stored under `key`, checked.
fn decode_snap(key: &str, obj: &[u8]) -> Result<GroupSnap> {
    let body = envelope::open(MAGIC_SNAP, key, obj)?;
    serde_json::from_slice(body).map_err(|e| corrupt(format!("{key}: {e}")))
}

impl ObjectStoreDatastore {
    /// The id group `name` stands for.
    pub fn group_id(&self, name: &str) -> Result<u32> {
        let key = format!("{DIR_GNAMES}{name}");
        let obj = self
            .store
            .get_opt(&key)?
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no group named '{name}'")))?;
        let n: GroupName = serde_json::from_slice(&obj)
            .map_err(|e| corrupt(format!("{key}: not a group name object: {e}")))?;
        Ok(n.group)
    }

    /// The newest definition of group `id`.
    pub fn group_def(&self, id: u32) -> Result<GroupDef> {
        let dir = defs_dir(id);
        let newest = self
            .store
            .list(&dir, None)?
            .into_iter()
            .map(|l| l.key)
            .max()
            .ok_or_else(|| corrupt(format!("group {id:08x} has no definition under {dir}")))?;
        let obj = self.store.get(&newest)?;
        let body = envelope::open(MAGIC_DEF, &newest, &obj)?;
        serde_json::from_slice(body).map_err(|e| corrupt(format!("{newest}: {e}")))
    }

    /// Every group, by name.
    pub fn groups(&self) -> Result<Vec<GroupDef>> {
        let mut out = Vec::new();
        for l in self.store.list(DIR_GNAMES, None)? {
            let Some(name) = l.key.strip_prefix(DIR_GNAMES) else {
                continue;
            };
            let def = self.group_def(self.group_id(name)?)?;
            if !def.removed {
                out.push(def);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// A new group of disk ids `disks` (checked by the caller: each in no
    /// other group). Its first definition is written before its name, so
    /// a name always leads to a definition.
    pub fn group_create(
        &self,
        name: &str,
        disks: Vec<u32>,
        quiesce_hook: Option<String>,
        quiesce_timeout_s: Option<u64>,
    ) -> Result<GroupDef> {
        strata_format::check_group_name("group", name)?;
        if self
            .store
            .get_opt(&format!("{DIR_GNAMES}{name}"))?
            .is_some()
        {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("a group named '{name}' already exists"),
            ));
        }
        let def = loop {
            let id = rand::random::<u32>();
            if id == 0 {
                continue;
            }
            let d = GroupDef {
                group: id,
                seq: 1,
                name: name.to_string(),
                disks: disks.clone(),
                created_ms: now_ms(),
                quiesce_hook: quiesce_hook.clone(),
                quiesce_timeout_s,
                removed: false,
                nonce: rand::random(),
            };
            if self.put_def(&d)? {
                break d;
            }
        };
        let body = serde_json::to_vec(&GroupName { group: def.group }).expect("json");
        if self
            .store
            .put_create(&format!("{DIR_GNAMES}{name}"), Bytes::from(body))?
            == Put::Exists
        {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("a group named '{name}' already exists"),
            ));
        }
        Ok(def)
    }

    fn put_def(&self, d: &GroupDef) -> Result<bool> {
        let key = format!("{}{:016x}", defs_dir(d.group), d.seq);
        let body = envelope::seal(MAGIC_DEF, &serde_json::to_vec(d).expect("json"));
        Ok(self.store.put_create(&key, Bytes::from(body))? == Put::Created)
    }

    /// The next definition of a group: `change(newest)`, refused if
    /// another host changed the group meanwhile.
    pub fn group_update(
        &self,
        id: u32,
        change: impl FnOnce(&GroupDef) -> Result<GroupDef>,
    ) -> Result<GroupDef> {
        let cur = self.group_def(id)?;
        let mut next = change(&cur)?;
        next.seq = cur.seq + 1;
        next.nonce = rand::random();
        if !self.put_def(&next)? {
            return Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "group '{}' was changed by another host meanwhile: try again",
                    cur.name
                ),
            ));
        }
        Ok(next)
    }

    /// Remove group `name` (the caller checked it has no snapshots): a
    /// last definition marked removed, then its name.
    pub fn group_remove(&self, name: &str) -> Result<()> {
        let id = self.group_id(name)?;
        self.group_update(id, |d| {
            Ok(GroupDef {
                removed: true,
                ..d.clone()
            })
        })?;
        self.store.delete(&format!("{DIR_GNAMES}{name}"))?;
        Ok(())
    }

    /// Group `id`'s snapshots, oldest first: one listing, and a read of
    /// each object this process has not read before (they never change).
    pub fn group_snapshots(&self, id: u32) -> Result<Vec<GroupSnap>> {
        let mut out = Vec::new();
        for l in self.store.list(&snaps_dir(id), None)? {
            if let Some(s) = self.group_snaps.lock().unwrap().get(&l.key) {
                out.push(s.clone());
                continue;
            }
            let s = decode_snap(&l.key, &self.store.get(&l.key)?)?;
            self.group_snaps
                .lock()
                .unwrap()
                .insert(l.key.clone(), s.clone());
            out.push(s);
        }
        out.sort_by_key(|s| s.created_ms);
        Ok(out)
    }

    /// Whether group snapshot `snapshot` of group `group` exists (its
    /// members' records count only then). One seen stays seen in this
    /// process until it deletes it: its members' records go first.
    pub fn group_snapshot_exists(&self, group: u32, snapshot: u64) -> Result<bool> {
        let key = snap_key(group, snapshot);
        if self.group_snaps.lock().unwrap().contains_key(&key) {
            return Ok(true);
        }
        let Some(obj) = self.store.get_opt(&key)? else {
            return Ok(false);
        };
        let s = decode_snap(&key, &obj)?;
        self.group_snaps.lock().unwrap().insert(key, s);
        Ok(true)
    }

    /// Group `id`'s name (names never change: read once per process).
    pub fn group_name(&self, id: u32) -> Result<String> {
        if let Some(n) = self.group_names.lock().unwrap().get(&id) {
            return Ok(n.clone());
        }
        let name = self.group_def(id)?.name;
        self.group_names.lock().unwrap().insert(id, name.clone());
        Ok(name)
    }

    /// Write a group snapshot's object: the commit point.
    pub fn group_snapshot_put(&self, s: &GroupSnap) -> Result<()> {
        let body = envelope::seal(MAGIC_SNAP, &serde_json::to_vec(s).expect("json"));
        match self
            .store
            .put_create(&snap_key(s.group, s.id), Bytes::from(body))?
        {
            Put::Created => Ok(()),
            Put::Exists => Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("group snapshot id {:016x} exists already", s.id),
            )),
        }
    }

    /// Delete a group snapshot's object (its members' records first).
    pub fn group_snapshot_drop(&self, group: u32, snapshot: u64) -> Result<()> {
        let key = snap_key(group, snapshot);
        self.store.delete(&key)?;
        self.group_snaps.lock().unwrap().remove(&key);
        Ok(())
    }
}
