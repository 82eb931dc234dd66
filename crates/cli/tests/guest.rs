//! A real Linux kernel uses a strata disk: QEMU (TCG) boots Debian's kernel
//! with a busybox initramfs (scripts/guest/build-initramfs.sh) whose /dev/vda
//! is a strata export over NBD. The guest makes ext4 and writes files, trims
//! after deleting one, and a linked clone of a snapshot taken before the trim
//! still holds the old files, fsck-clean.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Wall-clock limit for one boot, from QEMU start to power-off.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether a Debian kernel is installed (skips, or fails under
/// STRATA_REQUIRE_TOOLS=1, like `have`).
fn have_kernel() -> bool {
    let found = std::fs::read_dir("/boot")
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-"))
        })
        .unwrap_or(false);
    if !found {
        if std::env::var("STRATA_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("a kernel in /boot/vmlinuz-* is required (run scripts/install-deps.sh)");
        }
        eprintln!("skipping: no /boot/vmlinuz-* (linux-image-amd64)");
    }
    found
}

/// Builds (or reuses) the guest initramfs; returns (kernel, initramfs), or
/// None (skip) when the script reports a missing tool (exit 2) outside
/// STRATA_REQUIRE_TOOLS=1.
fn guest_image() -> Option<(PathBuf, PathBuf)> {
    // target/guest, next to the target/tmp cargo gives integration tests.
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("guest");
    let script = repo_root().join("scripts/guest/build-initramfs.sh");
    let t = Instant::now();
    let o = Command::new("bash")
        .arg(&script)
        .arg(&out)
        .output()
        .unwrap();
    let msg = format!(
        "{} failed ({}): {}{}",
        script.display(),
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.code() == Some(2) && std::env::var("STRATA_REQUIRE_TOOLS").as_deref() != Ok("1") {
        eprintln!("skipping: {msg}");
        return None;
    }
    assert!(o.status.success(), "{msg}");
    eprintln!("guest image ready in {:.1?}", t.elapsed());
    let kernel = std::fs::read_to_string(out.join("kernel")).unwrap();
    Some((PathBuf::from(kernel.trim()), out.join("initramfs.cpio.gz")))
}

/// What one boot printed: the console and its STRATA-GUEST-* lines.
struct Boot {
    console: String,
}

impl Boot {
    fn lines(&self, marker: &str) -> Vec<String> {
        let m = format!("STRATA-GUEST-{marker} ");
        self.console
            .lines()
            .filter_map(|l| l.find(&m).map(|i| l[i + m.len()..].trim().to_string()))
            .collect()
    }
    /// path -> sha256 from the STRATA-GUEST-SUM lines.
    fn sums(&self) -> BTreeMap<String, String> {
        self.lines("SUM")
            .iter()
            .map(|l| {
                let mut w = l.split_whitespace();
                let sum = w.next().unwrap().to_string();
                (w.next().unwrap().to_string(), sum)
            })
            .collect()
    }
}

/// Boots the guest with `strata.test=TEST` on export EXPORT and waits for it
/// to power off; fails with the console log unless it printed
/// `STRATA-GUEST-OK TEST` and no FAIL line.
fn boot(s: &Store, img: &(PathBuf, PathBuf), export: &str, test: &str) -> Boot {
    let log = s.dir.path().join(format!("console-{test}-{export}.log"));
    let err = s.dir.path().join(format!("qemu-{test}-{export}.err"));
    let drive = format!(
        "file=nbd:unix:{}:exportname={export},format=raw,if=virtio,cache=none,discard=unmap",
        s.sock().display()
    );
    let t = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-m", "256", "-smp", "1"])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .arg("-kernel")
        .arg(&img.0)
        .arg("-initrd")
        .arg(&img.1)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 loglevel=4 strata.test={test}"
        ))
        .arg("-drive")
        .arg(&drive)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start qemu-system-x86_64");
    // Poll for exit against the wall-clock limit (QEMU exits on power-off).
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > BOOT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let console = read(&log);
    let qemu_err = read(&err);
    let b = Boot { console };
    eprintln!(
        "guest boot strata.test={test} on {export}: {:.1?}",
        t.elapsed()
    );
    let ok = b.lines("OK").iter().any(|l| l == test);
    let fail = b.lines("FAIL");
    assert!(
        status.is_some(),
        "guest strata.test={test} did not power off within {BOOT_TIMEOUT:?}; qemu stderr: {qemu_err}\n--- console ---\n{}",
        b.console
    );
    assert!(
        ok && fail.is_empty() && status.unwrap().success(),
        "guest strata.test={test} failed (qemu {}): {fail:?}; qemu stderr: {qemu_err}\n--- console ---\n{}",
        status.unwrap(),
        b.console
    );
    b
}

fn allocated(s: &Store, disk: &str) -> u64 {
    s.json(&["info", disk])["allocated_bytes"].as_u64().unwrap()
}

#[test]
fn guest_kernel_makes_ext4_trims_and_a_snapshot_keeps_the_old_files() {
    if !have("qemu-system-x86_64") || !have_kernel() {
        return;
    }
    let Some(img) = guest_image() else {
        return;
    };
    let s = Store::new();
    s.ok(&["create", "disk", "--size", "256M", "--type", "thin"]);
    let srv = s.serve();

    // 1. mkfs.ext4, 20 MiB of random data and two small files.
    let w = boot(&s, &img, "disk", "write");
    let written = w.sums();
    assert_eq!(
        written.keys().collect::<Vec<_>>(),
        ["./big", "./dir/numbers", "./hello.txt"],
        "{}",
        w.console
    );
    assert_eq!(w.lines("TEXT"), ["hello from a strata guest"]);
    let after_write = allocated(&s, "disk");
    assert!(
        after_write >= 20 << 20,
        "only {after_write} bytes allocated after the guest wrote 20 MiB"
    );

    s.ok(&["snapshot", "create", "disk", "before"]);

    // 2. Delete the big file and fstrim: discards reach strata as NBD TRIM.
    let t = boot(&s, &img, "disk", "trim");
    eprintln!("fstrim: {:?}", t.lines("FSTRIM"));
    let mut kept = written.clone();
    kept.remove("./big");
    assert_eq!(t.sums(), kept, "{}", t.console);
    let after_trim = allocated(&s, "disk");
    eprintln!("allocated: {after_write} after write, {after_trim} after trim");
    assert!(
        after_trim + (15 << 20) <= after_write,
        "fstrim freed too little: {after_write} -> {after_trim} bytes"
    );

    // 3. A linked clone of the snapshot still has every file, fsck-clean.
    s.ok(&["clone", "disk@before", "c1"]);
    let v = boot(&s, &img, "c1", "verify");
    assert_eq!(v.sums(), written, "{}", v.console);
    assert_eq!(v.lines("TEXT"), ["hello from a strata guest"]);

    let check = s.json(&["check"]);
    eprintln!("check: {check}");
    srv.stop();
    let check_offline = s.json(&["check"]);
    for c in [&check, &check_offline] {
        let errors = c["errors"].as_array().expect("check --json has errors");
        assert!(errors.is_empty(), "strata check: {c}");
    }
}
