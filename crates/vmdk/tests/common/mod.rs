//! Helpers the VMDK crate's tests share: whether the qemu tools are
//! installed, and running one in a directory.
#![allow(dead_code)] // each test file uses a part

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Whether every tool in `tools` runs (`--version`). Under
/// STRATA_REQUIRE_TOOLS=1 a missing tool fails the test instead of
/// skipping it.
pub fn have(tools: &[&str]) -> bool {
    for tool in tools {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            if std::env::var("STRATA_REQUIRE_TOOLS").as_deref() == Ok("1") {
                panic!("{tool} is required (run scripts/install-deps.sh)");
            }
            eprintln!("skipping: {tool} not installed");
            return false;
        }
    }
    true
}

/// Run `prog` with `args` in `dir`.
pub fn run(dir: &Path, prog: &str, args: &[&str]) -> Output {
    Command::new(prog)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {prog}: {e}"))
}

/// How a run ended, for a failed assertion.
pub fn describe(prog: &str, args: &[&str], o: &Output) -> String {
    format!(
        "{prog} {args:?} exited {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run and require exit 0; returns stdout.
pub fn ok(dir: &Path, prog: &str, args: &[&str]) -> String {
    let o = run(dir, prog, args);
    assert!(o.status.success(), "{}", describe(prog, args, &o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}
