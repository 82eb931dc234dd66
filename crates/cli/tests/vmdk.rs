//! VMware disks in and out through the `strata` binary, checked with
//! qemu-img 7.2: import of a 3-link chain, export back as chains of every
//! delta kind (round trip of every link), serving a VMDK chain over NBD as
//! it is, raw/qcow2 import, and `vmdk check --repair` on a damaged file.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::vmdk::*;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn to_raw(fmt: &str, src: &str, dst: &Path) -> Vec<u8> {
    run_ok(
        "qemu-img",
        &["convert", "-f", fmt, "-O", "raw", src, p(dst)],
    );
    std::fs::read(dst).unwrap()
}

/// base.vmdk <- base-000001.vmdk <- base-000002.vmdk made by qemu-img, with
/// sub-grain writes, zeroed grains (zeroed_grain=on) and untouched grains.
fn qemu_chain(dir: &Path) -> Vec<PathBuf> {
    let base = dir.join("base.vmdk");
    run_ok(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "vmdk",
            "-o",
            "zeroed_grain=on",
            p(&base),
            "16M",
        ],
    );
    qemu_io_ok(
        &["-f", "vmdk"],
        p(&base),
        &[
            "write -P 0x11 0 1M",
            "write -P 0x12 5M 512",
            "write -P 0x13 8M 64k",
        ],
    );
    let mut links = vec![base];
    for i in 1..=2 {
        let child = dir.join(format!("base-{i:06}.vmdk"));
        let parent = links.last().unwrap().clone();
        run_ok(
            "qemu-img",
            &[
                "create",
                "-q",
                "-f",
                "vmdk",
                "-o",
                "zeroed_grain=on",
                "-b",
                p(&parent),
                "-F",
                "vmdk",
                p(&child),
            ],
        );
        let pat = format!("write -P 0x{}0 {}k 4k", i + 2, 64 * i + 4);
        let zero = format!("write -z {}M 64k", 8 * (i - 1) as u64);
        qemu_io_ok(
            &["-f", "vmdk"],
            p(&child),
            &[&pat, &zero, "write -P 0x77 3M 512"],
        );
        links.push(child);
    }
    links
}

#[test]
fn import_a_three_link_chain_and_export_it_back_as_every_kind_of_chain() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    each_kind(chain_round_trip_on);
}

fn chain_round_trip_on(kind: Kind) {
    let s = Store::of(kind);
    let files_dir = tempfile::tempdir().unwrap();
    let dir = files_dir.path();
    let links = qemu_chain(dir);
    let want: Vec<Vec<u8>> = links
        .iter()
        .enumerate()
        .map(|(i, l)| to_raw("vmdk", p(l), &dir.join(format!("want{i}.raw"))))
        .collect();
    let v = s.json(&["import", p(&links[2]), "vm"]);
    assert_eq!(
        v["snapshots"],
        serde_json::json!(["base", "base-000001"]),
        "{v}"
    );
    assert_eq!(v["disk"]["snapshots"], 2);
    // Each snapshot and the live disk read what its link read (offline,
    // through a full clone of each version exported as raw-equivalent VMDK).
    for (i, t) in ["vm@base", "vm@base-000001", "vm"].iter().enumerate() {
        let out = dir.join(format!("single{i}.vmdk"));
        s.ok(&["export", t, p(&out), "--subformat", "monolithicFlat"]);
        assert_eq!(to_raw("vmdk", p(&out), &dir.join("x.raw")), want[i], "{t}");
    }
    // Thin-ness: the base holds 1 MiB + 64 KiB + one 4 KiB grain, not 16
    // MiB (a local datastore counts what a snapshot maps).
    if kind == Kind::Local {
        let snaps = s.json(&["snapshot", "list", "vm"]);
        let base_mapped = snaps[0]["mapped_bytes"].as_u64().unwrap();
        assert!(base_mapped <= (1 << 20) + (64 << 10) + 4096, "{snaps}");
    }
    for sub in ["monolithicSparse", "vmfsSparse", "seSparse"] {
        let out = dir.join(format!("rt-{sub}.vmdk"));
        let v = s.json(&["export", "vm", p(&out), "--chain", "--subformat", sub]);
        let files: Vec<String> = v["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["file"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(files.len(), 3, "{v}");
        for (i, f) in files.iter().enumerate() {
            assert_eq!(
                to_raw("vmdk", f, &dir.join("y.raw")),
                want[i],
                "{sub} link {i}"
            );
            let c = run("qemu-img", &["check", "-f", "vmdk", f]);
            assert!(
                c.status.success(),
                "qemu-img check {f}: {}",
                String::from_utf8_lossy(&c.stdout)
            );
        }
        let info = run_ok(
            "qemu-img",
            &["info", "--output=json", "-f", "vmdk", files.last().unwrap()],
        );
        let info: serde_json::Value = serde_json::from_str(&info).unwrap();
        assert_eq!(info["format-specific"]["data"]["create-type"], sub);
        // And strata's own reader agrees, link by link.
        let back = format!("back-{sub}");
        s.ok(&["import", files.last().unwrap(), &back]);
        let out2 = dir.join(format!("again-{sub}.vmdk"));
        s.ok(&["export", &back, p(&out2), "--subformat", "streamOptimized"]);
        assert_eq!(
            to_raw("vmdk", p(&out2), &dir.join("z.raw")),
            want[2],
            "{sub} re-import"
        );
    }
    // Refusals with clear messages.
    let e = s.fails(&[
        "export",
        "vm",
        p(&dir.join("rt-seSparse.vmdk")),
        "--subformat",
        "seSparse",
    ]);
    assert!(e.contains("already exists"), "{e}");
    let e = s.fails(&[
        "export",
        "vm",
        p(&dir.join("n.vmdk")),
        "--subformat",
        "qcow9",
    ]);
    assert!(e.contains("unknown subformat"), "{e}");
    let e = s.fails(&[
        "export",
        "vm",
        p(&dir.join("n.vmdk")),
        "--chain",
        "--subformat",
        "streamOptimized",
    ]);
    assert!(e.contains("--chain"), "{e}");
    assert!(s.json(&["check"])["errors"].as_array().unwrap().is_empty());
}

#[test]
fn serve_a_sesparse_chain_as_it_is_and_qemu_reads_what_nbd_clients_wrote() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let s = Store::new();
    let dir = s.dir.path();
    // A flat base + seSparse delta, written by strata's exporter.
    s.ok(&["create", "d", "--size", "8M"]);
    {
        let srv = s.serve();
        qemu_io_ok(RAW, &s.uri("d"), &["write -P 0x5a 0 2M"]);
        s.ok(&["snapshot", "create", "d", "s1"]);
        qemu_io_ok(RAW, &s.uri("d"), &["write -P 0x6b 1M 4k"]);
        srv.stop();
    }
    s.ok(&[
        "export",
        "d",
        p(&dir.join("vm.vmdk")),
        "--chain",
        "--subformat",
        "seSparse",
    ]);
    let top = dir.join("vm-000001.vmdk");
    // Serve it without any datastore.
    let sock = dir.join("v.sock");
    let mut child = Command::new(strata())
        .args([
            "--datastore",
            p(&dir.join("none")),
            "serve",
            "--nbd-unix",
            p(&sock),
            "--vmdk",
        ])
        .arg(format!("vm={}", p(&top)))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&sock);
    let uri = format!("nbd+unix:///vm?socket={}", p(&sock));
    // Sub-grain writes (read-modify-write of 4 KiB grains over the parent),
    // zeroes and a discard.
    qemu_io_ok(
        RAW,
        &uri,
        &[
            "write -P 0x01 512 512",
            "write -P 0x02 1M 1k",
            "write -z 1536k 8k",
            "discard 6M 64k",
            "flush",
        ],
    );
    let served = to_raw("raw", &uri, &dir.join("served.raw"));
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let mut model = vec![0u8; 8 << 20];
    model[..2 << 20].fill(0x5a);
    model[(1 << 20)..(1 << 20) + 4096].fill(0x6b);
    model[512..1024].fill(0x01);
    model[(1 << 20)..(1 << 20) + 1024].fill(0x02);
    model[1536 << 10..(1536 + 8) << 10].fill(0);
    assert_eq!(served, model);
    assert_eq!(
        to_raw("vmdk", p(&top), &dir.join("after.raw")),
        model,
        "qemu-img reads the served writes"
    );
    let c = run("qemu-img", &["check", "-f", "vmdk", p(&top)]);
    assert!(c.status.success());
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(strata(), &["vmdk", "check", p(&top), "--json"])).unwrap();
    assert_eq!(v["remaining_errors"], 0, "{v}");
    // The CID changed on the first write, as VMware and QEMU do.
    let info: serde_json::Value =
        serde_json::from_str(&run_ok(strata(), &["vmdk", "info", p(&top), "--json"])).unwrap();
    assert_eq!(info["depth"], 2);
    // Shrink gives the discarded grains' space back; content unchanged.
    let before = std::fs::metadata(dir.join("vm-000001-sesparse.vmdk"))
        .unwrap()
        .len();
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(strata(), &["vmdk", "shrink", p(&top), "--json"])).unwrap();
    let after = std::fs::metadata(dir.join("vm-000001-sesparse.vmdk"))
        .unwrap()
        .len();
    assert!(after <= before, "{before} -> {after}: {v}");
    assert_eq!(to_raw("vmdk", p(&top), &dir.join("shrunk.raw")), model);
}

#[test]
fn raw_and_qcow2_import_keep_data_and_thinness() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let s = Store::new();
    let dir = s.dir.path();
    let q = dir.join("a.qcow2");
    run_ok("qemu-img", &["create", "-q", "-f", "qcow2", p(&q), "32M"]);
    qemu_io_ok(
        &["-f", "qcow2"],
        p(&q),
        &["write -P 0x42 3M 128k", "write -P 0x43 31M 4k"],
    );
    let want = to_raw("qcow2", p(&q), &dir.join("a.raw"));
    for (src, name) in [(q.clone(), "fromq"), (dir.join("a.raw"), "fromraw")] {
        let v = s.json(&["import", p(&src), name]);
        assert_eq!(v["disk"]["size_bytes"], 32 << 20);
        assert_eq!(v["disk"]["allocated_bytes"], (128 << 10) + 4096, "{v}");
        let out = dir.join(format!("{name}.vmdk"));
        s.ok(&["export", name, p(&out)]);
        assert_eq!(to_raw("vmdk", p(&out), &dir.join("b.raw")), want);
    }
    // Without qemu-img on the PATH, qcow2 import says what is missing.
    let o = Command::new(strata())
        .args(["--datastore", p(&s.path()), "import", p(&q), "noq"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("needs qemu-img"), "{e}");
    let junk = dir.join("junk.vmdk");
    std::fs::write(&junk, b"version=1\nCID=zz\n").unwrap();
    let e = s.fails(&["import", p(&junk), "j"]);
    assert!(e.contains("CID"), "{e}");
    let e = s.fails(&["import", p(&dir.join("missing.raw")), "m"]);
    assert!(e.contains("missing.raw"), "{e}");
    assert!(
        s.json(&["list"]).as_array().unwrap().len() == 2,
        "failed imports leave no disk behind"
    );
}

#[test]
fn vmdk_check_finds_and_repairs_damage() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.vmdk");
    run_ok("qemu-img", &["create", "-q", "-f", "vmdk", p(&img), "4M"]);
    qemu_io_ok(&["-f", "vmdk"], p(&img), &["write -P 0x33 0 128k"]);
    let good = to_raw("vmdk", p(&img), &dir.path().join("good.raw"));
    let o = Command::new(strata())
        .args(["vmdk", "check", p(&img)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    // Point grain 1's entry (in GT and RGT) past the end of the file, and
    // grain 3's at grain 0's data (doubly used).
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(strata(), &["vmdk", "info", p(&img), "--json"])).unwrap();
    assert_eq!(v["links"][0]["create_type"], "monolithicSparse");
    let mut bytes = std::fs::read(&img).unwrap();
    let gd = u64::from_le_bytes(bytes[56..64].try_into().unwrap()) as usize * 512;
    let rgd = u64::from_le_bytes(bytes[48..56].try_into().unwrap()) as usize * 512;
    for dir_off in [gd, rgd] {
        let gt = u32::from_le_bytes(bytes[dir_off..dir_off + 4].try_into().unwrap()) as usize * 512;
        let g0 = bytes[gt..gt + 4].to_vec();
        bytes[gt + 4..gt + 8].copy_from_slice(&0x00ff_ffffu32.to_le_bytes());
        bytes[gt + 12..gt + 16].copy_from_slice(&g0);
    }
    std::fs::write(&img, &bytes).unwrap();
    let o = Command::new(strata())
        .args(["vmdk", "check", p(&img)])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("past the end"), "{out}");
    assert!(out.contains("both use"), "{out}");
    let o = Command::new(strata())
        .args(["vmdk", "check", "--repair", p(&img)])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("no errors remain"), "{out}");
    let c = run("qemu-img", &["check", "-f", "vmdk", p(&img)]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stdout));
    // Grain 1 lost its data (never written: reads zeros); grain 3 keeps
    // what it read before the repair (grain 0's bytes); grain 0 is intact.
    let after = to_raw("vmdk", p(&img), &dir.path().join("after.raw"));
    let g = 64 << 10;
    assert_eq!(&after[..g], &good[..g]);
    assert!(after[g..2 * g].iter().all(|&b| b == 0));
    assert_eq!(&after[3 * g..4 * g], &good[..g]);
}
