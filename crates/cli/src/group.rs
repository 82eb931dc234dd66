//! `strata group`: consistency groups (docs/BACKUP.md), the command
//! line as requests (`output` prints their answers).

use clap::{Args, Subcommand};
use strata_api::units::invalid;
use strata_api::{Error, Request};

use crate::target::names;

#[derive(Subcommand)]
pub enum GroupCmd {
    /// Make a group of disks that are snapshotted together (a disk is in one group at most)
    Create {
        name: String,
        /// 1 to 100 disks of this datastore
        #[arg(required = true)]
        disks: Vec<String>,
        /// Run as 'CMD quiesce' before each group snapshot and 'CMD unquiesce' after it
        #[arg(long, value_name = "CMD")]
        quiesce_hook: Option<String>,
        /// Seconds the hook may take (default 60)
        #[arg(long, value_name = "S")]
        timeout: Option<u64>,
    },
    /// Add a disk to a group
    Add { name: String, disk: String },
    /// Take a disk out of a group (its snapshots stay; 'group revert' of older ones is refused)
    Remove { name: String, disk: String },
    /// Remove a group; its disks stay. Refused while it has snapshots
    #[command(visible_alias = "delete")]
    Rm { name: String },
    /// List the groups
    #[command(visible_alias = "ls")]
    List,
    /// Show a group: its disks, its hook, how many snapshots
    Info { name: String },
    /// Snapshot every disk of a group at one instant; list or delete group snapshots
    #[command(
        args_conflicts_with_subcommands = true,
        subcommand_negates_reqs = true,
        long_about = "Snapshot every disk of a group at one instant: 'strata group snapshot \
GROUP@SNAP' (or GROUP SNAP).\n\n\
Requests in flight finish, new ones wait (none fails), every member gets snapshot SNAP in one \
change, then I/O goes on; the snapshot holds every write any member acknowledged before the \
cut, flushed or not, and none after it. All or nothing. With a quiesce hook (the group's, or \
--quiesce-hook), 'CMD quiesce' runs before the cut and 'CMD unquiesce' after it, always; a \
failing or late hook creates nothing unless --ignore-quiesce-error. --json reports how long \
I/O was held (pause_us)."
    )]
    Snapshot(GroupSnapArgs),
    /// Revert every member to a group snapshot: GROUP@SNAP or GROUP SNAP
    ///
    /// Revert every disk of a group to a group snapshot (one change; discards changes since):
    /// GROUP@SNAP or GROUP SNAP
    Revert {
        #[command(flatten)]
        at: GroupAt,
        /// Even while clients have a member open: they are disconnected (docs/INTERLOCKS.md)
        #[arg(long)]
        force: bool,
    },
    /// Linked clones of every disk of GROUP@SNAP, as a new group
    #[command(
        long_about = "Linked clones of every disk of GROUP@SNAP (O(1) each), made with a new \
group of them in one change. A clone is named like its disk with the group's name replaced \
(vm1-os in vm1, cloned as vm2: vm2-os), else NEW-DISK; --rename DISK=NAME chooses."
    )]
    Clone {
        /// GROUP@SNAP
        source: String,
        /// The new group
        name: String,
        /// DISK=NAME: the clone of DISK is NAME (repeatable)
        #[arg(long = "rename", value_name = "DISK=NAME", value_parser = parse_rename)]
        renames: Vec<(String, String)>,
    },
}

#[derive(Args)]
pub struct GroupSnapArgs {
    #[command(subcommand)]
    action: Option<GroupSnapCmd>,
    #[command(flatten)]
    create: TakeArgs,
}

#[derive(Args)]
pub struct TakeArgs {
    /// GROUP@SNAP, or GROUP then SNAP (the name on the group and every member)
    #[arg(required = true, value_name = "GROUP[@SNAP]")]
    group: Option<String>,
    #[arg(value_name = "SNAP")]
    snapshot: Option<String>,
    #[arg(long, default_value = "")]
    description: String,
    /// Use this hook instead of the group's
    #[arg(long, value_name = "CMD")]
    quiesce_hook: Option<String>,
    /// Run no hook this time (a crash-consistent snapshot)
    #[arg(long, conflicts_with = "quiesce_hook")]
    no_quiesce: bool,
    /// When the hook fails or is late, take the snapshot anyway (crash-consistent)
    #[arg(long)]
    ignore_quiesce_error: bool,
    /// Seconds the hook may take (default: the group's, else 60)
    #[arg(long, value_name = "S")]
    timeout: Option<u64>,
    /// Longest wait, in ms, for the requests in flight to finish; past it nothing is created
    #[arg(long, value_name = "MS")]
    max_pause: Option<u64>,
}

#[derive(Subcommand)]
enum GroupSnapCmd {
    /// A group's snapshots, with what deleting each frees on its members
    #[command(visible_alias = "ls")]
    List { group: String },
    /// Delete a group snapshot, every member's, in one change: GROUP@SNAP or GROUP SNAP
    #[command(visible_alias = "rm")]
    Delete(GroupAt),
}

fn parse_rename(s: &str) -> Result<(String, String), Error> {
    match s.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
        _ => Err(invalid(format!("'{s}' is not DISK=NAME"))),
    }
}

/// A group snapshot named `GROUP@SNAP` or `GROUP SNAP`.
#[derive(Args)]
pub struct GroupAt {
    /// GROUP@SNAP, or GROUP followed by SNAP
    #[arg(value_name = "GROUP[@SNAP]")]
    group: String,
    #[arg(value_name = "SNAP")]
    snapshot: Option<String>,
}

impl GroupCmd {
    /// The request.
    pub fn request(&self) -> Result<Request, Error> {
        let s = String::clone;
        Ok(match self {
            GroupCmd::Create {
                name,
                disks,
                quiesce_hook,
                timeout,
            } => Request::GroupCreate {
                name: s(name),
                disks: disks.clone(),
                quiesce_hook: quiesce_hook.clone(),
                quiesce_timeout_s: *timeout,
            },
            GroupCmd::Add { name, disk } | GroupCmd::Remove { name, disk } => {
                Request::GroupMember {
                    name: s(name),
                    disk: s(disk),
                    add: matches!(self, GroupCmd::Add { .. }),
                }
            }
            GroupCmd::Rm { name } => Request::GroupDelete { name: s(name) },
            GroupCmd::List => Request::GroupList,
            GroupCmd::Info { name } => Request::GroupInfo { name: s(name) },
            GroupCmd::Snapshot(a) => a.request()?,
            GroupCmd::Revert { at, force } => {
                let (group, snapshot) = names(&at.group, at.snapshot.as_deref())?;
                let force = *force;
                Request::GroupSnapshotRevert {
                    group,
                    snapshot,
                    force,
                }
            }
            GroupCmd::Clone {
                source,
                name,
                renames,
            } => Request::GroupClone {
                source: s(source),
                name: s(name),
                renames: renames.clone(),
            },
        })
    }
}

impl GroupSnapArgs {
    /// `group snapshot` (create), `group snapshot list|delete`.
    fn request(&self) -> Result<Request, Error> {
        Ok(match &self.action {
            Some(GroupSnapCmd::List { group }) => Request::GroupSnapshotList {
                group: group.clone(),
            },
            Some(GroupSnapCmd::Delete(at)) => {
                let (group, snapshot) = names(&at.group, at.snapshot.as_deref())?;
                Request::GroupSnapshotDelete { group, snapshot }
            }
            None => {
                let c = &self.create;
                let target = c.group.as_deref().unwrap_or_default();
                let (group, snapshot) = names(target, c.snapshot.as_deref())?;
                Request::GroupSnapshotCreate {
                    group,
                    snapshot,
                    description: c.description.clone(),
                    quiesce_hook: c.quiesce_hook.clone(),
                    no_quiesce: c.no_quiesce,
                    ignore_quiesce_error: c.ignore_quiesce_error,
                    timeout_s: c.timeout,
                    max_pause_ms: c.max_pause,
                }
            }
        })
    }
}
