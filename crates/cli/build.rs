//! Names the build in `strata --version`: the git commit it was built
//! from (STRATA_COMMIT from the environment wins, for a build outside a
//! checkout such as a source package's; else "unknown commit").

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=STRATA_COMMIT");
    let commit = std::env::var("STRATA_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown commit".into());
    println!("cargo:rustc-env=STRATA_COMMIT={commit}");
}

/// The checkout's HEAD commit (12 hex digits); rebuilt when HEAD moves.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD, the branch it points at, and packed refs: a commit or a
    // checkout changes one of them.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = PathBuf::from(dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
            let common = PathBuf::from(common);
            println!(
                "cargo:rerun-if-changed={}",
                common.join("packed-refs").display()
            );
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                println!("cargo:rerun-if-changed={}", common.join(branch).display());
            }
        }
    }
    Some(commit)
}
