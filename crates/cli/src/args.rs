//! The command line: clap's commands and flags (`action.rs` makes them
//! typed requests).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use strata_api::units::{invalid, parse_size, NewSize};
use strata_api::{AlarmKind, Error, PackCodec, Provisioning};

use crate::serve_args::ServeArgs;
use crate::target::At;

/// The exit codes, one per kind of failure (docs/ERRORS.md), so a script
/// or a unit file can tell "try again later" from "this will never work".
pub const EXIT_CODES: &str = "Exit status:
  0   success
  1   the command ran and found problems (check, vmdk check)
  2   a usage error, an invalid argument or a request out of range
  3   not found
  4   already exists
  5   in use by another process (a lock): try again
  6   refused in this state, or read-only
  7   no space left
  8   another host holds the disk (fenced), or this host handed it over
  9   the object store cannot be reached, or refused the credentials
  10  not supported
  11  stored data failed a check (corrupt)
  12  I/O error
  13  removed or closed while in use";

#[derive(Parser)]
#[command(
    name = "strata",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("STRATA_COMMIT"), ")"),
    about = "strata: thin/thick virtual disks with O(1) snapshots and clones, served over NBD",
    long_about = "strata stores virtual disks in a datastore (a directory) and serves them over NBD.\n\
Every disk and snapshot has its own map, so I/O costs the same at any snapshot depth;\n\
snapshots and linked clones are O(1); deleting a snapshot moves no data.\n\n\
While `strata serve` runs, the other commands talk to it through its control socket.",
    after_long_help = EXIT_CODES
)]
pub struct Cli {
    /// Datastore directory
    ///
    /// Datastore directory [default: $STRATA_DATASTORE, else ~/.local/share/strata/datastore]
    #[arg(long, short = 'd', global = true, env = "STRATA_DATASTORE")]
    pub datastore: Option<PathBuf>,

    /// Budget of the metadata cache
    ///
    /// Budget of the engine's metadata cache (map and refcount pages), e.g. 128M
    #[arg(long, global = true, value_parser = parse_size, default_value = "128M")]
    pub metadata_cache: u64,

    /// Return once a long command's job has started
    ///
    /// For a long command (convert, punchzero, defrag, move, clone --full, import, export,
    /// export-diff, import-diff, eager create) on a running server: return once its job has
    /// started instead of following it
    #[arg(long, global = true)]
    pub detach: bool,

    /// Print the answer as JSON
    ///
    /// Print the answer as JSON instead of text (before or after the command)
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Create a datastore in the directory, or in an object store (--object-store)
    #[command(long_about = "Create a datastore in the directory.\n\n\
With --object-store s3://BUCKET/PREFIX the datastore lives in an S3-compatible object store,\n\
shared by every host that attaches to it (docs/MULTIHOST.md); the directory becomes this host's\n\
local directory (its identity and cache). The prefix must be empty, and the store must refuse a\n\
second create-only write of one key (strata checks, with 8 concurrent writes). Endpoint and\n\
credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION.")]
    Init {
        /// Capacity limit (default: the file system's free space)
        #[arg(long, value_parser = parse_size, conflicts_with = "object_store")]
        capacity: Option<u64>,
        /// Create the datastore in this object store: s3://BUCKET/PREFIX
        #[arg(long, value_name = "URL")]
        object_store: Option<String>,
    },
    /// Join an object-store datastore from this host (DIR becomes its local directory)
    #[command(
        long_about = "Join an object-store datastore made by 'strata init --object-store' on another host.\n\n\
The directory (--datastore) becomes this host's local directory: a new one, or this host's own\n\
for the same datastore (attaching again is harmless, e.g. after the directory was deleted).\n\
Prints what it found: the datastore's id, who created it, and its disks."
    )]
    Attach {
        /// The datastore: s3://BUCKET/PREFIX
        #[arg(long, value_name = "URL")]
        object_store: String,
    },
    /// Show the datastore's capacity, use, over-commit and alarms
    Status,
    /// Object store: make this host a disk's writer now (fencing the previous one)
    #[command(
        long_about = "Make this host the writer of DISK of an object-store datastore now, fencing the\n\
previous writer: its next FLUSH fails with an error naming this host, and it acknowledges no\n\
more writes (docs/MULTIHOST.md). A server claims a disk by itself at its first write, trim or\n\
write; this command is for handing a disk over before that. Of hosts claiming from one\n\
generation, exactly one wins; the others fail naming it."
    )]
    Claim {
        /// The disk
        name: String,
        /// Hand-over: wait for the writer's release, then claim
        ///
        /// Hand-over (live migration): wait until the writer has released the disk ('strata
        /// release' on its host), then claim it; never fence a live writer
        #[arg(long)]
        handover: bool,
        /// With --handover: how long to wait for the release
        #[arg(
            long,
            value_name = "SECONDS",
            default_value_t = 60,
            requires = "handover"
        )]
        wait: u64,
    },
    /// Object store: stop writing a disk here, so another host takes it unfenced
    #[command(
        long_about = "Release DISK of an object-store datastore for a hand-over (VM live migration;\n\
docs/MOVE.md): this host's server commits every write it acknowledged, then writes a manifest\n\
with no owner. From then on it refuses writes to the disk (clients get EPERM and the server\n\
says why) and its reads follow the next writer; nothing is fenced. Another host takes the disk\n\
with 'strata claim DISK --handover', or by its first write when it serves the disk with\n\
--incoming. 'strata claim DISK' here takes it back."
    )]
    Release {
        /// The disk
        name: String,
    },
    /// Object-store datastores: delete what no disk, snapshot or clone reaches any more
    #[command(
        long_about = "Collect garbage in an object-store datastore (any host may run it, also while\n\
disks are served everywhere): mark every grain and map node that a disk, a snapshot or a linked\n\
clone's hold reaches, then delete the segments nothing reaches whose writer was fenced or sealed\n\
them before its newest manifest (never an upload in flight), and each disk's manifests older\n\
than its newest unless they hold grains still reached, open a generation, or are its first.\n\
Prints stored, live and garbage bytes and each disk's exclusive bytes (what removing it would\n\
free). A run that another run overtakes deletes nothing."
    )]
    Gc {
        /// Only count: delete nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Object-store datastores: rewrite what overwrites left partly live, so gc can free it
    #[command(
        long_about = "Compact DISK of an object-store datastore (docs/FORMAT.md §11.7a): find the\n\
objects (segments, commit payloads) whose live bytes are under --below percent of their size,\n\
rewrite their live grains into new 8 MiB segments and commit the new places, each only if no\n\
write moved the grain meanwhile. 'strata gc' then frees the old objects. The disk's writer does\n\
it (its server, online, while clients write); run here on a disk nobody serves, this command\n\
claims it as any write would. Objects a snapshot reaches are left alone. A server also\n\
compacts by itself: at 50 % while clients write (at most as many bytes as they wrote; up to\n\
67 % while the disk's objects hold more than 1.4 times its live bytes) and at 85 % once a disk\n\
has been idle for 30 s ('strata serve --compact-idle' sets that delay; --compact-policy off\n\
turns both kinds of pass off)."
    )]
    Compact {
        /// The disk
        name: String,
        /// Rewrite objects less than this share live
        #[arg(long, value_name = "PERCENT", default_value_t = 85,
              value_parser = clap::value_parser!(u32).range(1..=100))]
        below: u32,
        /// Only say what would be rewritten
        #[arg(long)]
        dry_run: bool,
    },
    /// Set the datastore's capacity (also while it is served)
    #[command(
        long_about = "Set the datastore's capacity (also while it is served).\n\n\
A datastore created without --capacity follows its file system: its capacity is what it holds\n\
plus the file system's free space, so growing the file system grows it. `grow --capacity SIZE`\n\
sets an explicit capacity instead (it may also lower it, never below what is used plus what\n\
thick disks reserve); `grow --capacity fs` follows the file system again. Without --capacity,\n\
says which it is. Returns once the new capacity is durable.\n\n\
On a directory attached to an object store, which has no size of its own, the capacity is the\n\
figure the usage and over-commit alarms measure against, kept for this host (`fs`: none)."
    )]
    Grow {
        /// New capacity (e.g. 500G), or `fs` to follow the file system
        #[arg(long, value_parser = parse_capacity, value_name = "SIZE|fs")]
        capacity: Option<u64>,
    },
    /// Datastore alarms on usage and over-allocation: set, list
    #[command(subcommand)]
    Alarm(AlarmCmd),
    /// A running server's vhost-user-blk sockets: add, remove, list
    #[command(subcommand)]
    Vhost(VhostCmd),
    /// Create a disk
    #[command(long_about = "Create a disk.\n\n\
With --encrypt its data is encrypted with AES-256-XTS under a data key of its own, which the \
datastore keeps only wrapped by the secret given with --key-file, --key-keyring or --key-helper \
(docs/SECURITY.md). The secret is never stored; after a restart the disk stays locked until \
'strata unlock' (or 'serve --unlock') gives it again.")]
    Create {
        name: String,
        /// Virtual size (e.g. 10G)
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Provisioning: thin, zeroedthick or eagerzeroedthick
        #[arg(long = "type", default_value = "thin", value_parser = Provisioning::parse)]
        provisioning: Provisioning,
        /// Encrypt the disk's data (with the key given by --key-*)
        #[arg(long, requires = "key")]
        encrypt: bool,
        #[command(flatten)]
        key: crate::keys::KeyArgs,
        /// A label for the first keyslot ('strata key list' shows it)
        #[arg(long, value_name = "TEXT", requires = "encrypt")]
        key_label: Option<String>,
    },
    /// Give a running server an encrypted disk's key, so it serves the disk
    #[command(
        long_about = "Open an encrypted disk's keys with its secret and hand them to the \
running server, which then serves the disk until it stops (docs/SECURITY.md). Without a \
server, checks that the secret opens the disk and changes nothing. A wrong secret is refused \
and the disk stays locked."
    )]
    Unlock {
        disk: String,
        #[command(flatten)]
        key: crate::keys::KeyArgs,
    },
    /// Make a running server forget an encrypted disk's keys
    #[command(
        long_about = "Make the running server forget the keys of an encrypted disk and of \
every disk sharing them (its linked clones and the disk they came from): they read as \
locked until 'strata unlock' gives a key again, and the keys are wiped from the server's \
memory. Refused while clients have one of those disks (or a snapshot of it) open, naming \
them; --force disconnects them first. Writes nothing to the datastore."
    )]
    Lock {
        disk: String,
        /// Disconnect the clients of those disks first
        #[arg(long)]
        force: bool,
    },
    /// An encrypted disk's keyslots: list, add, remove
    #[command(subcommand)]
    Key(crate::keys::KeyCmd),
    /// Replace every keyslot of an encrypted disk by one for a new secret
    #[command(
        long_about = "Replace every keyslot of an encrypted disk by one for the new \
secret (--new-key-*): the old secrets stop opening it. The data key stays, so no data is \
written and it takes the same time with any number of snapshots. The disk must be unlocked \
or opened here with a current secret (--key-*). --deep also makes a new data key and \
re-encrypts every grain of the disk, its snapshots and linked clones online, a job paced like \
defrag; a copy of the datastore's files from before it no longer opens what was written \
after. 'rekey --deep DISK' with no new secret resumes an interrupted one. On an object store \
the disk's writer runs it, copying every grain into new segments (gc frees the old ones; a \
linked clone keeps its own copy of the record and what it inherited under the old key)."
    )]
    Rekey {
        disk: String,
        #[command(flatten)]
        key: crate::keys::KeyArgs,
        #[command(flatten)]
        new: crate::keys::NewKeyArgs,
        /// Also replace the data key, re-encrypting the data online (a job)
        #[arg(long)]
        deep: bool,
        /// With --deep: re-encrypt at most this much per second (e.g. 100M)
        #[arg(long, value_parser = parse_size, requires = "deep")]
        rate: Option<u64>,
    },
    /// List disks
    #[command(visible_alias = "ls")]
    List,
    /// Show one disk: size, allocation, snapshots, and what removing it would free
    ///
    /// Show one disk: size, provisioning, allocation, nb/tbz, snapshots, and what removing it
    /// (exclusive) and deleting all its snapshots (snapshot space) would free
    Info { name: String },
    /// Remove a disk and its snapshots (linked clones keep what they share)
    #[command(visible_alias = "delete")]
    Rm {
        name: String,
        /// Even while clients have it open: they are disconnected (docs/INTERLOCKS.md)
        #[arg(long)]
        force: bool,
    },
    /// Rename a disk (DISK NEW) or a snapshot (DISK@SNAP NEW), also while it is served
    #[command(
        long_about = "Rename a disk (DISK NEW) or a snapshot (DISK@SNAP NEW or DISK@NEW), also \
while it is served.\n\n\
Clients connected go on and are listed under the new name; the next client opens the export by\n\
its new name (vhost-user-blk sockets follow). Linked clones made from the disk's snapshots show\n\
the new name as their parent. One catalog change: after a crash the disk or snapshot has one\n\
name or the other. Local datastores only for now."
    )]
    Rename {
        /// The disk, or DISK@SNAP
        #[arg(value_name = "DISK[@SNAP]")]
        name: String,
        /// Its new name (for a snapshot: SNAP, or DISK@SNAP of the same disk)
        #[arg(value_name = "NEW")]
        to: String,
    },
    /// Write a version's changes (or all its data) as a Ceph 'rbd diff v1' stream
    #[command(
        name = "export-diff",
        long_about = "Write DISK[@SNAP]'s changes since BASE (without --from: everything it maps) as\n\
a Ceph 'rbd diff v1' stream: records 'f' (BASE), 't' (SNAP) and 's' (the size), then 'w'\n\
(data) and 'z' (zeroed) records in ascending order, then 'e'. 'rbd import-diff' and\n\
'rbd merge-diff' read it, and so does 'strata import-diff'. FILE '-' is standard output:\n\
  strata export-diff vm@s2 --from s1 - | ssh backup strata import-diff - vm\n\
Runs as a job with progress (docs/BACKUP.md)."
    )]
    ExportDiff {
        /// DISK@SNAP (or DISK: its live head)
        target: String,
        /// The base: a snapshot name, id:N, or another version
        #[arg(long)]
        from: Option<String>,
        /// The file to write (a new one: an existing file is refused), or - for standard output
        file: String,
    },
    /// Apply a Ceph 'rbd diff' stream (FILE or - for stdin) to a disk and take its snapshot
    #[command(
        name = "import-diff",
        long_about = "Apply an 'rbd diff' stream (v1 or v2; from 'strata export-diff' or 'rbd\n\
export-diff') to DISK: grow it to the stream's size, write its data and zero records, then\n\
take the snapshot the stream names ('t'). Refused before anything changes: a damaged header,\n\
a snapshot 't' the disk has, an 'f' it lacks, and (unless --force) a disk that differs from\n\
its snapshot 'f'. A stream found damaged, truncated or out of order later is refused naming\n\
the byte offset, and the disk is put back as it was. FILE '-' is standard input."
    )]
    ImportDiff {
        /// The stream: a file, or - for standard input
        file: String,
        /// The disk to apply it to
        disk: String,
        /// Apply it even if the disk differs from the stream's base snapshot
        #[arg(long)]
        force: bool,
    },
    /// The ranges where a disk or snapshot differs from a base, for incremental backups
    #[command(
        long_about = "The ranges where DISK (its live head) or DISK@SNAP differs from BASE, ascending\n\
and merged, each 'data' (the version maps data there) or 'zero' (it reads zeros: trimmed,\n\
zeroed, or never written past BASE's size). Exact at 4 KiB: the two versions' maps are\n\
compared, skipping what they share, so the cost follows what changed, not the disk's size.\n\n\
BASE is a snapshot of the same disk by name (s1) or id (id:7, from 'snapshot list --json':\n\
names can be reused, ids never are), or another version that shares history (a linked\n\
clone's origin: OTHER@SNAP). A BASE that no longer exists is an error: take a full backup.\n\
Everything past BASE's size counts as changed (docs/BACKUP.md)."
    )]
    Diff {
        /// DISK or DISK@SNAP
        target: String,
        /// The base: a snapshot name, id:N, or another version (OTHER, OTHER@SNAP)
        #[arg(long)]
        from: String,
        /// Only the totals (bytes of data and of zeros), not the ranges
        #[arg(long)]
        totals: bool,
    },
    /// Grow a disk (also while it is served)
    Extend {
        name: String,
        /// New virtual size (e.g. 20G), or +SIZE for that much more
        #[arg(long, value_parser = NewSize::parse)]
        size: NewSize,
    },
    /// Limit a disk's I/O rate: operations and/or bytes per second, online
    #[command(
        long_about = "Limit a disk's I/O rate, also while it is served.\n\nReads, writes and unmaps of the disk (and of its snapshots' exports), whatever transport they\ncome through, take one operation each and their bytes from two token buckets that refill at\n--iops and --bps and hold --burst seconds of their rate. A request that finds a bucket\nempty waits; none is refused. The limits are kept with the disk. 'strata info' shows them;\n--clear removes them."
    )]
    Limit {
        name: String,
        /// Operations per second
        #[arg(long, value_name = "N")]
        iops: Option<u64>,
        /// Bytes per second (e.g. 50M)
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        bps: Option<u64>,
        /// Seconds of the rate an idle disk may spend at once
        #[arg(long, value_name = "SECONDS")]
        burst: Option<u32>,
        /// Remove the disk's limits
        #[arg(long, conflicts_with_all = ["iops", "bps", "burst"])]
        clear: bool,
    },
    /// Change a disk's provisioning online (also while it is served)
    #[command(
        long_about = "Change a disk's provisioning type, also while it is served.\n\nto eagerzeroedthick: every unwritten block is allocated and written with zeros (tbz 0, no\nfirst-write cost); to zeroedthick: the rest of the size is reserved on the host file system;\nto thin: the reservation is released, and so are blocks that read all zeros.\nEach step leaves a consistent disk: after a crash, run the same command again to finish."
    )]
    Convert {
        name: String,
        /// Target type: thin, zeroedthick or eagerzeroedthick
        #[arg(long = "type", value_parser = Provisioning::parse)]
        provisioning: Provisioning,
        /// Scan or fill at most this much per second (e.g. 200M), to leave room for clients
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
    },
    /// Move a disk to another datastore while it is served (Storage vMotion)
    #[command(
        long_about = "Move a disk, with its snapshots, to another datastore while clients keep \
using it (Storage vMotion; docs/MOVE.md).\n\n\
DEST is another local datastore's directory or a directory attached to an object store. The \
server of this datastore copies the snapshots, then the disk, then again what clients changed \
meanwhile, until little is left; then it holds client I/O for a last pass and switches the export \
to the new copy (the report says for how long). Connected clients stay connected. The source is \
removed afterwards, and this server keeps serving the disk, under its name, from DEST (also after \
a restart). A move that fails, is cancelled ('strata jobs cancel') or cut by a crash leaves the \
source serving and removes the partial copy."
    )]
    Move {
        name: String,
        /// The datastore directory to move it to
        #[arg(long, value_name = "DEST")]
        to: PathBuf,
        /// The target's provisioning [default: the source's]
        ///
        /// The target's provisioning (default: the source's; object-store disks are thin):
        /// thin, zeroedthick or eagerzeroedthick. A thick disk moved with --type thin stores no
        /// zeros
        #[arg(long = "type", value_parser = Provisioning::parse)]
        provisioning: Option<Provisioning>,
        /// Move the live state only, not the snapshots
        ///
        /// Move the disk's live state only: its snapshots are not copied, and are deleted with
        /// the source
        #[arg(long)]
        head_only: bool,
        /// Copy at most this much per second (e.g. 200M), to leave room for clients
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
    },
    /// Release a thin disk's blocks that read all zeros (vmkfstools' punchzero)
    Punchzero {
        name: String,
        /// Scan at most this much per second (e.g. 200M), to leave room for clients
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
    },
    /// Lay a disk's grains out in logical order, online
    #[command(
        long_about = "Lay a disk's grains out in logical order, also while it is served.\n\n\
A region (1 MiB) whose data is not one physical run is copied to grains allocated one after\n\
the other; every map that shares a moved grain (snapshots, linked clones) is repointed, so\n\
nothing is unshared and used space does not grow. Paced against client I/O; a job that\n\
'strata jobs' can pause, resume and cancel. After a crash, run it again to finish.\n\n\
'strata info DISK' shows the disk's fragments; --dry-run shows what a run would move.\n\n\
--free-space (no DISK): move live grains down out of the top of the pool, lower the pool's\n\
end, and punch the free grains left inside it out of the host file, so the host holds about\n\
what 'strata status' calls used (plus the reserved tail of thick disks)."
    )]
    Defrag {
        /// The disk to lay out (not with --free-space)
        #[arg(required_unless_present = "free_space", conflicts_with = "free_space")]
        name: Option<String>,
        /// Consolidate the datastore's free space instead of laying out a disk
        #[arg(long, conflicts_with = "dry_run")]
        free_space: bool,
        /// Only report the fragments and the bytes a run would move
        #[arg(long)]
        dry_run: bool,
        /// Move at most this much per second (e.g. 100M), to leave room for clients
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
    },
    /// Share equal grains across disks (online), or with --estimate say what that would free
    #[command(
        long_about = "Find grains that hold equal bytes at the same offset of several disks and \
keep one of each\n(docs/FORMAT.md §17): copies of one image imported as separate disks, or \
clones that wrote\nthe same data, end up stored once, as if they had been made as linked \
clones.\n\n\
Without --estimate, the named disks (with their snapshots and linked clones; none named: every\n\
disk) are compared a region (1 MiB) at a time while clients use them: the grains mapped at one\n\
offset are read, equal ones (hashed, then compared byte for byte) become one, every sharer\n\
follows, and the copies are freed. Nothing is copied and no index is kept: memory stays bounded\n\
whatever the disks' sizes. A grain written afterwards is written anew, as after a snapshot.\n\
Thick disks keep their grains; encrypted disks share only with disks of the same key. Each\n\
region is one atomic step: after a crash, run it again to finish. Through a running server it\n\
is a job that 'strata jobs' can pause, resume and cancel.\n\n\
--estimate reads every grain the disks' heads and snapshots map, once, changes nothing and\n\
needs no key (encrypted disks are compared as stored), and reports: the bytes every version\n\
maps (logical), the distinct grains behind them (stored), what snapshots and clones share\n\
already, what re-sharing equal grains at the same offset would free (exact: compared byte for\n\
byte, only under one cipher), an estimate of sharing at any offset (from a hash sample),\n\
grains that hold only zeros, and how a sample of the unencrypted grains compresses with LZ4.\n\
Memory stays bounded whatever the disks' sizes. Paced against client I/O; through a running\n\
server it is a job that 'strata jobs' can pause, resume and cancel."
    )]
    Dedup {
        /// The disks to compare (their snapshots come with them); none: every disk
        disks: Vec<String>,
        /// Only report what sharing would free (and what compression would), changing nothing
        #[arg(long)]
        estimate: bool,
        /// Read at most this much per second (e.g. 100M), to leave room for clients
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
    },
    /// Pack disks' raw grains into compressed streams (LZ4, or zstd), online
    #[command(
        long_about = "Pack the named disks' raw grains (with their snapshots and linked clones; \
none named: every\ndisk) into compressed streams (docs/FORMAT.md §18): a grain that shrinks by \
at least an eighth\nis compressed and written with its region's others as one stream; grains \
that shrink less stay\nraw. Every disk, snapshot and clone that shared a raw grain names its \
packed form: nothing is\nunshared.\n\n\
--codec lz4 (the default) compresses each grain alone: a 4 KiB read of a packed grain costs \
little\nmore than a raw one. --codec zstd (level 4) also compresses an aligned run of four grains, \
else two,\ntogether when that is smaller: some 30% fewer bytes than LZ4 on OS images, \
40% on text, for\ncold and archival disks, whose random reads are slower.\n\n\
Online: a region (1 MiB) at a time while clients use the disks, paced against their I/O. Reads\n\
decompress inline; a grain a client later overwrites goes back to raw (the write takes a new\n\
raw grain), and a later run moves what still lives of streams more than half dead into new\n\
ones, freeing the old (repacked in the answer). Grains of encrypted and thick disks and grains\n\
of zeros stay raw ('strata punchzero' unmaps zeros). Each region is one atomic step: after a\n\
crash, run it again to finish. Through a running server it is a job that 'strata jobs' can\n\
pause, resume and cancel. Local datastores only in this version.\n\n\
For cold data: golden images, disks with many snapshots, archives. 'strata dedup --estimate'\n\
shows first how a sample of the disks' grains compresses."
    )]
    Compress {
        /// The disks to pack (their snapshots and clones come with them); none: every disk
        disks: Vec<String>,
        /// lz4 (reads near raw speed) or zstd (a quarter fewer bytes, for cold data)
        #[arg(long, value_name = "lz4|zstd", default_value = "lz4", value_parser = PackCodec::parse)]
        codec: PackCodec,
        /// Read at most this much per second (e.g. 100M), to leave room for clients
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
    },
    /// A running server's long operations: list, pause, resume, cancel
    Jobs {
        #[command(subcommand)]
        action: Option<JobCmd>,
    },
    /// The event log: who changed what, when (create, rm, snapshots, jobs, alarms...)
    #[command(
        long_about = "The datastore's event log, newest first: every change of state \
(create, rm, snapshot, revert,\n\
clone, convert, extend, claims, jobs started and finished, alarms, forced interlocks, logins\n\
to the dashboard's actions, recovery after an unclean stop, server start and stop), each with\n\
its time, who asked (the CLI's user, the HTTP API's token and address, or the server itself)\n\
and how it ended (ok, or the error). Reads (info, list, status, stats) are not logged. The log\n\
is kept in the datastore's directory (an object store's: this host's local directory) across\n\
restarts, at most about 2 MiB, the last several thousand events (docs/OPERATIONS.md).\n\
Read through the running server, or from the file when none runs."
    )]
    Events {
        /// Show at most this many (the newest)
        #[arg(long, value_name = "N", default_value_t = strata_api::event::EVENTS_LIMIT_DEFAULT)]
        limit: u32,
        /// Only the events about this disk (and its snapshots), DISK@SNAP, or group
        #[arg(long, value_name = "NAME")]
        target: Option<String>,
    },
    /// Snapshots: create, list, revert, delete
    #[command(subcommand)]
    Snapshot(SnapCmd),
    /// Consistency groups: disks snapshotted, reverted and cloned together at one instant
    #[command(subcommand)]
    Group(crate::group::GroupCmd),
    /// Scheduled snapshots with retention, run by the server: add, ls, rm, run
    #[command(subcommand)]
    Schedule(crate::schedule::ScheduleCmd),
    /// Clone a disk: linked from DISK@SNAP (O(1)), or --full into an independent copy
    Clone {
        /// DISK@SNAP for a linked clone; DISK or DISK@SNAP with --full
        source: String,
        /// Name of the new disk
        name: String,
        /// Copy the data into an independent disk
        #[arg(long)]
        full: bool,
        /// Provisioning of a full clone
        #[arg(long = "type", default_value = "thin", value_parser = Provisioning::parse)]
        provisioning: Provisioning,
        /// With --full: make the clone in the datastore in DIR
        ///
        /// With --full: make the clone in the datastore in DIR (local or attached to an object
        /// store) instead of the source's; the server serves it from there
        #[arg(long, value_name = "DIR", requires = "full")]
        to: Option<PathBuf>,
        /// With --full: copy at most this much per second (e.g. 200M), to leave room for clients
        #[arg(long, value_parser = parse_size, requires = "full")]
        rate: Option<u64>,
        /// A linked clone of an encrypted disk with a key of its own (--new-key-*)
        ///
        /// A linked clone of an encrypted disk with a key of its own: its writes go under a new
        /// data key, and only the new secret (--new-key-file, --new-key-keyring, --new-key-helper
        /// or --new-key-prompt) opens it; the source's secrets do not. Still O(1): what it
        /// inherits is not copied and stays under the source's key (docs/FORMAT.md §16.4). The
        /// source must be unlocked; a later deep rekey of the source copies what the clone still
        /// shares with it.
        #[arg(long, conflicts_with = "full")]
        own_key: bool,
        #[command(flatten)]
        new: crate::keys::NewKeyArgs,
    },
    /// Verify reference counts, ownership and accounting; non-zero exit on problems
    Check,
    /// I/O statistics of a served disk (vscsiStats histograms), from the running server
    Stats {
        /// Disk or DISK@SNAP export (default: every export with statistics)
        disk: Option<String>,
        /// Zero the statistics after reading them
        #[arg(long)]
        reset: bool,
        /// Stop recording after reading (vscsiStats -x)
        ///
        /// Stop recording after reading (vscsiStats -x); commands are then
        /// only forwarded, and the figures so far stay readable. Without
        /// DISK: every disk, and disks first used later
        #[arg(long, conflicts_with = "resume")]
        pause: bool,
        /// Start recording again after a --pause (vscsiStats -s)
        ///
        /// Start recording again after a --pause (vscsiStats -s); combine
        /// with --reset to start afresh
        #[arg(long)]
        resume: bool,
        /// Redraw every second until interrupted
        #[arg(long)]
        watch: bool,
    },
    /// Serve every disk (DISK, and DISK@SNAP read-only) and VMDK files as they are
    #[command(
        after_help = "See 'strata serve --help' for each option in full, and examples.",
        after_long_help = crate::serve_args::SERVE_EXAMPLES
    )]
    Serve(Box<ServeArgs>),
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell)
    #[command(
        long_about = "Print the completion script of a shell on stdout, e.g.\n\
  strata completions bash > ~/.local/share/bash-completion/completions/strata\n\
The Debian package installs the bash, zsh and fish scripts."
    )]
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Write the man pages (strata.1, and strata-COMMAND.1 for each command) into DIR
    #[command(hide = true)]
    Manpages {
        /// Where to write them (created if missing)
        dir: PathBuf,
    },
    /// Import a VMDK chain (its links as snapshots), a raw, qcow2 or LUKS1 image as a disk
    #[command(
        long_about = "Import a VMDK chain (its links as snapshots), a raw, qcow2 or LUKS1 \
image as a disk.\n\n\
With --encrypt (or any image with --key-*) the new disk is encrypted, its first keyslot opened \
by the given secret. A LUKS1 image (QEMU's 'luks' format, aes-xts-plain64) needs its \
passphrase that way, and the disk it becomes opens with the same secret; the data is decrypted \
and encrypted again under a new data key of the disk's own (docs/FORMAT.md §16.6).\n\n\
With --base DISK (or DISK@SNAP) the new disk starts as that disk's state, sharing every grain, \
and only the grains where a raw or qcow2 image differs are written (zeros there are unmapped): \
another copy of an image already imported takes no room (docs/FORMAT.md §17.2a)."
    )]
    Import {
        /// The image: VMDK (descriptor or sparse file; parents followed), raw, qcow2 or LUKS1
        path: PathBuf,
        /// Name of the new disk
        name: String,
        /// Provisioning of the new disk
        #[arg(long = "type", default_value = "thin", value_parser = Provisioning::parse)]
        provisioning: Provisioning,
        /// Image format [default: detected]: vmdk, raw, qcow2 (needs qemu-img) or luks
        #[arg(long)]
        format: Option<String>,
        /// Encrypt the new disk (with the key given by --key-*)
        #[arg(long, requires = "key")]
        encrypt: bool,
        #[command(flatten)]
        key: crate::keys::KeyArgs,
        /// A label for the first keyslot ('strata key list' shows it)
        #[arg(long, value_name = "TEXT", requires = "key")]
        key_label: Option<String>,
        /// Start from DISK's (or DISK@SNAP's) state, shared; write only the grains that differ
        #[arg(long, value_name = "DISK", conflicts_with = "encrypt")]
        base: Option<String>,
    },
    /// Export DISK or DISK@SNAP as a VMDK or a LUKS1 image
    #[command(
        long_about = "Export DISK or DISK@SNAP as a VMDK (or a chain of them) or, with \
--format luks, as a LUKS1 image (aes-xts-plain64) that QEMU's 'luks' driver and cryptsetup open \
with the secret given by --key-*: the bytes of --key-file are the passphrase, so the same file \
serves QEMU's 'secret,file='. The image gets a master key of its own, never the disk's data key. \
A locked encrypted disk is unlocked with the same secret first."
    )]
    Export {
        /// DISK or DISK@SNAP
        target: String,
        /// Output file (never overwritten); a VMDK's name ends in .vmdk
        out: PathBuf,
        /// Image format
        #[arg(long, default_value = "vmdk", value_parser = ["vmdk", "luks"])]
        format: String,
        #[command(flatten)]
        key: crate::keys::KeyArgs,
        /// monolithicSparse/Flat, streamOptimized, vmfsSparse or seSparse
        ///
        /// monolithicSparse, monolithicFlat, streamOptimized, vmfsSparse or seSparse
        #[arg(long, default_value = "monolithicSparse")]
        subformat: String,
        /// Write the snapshot path as a chain of files, base first
        ///
        /// Write the snapshot path as a chain: OUT.vmdk is the base, OUT-000001.vmdk... the
        /// deltas (vmfsSparse/seSparse chains get a monolithicFlat base); the last file is TARGET
        #[arg(long)]
        chain: bool,
        /// ddb.adapterType of the descriptor
        #[arg(long, default_value = "lsilogic", value_parser = ["ide", "buslogic", "lsilogic", "legacyESX"])]
        adapter: String,
    },
    /// Work on VMDK files directly (no datastore needed): info, check [--repair], shrink
    #[command(subcommand)]
    Vmdk(VmdkCmd),
}

#[derive(Subcommand)]
pub enum VmdkCmd {
    /// Show a VMDK chain link by link: create type, CIDs, extents
    ///
    /// Show a VMDK chain link by link: create type, CIDs, extents (takes no lock: works on served
    /// files)
    Info { path: PathBuf },
    /// Check every link's grain directories and tables (--repair fixes)
    ///
    /// Check grain directories and tables of every link: out-of-file, doubly used and bad
    /// entries; exits 1 when errors remain. Without --repair it takes no lock (works on served
    /// files, which may be mid-update); with --repair a file in use is refused
    Check {
        path: PathBuf,
        /// Fix what needs no guessing, in the top link
        ///
        /// Fix what needs no guessing (in the top link): clear never-written grains, give doubly
        /// used grains their own copies, extend cut-short files, clear the unclean flag
        #[arg(long)]
        repair: bool,
    },
    /// Give an SEsparse delta's unmapped and zero grains' space back
    ///
    /// Give the space of unmapped and all-zero grains of an SEsparse delta back to the file system;
    /// a file `strata serve --vmdk` serves is shrunk by that server, online and throttled
    Shrink {
        path: PathBuf,
        /// Read and copy at most this much per second (e.g. 50M)
        ///
        /// Read and copy at most this much per second (e.g. 50M), served or not; without it a
        /// server pauses eight times as long as each step took while clients send requests
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
    },
}

#[derive(Subcommand)]
pub enum JobCmd {
    /// One job and, once it has ended well, what it answered (a --detach'ed dedup's report)
    Show { id: u64 },
    /// Pause a job at the end of its current step (it holds no lock while paused)
    Pause { id: u64 },
    /// Resume a paused job
    Resume { id: u64 },
    /// Stop a convert, punchzero or defrag at the end of its current step; what it did stays
    Cancel { id: u64 },
}

#[derive(Subcommand)]
pub enum AlarmCmd {
    /// Set an alarm's thresholds (usage default 75/85, overcommit 100/200)
    #[command(long_about = "Set an alarm's thresholds, kept in the datastore.\n\n\
usage: (used + reserved bytes) / capacity, in percent (default warning 75, alarm 85).\n\
overcommit: provisioned bytes (sum of disk sizes) / capacity (default warning 100, alarm 200).\n\
An alarm is in state `alarm` at or above --alarm, `warning` at or above --warning, else `ok`.\n\n\
A running `strata serve` evaluates alarms every second and logs each change of state; with\n\
--exec it also runs CMD with `sh -c`, with STRATA_ALARM_KIND, STRATA_ALARM_STATE,\n\
STRATA_ALARM_PREVIOUS, STRATA_ALARM_PERCENT, STRATA_ALARM_WARNING_PERCENT,\n\
STRATA_ALARM_ALARM_PERCENT and STRATA_DATASTORE in its environment. Without --exec the\n\
command set before is kept; --exec '' removes it.")]
    Set {
        /// usage or overcommit
        #[arg(value_parser = AlarmKind::parse)]
        kind: AlarmKind,
        /// Warning at or above this percent
        #[arg(long, value_name = "PCT")]
        warning: u64,
        /// Alarm at or above this percent
        #[arg(long, value_name = "PCT")]
        alarm: u64,
        /// Shell command a server runs when the alarm's state changes
        #[arg(long, value_name = "CMD")]
        exec: Option<String>,
    },
    /// List the alarms: state now, percent, thresholds, command
    #[command(visible_alias = "ls")]
    List,
}

#[derive(Subcommand)]
pub enum VhostCmd {
    /// Serve DISK (or DISK@SNAP, read-only) on a new vhost-user-blk socket, without a restart
    #[command(
        long_about = "Serve DISK (or DISK@SNAP, read-only) to a vhost-user-blk frontend \
(QEMU, cloud-hypervisor) on a new Unix socket at SOCKET, on the running server of this datastore,\n\
without restarting it. The socket is served as those of 'serve --vhost-user-blk' are: the same\n\
queues, I/O threads, polling, --socket-mode and --socket-owner. A stale socket file at SOCKET is\n\
replaced; anything else there is refused. It lasts until 'strata vhost remove' or the server\n\
stops (add it to the server's --vhost-user-blk options to have it at the next start)."
    )]
    Add {
        /// The disk, or DISK@SNAP
        disk: String,
        /// Where the socket goes
        socket: std::path::PathBuf,
    },
    /// Stop serving a vhost-user-blk socket; refused while a frontend is connected
    #[command(visible_alias = "rm")]
    Remove {
        socket: std::path::PathBuf,
        /// Even while a frontend is connected: it is cut off first
        #[arg(long)]
        force: bool,
    },
    /// List the sockets served and the frontend connected to each
    #[command(visible_alias = "ls")]
    List,
}

#[derive(Subcommand)]
pub enum SnapCmd {
    /// Take a snapshot (O(1), whatever the disk holds): DISK@SNAP or DISK SNAP
    Create {
        #[command(flatten)]
        at: At,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List a disk's snapshots as a tree, with what deleting each would free
    ///
    /// List a disk's snapshots as a tree, each with what deleting it would free (exclusive)
    #[command(visible_alias = "ls")]
    List { disk: String },
    /// Make the disk equal to a snapshot again (discards changes since): DISK@SNAP or DISK SNAP
    Revert {
        #[command(flatten)]
        at: At,
        /// Even while clients have it open: they are disconnected (docs/INTERLOCKS.md)
        #[arg(long)]
        force: bool,
    },
    /// Rename a snapshot: DISK@SNAP NEW (also while it is served)
    Rename {
        #[arg(value_name = "DISK@SNAP")]
        target: String,
        #[arg(value_name = "NEW")]
        to: String,
    },
    /// Delete a snapshot (moves no data): DISK@SNAP or DISK SNAP
    #[command(visible_alias = "rm")]
    Delete {
        #[command(flatten)]
        at: At,
        /// Even while clients have it open: they are disconnected (docs/INTERLOCKS.md)
        #[arg(long)]
        force: bool,
    },
}

/// A size, or `fs` (0: follow the file system).
fn parse_capacity(s: &str) -> Result<u64, Error> {
    if s.eq_ignore_ascii_case("fs") {
        return Ok(0);
    }
    match parse_size(s)? {
        0 => Err(invalid(
            "a capacity of 0 makes no sense; use `--capacity fs` to follow the file system",
        )),
        n => Ok(n),
    }
}

pub fn default_datastore() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/strata/datastore")
}
