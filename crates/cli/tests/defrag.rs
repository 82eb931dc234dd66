//! Fragmentation measured and repaired online (issue 10): a served disk
//! written in random 4k order by fio (laid out by placement), with a
//! snapshot and a linked clone that both diverged by random overwrites
//! (which fragment it), is defragmented through the server; qemu-img
//! compares every byte of disk, snapshot and clone with copies taken
//! before, and sharing is kept (used bytes grow by at most 2%).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use common::*;

/// 4k random writes over the first `size` of `export`, `io` of them in
/// all (each grain at most once).
fn fio_randwrite_part(s: &Store, export: &str, size: &str, io: &str) {
    let uri = format!("--uri={}", s.uri(export));
    run_ok(
        "fio",
        &[
            "--name=frag",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            &format!("--size={size}"),
            &format!("--io_size={io}"),
            "--randrepeat=0",
            "--refill_buffers",
            "--output-format=terse",
        ],
    );
}

fn fio_randwrite(s: &Store, export: &str, size: &str) {
    let uri = format!("--uri={}", s.uri(export));
    run_ok(
        "fio",
        &[
            "--name=frag",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            &format!("--size={size}"),
            "--randrepeat=0",
            "--refill_buffers",
            "--output-format=terse",
        ],
    );
}

fn copy(s: &Store, export: &str) -> String {
    let out = s
        .dir
        .path()
        .join(format!("{}.raw", export.replace('@', "_")));
    save(&s.uri(export), &out);
    out.to_str().unwrap().to_string()
}

fn compare(s: &Store, export: &str, reference: &str) {
    run_ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            reference,
            &s.uri(export),
        ],
    );
}

fn fragments(s: &Store, disk: &str) -> u64 {
    let i = s.json(&["info", disk]);
    i["fragments"]
        .as_u64()
        .unwrap_or_else(|| panic!("info --json has no fragments: {i}"))
}

#[test]
fn a_served_disk_with_a_snapshot_and_a_clone_is_defragmented_online() {
    if !have("fio") || !have("qemu-img") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "32M"]);
    let srv = s.serve();
    fio_randwrite(&s, "vm", "32M");
    // Placement (FORMAT.md §10.5) lays out one version's random writes:
    // each 1 MiB region's grains at their offsets in a block of its own,
    // whatever order 16 writes in flight arrive in.
    let laid_out = fragments(&s, "vm");
    assert!(
        laid_out <= 64,
        "random first writes left {laid_out} fragments"
    );
    // Fragments come from overwrites after a snapshot: a quarter of the
    // disk's grains (the clone: an eighth), spread over all of it.
    s.ok(&["snapshot", "create", "vm", "s"]);
    s.ok(&["clone", "vm@s", "c"]);
    fio_randwrite_part(&s, "vm", "32M", "8M");
    fio_randwrite_part(&s, "c", "32M", "4M");
    let refs: Vec<(&str, String)> = ["vm", "vm@s", "c"]
        .into_iter()
        .map(|e| (e, copy(&s, e)))
        .collect();
    let before = fragments(&s, "vm");
    assert!(
        before > 1000,
        "overwrites after a snapshot left {before} fragments"
    );
    let used = s.json(&["status"])["used_bytes"].as_u64().unwrap();

    let dry = s.json(&["defrag", "vm", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["fragments_before"].as_u64(), Some(before));
    assert_eq!(dry["moved_bytes"].as_u64(), Some(32 << 20), "{dry}");
    assert_eq!(fragments(&s, "vm"), before, "a dry run moves nothing");

    let r = s.json(&["defrag", "vm"]);
    let after = r["fragments_after"].as_u64().unwrap();
    assert!(after * 100 <= before, "{before} -> {after} fragments: {r}");
    assert_eq!(fragments(&s, "vm"), after);
    let rc = s.json(&["defrag", "c"]);
    assert!(
        rc["fragments_after"].as_u64().unwrap() * 100 <= rc["fragments_before"].as_u64().unwrap()
    );
    for (export, reference) in &refs {
        compare(&s, export, reference);
    }
    let st = s.json(&["status"]);
    let used_after = st["used_bytes"].as_u64().unwrap();
    assert!(
        used_after * 100 <= used * 102,
        "used bytes {used} -> {used_after}: defrag unshared grains"
    );
    // The pool's layout is in status.
    let hist = st["free_extent_histogram"].as_object().expect("histogram");
    let sum: u64 = hist.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(Some(sum), st["free_extents"].as_u64(), "{st}");
    assert!(st["pool_file_bytes"].as_u64().unwrap() > 0, "{st}");
    let human = s.ok(&["status"]);
    assert!(human.contains("free extents:"), "{human}");
    assert!(s.ok(&["info", "vm"]).contains("fragments:"));

    let check = s.json(&["check"]);
    assert!(check["errors"].as_array().unwrap().is_empty(), "{check}");
    let served = (fragments(&s, "vm"), fragments(&s, "c"));
    srv.stop();
    // Offline too, and after a restart the layout is what defrag left.
    let check = s.json(&["check"]);
    assert!(check["errors"].as_array().unwrap().is_empty(), "{check}");
    assert_eq!((fragments(&s, "vm"), fragments(&s, "c")), served);
    let e = s.fails(&["defrag", "vm@s"]);
    assert!(e.contains("snapshot"), "{e}");
    let e = s.fails(&["defrag", "nosuch"]);
    assert!(e.contains("nosuch"), "{e}");
}

fn du(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
        .sum()
}

#[test]
fn free_space_consolidation_gives_the_host_back_what_is_not_used() {
    if !have("fio") || !have("qemu-img") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "512M"]);
    let srv = s.serve();
    let uri = format!("--uri={}", s.uri("vm"));
    run_ok(
        "fio",
        &[
            "--name=fill",
            "--ioengine=nbd",
            &uri,
            "--rw=write",
            "--bs=1M",
            "--iodepth=8",
            "--size=512M",
            "--output-format=terse",
        ],
    );
    s.ok(&["snapshot", "create", "vm", "s"]);
    fio_randwrite(&s, "vm", "512M");
    s.ok(&["snapshot", "delete", "vm", "s"]);
    // The reclaimer gives the snapshot's grains back in the background.
    for _ in 0..200 {
        if s.json(&["status"])["reclaiming"] == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let reference = copy(&s, "vm");
    let st = s.json(&["status"]);
    let used = st["used_bytes"].as_u64().unwrap();
    eprintln!(
        "before: used {used}, pool {}, on the host {} (du {})",
        st["pool_bytes"],
        st["pool_file_bytes"],
        du(&s.path())
    );

    let r = s.json(&["defrag", "--free-space"]);
    eprintln!("{r}");
    assert_eq!(r["grains_kept"], 0, "{r}");
    compare(&s, "vm", &reference);
    let st = s.json(&["status"]);
    let used = st["used_bytes"].as_u64().unwrap();
    let pool_file = st["pool_file_bytes"].as_u64().unwrap();
    let on_host = du(&s.path());
    eprintln!("after: used {used}, pool file {pool_file}, du {on_host}");
    assert!(
        pool_file <= used + (64 << 20),
        "pool file {pool_file} for {used} used: {r}"
    );
    assert!(
        on_host <= used + (160 << 20),
        "the datastore takes {on_host} on the host for {used} used"
    );
    assert!(
        st["pool_bytes"].as_u64().unwrap() <= used + used / 32 + (5 << 20),
        "the pool end did not come down: {st}"
    );
    let e = s.fails(&["defrag", "vm", "--free-space"]);
    assert!(
        e.contains("free-space") || e.contains("cannot be used"),
        "{e}"
    );
    let check = s.json(&["check"]);
    assert!(check["errors"].as_array().unwrap().is_empty(), "{check}");
    srv.stop();
    let check = s.json(&["check"]);
    assert!(check["errors"].as_array().unwrap().is_empty(), "{check}");
}

#[test]
fn the_background_policy_consolidates_free_space_by_itself() {
    if !have("fio") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "64M"]);
    let srv = s.serve_with(&["--free-space-threshold", "1M"]);
    let uri = format!("--uri={}", s.uri("vm"));
    run_ok(
        "fio",
        &[
            "--name=fill",
            "--ioengine=nbd",
            &uri,
            "--rw=write",
            "--bs=1M",
            "--size=64M",
            "--output-format=terse",
        ],
    );
    s.ok(&["snapshot", "create", "vm", "s"]);
    // Half the grains overwritten at random: the snapshot's grains they
    // replace are freed by the delete in runs too short to punch, so the
    // pool file holds 32 MiB more on the host than is used.
    fio_randwrite_part(&s, "vm", "64M", "32M");
    // Before the delete everything in the pool is in use, so the policy
    // has nothing to do yet and this figure is stable.
    let pool_before = s.json(&["status"])["pool_bytes"].as_u64().unwrap();
    s.ok(&["snapshot", "delete", "vm", "s"]);
    // The snapshot's grains go back to the pool in the background: wait
    // for the reclaimer, or `used` still counts them.
    let t = std::time::Instant::now();
    let st = loop {
        let st = s.json(&["status"]);
        if st["reclaiming"].as_u64() == Some(0) || t.elapsed().as_secs() > 30 {
            break st;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(
        st["reclaiming"].as_u64(),
        Some(0),
        "reclaim never ended: {st}"
    );
    let used = st["used_bytes"].as_u64().unwrap();
    assert!(
        pool_before > used + (48 << 20),
        "the deleted snapshot's space ({pool_before} bytes of pool) is above the used space: {st}"
    );
    // The policy looks every 10 s; give it three looks.
    let t = std::time::Instant::now();
    let pool = loop {
        let st = s.json(&["status"]);
        let pool = st["pool_bytes"].as_u64().unwrap();
        if pool <= used + used / 32 + (5 << 20) || t.elapsed().as_secs() > 35 {
            break pool;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(
        pool <= used + used / 32 + (5 << 20),
        "the pool end stayed at {pool} for {used} used"
    );
    let check = s.json(&["check"]);
    assert!(check["errors"].as_array().unwrap().is_empty(), "{check}");
    srv.stop();
}
