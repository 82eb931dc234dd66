//! Interoperability with real clients: libnbd's `nbdinfo` and `qemu-img`.
//! Each test prints a line and passes when its tool is not installed.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::memdisk::MemDisk;
use super::*;

fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn tool_or_skip(name: &str) -> Option<PathBuf> {
    let t = find_tool(name);
    if t.is_none() {
        eprintln!("skipping: {name} is not installed");
    }
    t
}

fn run(tool: &Path, args: &[&str]) -> Output {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", tool.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}\nstdout: {}\nstderr: {}",
        tool.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

fn uri(h: &Harness, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", h.sock.display())
}

#[test]
fn nbdinfo_lists_exports_and_maps_allocation() {
    let Some(nbdinfo) = tool_or_skip("nbdinfo") else {
        return;
    };
    let h = Harness::new();
    h.disk(0).fill(64 * KIB, &pattern(1, 8192));

    let list = stdout(&run(&nbdinfo, &["--list", &uri(&h, "")]));
    let section = |name: &str| -> String {
        let start = list
            .find(&format!("export=\"{name}\":"))
            .unwrap_or_else(|| panic!("{name} not listed:\n{list}"));
        let rest = &list[start + 1..];
        rest[..rest.find("export=\"").unwrap_or(rest.len())].to_string()
    };
    let disk = section("disk");
    for want in [
        "description: the test disk",
        "export-size: 1048576",
        "base:allocation",
        "is_read_only: false",
        "can_multi_conn: true",
        "can_fua: true",
        "can_trim: true",
        "can_zero: true",
        "can_fast_zero: true",
        "can_df: true",
    ] {
        assert!(disk.contains(want), "missing '{want}' in:\n{disk}");
    }
    assert!(section("other").contains("export-size: 2097152"));
    assert!(section("ro").contains("is_read_only: true"));

    let map = stdout(&run(&nbdinfo, &["--map", &uri(&h, "disk")]));
    let rows: Vec<(u64, u64, u32)> = map
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (0, 64 * KIB, 3),
            (64 * KIB, 8 * KIB, 0),
            (72 * KIB, MIB - 72 * KIB, 3)
        ],
        "map:\n{map}"
    );

    let size = stdout(&run(&nbdinfo, &["--size", &uri(&h, "other")]));
    assert_eq!(size.trim(), "2097152");
    h.wait_idle();
}

/// An 8 MiB raw image: data here and there, zeros in between.
fn source_image(dir: &Path) -> (PathBuf, Vec<u8>) {
    let mut img = vec![0u8; 8 * MIB as usize];
    for (i, (at, len)) in [(0, 4096), (MIB, 300 * KIB), (5 * MIB + 512, 64 * KIB)]
        .into_iter()
        .enumerate()
    {
        let (at, len) = (at as usize, len as usize);
        img[at..at + len].copy_from_slice(&pattern(i as u64 + 10, len));
    }
    let path = dir.join("source.raw");
    std::fs::write(&path, &img).unwrap();
    (path, img)
}

#[test]
fn qemu_img_converts_into_and_out_of_an_export() {
    let Some(qemu_img) = tool_or_skip("qemu-img") else {
        return;
    };
    let disks = vec![
        ("fast", "", MemDisk::new(8 * MIB)),
        ("slow", "", MemDisk::new(8 * MIB).without_fast_zero()),
    ];
    let h = Harness::with(ServerOptions::default(), disks);
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    h.server.serve_tcp(tcp).unwrap();
    let (src, img) = source_image(h.dir.path());
    let src = src.to_str().unwrap();

    let info = stdout(&run(&qemu_img, &["info", &uri(&h, "fast")]));
    assert!(
        info.contains("virtual size: 8 MiB (8388608 bytes)"),
        "qemu-img info:\n{info}"
    );

    // Leave junk in the targets first: convert must zero what it skips.
    h.disk(0).fill(3 * MIB, &[0xee; 8192]);
    h.disk(1).fill(3 * MIB, &[0xee; 8192]);
    for (i, target) in [uri(&h, "fast"), format!("nbd://127.0.0.1:{port}/slow")]
        .into_iter()
        .enumerate()
    {
        run(
            &qemu_img,
            &["convert", "-f", "raw", "-O", "raw", "-n", src, &target],
        );
        assert!(h.disk(i).contents(0, img.len()) == img, "{target} differs");
        let cmp = run(
            &qemu_img,
            &["compare", "-f", "raw", "-F", "raw", src, &target],
        );
        assert!(stdout(&cmp).contains("Images are identical"));
    }

    // And back out, through block status and reads.
    let back = h.dir.path().join("back.raw");
    run(
        &qemu_img,
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri(&h, "fast"),
            back.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&back).unwrap() == img,
        "image read back differs"
    );
    h.wait_idle();
}
