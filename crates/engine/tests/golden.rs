//! Format stability: a datastore written by format version 1 (committed under
//! tests/golden/v1, with a non-empty log to replay) must open and read back
//! exactly. Regenerate only on a deliberate format change:
//! `STRATA_WRITE_GOLDEN=1 cargo test -p strata-engine --test golden -- --ignored`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, OpenOptions, Provisioning};
use strata_storage::FileBackend;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1")
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
    Datastore::open(
        Arc::new(FileBackend::new(dir)),
        &OpenOptions::default(),
        None,
    )
    .unwrap()
}

#[test]
fn golden_v1_datastore_opens_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(golden_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let ds = open(tmp.path());
    for (export, off, data) in expected() {
        let h = ds.open_disk(export).unwrap();
        let mut buf = vec![0u8; data.len()];
        h.read_at(&mut buf, off).unwrap();
        assert!(buf == data, "golden export {export} differs");
    }
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
}

#[test]
#[ignore = "writes the golden datastore; run on a deliberate format change only"]
fn write_golden_v1() {
    if std::env::var("STRATA_WRITE_GOLDEN").as_deref() != Ok("1") {
        return;
    }
    let dir = golden_dir();
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
