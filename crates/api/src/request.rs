//! What a datastore command asks: a [`Request`], built from the command
//! line in one place (the CLI's `action`), run by strata-server's `ops` in
//! the CLI's process or by a server over the control socket (see the
//! `wire` module).
//!
//! It serialises internally tagged by `op` (`{"op":"info","name":"vm"}`):
//! one JSON line on the control socket.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_block::throttle::IoLimits;
use strata_block::{Error, Kind as ErrorKind};

use crate::alarm::AlarmRule;
use crate::disk::Provisioning;
use crate::job::JobAction;
use crate::key::{KeyGrant, Secret};
use crate::vmdk::{subformat_name, Subformat};

/// A datastore command.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    List,
    Info {
        name: String,
    },
    Create {
        name: String,
        size_bytes: u64,
        provisioning: Provisioning,
        /// Encrypted, with a first keyslot for this secret (FORMAT.md §16).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypt: Option<KeyGrant>,
    },
    Remove {
        name: String,
        /// Even while clients have it open: they are disconnected first
        /// (docs/INTERLOCKS.md).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    Extend {
        name: String,
        size_bytes: u64,
        /// `size_bytes` is how much to add (`extend --size +1G`), not the
        /// new size.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        by: bool,
    },
    /// Set (or clear) a disk's I/O limits.
    Limit {
        name: String,
        limits: IoLimits,
    },
    /// Change a disk's provisioning (online).
    Convert {
        name: String,
        provisioning: Provisioning,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Release a thin disk's zero grains.
    PunchZero {
        name: String,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Lay a disk's grains out in logical order (online), or with
    /// `dry_run` say what that would move.
    Defrag {
        name: String,
        #[serde(default)]
        dry_run: bool,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// `dedup --estimate [DISK...]`: what re-sharing equal grains of the
    /// disks (every disk when none is named) would free, read-only
    /// (docs/FORMAT.md §17.3).
    DedupEstimate {
        #[serde(default)]
        disks: Vec<String>,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// `dedup [DISK...]`: re-share equal grains of the disks (every disk
    /// when none is named) at the same virtual grain, online
    /// (docs/FORMAT.md §17.2).
    Dedup {
        #[serde(default)]
        disks: Vec<String>,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// `compress [DISK...] [--codec zstd]`: pack the disks' raw grains
    /// (every disk when none is named) that shrink by an eighth into
    /// compressed streams with `codec`, online (docs/FORMAT.md §18.5,
    /// §18.8).
    Compress {
        #[serde(default)]
        disks: Vec<String>,
        #[serde(default, skip_serializing_if = "crate::PackCodec::is_default")]
        codec: crate::PackCodec,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Consolidate free space: move live grains down, lower the pool's
    /// end, punch free grains out of the host file.
    DefragFreeSpace {
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// The server's jobs (long operations).
    Jobs,
    /// Pause, resume or cancel a job.
    JobControl {
        id: u64,
        action: JobAction,
    },
    SnapshotCreate {
        disk: String,
        snapshot: String,
        description: String,
    },
    SnapshotList {
        disk: String,
    },
    SnapshotRevert {
        disk: String,
        snapshot: String,
        /// Even while clients have it open: they are disconnected first
        /// (docs/INTERLOCKS.md).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    SnapshotDelete {
        disk: String,
        snapshot: String,
        /// Even while clients have it open: they are disconnected first
        /// (docs/INTERLOCKS.md).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    CloneLinked {
        source: String,
        name: String,
        /// A key of its own for the clone's writes, with a first keyslot
        /// for this secret (`clone --own-key`, FORMAT.md §16.4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        own_key: Option<KeyGrant>,
    },
    /// `group create NAME DISK...` (docs/BACKUP.md, consistency groups)
    GroupCreate {
        name: String,
        disks: Vec<String>,
        #[serde(default)]
        quiesce_hook: Option<String>,
        #[serde(default)]
        quiesce_timeout_s: Option<u64>,
    },
    /// `group rm NAME`
    GroupDelete {
        name: String,
    },
    /// `group add|remove NAME DISK`
    GroupMember {
        name: String,
        disk: String,
        add: bool,
    },
    /// `group list`
    GroupList,
    /// `group info NAME`
    GroupInfo {
        name: String,
    },
    /// `group snapshot NAME SNAP`: one cut across the members, with the
    /// group's quiesce hook (or `quiesce_hook`) around it.
    GroupSnapshotCreate {
        group: String,
        snapshot: String,
        #[serde(default)]
        description: String,
        #[serde(default)]
        quiesce_hook: Option<String>,
        /// Skip the hook.
        #[serde(default)]
        no_quiesce: bool,
        /// Take the snapshot (crash-consistent) when the hook fails.
        #[serde(default)]
        ignore_quiesce_error: bool,
        #[serde(default)]
        timeout_s: Option<u64>,
        #[serde(default)]
        max_pause_ms: Option<u64>,
    },
    /// `group snapshot list NAME`
    GroupSnapshotList {
        group: String,
    },
    /// `group snapshot delete NAME SNAP`
    GroupSnapshotDelete {
        group: String,
        snapshot: String,
    },
    /// `group revert NAME SNAP`
    GroupSnapshotRevert {
        group: String,
        snapshot: String,
        /// Even while clients have it open: they are disconnected first
        /// (docs/INTERLOCKS.md).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// `group clone NAME@SNAP NEW [--rename OLD=NEW]`
    GroupClone {
        source: String,
        name: String,
        #[serde(default)]
        renames: Vec<(String, String)>,
    },
    /// `diff TARGET --from BASE`: where version TARGET (`DISK` or
    /// `DISK@SNAP`) differs from BASE (docs/BACKUP.md).
    Diff {
        target: String,
        from: String,
        /// Only the totals, no ranges.
        #[serde(default)]
        totals: bool,
    },
    /// `export-diff TARGET [--from BASE] FILE`: the changes as an rbd diff
    /// v1 stream written to `out` (absolute; a file or a pipe).
    ExportDiff {
        target: String,
        #[serde(default)]
        from: Option<String>,
        out: PathBuf,
    },
    /// `import-diff FILE DISK [--force]`: apply an rbd diff stream read
    /// from `path` (absolute; a file or a pipe).
    ImportDiff {
        path: PathBuf,
        disk: String,
        #[serde(default)]
        force: bool,
    },
    CloneFull {
        source: String,
        name: String,
        provisioning: Provisioning,
        /// The datastore the clone goes to (None: the source's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<PathBuf>,
        /// Copy at most this many bytes per second (None: as fast as
        /// clients leave room for).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rate_bytes_per_sec: Option<u64>,
    },
    Check,
    /// `claim DISK` (object-store datastores): this host becomes its writer.
    Claim {
        name: String,
        /// Only once the writer released it (waiting up to `wait_seconds`),
        /// never fencing a live one.
        #[serde(default)]
        handover: bool,
        #[serde(default)]
        wait_seconds: Option<u64>,
    },
    /// `release DISK` (object-store datastores): this host's server
    /// commits what it acknowledged and stops writing the disk, for a
    /// hand-over.
    Release {
        name: String,
    },
    /// `gc [--dry-run]` (object-store datastores): collect what no live
    /// root reaches.
    Gc {
        dry_run: bool,
    },
    /// `compact DISK` (object-store datastores): rewrite the live grains
    /// of the disk's partly live objects (FORMAT.md §11.7a).
    Compact {
        name: String,
        /// Objects under this share live, in percent (None: 85).
        below_pct: Option<u32>,
        dry_run: bool,
    },
    /// `grow`: set the capacity (Some(0): follow the file system again), or
    /// with None only say what it is and how it can change.
    Grow {
        capacity_bytes: Option<u64>,
    },
    /// `alarm set`: one alarm's thresholds and command.
    AlarmSet {
        rule: AlarmRule,
        /// Keep the command set before (no --exec given).
        #[serde(default)]
        keep_exec: bool,
    },
    /// `alarm list`
    AlarmList,
    /// `events [--limit N] [--target NAME]`: the event log, newest first
    /// (docs/FORMAT.md §13).
    Events {
        /// None: `event::EVENTS_LIMIT_DEFAULT`.
        #[serde(default)]
        limit: Option<u32>,
        /// Only the events about this disk (and its snapshots), snapshot
        /// or group.
        #[serde(default)]
        target: Option<String>,
    },
    /// I/O statistics of one export (or all), optionally reset after
    /// reading, and recording paused (false) or resumed (true) after that.
    Stats {
        disk: Option<String>,
        reset: bool,
        #[serde(default)]
        recording: Option<bool>,
    },
    /// Import a VMDK chain, raw, qcow2 or LUKS1 image as a new disk.
    Import {
        /// Absolute, so that a server in another directory finds it.
        path: PathBuf,
        name: String,
        provisioning: Provisioning,
        /// None: detected from the content.
        format: Option<ImageFormat>,
        /// Make the disk encrypted with a first keyslot for this secret;
        /// a LUKS1 image needs it (it is the image's passphrase too).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypt: Option<KeyGrant>,
        /// Start from this disk's (or `DISK@SNAP`'s) state, sharing every
        /// grain, and write only what the image holds differently
        /// (docs/FORMAT.md §17.2a); raw and qcow2 images.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base: Option<String>,
    },
    /// Export a disk or snapshot as VMDK (optionally its snapshot path as
    /// a chain), or as a LUKS1 image when `luks` holds its passphrase.
    Export {
        target: String,
        /// Absolute, so that a server in another directory writes it there.
        out: PathBuf,
        #[serde(with = "subformat_name")]
        subformat: Subformat,
        chain: bool,
        adapter: String,
        /// A LUKS1 image whose keyslot opens with this secret (docs/FORMAT.md
        /// §16.6); it also unlocks a locked encrypted target.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        luks: Option<Secret>,
    },
    /// Move a disk (its snapshots too unless `head_only`) to another
    /// datastore while it is served (docs/MOVE.md).
    Move {
        name: String,
        /// The target datastore's directory (a local datastore, or one
        /// attached to an object store); absolute.
        to: PathBuf,
        #[serde(default)]
        head_only: bool,
        /// The target's provisioning (None: the source's).
        #[serde(default)]
        provisioning: Option<Provisioning>,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Shrink a served SEsparse VMDK file online: asked of the server that
    /// serves it (docs/FORMAT.md §9.5), found through its holder records.
    VmdkShrink {
        /// Absolute; the server matches it to an export by device and inode.
        path: PathBuf,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Serve `disk` (or `DISK@SNAP`) to a vhost-user-blk frontend on a
    /// new socket, on a running server (`strata vhost add`).
    VhostAdd {
        disk: String,
        /// Absolute.
        socket: PathBuf,
    },
    /// Stop serving a vhost-user-blk socket (`strata vhost remove`);
    /// refused while a frontend is connected unless `force`.
    VhostRemove {
        /// Absolute.
        socket: PathBuf,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// The vhost-user-blk sockets a server serves (`strata vhost ls`).
    VhostList,
    /// Rename a disk (`strata rename`), also while it is served.
    Rename {
        name: String,
        to: String,
    },
    /// Rename a snapshot (`strata snapshot rename DISK@SNAP NEW`).
    SnapshotRename {
        disk: String,
        snapshot: String,
        to: String,
    },
    /// `schedule add` (docs/OPERATIONS.md, "Scheduled snapshots").
    ScheduleAdd {
        schedule: crate::schedule::ScheduleSpec,
    },
    /// `schedule ls`
    ScheduleList,
    /// `schedule rm NAME` (its snapshots stay).
    ScheduleRemove {
        name: String,
    },
    /// `schedule run NAME`: one run now (snapshot, then expiry).
    ScheduleRun {
        name: String,
    },
    /// `unlock`, `key list|add|remove`, `rekey` (docs/SECURITY.md).
    Key(KeyRequest),
}

impl Request {
    /// What a job running this request does, for `strata jobs`.
    pub fn describe(&self) -> String {
        match self {
            Request::Create {
                name, provisioning, ..
            } => {
                format!("create {name} ({})", provisioning.as_str())
            }
            Request::Convert {
                name, provisioning, ..
            } => {
                format!("convert {name} to {}", provisioning.as_str())
            }
            Request::PunchZero { name, .. } => format!("punchzero {name}"),
            Request::Defrag { name, .. } => format!("defrag {name}"),
            Request::Compact { name, .. } => format!("compact {name}"),
            Request::DefragFreeSpace { .. } => "defrag --free-space".to_string(),
            Request::DedupEstimate { disks, .. } if disks.is_empty() => {
                "dedup --estimate (every disk)".to_string()
            }
            Request::DedupEstimate { disks, .. } => format!("dedup --estimate {}", disks.join(" ")),
            Request::Dedup { disks, .. } if disks.is_empty() => "dedup (every disk)".to_string(),
            Request::Dedup { disks, .. } => format!("dedup {}", disks.join(" ")),
            Request::Compress { disks, codec, .. } => {
                let codec = match codec.is_default() {
                    true => String::new(),
                    false => format!(" --codec {}", codec.as_str()),
                };
                if disks.is_empty() {
                    format!("compress{codec} (every disk)")
                } else {
                    format!("compress{codec} {}", disks.join(" "))
                }
            }
            Request::Key(KeyRequest::Rekey {
                deep: true, name, ..
            }) => format!("rekey --deep {name}"),
            Request::CloneFull {
                source,
                name,
                to: Some(to),
                ..
            } => format!("clone --full {source} {name} --to {}", to.display()),
            Request::CloneFull { source, name, .. } => format!("clone --full {source} {name}"),
            Request::Import { path, name, .. } => format!("import {} as {name}", path.display()),
            Request::Export { target, out, .. } => format!("export {target} to {}", out.display()),
            Request::Move { name, to, .. } => format!("move {name} to {}", to.display()),
            Request::ExportDiff {
                target,
                from: Some(f),
                ..
            } => format!("export-diff {target} --from {f}"),
            Request::ExportDiff { target, .. } => format!("export-diff {target}"),
            Request::ImportDiff { path, disk, .. } => {
                format!("import-diff {} into {disk}", path.display())
            }
            other => format!("{other:?}"),
        }
    }

    /// Whether a server runs the request as a job (see `jobs`): the long ones.
    pub fn is_job(&self) -> bool {
        self.shows_progress()
    }

    /// Whether the request may take long enough to deserve a progress bar.
    pub fn shows_progress(&self) -> bool {
        matches!(
            self,
            Request::CloneFull { .. }
                | Request::Convert { .. }
                | Request::PunchZero { .. }
                | Request::Defrag { dry_run: false, .. }
                | Request::DefragFreeSpace { .. }
                | Request::DedupEstimate { .. }
                | Request::Dedup { .. }
                | Request::Compress { .. }
                | Request::Key(KeyRequest::Rekey { deep: true, .. })
                | Request::Import { .. }
                | Request::Export { .. }
                | Request::Move { .. }
                | Request::ExportDiff { .. }
                | Request::ImportDiff { .. }
                | Request::Create {
                    provisioning: Provisioning::Eagerzeroedthick,
                    ..
                }
        )
    }
}

/// A request about an encrypted disk's keys, tagged by `key_op` beside
/// the request's `op` of `key`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "key_op", rename_all = "snake_case")]
pub enum KeyRequest {
    /// `unlock DISK`: open an encrypted disk's keys with `key` and keep
    /// them where the datastore is held (a server: until it stops).
    Unlock { name: String, key: Secret },
    /// `lock DISK`: forget the keys of the disk's keyring where they are
    /// held; refused while clients have a disk of the keyring open, unless
    /// `force` (which disconnects them).
    Lock {
        name: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// `key list DISK`: its cipher and keyslots (never a key).
    List { name: String },
    /// `key add DISK`: a keyslot for `new`. `key` opens the disk first
    /// when it is not unlocked already.
    Add {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<Secret>,
        new: KeyGrant,
    },
    /// `key remove DISK SLOT` (the last slot is refused).
    Remove {
        name: String,
        slot: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<Secret>,
    },
    /// `rekey DISK`: every keyslot replaced by one for `new`; `deep` also
    /// replaces the data key (re-encrypting the data).
    Rekey {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<Secret>,
        /// None only for `--deep`: resume the deep rekey under way.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        new: Option<KeyGrant>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        deep: bool,
        /// `--deep --rate`: bytes re-encrypted per second at most.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rate_bytes_per_sec: Option<u64>,
    },
}

impl KeyRequest {
    /// The disk it is about.
    pub fn name(&self) -> &str {
        match self {
            KeyRequest::Unlock { name, .. }
            | KeyRequest::Lock { name, .. }
            | KeyRequest::List { name }
            | KeyRequest::Add { name, .. }
            | KeyRequest::Remove { name, .. }
            | KeyRequest::Rekey { name, .. } => name,
        }
    }

    /// Its event kind: who unlocked a disk and who changed its keyslots
    /// (never a key: a `Secret` does not print); None for `key list`.
    pub fn event_kind(&self) -> Option<&'static str> {
        Some(match self {
            KeyRequest::Unlock { .. } => "unlock",
            KeyRequest::Lock { .. } => "lock",
            KeyRequest::Add { .. } => "key_add",
            KeyRequest::Remove { .. } => "key_remove",
            KeyRequest::Rekey { .. } => "rekey",
            KeyRequest::List { .. } => return None,
        })
    }

    /// More about its event (None when nothing).
    pub fn event_detail(&self) -> Option<String> {
        match self {
            KeyRequest::Remove { slot, .. } => Some(format!("slot {slot}")),
            KeyRequest::Rekey { deep: true, .. } => Some("--deep".into()),
            KeyRequest::Lock { force: true, .. } => Some("--force".into()),
            _ => None,
        }
    }
}

/// An image format `import` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    Vmdk,
    Raw,
    /// Read through `qemu-img convert`.
    Qcow2,
    /// LUKS1, AES-256-XTS (docs/FORMAT.md §16.6).
    Luks,
}

impl ImageFormat {
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "vmdk" => Ok(ImageFormat::Vmdk),
            "raw" => Ok(ImageFormat::Raw),
            "qcow2" => Ok(ImageFormat::Qcow2),
            "luks" => Ok(ImageFormat::Luks),
            other => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("unknown import format {other:?}: vmdk, raw, qcow2 or luks"),
            )),
        }
    }
}

/// Make a path absolute so a server in another directory finds it: the
/// paths in a [`Request`] are.
pub fn absolute(p: &Path) -> Result<PathBuf, Error> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    Ok(std::env::current_dir()
        .map_err(|e| Error::new(ErrorKind::Io, format!("current directory: {e}")))?
        .join(p))
}
