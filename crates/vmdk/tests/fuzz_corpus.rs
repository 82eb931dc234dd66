//! The corpora of the VMDK fuzz targets (fuzz/corpus/descriptor,
//! fuzz/corpus/sparse_headers, fuzz/corpus/open_image): seeds cut from
//! real images, each with 64 KiB of 0xab at offset 0 (and, in the chains,
//! 64 KiB of 0xcd at 1 MiB in the child):
//!
//! - `qemu_*`: made by qemu-img (`create -f vmdk` monolithicSparse,
//!   monolithicFlat, twoGbMaxExtentSparse, a backing chain;
//!   `convert -O vmdk -o subformat=streamOptimized`), written by qemu-io;
//! - `strata_export_*`: `strata export --subformat streamOptimized` of a
//!   disk imported from a raw image (the CLI binary: `STRATA_BIN`, else
//!   target/{helper-vmdk/,}debug/strata);
//! - `strata_*` (the rest): made by this crate's writer
//!   (`create_image` vmfsSparse, seSparse; the seSparse extent's regions
//!   packed together so the file is KBs, not the 6 MiB of ESXi's layout)
//!   and the ESXi layout of tests/sesparse_fixtures.rs (its header only).
//!
//! CIDs are replaced by fixed ones (qemu and strata draw them at random),
//! file names in descriptors by the names `open_image` gives its files.
//!
//! The replay runs every file of the three corpora through
//! `strata_vmdk::fuzzing`; a `valid_*` seed must parse (descriptors: with
//! its extents), decode as what its name says (headers) or open cleanly,
//! pass `check`, and read back exactly the bytes written (images).
//!
//! `cargo test -p strata-vmdk --test fuzz_corpus -- --ignored write_seeds`
//! writes the seeds again (the qemu and CLI ones only where those tools are
//! found). The seeds made by this crate's writer are compared with the
//! committed ones on every run; qemu's and the CLI's only when
//! `STRATA_COMPARE_TOOL_SEEDS=1` (they depend on the tools' versions).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_block::BlockDevice;
use strata_storage::{Backend, SimBackend};
use strata_vmdk::fuzzing::{self, SEP};
use strata_vmdk::sparse::{CowdHeader, KdmvHeader, SeSparseHeader};
use strata_vmdk::{create_image, ImageSpec, OpenOptions, Subformat, VmdkImage};

const MIB: u64 = 1 << 20;
const KIB64: usize = 65536;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// An image: its files in order (the first is opened), as `open_image`
/// names them.
struct Image {
    name: String,
    files: Vec<Vec<u8>>,
}

/// Named inputs of one target.
type Named = Vec<(String, Vec<u8>)>;

/// The seeds of the three targets.
#[derive(Default)]
struct Seeds {
    descriptor: Named,
    sparse_headers: Named,
    open_image: Named,
}

impl Seeds {
    fn extend(&mut self, o: Seeds) {
        self.descriptor.extend(o.descriptor);
        self.sparse_headers.extend(o.sparse_headers);
        self.open_image.extend(o.open_image);
    }
    fn by_target(&self) -> [(&'static str, &Named); 3] {
        [
            ("descriptor", &self.descriptor),
            ("sparse_headers", &self.sparse_headers),
            ("open_image", &self.open_image),
        ]
    }
}

/// What a `valid_*` image must read: 0xab in its first 64 KiB, in a chain
/// 0xcd in the 64 KiB at 1 MiB, zeros elsewhere.
fn expected(name: &str, size: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    v[..KIB64].fill(0xab);
    if name.contains("chain") {
        v[MIB as usize..MIB as usize + KIB64].fill(0xcd);
    }
    v
}

/// Replace every `CID=` value but ffffffff (and `parentCID=` values the
/// same way) by a fixed one of the same length (qemu writes them without
/// leading zeros; an embedded descriptor must keep its length), in the
/// order first seen across `files`.
fn fix_cids(files: &mut [Vec<u8>]) {
    let mut seen: Vec<Vec<u8>> = Vec::new();
    for f in files.iter_mut() {
        let mut i = 0;
        while let Some(p) = f[i..].windows(4).position(|w| w == b"CID=") {
            let at = i + p + 4;
            let w = f[at..].iter().take_while(|c| c.is_ascii_hexdigit()).count();
            i = at + w;
            if w == 0 || w > 8 {
                continue;
            }
            let old = f[at..at + w].to_ascii_lowercase();
            if old == b"ffffffff" {
                continue;
            }
            let n = match seen.iter().position(|s| *s == old) {
                Some(n) => n,
                None => {
                    seen.push(old);
                    seen.len() - 1
                }
            };
            let new = format!("{:08x}", 0x5eed_0001 + n);
            f[at..at + w].copy_from_slice(&new.as_bytes()[8 - w..]);
        }
    }
}

fn replace(text: &[u8], from: &str, to: &str) -> Vec<u8> {
    String::from_utf8(text.to_vec())
        .expect("descriptor text")
        .replace(from, to)
        .into_bytes()
}

/// The descriptor text of an image's first file: the file itself, or
/// the one embedded in a KDMV file.
fn descriptor_text(f: &[u8]) -> Vec<u8> {
    if f.starts_with(b"KDMV") {
        let h = KdmvHeader::decode(f[..512].try_into().unwrap()).unwrap();
        let d = &f[(h.desc_offset * 512) as usize..((h.desc_offset + h.desc_size) * 512) as usize];
        let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
        d[..end].to_vec()
    } else {
        f.to_vec()
    }
}

/// The header sectors of a sparse file, named after their kind.
fn header_seeds(image: &str, idx: usize, f: &[u8]) -> Vec<(String, Vec<u8>)> {
    let sector = |s: u64| f[(s * 512) as usize..(s * 512 + 512) as usize].to_vec();
    let mut out = Vec::new();
    if f.len() < 1024 {
        return out;
    }
    if f.starts_with(b"KDMV") {
        out.push((format!("valid_kdmv_{image}_{idx}"), sector(0)));
        let h = KdmvHeader::decode(f[..512].try_into().unwrap()).unwrap();
        if h.gd_offset == u64::MAX {
            // streamOptimized: the footer holds the real directory offset.
            let footer = f[f.len() - 1024..f.len() - 512].to_vec();
            out.push((format!("valid_kdmv_footer_{image}_{idx}"), footer));
        }
    } else if f.starts_with(b"COWD") {
        out.push((format!("valid_cowd_{image}_{idx}"), sector(0)));
    } else if let Ok(h) = SeSparseHeader::decode(f[..512].try_into().unwrap()) {
        out.push((format!("valid_sesparse_{image}_{idx}"), sector(0)));
        out.push((
            format!("valid_sesparse_volatile_{image}_{idx}"),
            sector(h.volatile.0),
        ));
    }
    out
}

/// The seeds of a set of images.
fn seeds_of(images: &[Image]) -> Seeds {
    let mut s = Seeds::default();
    for img in images {
        s.descriptor.push((
            format!("valid_{}", img.name),
            descriptor_text(&img.files[0]),
        ));
        for (i, f) in img.files.iter().enumerate() {
            s.sparse_headers.extend(header_seeds(&img.name, i, f));
        }
        let mut joined = Vec::new();
        for (i, f) in img.files.iter().enumerate() {
            if i > 0 {
                joined.extend_from_slice(SEP);
            }
            joined.extend_from_slice(f);
        }
        assert!(
            joined.len() <= MIB as usize,
            "{}: {}",
            img.name,
            joined.len()
        );
        s.open_image.push((format!("valid_{}", img.name), joined));
    }
    s
}

// ---------------------------------------------------------------- strata's writer

fn sim_file(b: &SimBackend, name: &str) -> Vec<u8> {
    let f = b.open(name, false).unwrap();
    let mut v = vec![0u8; f.len().unwrap() as usize];
    f.read_at(&mut v, 0).unwrap();
    v
}

/// An seSparse extent with its regions moved next to each other, each no
/// larger than it needs to be (QEMU and strata read any layout).
fn pack_sesparse(f: &[u8]) -> Vec<u8> {
    let h = SeSparseHeader::decode(f[..512].try_into().unwrap()).unwrap();
    let n_gt = h
        .capacity
        .div_ceil(SeSparseHeader::GRAIN_SECTORS * SeSparseHeader::GT_ENTRIES);
    let grains = h.capacity.div_ceil(SeSparseHeader::GRAIN_SECTORS);
    // Grains stored: up to the end of the file.
    let stored = (f.len() as u64 / 512).saturating_sub(h.grains.0);
    let want = [
        (h.volatile, 1),
        (h.journal_header, 2),
        (h.journal, 1),
        (h.grain_dir, (n_gt * 8).div_ceil(512)),
        (h.grain_tables, n_gt * SeSparseHeader::GT_SECTORS),
        (h.free_bitmap, grains.div_ceil(8).div_ceil(512)),
        (h.backmap, n_gt * SeSparseHeader::GT_SECTORS),
        (h.grains, stored),
    ];
    let mut out = vec![0u8; 512];
    let mut at = 1u64;
    let mut new = Vec::new();
    for ((old_off, old_size), size) in want {
        let size = size.min(old_size).max(1);
        let src = (old_off * 512) as usize;
        let n = ((size * 512) as usize).min(f.len().saturating_sub(src));
        out.resize(((at + size) * 512) as usize, 0);
        out[(at * 512) as usize..(at * 512) as usize + n].copy_from_slice(&f[src..src + n]);
        new.push((at, size));
        at += size;
    }
    let packed = SeSparseHeader {
        capacity: h.capacity,
        volatile: new[0],
        journal_header: new[1],
        journal: new[2],
        grain_dir: new[3],
        grain_tables: new[4],
        free_bitmap: new[5],
        backmap: new[6],
        grains: (new[7].0, h.grains.1),
    };
    out[..512].copy_from_slice(&packed.encode());
    out
}

/// Images made by this crate's writer, and the ESXi-layout headers of
/// tests/sesparse_fixtures.rs: the same every time.
fn strata_seeds() -> Seeds {
    let mut images = Vec::new();
    for (sub, tag) in [
        (Subformat::VmfsSparse, "vmfsSparse"),
        (Subformat::SeSparse, "seSparse"),
    ] {
        let b = SimBackend::new();
        let spec = ImageSpec::new(sub, 2 * MIB / 512);
        let img = create_image(Arc::new(b.clone()), "d.vmdk", &spec).unwrap();
        img.write_at(&[0xab; KIB64], 0, false).unwrap();
        img.flush().unwrap();
        drop(img);
        let names = strata_vmdk::create::image_files("d.vmdk", sub);
        assert_eq!(names.len(), 2, "{names:?}");
        let desc = sim_file(&b, &names[0]);
        let mut ext = sim_file(&b, &names[1]);
        if sub == Subformat::SeSparse {
            ext = pack_sesparse(&ext);
        }
        let desc = replace(&desc, &format!("\"{}\"", names[1]), "\"a.vmdk\"");
        let mut files = vec![desc, ext];
        fix_cids(&mut files);
        images.push(Image {
            name: format!("strata_{tag}"),
            files,
        });
    }
    let mut s = seeds_of(&images);
    // ESXi's layout for a 48 MiB delta, as tests/sesparse_fixtures.rs
    // builds it (the image itself is too large for a seed).
    let esxi = SeSparseHeader::layout(3 * 32768);
    s.sparse_headers
        .push(("valid_sesparse_esxi_layout".into(), esxi.encode().to_vec()));
    s
}

// ---------------------------------------------------------------- qemu

fn run(dir: &Path, prog: &str, args: &[&str]) {
    common::ok(dir, prog, args);
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

/// Images qemu-img makes and qemu-io writes into; None without them.
fn qemu_seeds() -> Option<Seeds> {
    if !common::have(&["qemu-img", "qemu-io"]) {
        return None;
    }
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let write = |f: &str, pat: u8, off: &str| {
        run(
            d,
            "qemu-io",
            &[
                "-f",
                "vmdk",
                "-c",
                &format!("write -P {pat:#x} {off} 64k"),
                f,
            ],
        )
    };
    let create = |f: &str, sub: &str, size: &str| {
        run(
            d,
            "qemu-img",
            &[
                "create",
                "-q",
                "-f",
                "vmdk",
                "-o",
                &format!("subformat={sub}"),
                f,
                size,
            ],
        )
    };
    let mut images = Vec::new();

    create("sparse.vmdk", "monolithicSparse", "4M");
    write("sparse.vmdk", 0xab, "0");
    images.push(("qemu_monolithicSparse", vec![read(d, "sparse.vmdk")]));

    run(
        d,
        "qemu-img",
        &[
            "convert",
            "-q",
            "-f",
            "vmdk",
            "-O",
            "vmdk",
            "-o",
            "subformat=streamOptimized",
            "sparse.vmdk",
            "stream.vmdk",
        ],
    );
    images.push(("qemu_streamOptimized", vec![read(d, "stream.vmdk")]));

    // A flat extent holds the whole disk: 128 KiB keeps the seed small.
    create("flat.vmdk", "monolithicFlat", "128K");
    write("flat.vmdk", 0xab, "0");
    let desc = replace(&read(d, "flat.vmdk"), "\"flat-flat.vmdk\"", "\"a.vmdk\"");
    images.push(("qemu_monolithicFlat", vec![desc, read(d, "flat-flat.vmdk")]));

    create("two.vmdk", "twoGbMaxExtentSparse", "4M");
    write("two.vmdk", 0xab, "0");
    let desc = replace(&read(d, "two.vmdk"), "\"two-s001.vmdk\"", "\"a.vmdk\"");
    images.push((
        "qemu_twoGbMaxExtentSparse",
        vec![desc, read(d, "two-s001.vmdk")],
    ));

    // A chain: a monolithicSparse child of the monolithicSparse above.
    run(
        d,
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "vmdk",
            "-b",
            "sparse.vmdk",
            "-F",
            "vmdk",
            "child.vmdk",
        ],
    );
    write("child.vmdk", 0xcd, "1M");
    let child = read(d, "child.vmdk");
    // The hint is embedded in the sparse file: keep its length.
    let child = replace_same_len(&child, b"\"sparse.vmdk\"", b"\"a.vmdk\"");
    images.push(("qemu_chain", vec![child, read(d, "sparse.vmdk")]));

    let images: Vec<Image> = images
        .into_iter()
        .map(|(name, mut files)| {
            fix_cids(&mut files);
            Image {
                name: name.into(),
                files,
            }
        })
        .collect();
    Some(seeds_of(&images))
}

/// Replace `from` by `to` padded with spaces after its closing quote, so
/// an embedded descriptor keeps its length.
fn replace_same_len(f: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = f.to_vec();
    let at = f
        .windows(from.len())
        .position(|w| w == from)
        .expect("string to replace");
    let mut new = to.to_vec();
    new.resize(from.len(), b' ');
    out[at..at + from.len()].copy_from_slice(&new);
    out
}

// ---------------------------------------------------------------- strata CLI

fn strata_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_BIN") {
        return Some(p.into());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    ["helper-vmdk/debug/strata", "debug/strata"]
        .iter()
        .map(|p| root.join(p))
        .find(|p| p.exists())
}

/// `strata export --subformat streamOptimized` of a 4 MiB disk imported
/// from a raw image; None without the binary.
fn cli_seeds() -> Option<Seeds> {
    let Some(bin) = strata_bin() else {
        eprintln!("no strata binary (STRATA_BIN): no strata_export seeds");
        return None;
    };
    let bin = bin.to_str().unwrap().to_string();
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let mut raw = vec![0u8; 4 * MIB as usize];
    raw[..KIB64].fill(0xab);
    std::fs::write(d.join("disk.raw"), raw).unwrap();
    let ds = ["--datastore", "ds"];
    run(d, &bin, &[&ds[..], &["init"]].concat());
    run(
        d,
        &bin,
        &[&ds[..], &["import", "disk.raw", "disk", "--format", "raw"]].concat(),
    );
    run(
        d,
        &bin,
        &[
            &ds[..],
            &[
                "export",
                "disk",
                "out.vmdk",
                "--subformat",
                "streamOptimized",
            ],
        ]
        .concat(),
    );
    let mut files = vec![read(d, "out.vmdk")];
    fix_cids(&mut files);
    Some(seeds_of(&[Image {
        name: "strata_export_streamOptimized".into(),
        files,
    }]))
}

// ---------------------------------------------------------------- tests

fn write_set(s: &Seeds) {
    for (target, seeds) in s.by_target() {
        std::fs::create_dir_all(corpus(target)).unwrap();
        for (name, data) in seeds {
            std::fs::write(corpus(target).join(name), data).unwrap();
        }
    }
}

#[test]
#[ignore = "writes fuzz/corpus/{descriptor,sparse_headers,open_image}; runs qemu-img, qemu-io, strata"]
fn write_seeds() {
    let mut s = strata_seeds();
    s.extend(qemu_seeds().unwrap_or_default());
    s.extend(cli_seeds().unwrap_or_default());
    write_set(&s);
}

fn compare(s: &Seeds) {
    for (target, seeds) in s.by_target() {
        for (name, data) in seeds {
            let on_disk = std::fs::read(corpus(target).join(name)).unwrap_or_else(|e| {
                panic!("{target}/{name}: {e} (run the ignored write_seeds test)")
            });
            assert!(
                on_disk == *data,
                "{target}/{name} differs from the generator's"
            );
        }
    }
}

#[test]
fn committed_seeds_are_what_the_generator_writes() {
    compare(&strata_seeds());
    if std::env::var_os("STRATA_COMPARE_TOOL_SEEDS").is_some() {
        compare(&qemu_seeds().expect("qemu-img and qemu-io"));
        compare(&cli_seeds().expect("a strata binary"));
    }
}

fn files_of(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus(target))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Every source of seeds is there.
fn assert_sources(target: &str, names: &[String]) {
    for src in [
        "valid_qemu_",
        "valid_strata_export_",
        "valid_strata_seSparse",
        "valid_strata_vmfsSparse",
    ] {
        assert!(
            names.iter().any(|n| n.starts_with(src)),
            "{target}: no {src}* seed"
        );
    }
}

#[test]
fn every_descriptor_seed_passes_and_valid_ones_parse() {
    let files = files_of("descriptor");
    assert!(files.len() >= 8, "{} descriptors", files.len());
    for (name, data) in &files {
        let s = fuzzing::descriptor(data);
        if name.starts_with("valid_") {
            assert!(s.parsed, "{name} does not parse");
            assert!(s.extents >= 1 && s.sectors >= 256, "{name}: {s:?}");
        }
    }
    assert_sources(
        "descriptor",
        &files.into_iter().map(|(n, _)| n).collect::<Vec<_>>(),
    );
}

#[test]
fn every_header_seed_passes_and_valid_ones_decode_as_named() {
    let files = files_of("sparse_headers");
    let mut kinds = [0; 4];
    for (name, data) in &files {
        let s = fuzzing::sparse_headers(data);
        if !name.starts_with("valid_") {
            continue;
        }
        let (i, ok) = if name.starts_with("valid_kdmv") {
            (0, s.kdmv)
        } else if name.starts_with("valid_cowd") {
            (1, s.cowd)
        } else if name.starts_with("valid_sesparse_volatile") {
            (2, s.sesparse_volatile)
        } else if name.starts_with("valid_sesparse") {
            (3, s.sesparse)
        } else {
            panic!("{name}: which header?")
        };
        assert!(ok, "{name}: {s:?}");
        assert_eq!(data.len(), 512, "{name}");
        kinds[i] += 1;
    }
    assert!(kinds.iter().all(|&n| n > 0), "every kind: {kinds:?}");
    // A KDMV sector decodes as a KDMV header with the 0xab grain's table.
    let (_, kdmv) = files
        .iter()
        .find(|(n, _)| n.starts_with("valid_kdmv_qemu_monolithicSparse"))
        .expect("qemu's KDMV header");
    let h = KdmvHeader::decode(kdmv[..].try_into().unwrap()).unwrap();
    assert_eq!(h.capacity, 4 * MIB / 512);
    let (_, cowd) = files
        .iter()
        .find(|(n, _)| n.starts_with("valid_cowd"))
        .unwrap();
    assert!(CowdHeader::decode(cowd).is_ok());
}

#[test]
fn every_image_seed_passes_and_valid_ones_read_back_what_was_written() {
    let files = files_of("open_image");
    assert!(files.len() >= 7, "{} images", files.len());
    let total: usize = files.iter().map(|(_, d)| d.len()).sum();
    assert!(total <= 2 * MIB as usize, "{total} bytes");
    for (name, data) in &files {
        assert!(data.len() <= MIB as usize, "{name}: over -max_len");
        let s = fuzzing::open_image(data);
        if !name.starts_with("valid_") {
            continue;
        }
        assert!(s.clean(), "{name}: {s:?}");
        assert!(s.bytes_read > s.size, "{name}: {s:?}");
        let want_links = if name.contains("chain") { 2 } else { 1 };
        assert_eq!(s.links, want_links, "{name}");
        // What the generator wrote, and zeros elsewhere (as data or holes).
        let img = VmdkImage::open_in(
            Arc::new(fuzzing::install(data)),
            fuzzing::NAMES[0],
            &OpenOptions::default(),
        )
        .unwrap();
        let mut buf = vec![0x5a; s.size as usize];
        img.read_at(&mut buf, 0).unwrap();
        let want = expected(name, s.size);
        if let Some(i) = (0..buf.len()).find(|&i| buf[i] != want[i]) {
            panic!("{name}: byte {i} is {:#x}, not {:#x}", buf[i], want[i]);
        }
        // Every image but the flat one leaves most of the disk unallocated.
        assert_eq!(
            s.zero_bytes > 0,
            !name.contains("Flat"),
            "{name}: holes: {s:?}"
        );
    }
    assert_sources(
        "open_image",
        &files.into_iter().map(|(n, _)| n).collect::<Vec<_>>(),
    );
}
