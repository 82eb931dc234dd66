//! Helpers for tests of VMDK files served or changed by the `strata`
//! binary: commands run without a datastore, with the holder records of
//! each test in a folder of its own.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{strata, Store};

pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Holder records of each test in a folder of its own.
pub fn runtime(s: &Store) -> PathBuf {
    s.dir.path().join("run")
}

pub fn strata_cmd(s: &Store, args: &[&str]) -> Output {
    Command::new(strata())
        .env("STRATA_RUNTIME_DIR", runtime(s))
        .args(args)
        .output()
        .unwrap()
}

pub fn ok(s: &Store, args: &[&str]) -> String {
    let o = strata_cmd(s, args);
    assert!(
        o.status.success(),
        "strata {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

pub fn fails(s: &Store, args: &[&str]) -> String {
    let o = strata_cmd(s, args);
    assert!(!o.status.success(), "strata {args:?} should have failed");
    String::from_utf8(o.stderr).unwrap()
}
