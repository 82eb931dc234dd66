//! Format stability: datastores written by format versions 1 and 2
//! (committed under tests/golden/v1 and v2, each with a non-empty log to
//! replay) must open and read back exactly; opening v1 upgrades it to v2
//! (docs/FORMAT.md §8). Regenerate only on a deliberate format change, and
//! only the current version's directory:
//! `STRATA_WRITE_GOLDEN=1 cargo test -p strata-engine --test golden -- --ignored`.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, Provisioning};
use strata_storage::FileBackend;

fn golden_dir(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/v{version}"))
}

fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| tag.wrapping_add((i / 4096) as u8))
        .collect()
}

/// What the golden datastore holds: (export, offset, bytes).
fn expected() -> Vec<(&'static str, u64, Vec<u8>)> {
    let mut g = vec![0u8; 4 << 20];
    g[..1 << 20].copy_from_slice(&pattern(0x10, 1 << 20));
    let s = g.clone();
    g[512 << 10..1536 << 10].copy_from_slice(&pattern(0x40, 1 << 20));
    g[2 << 20..(2 << 20) + 8192].copy_from_slice(&pattern(0x70, 8192)); // in the log only
    let mut c = s.clone();
    c[0..4096].copy_from_slice(&pattern(0x90, 4096));
    vec![("g", 0, g), ("g@s", 0, s), ("c", 0, c)]
}

fn open(dir: &Path) -> Datastore {
    common::open_dir(dir).unwrap()
}

/// Copy golden version `version` to a scratch directory, open it, read
/// everything back and check it.
fn open_golden(version: u32) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(golden_dir(version)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let ds = open(tmp.path());
    for (export, off, data) in expected() {
        let h = ds.open_disk(export).unwrap();
        let mut buf = vec![0u8; data.len()];
        h.read_at(&mut buf, off).unwrap();
        assert!(buf == data, "golden v{version}: export {export} differs");
    }
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "golden v{version}: {:#?}", r.errors);
    tmp
}

fn superblock_version(dir: &Path) -> u32 {
    let b = std::fs::read(dir.join(strata_format::FILE_SUPER)).unwrap();
    strata_format::Superblock::pick(&b[..4096], &b[4096..])
        .unwrap()
        .version
}

#[test]
fn golden_v1_datastore_is_upgraded_on_open_and_reads_back() {
    assert_eq!(superblock_version(&golden_dir(1)), 1);
    let tmp = open_golden(1);
    // The upgrade finished: version 2, the v1 log and the new count file gone.
    assert_eq!(superblock_version(tmp.path()), 2);
    assert!(!tmp.path().join(strata_format::FILE_JOURNAL_V1).exists());
    assert!(!tmp
        .path()
        .join(strata_format::FILE_REFCOUNT_UPGRADE)
        .exists());
    // And it opens again as a plain version-2 datastore.
    let ds = open(tmp.path());
    for (export, off, data) in expected() {
        let h = ds.open_disk(export).unwrap();
        let mut buf = vec![0u8; data.len()];
        h.read_at(&mut buf, off).unwrap();
        assert!(buf == data, "upgraded golden: export {export} differs");
    }
}

#[test]
fn golden_v2_datastore_opens_and_reads_back() {
    assert_eq!(superblock_version(&golden_dir(2)), 2);
    open_golden(2);
}

#[test]
fn an_upgrade_cut_short_after_its_superblock_finishes_on_the_next_open() {
    // Steps 1-5 done, step 6 not: refcount.v2 beside the old file, the v1
    // log still there (docs/FORMAT.md §8).
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(golden_dir(1)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    // Run the upgrade once, then put the pre-step-6 state back.
    let v1_refs = std::fs::read(tmp.path().join("refcount.data")).unwrap();
    let v1_log = std::fs::read(tmp.path().join("journal.log")).unwrap();
    drop(open(tmp.path()));
    // After the first open the log was checkpointed; emulate the cut by
    // restoring the old files under their old names and the new count file
    // under its upgrade name.
    let v2_refs = std::fs::read(tmp.path().join("refcount.data")).unwrap();
    std::fs::write(tmp.path().join("refcount.v2"), &v2_refs).unwrap();
    std::fs::write(tmp.path().join("refcount.data"), &v1_refs).unwrap();
    std::fs::write(tmp.path().join("journal.log"), &v1_log).unwrap();
    let ds = open(tmp.path());
    assert!(!tmp.path().join("refcount.v2").exists());
    assert!(!tmp.path().join("journal.log").exists());
    for (export, off, data) in expected() {
        let h = ds.open_disk(export).unwrap();
        let mut buf = vec![0u8; data.len()];
        h.read_at(&mut buf, off).unwrap();
        assert!(buf == data, "export {export} differs");
    }
    assert!(ds.check().unwrap().is_clean());
}

#[test]
#[ignore = "writes the golden datastore; run on a deliberate format change only"]
fn write_golden_current_version() {
    if std::env::var("STRATA_WRITE_GOLDEN").as_deref() != Ok("1") {
        return;
    }
    let dir = golden_dir(strata_format::FORMAT_VERSION);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Datastore::init(
        Arc::new(FileBackend::new(&dir)),
        &InitOptions {
            capacity_bytes: 1 << 30,
        },
    )
    .unwrap();
    let ds = open(&dir);
    ds.create_disk("g", 4 << 20, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let g = ds.open_disk("g").unwrap();
    g.write_at(&pattern(0x10, 1 << 20), 0, false).unwrap();
    ds.snapshot_create("g", "s", "golden").unwrap();
    g.write_at(&pattern(0x40, 1 << 20), 512 << 10, false)
        .unwrap();
    ds.clone_linked("g@s", "c").unwrap();
    ds.open_disk("c")
        .unwrap()
        .write_at(&pattern(0x90, 4096), 0, false)
        .unwrap();
    ds.close().unwrap();
    drop((g, ds));
    // Reopen and leave one flushed batch in the log, without a checkpoint.
    let ds = open(&dir);
    let g = ds.open_disk("g").unwrap();
    g.write_at(&pattern(0x70, 8192), 2 << 20, false).unwrap();
    g.flush().unwrap();
    std::fs::remove_file(dir.join("lock")).ok();
}
