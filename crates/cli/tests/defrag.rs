//! Fragmentation measured and repaired online (issue 10): a served disk
//! written in random 4k order by fio, with a snapshot and a linked clone
//! that both diverged, is defragmented through the server; qemu-img
//! compares every byte of disk, snapshot and clone with copies taken
//! before, and sharing is kept (used bytes grow by at most 2%).

mod common;

use common::*;

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
    run_ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &s.uri(export),
            out.to_str().unwrap(),
        ],
    );
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
    s.ok(&["snapshot", "create", "vm", "s"]);
    s.ok(&["clone", "vm@s", "c"]);
    fio_randwrite(&s, "vm", "8M");
    fio_randwrite(&s, "c", "4M");
    let refs: Vec<(&str, String)> = ["vm", "vm@s", "c"]
        .into_iter()
        .map(|e| (e, copy(&s, e)))
        .collect();
    let before = fragments(&s, "vm");
    assert!(before > 1000, "random 4k writes left {before} fragments");
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
