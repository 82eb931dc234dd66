//! strata as operators install and run it: `--version` names the commit,
//! shell completions and man pages come from the command line's own
//! definitions, a server tells systemd (NOTIFY_SOCKET) when it is ready
//! and when it stops, and `make deb` (scripts/make-deb.sh) builds a
//! package that dpkg installs, whose unit systemd-analyze accepts and
//! whose man pages man finds.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn out(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let v = run_ok(strata(), &["--version"]);
    let want_version = env!("CARGO_PKG_VERSION");
    assert!(
        v.starts_with(&format!("strata {want_version} (")),
        "--version says {v:?}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root())
        .output();
    match head {
        Ok(h) if h.status.success() => {
            let head = String::from_utf8_lossy(&h.stdout).trim().to_string();
            assert_eq!(v.trim(), format!("strata {want_version} ({head})"));
        }
        _ => eprintln!("not a git checkout: the commit is not compared"),
    }
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    let bash = run_ok(strata(), &["completions", "bash"]);
    assert!(bash.contains("--vhost-user-blk") && bash.contains("snapshot"));
    if have("bash") {
        // The script parses.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("strata.bash");
        std::fs::write(&f, &bash).unwrap();
        out(Command::new("bash").arg("-n").arg(&f));
    }
    for shell in ["zsh", "fish"] {
        let s = run_ok(strata(), &["completions", shell]);
        assert!(s.contains("vhost-user-blk"), "{shell}: {s:.200}");
    }
    let bad = Command::new(strata())
        .args(["completions", "cmd.exe"])
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bash"));

    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man1");
    run_ok(strata(), &["manpages", man.to_str().unwrap()]);
    for page in [
        "strata",
        "strata-serve",
        "strata-snapshot-create",
        "strata-alarm-set",
    ] {
        let text = std::fs::read_to_string(man.join(format!("{page}.1")))
            .unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page}.1 is no man page"
        );
    }
    let serve = std::fs::read_to_string(man.join("strata-serve.1")).unwrap();
    assert!(
        serve.contains("vhost\\-user\\-blk"),
        "strata-serve.1 lacks its flags"
    );
    // Hidden commands and clap's own `help` get no page.
    assert!(!man.join("strata-manpages.1").exists());
    assert!(!man.join("strata-help.1").exists());
}

#[test]
fn a_server_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify");
    let sock = UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let server = Server::start_env(&s, &[], &[("NOTIFY_SOCKET", notify.to_str().unwrap())]);
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("no READY=1 from the server");
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "READY=1\n");
    // Ready means serving: the NBD socket answers.
    if have("nbdinfo") {
        out(Command::new("nbdinfo").arg("--list").arg(s.uri("")));
    }
    server.stop();
    let n = sock.recv(&mut buf).expect("no STOPPING=1 from the server");
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "STOPPING=1\n");
}

/// Removes the package installed for real, whatever the test's outcome.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "strata"]).output();
    }
}

#[test]
fn make_deb_builds_a_package_dpkg_installs() {
    if !(have("dpkg-deb") && have("objcopy")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let made = out(Command::new(root().join("scripts/make-deb.sh"))
        .env("STRATA_BIN", strata())
        .env("OUT", dir.path()));
    let deb = PathBuf::from(made.lines().last().unwrap().trim());
    assert!(deb.exists(), "no package at {}", deb.display());
    let version = run_ok(strata(), &["--version"]);
    let commit = version
        .trim()
        .rsplit('(')
        .next()
        .unwrap()
        .trim_end_matches(')');
    let info = out(Command::new("dpkg-deb").args(["--field"]).arg(&deb));
    assert!(info.contains("Package: strata"), "{info}");
    assert!(
        info.contains("+git") || commit == "unknown commit",
        "{info}"
    );
    let contents = out(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    for f in [
        "./usr/bin/strata",
        "./lib/systemd/system/strata@.service",
        "./etc/default/strata",
        "./usr/share/man/man1/strata.1.gz",
        "./usr/share/man/man1/strata-serve.1.gz",
        "./usr/share/bash-completion/completions/strata",
        "./usr/share/zsh/vendor-completions/_strata",
        "./usr/share/fish/vendor_completions.d/strata.fish",
        "./usr/share/doc/strata/README.md",
        "./usr/share/doc/strata/docs/FORMAT.md",
        "./usr/share/doc/strata/copyright",
        "./usr/share/strata/quiesce-hooks/virsh-fsfreeze",
        "./usr/share/strata/quiesce-hooks/host-fsfreeze",
        "./usr/share/strata/backup/backup-nightly",
        "./usr/share/strata/backup/restore",
    ] {
        assert!(
            contents.contains(f),
            "{f} is not in the package:\n{contents}"
        );
    }

    // Installed into a directory of its own (dpkg's whole unpack and
    // configure, the maintainer scripts run without chroot).
    let inst = dir.path().join("root");
    let admin = inst.join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("info")).unwrap();
    std::fs::create_dir_all(admin.join("updates")).unwrap();
    std::fs::write(admin.join("status"), "").unwrap();
    std::fs::write(admin.join("available"), "").unwrap();
    out(Command::new("dpkg")
        .arg(format!("--instdir={}", inst.display()))
        .arg(format!("--admindir={}", admin.display()))
        .args([
            "--force-script-chrootless",
            "--force-depends",
            "--force-not-root",
            "-i",
        ])
        .arg(&deb));
    let installed = inst.join("usr/bin/strata");
    assert_eq!(out(Command::new(&installed).arg("--version")), version);
    // The quiesce hooks run as programs.
    for hook in [
        "quiesce-hooks/virsh-fsfreeze",
        "quiesce-hooks/host-fsfreeze",
        "backup/backup-nightly",
        "backup/restore",
    ] {
        let p = inst.join("usr/share/strata").join(hook);
        let mode = std::os::unix::fs::PermissionsExt::mode(&p.metadata().unwrap().permissions());
        assert_eq!(mode & 0o777, 0o755, "{}", p.display());
    }

    // And into this system for real, when that harms nothing: as root, no
    // strata package installed before (a fresh CI machine). Purged after.
    let root_user = unsafe { libc::geteuid() } == 0;
    let present = Command::new("dpkg")
        .args(["-s", "strata"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !root_user || present {
        eprintln!("the package is not installed into this system (not root, or installed already)");
        return;
    }
    let _purge = Installed;
    out(Command::new("dpkg").arg("-i").arg(&deb));
    assert_eq!(
        out(Command::new("/usr/bin/strata").arg("--version")),
        version
    );
    if have("man") {
        let pages = out(Command::new("man").args(["-w", "strata", "strata-serve"]));
        assert!(pages.contains("strata-serve.1"), "{pages}");
    }
    if have("systemd-analyze") {
        out(Command::new("systemd-analyze").args(["verify", "strata@test.service"]));
    }
    out(Command::new("dpkg").args(["--purge", "strata"]));
    assert!(
        !Path::new("/usr/bin/strata").exists(),
        "purge left the binary"
    );
}

/// What the journal would hold, on stderr where no systemd runs: a
/// server's start, each alarm change at the level its new state calls for
/// (alarm an error, warning a warning, back to ok info), and its clean
/// stop, each one line with its fields. (Under systemd, JOURNAL_STREAM
/// names stderr and the same events go to the journal with priorities
/// 3, 4 and 5 and STRATA_* fields: checked by hand with journald, see
/// docs/OPERATIONS.md.)
#[test]
fn a_server_logs_its_start_alarm_changes_and_stop_with_their_fields() {
    let s = Store::empty();
    s.ok(&["init", "--capacity", "1G"]);
    // 1000 % provisioned: over the default overcommit alarm (200 %).
    s.ok(&["create", "d", "--size", "10G"]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let mut child = Command::new(strata())
        .arg("--datastore")
        .arg(s.path())
        .args(["serve", "--nbd-unix"])
        .arg(s.sock())
        .env_remove("STRATA_LOG")
        .env_remove("JOURNAL_STREAM")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for(&s.sock());
    let read = || std::fs::read_to_string(&log).unwrap();
    let line_with = |text: &str| {
        read()
            .lines()
            .find(|l| l.contains(text))
            .map(str::to_string)
    };
    let seen = |what: &str, text: &str| {
        eventually(what, Duration::from_secs(30), || line_with(text).is_some());
        line_with(text).unwrap()
    };
    let start = seen("the start", "event=\"start\"");
    assert!(
        start.contains(" INFO ") && start.contains("kind=\"local\""),
        "{start}"
    );
    assert!(
        start.contains(&format!("datastore={}", s.path().display())),
        "{start}"
    );
    let alarm = seen("the alarm", "state=\"alarm\"");
    assert!(
        alarm.contains("ERROR") && alarm.contains("event=\"alarm\""),
        "{alarm}"
    );
    assert!(
        alarm.contains("kind=\"overcommit\"")
            && alarm.contains("previous=\"ok\"")
            && alarm.contains("percent=1000"),
        "{alarm}"
    );
    s.ok(&[
        "alarm",
        "set",
        "overcommit",
        "--warning",
        "500",
        "--alarm",
        "2000",
    ]);
    let warning = seen("the warning", "state=\"warning\"");
    assert!(
        warning.contains(" WARN ") && warning.contains("previous=\"alarm\""),
        "{warning}"
    );
    s.ok(&[
        "alarm",
        "set",
        "overcommit",
        "--warning",
        "1500",
        "--alarm",
        "2000",
    ]);
    let ok = seen("the way back", "state=\"ok\"");
    assert!(
        ok.contains(" INFO ") && ok.contains("previous=\"warning\""),
        "{ok}"
    );
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let stop = line_with("event=\"stop\"").unwrap_or_else(|| panic!("no stop line:\n{}", read()));
    assert!(stop.contains("datastore flushed and closed"), "{stop}");
    // One line per event, no colour codes in a file.
    assert!(!read().contains('\u{1b}'), "escape codes in the log file");
}
