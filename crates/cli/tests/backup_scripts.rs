//! The nightly incremental backup and its restore, scripted
//! (`scripts/backup-nightly`, `scripts/restore`; docs/BACKUP.md): three
//! nights with guest writes (qemu-io over NBD) between them, then a
//! restore into a new datastore that reads byte for byte as the last
//! night's snapshot.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// Run a script against datastore `ds`; its stdout.
fn run_script(name: &str, ds: &Path, args: &[&str], snap: Option<&str>) -> String {
    let mut c = Command::new("sh");
    c.arg(script(name))
        .args(args)
        .env("STRATA", strata())
        .env("STRATA_DATASTORE", ds);
    if let Some(s) = snap {
        c.env("STRATA_BACKUP_SNAPSHOT", s);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{name} {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn three_nights_of_backups_restore_byte_for_byte() {
    if !have("qemu-io") || !have("qemu-img") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "16M"]);
    let srv = s.serve();
    let backups = s.dir.path().join("backups");
    let b = backups.to_str().unwrap();
    let nights: [(&str, &[&str]); 3] = [
        ("n1", &["write -P 1 0 1M", "write -P 9 12M 64k"]),
        ("n2", &["write -P 2 4M 1M", "write -P 3 0 64k"]),
        (
            "n3",
            &["write -P 4 8M 2M", "discard 4M 512k", "write -z 12M 64k"],
        ),
    ];
    for (snap, writes) in nights {
        qemu_io_ok(RAW, &s.uri("vm"), writes);
        let out = run_script("backup-nightly", &s.path(), &["vm", b], Some(snap));
        assert!(out.contains(&format!("vm@{snap}")), "{out}");
    }
    // One base kept: the last night's.
    let snaps = s.json(&["snapshot", "list", "vm"]);
    let names: Vec<_> = snaps
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].clone())
        .collect();
    assert_eq!(names, [serde_json::json!("n3")], "{snaps}");
    assert_eq!(
        std::fs::read_to_string(backups.join("last"))
            .unwrap()
            .trim(),
        "n3"
    );
    let mut files: Vec<_> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".diff"))
        .collect();
    files.sort();
    assert_eq!(files, ["0000-n1.diff", "0001-n2.diff", "0002-n3.diff"]);
    // The incrementals hold what changed, not the disk.
    let size = |f: &str| std::fs::metadata(backups.join(f)).unwrap().len();
    assert!(size("0001-n2.diff") < 2 << 20, "{}", size("0001-n2.diff"));

    // Restore into a new datastore (no server: the CLI does it).
    let r = Store::new();
    let out = run_script("restore", &r.path(), &[b, "vm"], None);
    assert_eq!(out.lines().count(), 3, "{out}");
    let restored = r.json(&["info", "vm"]);
    assert_eq!(restored["size_bytes"], 16 << 20, "{restored}");
    let rsrv = r.serve();
    let cmp = raw_compare(&s.uri("vm@n3"), &r.uri("vm"));
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stdout)
    );
    let cmp = raw_compare(&s.uri("vm"), &r.uri("vm@n3"));
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stdout)
    );
    rsrv.stop();
    srv.stop();

    // A night missing from the chain stops the restore.
    std::fs::remove_file(backups.join("0001-n2.diff")).unwrap();
    let r2 = Store::new();
    let o = Command::new("sh")
        .arg(script("restore"))
        .args([b, "vm"])
        .env("STRATA", strata())
        .env("STRATA_DATASTORE", r2.path())
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "a restore without night 2 went through"
    );
}
