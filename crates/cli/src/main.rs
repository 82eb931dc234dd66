//! `strata`: the command-line tool and server of the strata disk engine.

mod control;
mod holders;
mod ops;
mod serve;
mod units;
mod vmdk_cmd;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use strata_engine::{Datastore, Error, ErrorKind, InitOptions, Provisioning};
use strata_storage::FileBackend;

use crate::ops::{LockOutcome, Request};
use crate::units::{human, parse_size};

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "strata: thin/thick virtual disks with O(1) snapshots and clones, served over NBD",
    long_about = "strata stores virtual disks in a datastore (a directory) and serves them over NBD.\n\
Every disk and snapshot has its own map, so I/O costs the same at any snapshot depth;\n\
snapshots and linked clones are O(1); deleting a snapshot moves no data.\n\n\
While `strata serve` runs, the other commands talk to it through its control socket."
)]
struct Cli {
    /// Datastore directory [default: $STRATA_DATASTORE, else ~/.local/share/strata/datastore]
    #[arg(long, short = 'd', global = true, env = "STRATA_DATASTORE")]
    datastore: Option<PathBuf>,

    /// Metadata cache budget (e.g. 128M)
    #[arg(long, global = true, value_parser = parse_size, default_value = "128M")]
    cache: u64,

    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args)]
struct JsonFlag {
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a datastore in the directory
    Init {
        /// Capacity limit (default: the file system's free space)
        #[arg(long, value_parser = parse_size)]
        capacity: Option<u64>,
    },
    /// Show the datastore's capacity, use and over-commit
    Status(JsonFlag),
    /// Create a disk
    Create {
        name: String,
        /// Virtual size (e.g. 10G)
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Provisioning: thin, zeroedthick or eagerzeroedthick
        #[arg(long = "type", default_value = "thin", value_parser = parse_prov)]
        provisioning: Provisioning,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// List disks
    List(JsonFlag),
    /// Show one disk: size, provisioning, allocation, nb/tbz, snapshots
    Info {
        name: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Remove a disk and its snapshots (linked clones keep what they share)
    Rm { name: String },
    /// Grow a disk (also while it is served)
    Extend {
        name: String,
        /// New virtual size
        #[arg(long, value_parser = parse_size)]
        size: u64,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Snapshots: create, list, revert, delete
    #[command(subcommand)]
    Snapshot(SnapCmd),
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
        #[arg(long = "type", default_value = "thin", value_parser = parse_prov)]
        provisioning: Provisioning,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Verify reference counts, ownership and accounting; non-zero exit on problems
    Check(JsonFlag),
    /// I/O statistics of a served disk (vscsiStats histograms), from the running server
    Stats {
        /// Disk or DISK@SNAP export (default: every export with statistics)
        disk: Option<String>,
        /// Zero the statistics after reading them
        #[arg(long)]
        reset: bool,
        /// Stop recording after reading (vscsiStats -x); commands are then
        /// only forwarded, and the figures so far stay readable. Without
        /// DISK: every disk, and disks first used later
        #[arg(long, conflicts_with = "resume")]
        pause: bool,
        /// Start recording again after a --pause (vscsiStats -s); combine
        /// with --reset to start afresh
        #[arg(long)]
        resume: bool,
        /// Redraw every second until interrupted
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Serve every disk over NBD (exports DISK and read-only DISK@SNAP), and VMDK files as they are
    Serve(serve::ServeArgs),
    /// Import a VMDK chain (snapshots = its links), a raw image or a qcow2 image as a new disk
    Import {
        /// The image: a VMDK descriptor or sparse file (its parents are followed), raw, or qcow2
        path: PathBuf,
        /// Name of the new disk
        name: String,
        /// Provisioning of the new disk
        #[arg(long = "type", default_value = "thin", value_parser = parse_prov)]
        provisioning: Provisioning,
        /// Image format [default: detected from the content]: vmdk, raw or qcow2 (needs qemu-img)
        #[arg(long)]
        format: Option<String>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Export DISK or DISK@SNAP as a VMDK
    Export {
        /// DISK or DISK@SNAP
        target: String,
        /// Output file, ending in .vmdk (never overwritten)
        out: PathBuf,
        /// monolithicSparse, monolithicFlat, streamOptimized, vmfsSparse or seSparse
        #[arg(long, default_value = "monolithicSparse")]
        subformat: String,
        /// Write the snapshot path as a chain: OUT.vmdk is the base, OUT-000001.vmdk... the
        /// deltas (vmfsSparse/seSparse chains get a monolithicFlat base); the last file is TARGET
        #[arg(long)]
        chain: bool,
        /// ddb.adapterType of the descriptor
        #[arg(long, default_value = "lsilogic", value_parser = ["ide", "buslogic", "lsilogic", "legacyESX"])]
        adapter: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Work on VMDK files directly (no datastore needed): info, check [--repair], shrink
    #[command(subcommand)]
    Vmdk(VmdkCmd),
}

#[derive(Subcommand)]
enum VmdkCmd {
    /// Show a VMDK chain link by link: create type, CIDs, extents (takes no lock: works on served
    /// files)
    Info {
        path: PathBuf,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Check grain directories and tables of every link: out-of-file, doubly used and bad
    /// entries; exits 1 when errors remain. Without --repair it takes no lock (works on served
    /// files, which may be mid-update); with --repair a file in use is refused
    Check {
        path: PathBuf,
        /// Fix what needs no guessing (in the top link): clear never-written grains, give doubly
        /// used grains their own copies, extend cut-short files, clear the unclean flag
        #[arg(long)]
        repair: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Give the space of unmapped and all-zero grains of an SEsparse delta back to the file system
    /// (refused while the file is served or otherwise in use)
    Shrink {
        path: PathBuf,
        #[command(flatten)]
        json: JsonFlag,
    },
}

#[derive(Subcommand)]
enum SnapCmd {
    /// Take a snapshot (O(1), whatever the disk holds)
    Create {
        disk: String,
        snapshot: String,
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// List a disk's snapshots as a tree
    List {
        disk: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Make the disk equal to a snapshot again (discards changes since)
    Revert { disk: String, snapshot: String },
    /// Delete a snapshot (moves no data)
    Delete { disk: String, snapshot: String },
}

fn parse_prov(s: &str) -> Result<Provisioning, String> {
    Provisioning::parse(s).map_err(|e| e.message)
}

fn default_datastore() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/strata/datastore")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let dir = cli.datastore.clone().unwrap_or_else(default_datastore);
    match run(&cli, &dir) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata: error: {}", e.message);
            ExitCode::from(1)
        }
    }
}

fn run(cli: &Cli, dir: &Path) -> Result<ExitCode, Error> {
    let (req, json) = match &cli.cmd {
        Cmd::Init { capacity } => return init(dir, capacity.unwrap_or(0)),
        Cmd::Serve(args) => return serve::run(dir, cli.cache, args),
        Cmd::Vmdk(v) => return vmdk(v),
        Cmd::Import {
            path,
            name,
            provisioning,
            format,
            json,
        } => (
            Request::Import {
                path: vmdk_cmd::absolute(path)?,
                name: name.clone(),
                provisioning: *provisioning,
                format: format.clone(),
            },
            json.json,
        ),
        Cmd::Export {
            target,
            out,
            subformat,
            chain,
            adapter,
            json,
        } => {
            strata_vmdk::Subformat::parse(subformat)
                .map_err(|e| Error::new(ErrorKind::InvalidArgument, e))?;
            (
                Request::Export {
                    target: target.clone(),
                    out: vmdk_cmd::absolute(out)?,
                    subformat: subformat.clone(),
                    chain: *chain,
                    adapter: adapter.clone(),
                },
                json.json,
            )
        }
        Cmd::Status(j) => (Request::Status, j.json),
        Cmd::Create {
            name,
            size,
            provisioning,
            json,
        } => (
            Request::Create {
                name: name.clone(),
                size_bytes: *size,
                provisioning: *provisioning,
            },
            json.json,
        ),
        Cmd::List(j) => (Request::List, j.json),
        Cmd::Info { name, json } => (Request::Info { name: name.clone() }, json.json),
        Cmd::Rm { name } => (Request::Remove { name: name.clone() }, false),
        Cmd::Extend { name, size, json } => (
            Request::Extend {
                name: name.clone(),
                size_bytes: *size,
            },
            json.json,
        ),
        Cmd::Snapshot(SnapCmd::Create {
            disk,
            snapshot,
            description,
            json,
        }) => (
            Request::SnapshotCreate {
                disk: disk.clone(),
                snapshot: snapshot.clone(),
                description: description.clone(),
            },
            json.json,
        ),
        Cmd::Snapshot(SnapCmd::List { disk, json }) => {
            (Request::SnapshotList { disk: disk.clone() }, json.json)
        }
        Cmd::Snapshot(SnapCmd::Revert { disk, snapshot }) => (
            Request::SnapshotRevert {
                disk: disk.clone(),
                snapshot: snapshot.clone(),
            },
            false,
        ),
        Cmd::Snapshot(SnapCmd::Delete { disk, snapshot }) => (
            Request::SnapshotDelete {
                disk: disk.clone(),
                snapshot: snapshot.clone(),
            },
            false,
        ),
        Cmd::Clone {
            source,
            name,
            full,
            provisioning,
            json,
        } => {
            if *full {
                (
                    Request::CloneFull {
                        source: source.clone(),
                        name: name.clone(),
                        provisioning: *provisioning,
                    },
                    json.json,
                )
            } else {
                if *provisioning != Provisioning::Thin {
                    return Err(Error::new(
                        ErrorKind::InvalidArgument,
                        "--type applies to full clones only (a linked clone is thin); add --full",
                    ));
                }
                (
                    Request::CloneLinked {
                        source: source.clone(),
                        name: name.clone(),
                    },
                    json.json,
                )
            }
        }
        Cmd::Check(j) => (Request::Check, j.json),
        Cmd::Stats {
            disk,
            reset,
            pause,
            resume,
            watch,
            json,
        } => {
            let req = Request::Stats {
                disk: disk.clone(),
                reset: *reset,
                recording: match (pause, resume) {
                    (true, _) => Some(false),
                    (_, true) => Some(true),
                    _ => None,
                },
            };
            if *watch {
                loop {
                    let v = dispatch(dir, cli.cache, &req)?;
                    print!("\x1b[2J\x1b[H");
                    if json.json {
                        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
                    } else {
                        print_human(&req, &v);
                    }
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
            (req, json.json)
        }
    };
    let value = dispatch(dir, cli.cache, &req)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&value).expect("json"));
    } else {
        print_human(&req, &value);
    }
    if matches!(req, Request::Check)
        && !value["errors"]
            .as_array()
            .map(|a| a.is_empty())
            .unwrap_or(false)
    {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn vmdk(cmd: &VmdkCmd) -> Result<ExitCode, Error> {
    let (v, json) = match cmd {
        VmdkCmd::Info { path, json } => (vmdk_cmd::info(path)?, json.json),
        VmdkCmd::Check { path, repair, json } => (vmdk_cmd::check(path, *repair)?, json.json),
        VmdkCmd::Shrink { path, json } => {
            let bar = progress_bar(!json.json, "{spinner} [{bar:40}] {percent}% eta {eta}");
            let v = vmdk_cmd::shrink(path, &mut |d, t| {
                if let Some(b) = &bar {
                    b.set_length(t);
                    b.set_position(d);
                }
            })?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            (v, json.json)
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    } else {
        match cmd {
            VmdkCmd::Info { .. } => {
                println!(
                    "size: {} ({} links)",
                    human(u(&v["size_bytes"])),
                    u(&v["depth"])
                );
                for (i, l) in v["links"].as_array().into_iter().flatten().enumerate() {
                    println!(
                        "{}{}  {}  CID {} parentCID {}",
                        "  ".repeat(i),
                        s(&l["file"]),
                        s(&l["create_type"]),
                        s(&l["cid"]),
                        s(&l["parent_cid"])
                    );
                    for e in l["extents"].as_array().into_iter().flatten() {
                        println!(
                            "{}  extent {} {} sectors: {} {}",
                            "  ".repeat(i),
                            s(&e["type"]),
                            u(&e["sectors"]),
                            s(&e["format"]),
                            s(&e["file"])
                        );
                    }
                }
            }
            VmdkCmd::Check { .. } => {
                for f in v["files"].as_array().into_iter().flatten() {
                    println!(
                        "{}: {} allocated, {} zero, {} unmapped grains",
                        s(&f["file"]),
                        u(&f["allocated_grains"]),
                        u(&f["zero_grains"]),
                        u(&f["unmapped_grains"])
                    );
                    for (label, key) in [
                        ("error", "errors"),
                        ("warning", "warnings"),
                        ("repaired", "repaired"),
                    ] {
                        for m in f[key].as_array().into_iter().flatten() {
                            println!("  {label}: {}", s(m));
                        }
                    }
                }
                if u(&v["remaining_errors"]) == 0 {
                    println!("no errors remain");
                } else {
                    println!("{} errors remain", u(&v["remaining_errors"]));
                }
            }
            VmdkCmd::Shrink { .. } => {
                for r in v.as_array().into_iter().flatten() {
                    println!(
                        "shrunk from {} to {} ({} grains moved, {} all-zero grains turned into zero entries)",
                        human(u(&r["bytes_before"])),
                        human(u(&r["bytes_after"])),
                        u(&r["moved"]),
                        u(&r["zero_grains_found"])
                    );
                }
            }
        }
    }
    if matches!(cmd, VmdkCmd::Check { .. }) && u(&v["remaining_errors"]) > 0 {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on stderr when `show` and stderr is a terminal.
fn progress_bar(show: bool, template: &str) -> Option<indicatif::ProgressBar> {
    if !show || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(0);
    b.set_style(
        indicatif::ProgressStyle::with_template(template)
            .expect("template")
            .progress_chars("=> "),
    );
    Some(b)
}

fn init(dir: &Path, capacity: u64) -> Result<ExitCode, Error> {
    std::fs::create_dir_all(dir).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!("cannot create {}: {e}", dir.display()),
        )
    })?;
    let lock = match ops::try_lock(dir)? {
        LockOutcome::Locked(f) => f,
        LockOutcome::Held(pid) => return Err(held(dir, pid)),
    };
    Datastore::init(
        std::sync::Arc::new(FileBackend::new(dir)),
        &InitOptions {
            capacity_bytes: capacity,
        },
    )?;
    drop(lock);
    println!("initialised datastore {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

fn held(dir: &Path, pid: Option<u32>) -> Error {
    let who = pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
    Error::new(
        ErrorKind::Locked,
        format!(
            "datastore {} is in use by another process{who}",
            dir.display()
        ),
    )
}

/// Run a request locally, or through the server that holds the datastore.
fn dispatch(dir: &Path, cache: u64, req: &Request) -> Result<Value, Error> {
    if !dir.join(strata_format::FILE_SUPER).exists() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no datastore at {} (run 'strata init' or pass --datastore)",
                dir.display()
            ),
        ));
    }
    let bar = make_bar(req);
    let mut progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let r = match ops::try_lock(dir)? {
        LockOutcome::Locked(lock) => {
            let ds = ops::open_local(dir, lock, cache)?;
            let r = ops::execute(
                &ops::Ctx {
                    ds: &ds,
                    stats: None,
                },
                req,
                &mut progress,
            );
            ds.close()?;
            r
        }
        LockOutcome::Held(pid) => {
            let sock = dir.join(strata_format::FILE_CONTROL);
            if !sock.exists() {
                return Err(held(dir, pid));
            }
            control::request(&sock, req, &mut progress)
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    r
}

fn make_bar(req: &Request) -> Option<indicatif::ProgressBar> {
    progress_bar(
        req.shows_progress(),
        "{spinner} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn print_disk(d: &Value) {
    println!("name:            {}", s(&d["name"]));
    println!(
        "size:            {} ({} bytes)",
        human(u(&d["size_bytes"])),
        u(&d["size_bytes"])
    );
    println!("provisioning:    {}", s(&d["provisioning"]));
    println!(
        "allocated:       {} ({} bytes)",
        human(u(&d["allocated_bytes"])),
        u(&d["allocated_bytes"])
    );
    println!(
        "nb / tbz:        {} / {} (1 MiB blocks)",
        u(&d["nb"]),
        u(&d["tbz"])
    );
    println!("snapshots:       {}", u(&d["snapshots"]));
    println!(
        "current snapshot:{}",
        format_args!(" {}", s(&d["current_snapshot"]))
    );
    println!("parent:          {}", s(&d["parent"]));
}

fn print_human(req: &Request, v: &Value) {
    match req {
        Request::Status => {
            println!("datastore:    {}", s(&v["location"]));
            println!("capacity:     {}", human(u(&v["capacity_bytes"])));
            println!("used:         {}", human(u(&v["used_bytes"])));
            println!(
                "reserved:     {} (thick disks, not yet written)",
                human(u(&v["reserved_bytes"]))
            );
            println!("free:         {}", human(u(&v["free_bytes"])));
            println!(
                "provisioned:  {} ({}% of capacity)",
                human(u(&v["provisioned_bytes"])),
                u(&v["overcommit_percent"])
            );
            println!(
                "disks:        {} ({} snapshots)",
                u(&v["disks"]),
                u(&v["snapshots"])
            );
            if u(&v["reclaiming"]) > 0 {
                println!(
                    "reclaiming:   space of {} deleted snapshots or disks",
                    u(&v["reclaiming"])
                );
            }
            if !v["fail_stop"].is_null() {
                println!(
                    "FAIL-STOPPED: {} (writes are refused; restart the server to recover \
                     from the log)",
                    s(&v["fail_stop"]["cause"])
                );
            }
        }
        Request::List => {
            println!(
                "{:<24} {:>10} {:<17} {:>10} {:>5}  PARENT",
                "NAME", "SIZE", "TYPE", "ALLOCATED", "SNAPS"
            );
            for d in v.as_array().into_iter().flatten() {
                println!(
                    "{:<24} {:>10} {:<17} {:>10} {:>5}  {}",
                    s(&d["name"]),
                    human(u(&d["size_bytes"])),
                    s(&d["provisioning"]),
                    human(u(&d["allocated_bytes"])),
                    u(&d["snapshots"]),
                    s(&d["parent"])
                );
            }
        }
        Request::Info { .. }
        | Request::Create { .. }
        | Request::Extend { .. }
        | Request::CloneLinked { .. }
        | Request::CloneFull { .. }
        | Request::SnapshotRevert { .. } => print_disk(v),
        Request::Remove { name } => println!("removed {name}"),
        Request::SnapshotCreate { disk, snapshot, .. } => {
            println!("created snapshot {disk}@{snapshot}")
        }
        Request::SnapshotDelete { disk, snapshot } => {
            println!("deleted snapshot {disk}@{snapshot}")
        }
        Request::SnapshotList { .. } => print_tree(v),
        Request::Stats { .. } => print_stats(v),
        Request::Import { .. } => {
            print_disk(&v["disk"]);
            let snaps = v["snapshots"].as_array().cloned().unwrap_or_default();
            if !snaps.is_empty() {
                println!(
                    "imported {} links; snapshots (base first): {}",
                    snaps.len() + 1,
                    snaps.iter().map(s).collect::<Vec<_>>().join(", ")
                );
            }
        }
        Request::Export { .. } => {
            for l in v["links"].as_array().into_iter().flatten() {
                println!(
                    "wrote {} ({}) from {}",
                    s(&l["file"]),
                    s(&l["subformat"]),
                    s(&l["version"])
                );
            }
            println!("open {}", s(&v["open"]));
        }
        Request::Check => {
            let errors = v["errors"].as_array().cloned().unwrap_or_default();
            println!(
                "checked {} versions, {} map nodes, {} data grains; {} used",
                u(&v["versions"]),
                u(&v["map_nodes"]),
                u(&v["data_grains"]),
                human(u(&v["used_bytes"]))
            );
            if errors.is_empty() {
                println!("clean: no leaked or doubly owned grain, accounting exact");
            } else {
                println!(
                    "{} problems ({} leaked grains, {} counted too low):",
                    errors.len(),
                    u(&v["leaked_grains"]),
                    u(&v["overshared_grains"])
                );
                for e in errors {
                    println!("  {}", s(&e));
                }
            }
        }
    }
}

fn print_stats(v: &Value) {
    let Some(map) = v.as_object() else { return };
    if map.is_empty() {
        println!("no statistics yet: no client has used a disk since the server started");
    }
    for (disk, snap) in map {
        println!("=== {disk}");
        match serde_json::from_value::<strata_stats::StatsSnapshot>(snap.clone()) {
            Ok(s) => print!("{}", strata_stats::render_text(&s)),
            Err(e) => println!("(unreadable statistics: {e})"),
        }
    }
}

/// Snapshots as an indented tree; `*` marks where the live state is.
fn print_tree(v: &Value) {
    let snaps = v.as_array().cloned().unwrap_or_default();
    if snaps.is_empty() {
        println!("no snapshots");
        return;
    }
    fn depth(snaps: &[Value], name: &Value) -> usize {
        let mut d = 0;
        let mut cur = name.clone();
        while let Some(p) = snaps
            .iter()
            .find(|s| s["name"] == cur)
            .map(|s| s["parent"].clone())
        {
            if p.is_null() || d > snaps.len() {
                break;
            }
            d += 1;
            cur = p;
        }
        d
    }
    for sn in &snaps {
        let d = depth(&snaps, &sn["name"]);
        let mark = if sn["current"].as_bool().unwrap_or(false) {
            "  <- you are here"
        } else {
            ""
        };
        let desc = sn["description"].as_str().unwrap_or("");
        println!(
            "{}{}  ({}{}){}",
            "  ".repeat(d),
            s(&sn["name"]),
            human(u(&sn["mapped_bytes"])),
            if desc.is_empty() {
                String::new()
            } else {
                format!(", {desc}")
            },
            mark
        );
    }
}
