//! A move cut at each of its steps (docs/MOVE.md, "Crash analysis"),
//! driven through the server library: [`Places`] and its [`Mover`], as a
//! server's control socket runs `strata move`. The move runs in a child
//! process (this test binary again) whose step hook aborts it at the step,
//! as kill -9 would end a server there; then a start on the same
//! directories ([`Places::open`]) undoes the move before its commit point
//! or finishes it after, the disk and its snapshot read back every byte,
//! and a repeated move completes. (A server killed at a random moment of
//! a move: crates/cli/tests/move.rs.)
#![allow(clippy::too_many_lines)] // test code is outside the ratchet (crates/tidy)

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use strata_api::{Request, Response};
use strata_block::BlockDevice;
use strata_datastore::{OpenOptions, Provisioning, Role};
use strata_server::moving::{MoveSettings, MoveStep};
use strata_server::ops::Mover;
use strata_server::placement::{Config, Places, Store};

/// Test-only: set in the child process, the step its move aborts at (no
/// production code reads the environment).
const TEST_ABORT_AT: &str = "STRATA_TEST_ONLY_MOVE_ABORT_AT";
/// Test-only: the child's home and target datastores.
const TEST_HOME: &str = "STRATA_TEST_ONLY_MOVE_HOME";
const TEST_DEST: &str = "STRATA_TEST_ONLY_MOVE_DEST";
/// This test's name, for the child to run it alone.
const NAME: &str = "a_move_cut_at_each_step_keeps_the_disk_and_a_repeated_move_completes";

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;

/// What the child prints once its move returned (it must not).
const RETURNED: &str = "the move returned";

fn step_named(name: &str) -> MoveStep {
    MoveStep::ALL
        .into_iter()
        .find(|s| s.as_str() == name)
        .unwrap_or_else(|| panic!("no move step {name}"))
}

/// A datastore as a server opens it.
fn open(dir: &Path) -> Store {
    let opts = OpenOptions {
        role: Role::Server,
        ..OpenOptions::default()
    };
    strata_datastore::open(dir, &opts).unwrap()
}

/// A server's start on `home`: its datastore and placement (recovering
/// the moves a crash cut), its moves told of each step by `on_step`.
fn start(home: &Path, moves: MoveSettings) -> Arc<Places> {
    let cfg = Config {
        moves,
        ..Config::default()
    };
    Places::open(home, open(home), cfg).unwrap()
}

/// A server's clean stop: the datastores it opened closed, then home.
fn stop(places: Arc<Places>) {
    let home = places.store(&places.home_location()).unwrap();
    places.close();
    drop(places);
    home.close().unwrap();
}

/// `strata move d --to DIR`, as the server's job runs it.
fn move_disk(places: &Places, to: &Path) -> Result<Response, strata_datastore::Error> {
    let req = Request::Move {
        name: "d".into(),
        to: to.to_path_buf(),
        head_only: false,
        provisioning: None,
        rate_bytes_per_sec: None,
    };
    places.reserve_move(&req)?;
    places.run_move(&req, None, &mut |_, _| {})
}

fn moved_snapshots(r: Response) -> Vec<String> {
    match r {
        Response::Moved(m) => m.snapshots,
        other => panic!("not a move's report: {other:?}"),
    }
}

fn write(dev: &dyn BlockDevice, img: &mut [u8], byte: u8, at: u64, len: u64) {
    let buf = vec![byte; len as usize];
    dev.write_at(&buf, at, false).unwrap();
    img[at as usize..(at + len) as usize].copy_from_slice(&buf);
}

/// Disk `d` with data worth checking and a snapshot, flushed: its head's
/// and its snapshot's bytes.
fn disk_with_data(home: &Path) -> (Vec<u8>, Vec<u8>) {
    strata_datastore::init(home, &Default::default()).unwrap();
    let ds = open(home);
    ds.create("d", SIZE, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let mut img = vec![0u8; SIZE as usize];
    let dev = ds.open("d").unwrap();
    write(&*dev, &mut img, 0x5a, 0, 8 * MIB);
    write(&*dev, &mut img, 0x6b, 20 * MIB, 3 * MIB);
    dev.flush().unwrap();
    ds.snapshot_create("d", "snap", "").unwrap();
    let snap = img.clone();
    write(&*dev, &mut img, 0x7c, MIB, MIB);
    dev.flush().unwrap();
    drop(dev);
    ds.close().unwrap();
    (img, snap)
}

/// Export `target` as the server serves it reads `img`.
fn same(places: &Places, target: &str, img: &[u8]) {
    let dev = places.slot(target).unwrap().device();
    assert_eq!(dev.size_bytes(), img.len() as u64, "{target}");
    let mut buf = vec![0u8; MIB as usize];
    for (i, want) in img.chunks(MIB as usize).enumerate() {
        dev.read_at(&mut buf, i as u64 * MIB).unwrap();
        assert!(buf == want, "{target} differs in its MiB {i}");
    }
}

/// The home's placement file (docs/MOVE.md), empty if none yet.
fn placement(home: &Path) -> serde_json::Value {
    match std::fs::read(home.join("placement.json")) {
        Ok(b) => serde_json::from_slice(&b).unwrap(),
        Err(_) => serde_json::json!({ "disks": {}, "moves": {} }),
    }
}

/// The disks of the datastore in `dir`, opened as a command would.
fn names(dir: &Path) -> Vec<String> {
    let ds = strata_datastore::open(dir, &OpenOptions::default()).unwrap();
    let n = ds
        .list()
        .unwrap()
        .into_iter()
        .map(|d| d.info.name)
        .collect();
    ds.close().unwrap();
    n
}

/// The child: a server on the home directory whose move of `d` aborts the
/// process at `step`.
fn mover(step: &str) {
    let step = step_named(step);
    let home = PathBuf::from(std::env::var(TEST_HOME).unwrap());
    let dest = PathBuf::from(std::env::var(TEST_DEST).unwrap());
    let places = start(
        &home,
        MoveSettings {
            on_step: Some(Arc::new(move |_, at| {
                if at == step {
                    eprintln!("aborting at {}", at.as_str());
                    std::process::abort();
                }
            })),
            ..MoveSettings::default()
        },
    );
    let r = move_disk(&places, &dest);
    println!("{RETURNED}: {r:?}");
}

/// Issue 13's second acceptance case: a move cut at each step (the hook
/// aborts the process there) keeps the disk, and a repeated move
/// completes.
#[test]
fn a_move_cut_at_each_step_keeps_the_disk_and_a_repeated_move_completes() {
    if let Ok(step) = std::env::var(TEST_ABORT_AT) {
        return mover(&step);
    }
    for step in MoveStep::ALL {
        let at = step.as_str();
        let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (home, dest) = (dirs.0.path(), dirs.1.path());
        let (img, snap) = disk_with_data(home);
        strata_datastore::init(dest, &Default::default()).unwrap();
        let o = Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(TEST_ABORT_AT, at)
            .env(TEST_HOME, home)
            .env(TEST_DEST, dest)
            .output()
            .unwrap();
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        // The move did not end: the process died at the step.
        assert_eq!(o.status.signal(), Some(libc::SIGABRT), "{at}: {out}");
        assert!(!out.contains(RETURNED), "{at}: {out}");
        assert!(out.contains(&format!("aborting at {at}")), "{at}: {out}");

        let places = start(home, MoveSettings::default());
        same(&places, "d", &img);
        same(&places, "d@snap", &snap);
        let p = placement(home);
        assert_eq!(p["moves"], serde_json::json!({}), "{at}: {p}");
        let places = if step == MoveStep::Switched {
            // Past the commit point: the target is the disk, the source
            // was removed at the start.
            assert!(p["disks"]["d"]["dir"].as_str().is_some(), "{p}");
            stop(places);
            assert!(!names(home).contains(&"d".to_string()));
            assert!(names(dest).contains(&"d".to_string()));
            let places = start(home, MoveSettings::default());
            // Moving back home completes.
            move_disk(&places, home).unwrap();
            places
        } else {
            // Before it: the source serves, the partial copy is gone.
            assert_eq!(p["disks"], serde_json::json!({}), "{at}: {p}");
            stop(places);
            assert!(names(dest).is_empty(), "{at}");
            let places = start(home, MoveSettings::default());
            let r = move_disk(&places, dest).unwrap();
            assert_eq!(moved_snapshots(r), vec!["snap".to_string()]);
            places
        };
        same(&places, "d", &img);
        same(&places, "d@snap", &snap);
        stop(places);
    }
}
