//! Interop with the real qemu-img / qemu-io (7.2): strata reads every VMDK
//! subformat qemu-img creates and writes (including a backing-file child),
//! qemu-img reads, compares and checks every subformat strata exports,
//! mixed chains (flat base, VMFSsparse delta, SEsparse delta) read the same
//! through both, SEsparse shrink keeps the content qemu sees, and qemu-io
//! can write into strata's writable exports.
//!
//! Every test compares against an in-memory model of the writes as well, so
//! a bug both implementations shared would still show.
//!
//! The tests skip (with a message) when qemu-img or qemu-io is missing,
//! unless STRATA_REQUIRE_TOOLS=1, when they fail instead.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;
use common::{describe, ok, run};

use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Arc;

use strata_block::{BlockDevice, ZeroOptions};
use strata_storage::{Backend, FileBackend};
use strata_vmdk::{create_image, ImageSpec, OpenOptions, StreamWriter, Subformat, VmdkImage};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn have_qemu() -> bool {
    common::have(&["qemu-img", "qemu-io"])
}

/// Deterministic, non-repeating bytes (never a whole zero sector).
fn gen(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | ((i % 509 == 0) as u8)
        })
        .collect()
}

/// One write to a disk. `Zero` and `Unmap` both read back as zeros.
#[derive(Clone)]
enum Op {
    Data(u64, Arc<Vec<u8>>),
    Zero(u64, u64),
    Unmap(u64, u64),
}

impl Op {
    fn range(&self) -> (u64, u64) {
        match self {
            Op::Data(o, d) => (*o, d.len() as u64),
            Op::Zero(o, l) | Op::Unmap(o, l) => (*o, *l),
        }
    }
}

/// What a disk should read as: the writes replayed over zeros. Kept as a
/// list so multi-GiB disks need no multi-GiB buffer.
#[derive(Clone)]
struct Model {
    size: u64,
    ops: Vec<Op>,
}

impl Model {
    fn new(size: u64) -> Self {
        Model {
            size,
            ops: Vec::new(),
        }
    }

    fn data(&mut self, off: u64, len: u64, seed: u64) -> Op {
        let op = Op::Data(off, Arc::new(gen(seed ^ off, len as usize)));
        self.push(op.clone());
        op
    }

    fn push(&mut self, op: Op) {
        let (o, l) = op.range();
        assert!(o + l <= self.size, "test bug: op past the end");
        self.ops.push(op);
    }

    fn read(&self, buf: &mut [u8], off: u64) {
        buf.fill(0);
        let end = off + buf.len() as u64;
        for op in &self.ops {
            let (o, l) = op.range();
            let (s, e) = (o.max(off), (o + l).min(end));
            if s >= e {
                continue;
            }
            let dst = &mut buf[(s - off) as usize..(e - off) as usize];
            match op {
                Op::Data(_, d) => dst.copy_from_slice(&d[(s - o) as usize..(e - o) as usize]),
                _ => dst.fill(0),
            }
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.size as usize];
        self.read(&mut b, 0);
        b
    }
}

fn assert_eq_at(what: &str, off: u64, x: &[u8], y: &[u8]) {
    if x != y {
        let i = (0..x.len()).find(|&i| x[i] != y[i]).unwrap();
        let j = (i..x.len()).rev().find(|&j| x[j] != y[j]).unwrap();
        panic!(
            "{what}: first difference at byte {} (0x{:02x} vs 0x{:02x}), last in this chunk at {}",
            off + i as u64,
            x[i],
            y[i],
            off + j as u64
        );
    }
}

const CHUNK: u64 = 4 * MIB;

/// Compare two readers of `size` bytes chunk by chunk.
fn assert_same(
    what: &str,
    size: u64,
    mut a: impl FnMut(&mut [u8], u64),
    mut b: impl FnMut(&mut [u8], u64),
) {
    let mut x = vec![0u8; CHUNK as usize];
    let mut y = vec![0u8; CHUNK as usize];
    let mut off = 0;
    while off < size {
        let n = CHUNK.min(size - off) as usize;
        a(&mut x[..n], off);
        b(&mut y[..n], off);
        assert_eq_at(what, off, &x[..n], &y[..n]);
        off += n as u64;
    }
}

fn open_ro(path: &Path) -> VmdkImage {
    VmdkImage::open(path, &OpenOptions::default())
        .unwrap_or_else(|e| panic!("strata cannot open {}: {e}", path.display()))
}

fn open_rw(path: &Path) -> VmdkImage {
    VmdkImage::open(
        path,
        &OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("strata cannot open {} for writing: {e}", path.display()))
}

fn strata_reader(img: &VmdkImage) -> impl FnMut(&mut [u8], u64) + '_ {
    move |buf, off| {
        img.read_at(buf, off)
            .unwrap_or_else(|e| panic!("strata read at {off}: {e}"));
    }
}

fn file_reader(path: &Path) -> impl FnMut(&mut [u8], u64) {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    move |buf, off| {
        buf.fill(0);
        if off < len {
            let n = ((len - off) as usize).min(buf.len());
            f.read_exact_at(&mut buf[..n], off).unwrap();
        }
    }
}

/// `qemu-img convert -O raw` of `vmdk` (in `dir`) into `dir/raw`; returns its path.
fn qemu_convert(dir: &Path, vmdk: &str, raw: &str) -> std::path::PathBuf {
    let _ = std::fs::remove_file(dir.join(raw));
    ok(
        dir,
        "qemu-img",
        &["convert", "-f", "vmdk", "-O", "raw", vmdk, raw],
    );
    dir.join(raw)
}

/// Check that qemu-img, strata and the model agree on `vmdk` in `dir`.
fn assert_all_agree(what: &str, dir: &Path, vmdk: &str, model: &Model) {
    let raw = qemu_convert(dir, vmdk, "qemu-ref.raw");
    assert_eq!(
        std::fs::metadata(&raw).unwrap().len(),
        model.size,
        "{what}: qemu-img's raw has the wrong size"
    );
    let img = open_ro(&dir.join(vmdk));
    assert_eq!(img.size_bytes(), model.size, "{what}: strata's disk size");
    // One pass over the three (the disks may be GiBs).
    let mut read_raw = file_reader(&raw);
    let mut read_strata = strata_reader(&img);
    let (mut r, mut m, mut st) = (
        vec![0u8; CHUNK as usize],
        vec![0u8; CHUNK as usize],
        vec![0u8; CHUNK as usize],
    );
    let mut off = 0;
    while off < model.size {
        let n = CHUNK.min(model.size - off) as usize;
        read_raw(&mut r[..n], off);
        model.read(&mut m[..n], off);
        read_strata(&mut st[..n], off);
        assert_eq_at(
            &format!("{what}: qemu-img convert vs model"),
            off,
            &r[..n],
            &m[..n],
        );
        assert_eq_at(
            &format!("{what}: strata vs qemu-img convert"),
            off,
            &st[..n],
            &r[..n],
        );
        off += n as u64;
    }
    std::fs::remove_file(raw).unwrap();
}

/// Apply `ops` to `vmdk` (in `dir`) with one qemu-io run.
fn qemu_io_write(dir: &Path, vmdk: &str, ops: &[Op]) {
    let mut args: Vec<String> = vec!["-f".into(), "vmdk".into()];
    for (i, op) in ops.iter().enumerate() {
        let c = match op {
            Op::Data(o, d) => {
                let src = format!("qemu-io-src-{i}.bin");
                std::fs::write(dir.join(&src), &d[..]).unwrap();
                format!("write -s {src} {o} {}", d.len())
            }
            Op::Zero(o, l) => format!("write -z {o} {l}"),
            Op::Unmap(o, l) => format!("write -z -u {o} {l}"),
        };
        args.push("-c".into());
        args.push(c);
    }
    args.push(vmdk.into());
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = ok(dir, "qemu-io", &a);
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io reported a failure:\n{out}"
    );
    for i in 0..ops.len() {
        let _ = std::fs::remove_file(dir.join(format!("qemu-io-src-{i}.bin")));
    }
}

/// Apply `op` through strata.
fn strata_write(img: &VmdkImage, op: &Op) {
    let r = match op {
        Op::Data(o, d) => img.write_at(d, *o, false),
        Op::Zero(o, l) => img.write_zeroes(*o, *l, ZeroOptions::default()),
        Op::Unmap(o, l) => img.unmap(*o, *l),
    };
    let (o, l) = op.range();
    r.unwrap_or_else(|e| panic!("strata write of {l} bytes at {o}: {e}"));
}

fn qemu_info(dir: &Path, vmdk: &str) -> serde_json::Value {
    let out = ok(
        dir,
        "qemu-img",
        &["info", "-f", "vmdk", "--output=json", vmdk],
    );
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("qemu-img info json: {e}\n{out}"))
}

fn create_type(info: &serde_json::Value) -> String {
    info["format-specific"]["data"]["create-type"]
        .as_str()
        .unwrap_or_else(|| panic!("no create-type in {info}"))
        .to_string()
}

fn qemu_check(dir: &Path, vmdk: &str) {
    ok(dir, "qemu-img", &["check", "-f", "vmdk", vmdk]);
}

fn qemu_compare(dir: &Path, vmdk: &str, raw: &str) {
    let args = ["compare", "-f", "vmdk", "-F", "raw", vmdk, raw];
    let o = run(dir, "qemu-img", &args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        describe("qemu-img", &args, &o)
    );
}

/// The writes of test 1, sized to the disk: whole grains, sub-grain 512 B
/// writes into unallocated grains, writes across grain (and, on big disks,
/// extent) boundaries, zeroing of data and of nothing, the last sector.
fn qemu_pattern(model: &mut Model, seed: u64) -> Vec<Op> {
    let size = model.size;
    let mut ops = vec![
        model.data(0, 64 * KIB, seed),
        model.data(64 * KIB + 512, 512, seed + 1),
        model.data(3 * 64 * KIB - 1024, 4 * KIB, seed + 2),
        model.data(MIB, 200 * KIB, seed + 3),
    ];
    for op in [
        Op::Zero(MIB + 64 * KIB, 64 * KIB),
        Op::Zero(MIB + 150 * KIB, 1024),
        Op::Zero(4 * MIB, 128 * KIB),
    ] {
        model.push(op.clone());
        ops.push(op);
    }
    ops.push(model.data(5 * MIB + 7 * 512, 3 * 512, seed + 4));
    ops.push(model.data(MIB + 4 * KIB, 512, seed + 5)); // in place, in allocated data
    ops.push(model.data(size - 512, 512, seed + 6));
    ops.push(model.data(size - 6 * KIB, 4 * KIB, seed + 7));
    if size > 64 * MIB {
        // Past the first grain table (512 grains of 64 KiB = 32 MiB).
        ops.push(model.data(32 * MIB - 1024, 2 * KIB, seed + 11));
        ops.push(model.data(40 * MIB + 512, 512, seed + 12));
        let z = Op::Zero(32 * MIB - 64 * KIB, 64 * KIB);
        model.push(z.clone());
        ops.push(z);
    }
    if size > 2 * GIB + MIB {
        ops.push(model.data(2 * GIB - 1024, 4 * KIB, seed + 8));
        ops.push(model.data(2 * GIB - 192 * KIB, 512, seed + 9));
        let z = Op::Zero(2 * GIB - 128 * KIB, 192 * KIB);
        model.push(z.clone());
        ops.push(z);
        ops.push(model.data(2 * GIB + 512, 512, seed + 10));
    }
    if size > 4 * GIB + 64 * MIB {
        ops.push(model.data(4 * GIB - 512, 1024, seed + 13));
        ops.push(model.data(4 * GIB + 33 * MIB + 512, 512, seed + 14));
    }
    ops
}

/// Every subformat qemu-img 7.2 creates, written by qemu-io, reads the
/// same through strata as through `qemu-img convert -O raw`; then strata
/// writes into qemu's layout and qemu still reads and checks it.
#[test]
fn strata_reads_what_qemu_writes() {
    if !have_qemu() {
        return;
    }
    let small = 100 * MIB + 1536; // several grain tables; the last grain is short
    let big = 2 * GIB + MIB + 1536; // two extents for the twoGb* kinds
    let cases: &[(&str, &str, u64, &str)] = &[
        (
            "monolithicSparse",
            "subformat=monolithicSparse",
            small,
            "monolithicSparse",
        ),
        (
            "monolithicSparse+zeroed_grain",
            "subformat=monolithicSparse,zeroed_grain=on",
            small,
            "monolithicSparse",
        ),
        (
            "monolithicFlat",
            "subformat=monolithicFlat",
            small,
            "monolithicFlat",
        ),
        (
            "twoGbMaxExtentSparse",
            "subformat=twoGbMaxExtentSparse",
            big,
            "twoGbMaxExtentSparse",
        ),
        (
            "twoGbMaxExtentFlat",
            "subformat=twoGbMaxExtentFlat",
            big,
            "twoGbMaxExtentFlat",
        ),
        (
            "big monolithicSparse",
            "subformat=monolithicSparse",
            5 * GIB + 1536,
            "monolithicSparse",
        ),
    ];
    for (i, &(what, opts, size, ct)) in cases.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let size_s = size.to_string();
        ok(
            d,
            "qemu-img",
            &[
                "create",
                "-q",
                "-f",
                "vmdk",
                "-o",
                opts,
                "my disk.vmdk",
                &size_s,
            ],
        );
        assert_eq!(create_type(&qemu_info(d, "my disk.vmdk")), ct);
        let mut model = Model::new(size);
        let ops = qemu_pattern(&mut model, 100 * i as u64);
        qemu_io_write(d, "my disk.vmdk", &ops);
        let agree = if size > 3 * GIB {
            assert_big_agree
        } else {
            assert_all_agree
        };
        agree(what, d, "my disk.vmdk", &model);
        // strata writes into qemu's layout; qemu still reads and checks it.
        let img = open_rw(&d.join("my disk.vmdk"));
        for op in strata_pattern(&mut model, 7000 + i as u64) {
            strata_write(&img, &op);
        }
        img.flush().unwrap();
        drop(img);
        qemu_check(d, "my disk.vmdk");
        agree(&format!("{what}, then strata"), d, "my disk.vmdk", &model);
    }
}

/// A child made with `qemu-img create -b base.vmdk -F vmdk` (plain, with
/// zeroed grains, twoGbMaxExtentSparse), written by qemu-io over a written
/// base: copy-on-write of partial grains, zeroing over the parent's data,
/// fall-through of untouched grains. Then strata writes into the child.
#[test]
fn strata_reads_qemu_backing_chains() {
    if !have_qemu() {
        return;
    }
    let size = 9 * MIB + 1536;
    for (what, child_opts) in [
        ("child", None),
        ("child with zeroed grains", Some("zeroed_grain=on")),
        (
            "twoGbMaxExtentSparse child",
            Some("subformat=twoGbMaxExtentSparse"),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        ok(
            d,
            "qemu-img",
            &["create", "-q", "-f", "vmdk", "base.vmdk", &size.to_string()],
        );
        let mut model = Model::new(size);
        let mut base_ops = qemu_pattern(&mut model, 7);
        base_ops.push(model.data(2 * MIB, 2 * MIB, 8));
        base_ops.push(model.data(6 * MIB, 512 * KIB, 9));
        qemu_io_write(d, "base.vmdk", &base_ops);
        let base_model = model.clone();

        let mut args = vec![
            "create",
            "-q",
            "-f",
            "vmdk",
            "-b",
            "base.vmdk",
            "-F",
            "vmdk",
        ];
        if let Some(o) = child_opts {
            args.extend(["-o", o]);
        }
        args.push("child.vmdk");
        ok(d, "qemu-img", &args);
        let mut ops = vec![
            model.data(2 * MIB + 512, 512, 20), // COW: the rest of the grain from the base
            model.data(2 * MIB + 128 * KIB - 1024, 2 * KIB, 21), // across two base grains
            model.data(8 * MIB, 4 * KIB, 22),   // over nothing
        ];
        for op in [
            Op::Zero(2 * MIB + 256 * KIB, 128 * KIB), // whole grains of base data
            Op::Zero(6 * MIB + 1024, 1024),           // part of a base grain
            Op::Zero(0, 64 * KIB),
        ] {
            model.push(op.clone());
            ops.push(op);
        }
        qemu_io_write(d, "child.vmdk", &ops);
        assert_all_agree(what, d, "child.vmdk", &model);
        // The base is untouched and still reads the same.
        assert_all_agree(&format!("{what}: base"), d, "base.vmdk", &base_model);
        let img = open_ro(&d.join("child.vmdk"));
        assert_eq!(img.links.len(), 2, "{what}: strata sees the base");
        drop(img);
        // strata writes into qemu's child: partial grains copy from the
        // base, zeroing stops the fall-through; qemu reads it the same.
        let img = open_rw(&d.join("child.vmdk"));
        let mut ops = vec![
            model.data(6 * MIB + 64 * KIB + 512, 512, 30),
            model.data(7 * MIB - 1024, 2 * KIB, 31),
        ];
        for op in [
            Op::Zero(6 * MIB + 128 * KIB, 64 * KIB),
            Op::Unmap(6 * MIB + 256 * KIB, 64 * KIB),
            Op::Zero(2 * MIB + 1024, 512),
        ] {
            model.push(op.clone());
            ops.push(op);
        }
        for op in &ops {
            strata_write(&img, op);
        }
        img.flush().unwrap();
        drop(img);
        qemu_check(d, "child.vmdk");
        assert_all_agree(&format!("{what}, then strata"), d, "child.vmdk", &model);
        // A strata SEsparse delta on qemu's chain, read by qemu.
        let cid = open_ro(&d.join("child.vmdk")).current_cid();
        let backend: Arc<dyn Backend> = Arc::new(FileBackend::new(d));
        let top = create_image(
            backend,
            "top.vmdk",
            &spec(Subformat::SeSparse, size, Some(("child.vmdk", cid))),
        )
        .unwrap();
        let mut ops = vec![model.data(6 * MIB + 64 * KIB + 1024, 512, 40)];
        for op in [
            Op::Unmap(2 * MIB + 4 * KIB, 4 * KIB),
            Op::Zero(6 * MIB + 512 * KIB - 8 * KIB, 8 * KIB),
        ] {
            model.push(op.clone());
            ops.push(op);
        }
        for op in &ops {
            strata_write(&top, op);
        }
        drop(top);
        assert_all_agree(
            &format!("{what}, strata SEsparse on top"),
            d,
            "top.vmdk",
            &model,
        );
    }
}

/// streamOptimized made by `qemu-img convert` of a raw file.
#[test]
fn strata_reads_qemu_stream_optimized() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let size = 9 * MIB + 1536;
    let mut model = Model::new(size);
    qemu_pattern(&mut model, 55);
    model.data(7 * MIB, 300 * KIB, 56);
    // Compressible data too: a grain of a repeated short pattern.
    model.push(Op::Data(
        3 * MIB,
        Arc::new((0..64 * KIB).map(|i| (i % 7) as u8 + 1).collect()),
    ));
    std::fs::write(d.join("src.raw"), model.bytes()).unwrap();
    ok(
        d,
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "vmdk",
            "-o",
            "subformat=streamOptimized",
            "src.raw",
            "disk.vmdk",
        ],
    );
    assert_eq!(create_type(&qemu_info(d, "disk.vmdk")), "streamOptimized");
    assert_all_agree("streamOptimized", d, "disk.vmdk", &model);
}

/// streamOptimized made by `qemu-img create` and appended to by qemu-io
/// (qemu writes whole grains only, compressed, where none is yet).
#[test]
fn strata_reads_qemu_io_appended_stream() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let size = 40 * MIB;
    ok(
        d,
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "vmdk",
            "-o",
            "subformat=streamOptimized",
            "disk.vmdk",
            &size.to_string(),
        ],
    );
    let mut model = Model::new(size);
    let ops = vec![
        model.data(0, 64 * KIB, 1),
        model.data(128 * KIB, 128 * KIB, 2),
        model.data(33 * MIB, 64 * KIB, 3),
    ];
    qemu_io_write(d, "disk.vmdk", &ops);
    // A second session appends more, before the earlier grains too.
    let ops = vec![
        model.data(64 * KIB, 64 * KIB, 4),
        model.data(MIB, 64 * KIB, 5),
    ];
    qemu_io_write(d, "disk.vmdk", &ops);
    qemu_check(d, "disk.vmdk");
    assert_all_agree("streamOptimized by qemu-io", d, "disk.vmdk", &model);
}

/// The writes of test 2 (and the deltas of 3 and 4): sub-grain writes at
/// odd 512 B offsets into 4 KiB and 64 KiB grains, writes across grain
/// boundaries, in-place overwrites, zeroing and unmapping of whole and
/// partial grains over data and over nothing.
fn strata_pattern(model: &mut Model, seed: u64) -> Vec<Op> {
    let size = model.size;
    let mut ops = vec![
        model.data(0, 64 * KIB, seed),
        model.data(64 * KIB + 512, 512, seed + 1),
        model.data(100 * KIB + 1536, 512, seed + 2),
        model.data(200 * KIB - 512, 1024, seed + 3),
        model.data(MIB - 2 * KIB, 8 * KIB, seed + 4),
        model.data(2 * MIB, 256 * KIB, seed + 5),
        model.data(1024, 512, seed + 6),
    ];
    for op in [
        Op::Zero(2 * MIB + 64 * KIB, 64 * KIB),
        Op::Zero(2 * MIB + 4 * KIB + 512, 1024),
        Op::Unmap(2 * MIB + 128 * KIB, 64 * KIB + 4 * KIB),
        Op::Unmap(2 * MIB + 200 * KIB + 512, 512),
        Op::Zero(5 * MIB, 128 * KIB),
        Op::Unmap(6 * MIB, 64 * KIB),
    ] {
        model.push(op.clone());
        ops.push(op);
    }
    let zeros = Op::Data(3 * MIB, Arc::new(vec![0u8; 8 * KIB as usize]));
    model.push(zeros.clone());
    ops.push(zeros);
    ops.push(model.data(size - 512, 512, seed + 7));
    ops.push(model.data(size - 6 * KIB - 512, 4 * KIB, seed + 8));
    if size > 80 * MIB {
        // Past the first grain table of every kind (KDMV 32 MiB, SEsparse
        // 16 MiB, COWD 2 MiB) and across table boundaries.
        ops.push(model.data(32 * MIB - 1024, 2 * KIB, seed + 9));
        ops.push(model.data(48 * MIB - 64 * KIB, 128 * KIB, seed + 10));
        ops.push(model.data(70 * MIB + 1536, 512, seed + 11));
        for op in [
            Op::Zero(48 * MIB - 4 * KIB, 8 * KIB),
            Op::Unmap(48 * MIB + 32 * KIB, 32 * KIB),
            Op::Zero(64 * MIB - 64 * KIB, 128 * KIB),
        ] {
            model.push(op.clone());
            ops.push(op);
        }
    }
    ops
}

fn write_stream(d: &Path, name: &str, model: &Model) {
    let backend = FileBackend::new(d);
    let mut w = StreamWriter::create(&backend, name, model.size / 512, "lsilogic").unwrap();
    let gb = w.grain_bytes();
    let bytes = model.bytes();
    for (i, g) in bytes.chunks(gb as usize).enumerate() {
        w.write_grain(i as u64, g).unwrap();
    }
    w.finish().unwrap();
}

/// Every subformat strata exports reads in qemu-img as what strata wrote:
/// `qemu-img compare` against the model's raw says identical, `qemu-img
/// check` finds no errors, `qemu-img info` names the create type.
#[test]
fn qemu_reads_what_strata_exports() {
    if !have_qemu() {
        return;
    }
    let size = 100 * MIB + 1536;
    for (i, sf) in Subformat::ALL.into_iter().enumerate() {
        let what = sf.name();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut model = Model::new(size);
        if sf == Subformat::StreamOptimized {
            strata_pattern(&mut model, 1000 * i as u64);
            write_stream(d, "out put.vmdk", &model);
        } else {
            let backend: Arc<dyn Backend> = Arc::new(FileBackend::new(d));
            let img = create_image(backend, "out put.vmdk", &ImageSpec::new(sf, size / 512))
                .unwrap_or_else(|e| panic!("{what}: create: {e}"));
            for op in strata_pattern(&mut model, 1000 * i as u64) {
                strata_write(&img, &op);
            }
            img.flush().unwrap();
        }
        std::fs::write(d.join("ref.raw"), model.bytes()).unwrap();
        assert_same(
            &format!("{what}: strata vs model"),
            size,
            strata_reader(&open_ro(&d.join("out put.vmdk"))),
            |b, o| model.read(b, o),
        );
        qemu_compare(d, "out put.vmdk", "ref.raw");
        qemu_check(d, "out put.vmdk");
        let info = qemu_info(d, "out put.vmdk");
        assert_eq!(create_type(&info), what, "{info}");
        assert_eq!(info["virtual-size"].as_u64(), Some(size), "{what}: {info}");
        assert_all_agree(what, d, "out put.vmdk", &model);
    }
}

/// A raw file holding the model (sparse: only the writes are written).
fn write_raw(path: &Path, model: &Model) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(model.size).unwrap();
    for op in &model.ops {
        let (o, l) = op.range();
        match op {
            Op::Data(_, d) => f.write_all_at(d, o).unwrap(),
            _ => f.write_all_at(&vec![0u8; l as usize], o).unwrap(),
        }
    }
}

/// Big exports (several GiB: multi-sector grain directories, offsets past
/// 4 GiB) and tiny or empty ones, of every subformat.
#[test]
fn qemu_reads_big_and_tiny_strata_exports() {
    if !have_qemu() {
        return;
    }
    for size in [5 * GIB + 1536, 512, 4096 + 512, MIB] {
        for sf in Subformat::ALL {
            // qemu walks VMFSsparse a 512 B grain at a time: keep it smaller.
            let size = if sf == Subformat::VmfsSparse && size > GIB {
                GIB + 64 * MIB + 1536
            } else {
                size
            };
            let what = format!("{} of {size} bytes", sf.name());
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            let mut model = Model::new(size);
            let mut ops = Vec::new();
            if size > GIB {
                let hi = size - GIB - 8 * MIB; // hi + 96 MiB is past 4 GiB on the 5 GiB disk
                ops = vec![
                    model.data(0, 64 * KIB, 1),
                    model.data(GIB - 1024, 4 * KIB, 2),
                    model.data(hi + 512, 512, 3),
                    model.data(hi + 96 * MIB - 512, 72 * KIB, 4),
                    model.data(size - 512, 512, 5),
                ];
                for op in [
                    Op::Zero(hi + 96 * MIB + 4 * KIB, 8 * KIB),
                    Op::Unmap(hi + 96 * MIB + 32 * KIB, 32 * KIB),
                ] {
                    model.push(op.clone());
                    ops.push(op);
                }
            } else if size > MIB {
                ops.push(model.data(size - 1024, 1024, 6));
            } else if size == 512 {
                ops.push(model.data(0, 512, 7));
            } // a MiB: left empty
            if sf == Subformat::StreamOptimized {
                let backend = FileBackend::new(d);
                let mut w =
                    StreamWriter::create(&backend, "out.vmdk", size / 512, "lsilogic").unwrap();
                let gb = w.grain_bytes();
                let mut g = vec![0u8; gb as usize];
                for k in 0..size.div_ceil(gb) {
                    let n = gb.min(size - k * gb) as usize;
                    model.read(&mut g[..n], k * gb);
                    w.write_grain(k, &g[..n]).unwrap();
                }
                w.finish().unwrap();
            } else {
                let backend: Arc<dyn Backend> = Arc::new(FileBackend::new(d));
                let img = create_image(backend, "out.vmdk", &ImageSpec::new(sf, size / 512))
                    .unwrap_or_else(|e| panic!("{what}: create: {e}"));
                for op in &ops {
                    strata_write(&img, op);
                }
                img.flush().unwrap();
            }
            write_raw(&d.join("ref.raw"), &model);
            qemu_compare(d, "out.vmdk", "ref.raw");
            qemu_check(d, "out.vmdk");
            let info = qemu_info(d, "out.vmdk");
            assert_eq!(create_type(&info), sf.name(), "{info}");
            assert_eq!(info["virtual-size"].as_u64(), Some(size), "{what}: {info}");
            let img = open_ro(&d.join("out.vmdk"));
            if size > GIB {
                assert_strata_windows(&what, &img, &model);
            } else {
                assert_same(
                    &format!("{what}: strata vs model"),
                    size,
                    strata_reader(&img),
                    |b, o| model.read(b, o),
                );
            }
        }
    }
}

/// Compare strata with the model around every write and a MiB at every
/// 256 MiB: for disks too big to read whole (qemu-img compare reads them).
fn assert_strata_windows(what: &str, img: &VmdkImage, model: &Model) {
    let size = model.size;
    let mut windows: Vec<(u64, u64)> = model
        .ops
        .iter()
        .map(|op| {
            let (o, l) = op.range();
            (o.saturating_sub(128 * KIB), (o + l + 128 * KIB).min(size))
        })
        .collect();
    windows.extend(
        (0..size)
            .step_by(256 * MIB as usize)
            .map(|o| (o, (o + MIB).min(size))),
    );
    for (s, e) in windows {
        let (mut a, mut b) = (vec![0u8; (e - s) as usize], vec![0u8; (e - s) as usize]);
        img.read_at(&mut a, s).unwrap();
        model.read(&mut b, s);
        assert_eq_at(&format!("{what}: strata vs model"), s, &a, &b);
    }
}

/// Like [`assert_all_agree`], for disks of several GiB: `qemu-img compare`
/// against the model's raw, strata against the model around the writes.
fn assert_big_agree(what: &str, dir: &Path, vmdk: &str, model: &Model) {
    write_raw(&dir.join("ref.raw"), model);
    qemu_compare(dir, vmdk, "ref.raw");
    std::fs::remove_file(dir.join("ref.raw")).unwrap();
    let img = open_ro(&dir.join(vmdk));
    assert_eq!(img.size_bytes(), model.size, "{what}: strata's disk size");
    assert_strata_windows(what, &img, model);
}

fn spec(sf: Subformat, size: u64, parent: Option<(&str, u32)>) -> ImageSpec {
    let mut s = ImageSpec::new(sf, size / 512);
    s.parent = parent.map(|(h, c)| (h.to_string(), c));
    s
}

/// A chain of three mixed links made by strata (monolithicFlat base, a
/// VMFSsparse/COWD delta on it, an SEsparse delta on that) reads the same
/// in strata, qemu-img and the model; then a fourth link made and written
/// by qemu on top reads the same in strata.
#[test]
fn mixed_chain_reads_the_same_in_qemu() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let backend: Arc<dyn Backend> = Arc::new(FileBackend::new(d));
    let size = 9 * MIB + 1536;
    let mut model = Model::new(size);

    // Base: data nearly everywhere, so the deltas' zeros and holes show.
    let base = create_image(
        backend.clone(),
        "base.vmdk",
        &spec(Subformat::MonolithicFlat, size, None),
    )
    .unwrap();
    for k in 0..9 {
        strata_write(&base, &model.data(k * MIB, MIB - 4 * KIB, 300 + k));
    }
    strata_write(&base, &model.data(9 * MIB, 1536, 310));
    base.flush().unwrap();
    drop(base);
    let base_model = model.clone();
    let base_cid = open_ro(&d.join("base.vmdk")).current_cid();

    // VMFSsparse delta: partial writes (grains are 512 B, so every write
    // is whole grains), zeroing and unmapping over base data.
    let mid = create_image(
        backend.clone(),
        "mid.vmdk",
        &spec(Subformat::VmfsSparse, size, Some(("base.vmdk", base_cid))),
    )
    .unwrap();
    let mut mid_ops = vec![
        model.data(512, 1024, 400),
        model.data(MIB - 8 * KIB, 16 * KIB, 401), // over the base's gap
        model.data(4 * MIB + 1536, 4 * KIB, 402),
    ];
    for op in [
        Op::Zero(MIB + 3 * 512, 5 * 512),
        Op::Unmap(3 * MIB, 64 * KIB),
        Op::Zero(7 * MIB, 128 * KIB),
    ] {
        model.push(op.clone());
        mid_ops.push(op);
    }
    for op in &mid_ops {
        strata_write(&mid, op);
    }
    mid.flush().unwrap();
    drop(mid);
    let mid_model = model.clone();
    let mid_img = open_ro(&d.join("mid.vmdk"));
    assert_eq!(mid_img.links.len(), 2);
    let mid_cid = mid_img.current_cid();
    assert_eq!(mid_cid, mid_img.links[0].descriptor.cid);
    drop(mid_img);

    // SEsparse delta on top: 4 KiB grains.
    let top = create_image(
        backend.clone(),
        "top.vmdk",
        &spec(Subformat::SeSparse, size, Some(("mid.vmdk", mid_cid))),
    )
    .unwrap();
    let mut top_ops = vec![
        model.data(2 * KIB + 512, 512, 500), // RMW: rest from mid and base
        model.data(4 * MIB, 8 * KIB + 1024, 501), // across mid's data
        model.data(8 * MIB + 4 * KIB, 4 * KIB, 502), // a whole grain
    ];
    for op in [
        Op::Zero(5 * MIB, 64 * KIB),               // whole grains of base data
        Op::Zero(5 * MIB + 100 * KIB + 512, 1024), // part of a grain
        Op::Unmap(6 * MIB, 32 * KIB),              // whole grains: unmapped entries
        Op::Unmap(6 * MIB + 40 * KIB + 512, 512),  // part of a grain: zeros written
        Op::Unmap(4 * MIB + 4 * KIB, 4 * KIB),     // a grain the top just wrote
        Op::Zero(MIB, 4 * KIB),                    // over mid's zeros
    ] {
        model.push(op.clone());
        top_ops.push(op);
    }
    for op in &top_ops {
        strata_write(&top, op);
    }
    top.flush().unwrap();
    drop(top);

    let top_img = open_ro(&d.join("top.vmdk"));
    assert_eq!(top_img.links.len(), 3);
    assert_eq!(top_img.links[0].create_type(), "seSparse");
    assert_eq!(top_img.links[1].create_type(), "vmfsSparse");
    assert_eq!(top_img.links[2].create_type(), "monolithicFlat");
    // The top really holds all four kinds of grain entries.
    let checks = top_img.check(false).unwrap();
    let se = &checks
        .iter()
        .find(|(n, _)| n == "top-sesparse.vmdk")
        .unwrap_or_else(|| panic!("no SEsparse extent in {checks:?}"))
        .1;
    assert!(se.errors.is_empty(), "{se:?}");
    assert!(
        se.allocated_grains > 0 && se.zero_grains > 0 && se.unmapped_grains > 0,
        "{se:?}"
    );
    let runs = top_img.link_status(0, 0, size, usize::MAX).unwrap();
    assert!(
        runs.iter()
            .any(|&(_, st)| st == strata_vmdk::RangeState::Unallocated),
        "{runs:?}"
    );
    // Each level as strata sees it.
    for (level, m) in [(1usize, &mid_model), (2, &base_model)] {
        assert_same(
            &format!("strata link {level} vs model"),
            size,
            |b, o| top_img.read_link(level, b, o).unwrap(),
            |b, o| m.read(b, o),
        );
    }
    drop(top_img);
    assert_all_agree("seSparse > vmfsSparse > flat", d, "top.vmdk", &model);
    assert_all_agree("vmfsSparse > flat", d, "mid.vmdk", &mid_model);
    assert_all_agree("flat base", d, "base.vmdk", &base_model);
    qemu_check(d, "top.vmdk");
    let info = ok(
        d,
        "qemu-img",
        &["info", "-f", "vmdk", "--backing-chain", "top.vmdk"],
    );
    assert!(
        info.contains("mid.vmdk") && info.contains("base.vmdk"),
        "{info}"
    );

    // A fourth link made and written by qemu on top of strata's chain,
    // naming its parent by absolute path.
    let abs = d.join("top.vmdk").to_string_lossy().into_owned();
    ok(
        d,
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "vmdk",
            "-b",
            &abs,
            "-F",
            "vmdk",
            "qchild.vmdk",
        ],
    );
    let mut ops = vec![
        model.data(2 * KIB, 1024, 600), // RMW through all three links
        model.data(6 * MIB + 64 * KIB, 64 * KIB, 601),
    ];
    let z = Op::Zero(3 * MIB + 64 * KIB, 64 * KIB);
    model.push(z.clone());
    ops.push(z);
    qemu_io_write(d, "qchild.vmdk", &ops);
    assert_eq!(open_ro(&d.join("qchild.vmdk")).links.len(), 4);
    assert_all_agree(
        "qemu child > seSparse > vmfsSparse > flat",
        d,
        "qchild.vmdk",
        &model,
    );
}

/// SEsparse shrink keeps what qemu-img reads and gives space back.
#[test]
fn sesparse_shrink_keeps_content_for_qemu() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let backend: Arc<dyn Backend> = Arc::new(FileBackend::new(d));
    let size = 16 * MIB;
    let mut model = Model::new(size);
    // A flat parent full of data, so zero and unmapped grains must stop
    // the fall-through to show as zeros.
    let base = create_image(
        backend.clone(),
        "base.vmdk",
        &spec(Subformat::MonolithicFlat, size, None),
    )
    .unwrap();
    strata_write(&base, &model.data(0, size, 1));
    drop(base);
    let cid = open_ro(&d.join("base.vmdk")).current_cid();
    let img = create_image(
        backend.clone(),
        "delta.vmdk",
        &spec(Subformat::SeSparse, size, Some(("base.vmdk", cid))),
    )
    .unwrap();
    // Allocate grains all over, then unmap and zero many of them.
    for k in 0..64u64 {
        strata_write(&img, &model.data(k * 128 * KIB, 12 * KIB + 512, 50 + k));
    }
    let mut ops = Vec::new();
    for k in (0..64u64).step_by(3) {
        ops.push(Op::Unmap(k * 128 * KIB, 12 * KIB));
    }
    for k in (1..64u64).step_by(5) {
        ops.push(Op::Zero(k * 128 * KIB + 4 * KIB, 8 * KIB));
    }
    // Data that happens to be zeros: shrink turns it into zero grains.
    ops.push(Op::Data(9 * MIB, Arc::new(vec![0u8; 16 * KIB as usize])));
    // Partial unmap: zeros written into the grain.
    ops.push(Op::Unmap(10 * MIB + 512, 1024));
    for op in ops {
        model.push(op.clone());
        strata_write(&img, &op);
    }
    img.flush().unwrap();
    drop(img);
    let delta_file = d.join("delta-sesparse.vmdk");
    let before = std::fs::metadata(&delta_file).unwrap().len();
    assert_all_agree("seSparse before shrink", d, "delta.vmdk", &model);

    let img = open_rw(&d.join("delta.vmdk"));
    let reports = img.shrink(&mut |_, _| {}).unwrap();
    assert_eq!(reports.len(), 1);
    let r = reports[0];
    assert!(r.zero_grains_found >= 4, "{r:?}");
    assert!(r.grains_after < r.grains_before, "{r:?}");
    drop(img);
    let after = std::fs::metadata(&delta_file).unwrap().len();
    assert!(
        after < before,
        "shrink left the file at {after} bytes (was {before}): {r:?}"
    );
    assert_eq!(after, r.bytes_after);
    assert_all_agree("seSparse after shrink", d, "delta.vmdk", &model);
    qemu_check(d, "delta.vmdk");
    // And strata can keep writing after the shrink.
    let img = open_rw(&d.join("delta.vmdk"));
    for op in [
        model.data(11 * MIB + 512, 512, 900),
        model.data(15 * MIB, 64 * KIB, 901),
    ] {
        strata_write(&img, &op);
    }
    drop(img);
    assert_all_agree("seSparse written after shrink", d, "delta.vmdk", &model);
}

/// qemu-io can write into strata's writable exports (monolithicSparse
/// with and without zeroed grains, vmfsSparse; standalone and as deltas on
/// a flat base), and strata reads qemu's writes back and writes on.
#[test]
fn qemu_writes_into_strata_exports() {
    if !have_qemu() {
        return;
    }
    let size = 9 * MIB + 1536;
    for (sf, zero_grain, delta) in [
        (Subformat::MonolithicSparse, true, false),
        (Subformat::MonolithicSparse, false, false),
        (Subformat::VmfsSparse, false, false),
        (Subformat::MonolithicSparse, true, true),
        (Subformat::VmfsSparse, false, true),
    ] {
        let what = format!(
            "{}{}{}",
            sf.name(),
            if zero_grain { "+zeroed_grain" } else { "" },
            if delta { " delta" } else { "" }
        );
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let backend: Arc<dyn Backend> = Arc::new(FileBackend::new(d));
        let mut model = Model::new(size);
        let mut parent = None;
        if delta {
            let base = create_image(
                backend.clone(),
                "base.vmdk",
                &spec(Subformat::MonolithicFlat, size, None),
            )
            .unwrap();
            strata_write(&base, &model.data(0, size, 3));
            drop(base);
            parent = Some(("base.vmdk", open_ro(&d.join("base.vmdk")).current_cid()));
        }
        let mut s = spec(sf, size, parent);
        s.zero_grain = zero_grain;
        let img = create_image(backend.clone(), "disk.vmdk", &s).unwrap();
        for op in [
            model.data(MIB + 512, 512, 10),
            model.data(3 * MIB, 128 * KIB, 11),
        ] {
            strata_write(&img, &op);
        }
        img.flush().unwrap();
        drop(img);
        // qemu-io on top of strata's data and in fresh places.
        let mut ops = qemu_pattern(&mut model, 20);
        ops.push(model.data(3 * MIB + 4 * KIB + 512, 512, 30));
        let z = Op::Zero(3 * MIB + 64 * KIB, 64 * KIB);
        model.push(z.clone());
        ops.push(z);
        qemu_io_write(d, "disk.vmdk", &ops);
        qemu_check(d, "disk.vmdk");
        assert_all_agree(&what, d, "disk.vmdk", &model);
        // strata keeps working on what qemu wrote.
        let img = open_rw(&d.join("disk.vmdk"));
        for op in [
            model.data(MIB + 1024, 512, 40),
            model.data(7 * MIB + 512, 64 * KIB, 41),
        ] {
            strata_write(&img, &op);
        }
        drop(img);
        qemu_check(d, "disk.vmdk");
        assert_all_agree(&format!("{what}, then strata"), d, "disk.vmdk", &model);
    }
}
