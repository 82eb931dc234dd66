//! The corpus of the `vhost_chain` fuzz target (fuzz/corpus/vhost_chain):
//! seeds encoded by hand from the request shapes real drivers send
//! ([`seeds`]: Linux virtio_blk puts the header, each data segment and the
//! status in descriptors of their own; others merge the header with the
//! data or the data with the status), plus malformed chains. Each is
//! replayed through `strata_vhost::fuzzing::chain`, which runs the real
//! parser and executor and checks the status byte, used length and disk
//! contents; a seed's name says what it must come to (`ok_`, `ioerr_`,
//! `unsupp_`, `refused_`, `nostatus_`). Files without such a prefix (kept
//! from fuzzing) must only pass the checks.
//!
//! `cargo test -p strata-vhost --test fuzz_corpus -- --ignored` writes the
//! seeds again after a change of the input format.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::path::{Path, PathBuf};

use strata_vhost::fuzzing::{
    self, addr, encode, len, EncDesc, Head, Parse, F_ADJACENT, F_HIGH, F_READ_ONLY, F_TWO_REGIONS,
    F_WRITETHROUGH,
};
use strata_vhost::request::{kind, status, RANGE_FLAG_UNMAP};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/vhost_chain")
}

// Offsets in region 0 (64 KiB unless said).
const HDR: u64 = 0;
const RANGES: u64 = 0x10;
const STATUS: u64 = 0x100;
const BUF: u64 = 0x1000;
const BUF2: u64 = 0x3000;

/// Guest memory contents from region 0's start.
struct Guest(Vec<u8>);

impl Guest {
    fn new() -> Self {
        Guest(Vec::new())
    }
    fn put(&mut self, off: u64, bytes: &[u8]) -> &mut Self {
        let off = off as usize;
        if self.0.len() < off + bytes.len() {
            self.0.resize(off + bytes.len(), 0);
        }
        self.0[off..off + bytes.len()].copy_from_slice(bytes);
        self
    }
    fn header(&mut self, off: u64, kind: u32, sector: u64) -> &mut Self {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.put(off, &h)
    }
    fn range(&mut self, off: u64, sector: u64, n: u32, flags: u32) -> &mut Self {
        let mut r = [0u8; 16];
        r[0..8].copy_from_slice(&sector.to_le_bytes());
        r[8..12].copy_from_slice(&n.to_le_bytes());
        r[12..16].copy_from_slice(&flags.to_le_bytes());
        self.put(off, &r)
    }
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn r(off: u64, l: u32) -> EncDesc {
    EncDesc::at(off, l, false)
}
fn w(off: u64, l: u32) -> EncDesc {
    EncDesc::at(off, l, true)
}
fn in_region1(off: u64, l: u32, write_only: bool) -> EncDesc {
    EncDesc {
        addr_mode: addr::REGION1,
        ..EncDesc::at(off, l, write_only)
    }
}

/// Every seed: name and input.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let h = Head::default();
    let mut v: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let mut add = |name, head: &Head, descs: &[EncDesc], g: &Guest| {
        v.push((name, encode(head, descs, &g.0)));
    };

    // Linux virtio_blk: header, data, status in descriptors of their own.
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 8).put(STATUS, &[0xff]);
    add(
        "ok_in_linux",
        &h,
        &[r(HDR, 16), w(BUF, 4096), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::OUT, 16).put(BUF, &data(4096, 1));
    add(
        "ok_out_linux",
        &h,
        &[r(HDR, 16), r(BUF, 4096), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::FLUSH, 0);
    add("ok_flush", &h, &[r(HDR, 16), w(STATUS, 1)], &g);
    let mut g = Guest::new();
    g.header(HDR, kind::GET_ID, 0);
    add("ok_get_id", &h, &[r(HDR, 16), w(BUF, 20), w(STATUS, 1)], &g);
    let mut g = Guest::new();
    g.header(HDR, kind::DISCARD, 0).range(RANGES, 32, 16, 0);
    add(
        "ok_discard",
        &h,
        &[r(HDR, 16), r(RANGES, 16), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::WRITE_ZEROES, 0)
        .range(RANGES, 100, 8, RANGE_FLAG_UNMAP)
        .range(RANGES + 16, 1000, 24, 0);
    add(
        "ok_write_zeroes_two_ranges",
        &h,
        &[r(HDR, 16), r(RANGES, 32), w(STATUS, 1)],
        &g,
    );
    // Several segments (a scatter-gather list), the last in region 1.
    let two = Head {
        flags: F_TWO_REGIONS,
        ..h
    };
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 2040);
    add(
        "ok_in_multiseg_two_regions",
        &two,
        &[
            r(HDR, 16),
            w(BUF, 1024),
            w(BUF2, 512),
            in_region1(0x800, 2560, true),
            w(STATUS, 1),
        ],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::OUT, 3)
        .put(BUF, &data(1536, 2))
        .put(BUF2, &data(512, 3));
    add(
        "ok_out_multiseg",
        &h,
        &[
            r(HDR, 16),
            r(BUF, 1000),
            r(BUF + 1000, 536),
            r(BUF2, 512),
            w(STATUS, 1),
        ],
        &g,
    );
    // Header split across descriptors; header merged with data; data
    // merged with status (drivers without a layout of their own).
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 1);
    add(
        "ok_in_header_split",
        &h,
        &[r(HDR, 8), r(HDR + 8, 8), w(BUF, 512), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(BUF - 16, kind::OUT, 64).put(BUF, &data(1024, 4));
    add(
        "ok_out_header_with_data",
        &h,
        &[r(BUF - 16, 16 + 1024), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 2047);
    add(
        "ok_in_status_merged",
        &h,
        &[r(HDR, 16), w(BUF, 512 + 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::GET_ID, 0);
    add(
        "ok_get_id_short_merged",
        &h,
        &[r(HDR, 16), w(BUF, 8 + 1)],
        &g,
    );
    // Empty descriptors in the chain.
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 5);
    add(
        "ok_in_empty_descriptors",
        &h,
        &[
            r(HDR, 16),
            r(BUF2, 0),
            w(BUF, 512),
            w(BUF2, 0),
            w(STATUS, 1),
            w(BUF2, 0),
        ],
        &g,
    );
    // A buffer across two adjacent regions; memory near the top of the
    // address space; a guest with its write cache off.
    let adj = Head {
        flags: F_TWO_REGIONS | F_ADJACENT,
        region0_pages: 2,
        region1_pages: 2,
        ..h
    };
    let mut g = Guest::new();
    g.header(HDR, kind::OUT, 200).put(0x1800, &data(4096, 5));
    add(
        "ok_out_across_regions",
        &adj,
        &[r(HDR, 16), r(0x1800, 4096), w(STATUS, 1)],
        &g,
    );
    let high = Head {
        flags: F_HIGH | F_TWO_REGIONS,
        region0_page: 0,
        ..h
    };
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 0);
    add(
        "ok_in_high_memory",
        &high,
        &[
            r(HDR, 16),
            w(0xf000, 4096),
            in_region1(0, 512, true),
            w(STATUS, 1),
        ],
        &g,
    );
    let wt = Head {
        flags: F_WRITETHROUGH,
        ..h
    };
    let mut g = Guest::new();
    g.header(HDR, kind::OUT, 2047).put(BUF, &data(512, 6));
    add(
        "ok_out_writethrough",
        &wt,
        &[r(HDR, 16), r(BUF, 512), w(STATUS, 1)],
        &g,
    );

    // Requests the device refuses.
    let ro = Head {
        flags: F_READ_ONLY,
        ..h
    };
    let mut g = Guest::new();
    g.header(HDR, kind::OUT, 0).put(BUF, &data(512, 7));
    add(
        "ioerr_out_read_only",
        &ro,
        &[r(HDR, 16), r(BUF, 512), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 2047);
    add(
        "ioerr_in_past_end",
        &h,
        &[r(HDR, 16), w(BUF, 1024), w(STATUS, 1)],
        &g,
    );
    add(
        "ioerr_in_overlapping_buffers",
        &h,
        &[r(HDR, 16), w(BUF, 1024), w(BUF + 512, 1024), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 0);
    add(
        "ioerr_in_unaligned",
        &h,
        &[r(HDR, 16), w(BUF, 1000), w(STATUS, 1)],
        &g,
    );
    let outside = EncDesc {
        addr_mode: addr::PAST_MEMORY,
        ..w(0, 512)
    };
    add(
        "ioerr_in_buffer_outside_memory",
        &h,
        &[r(HDR, 16), outside, w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::OUT, 0);
    let huge = EncDesc {
        len_mode: len::HUGE,
        ..r(BUF, 0)
    };
    add(
        "ioerr_out_huge_length",
        &h,
        &[r(HDR, 16), huge, w(STATUS, 1)],
        &g,
    );
    // 30 overlapping 24 KiB segments: 720 KiB of data from 24 KiB of
    // guest memory, past the 512 KiB the harness's limits allow.
    let mut chain = vec![r(HDR, 16)];
    chain.extend((0..30).map(|_| r(BUF, 24 << 10)));
    chain.push(w(STATUS, 1));
    add("ioerr_out_overlapping_past_max_data", &h, &chain, &g);
    let one_range = Head {
        limits: strata_vhost::request::Limits {
            max_discard_seg: 1,
            ..h.limits
        },
        ..h
    };
    let mut g = Guest::new();
    g.header(HDR, kind::DISCARD, 0)
        .range(RANGES, 0, 8, 0)
        .range(RANGES + 16, 8, 8, 0);
    add(
        "ioerr_discard_too_many_ranges",
        &one_range,
        &[r(HDR, 16), r(RANGES, 32), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, kind::DISCARD, 0)
        .range(RANGES, 0, 8, RANGE_FLAG_UNMAP);
    add(
        "unsupp_discard_unmap_flag",
        &h,
        &[r(HDR, 16), r(RANGES, 16), w(STATUS, 1)],
        &g,
    );
    let mut g = Guest::new();
    g.header(HDR, 2, 0); // VIRTIO_BLK_T_SCSI_CMD
    add(
        "unsupp_scsi_cmd",
        &h,
        &[r(HDR, 16), w(BUF, 96), w(STATUS, 1)],
        &g,
    );

    // Malformed chains.
    let mut g = Guest::new();
    g.header(HDR, kind::IN, 0);
    add("refused_short_header", &h, &[r(HDR, 8), w(STATUS, 1)], &g);
    add(
        "refused_readable_after_writable",
        &h,
        &[r(HDR, 16), w(BUF, 512), r(BUF2, 16), w(STATUS, 1)],
        &g,
    );
    // The device-readable descriptor is the last one: the status goes in
    // the last writable byte, the data buffer (regression: the readable
    // descriptor was taken for the status and its bytes written).
    add(
        "refused_readable_last",
        &h,
        &[r(HDR, 16), w(BUF, 513), r(BUF2, 1)],
        &g,
    );
    add(
        "nostatus_no_writable_byte",
        &h,
        &[r(HDR, 16), r(BUF, 512)],
        &g,
    );
    let status_outside = EncDesc {
        addr_mode: addr::PAST_MEMORY,
        ..w(0, 1)
    };
    add(
        "nostatus_status_outside_memory",
        &h,
        &[r(HDR, 16), w(BUF, 512), status_outside],
        &g,
    );
    v
}

#[test]
#[ignore = "writes fuzz/corpus/vhost_chain"]
fn write_seeds() {
    std::fs::create_dir_all(corpus()).unwrap();
    for (name, input) in seeds() {
        std::fs::write(corpus().join(name), input).unwrap();
    }
}

#[test]
fn committed_seeds_are_what_the_generator_writes() {
    for (name, input) in seeds() {
        let on_disk = std::fs::read(corpus().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e} (run the ignored write_seeds test)"));
        assert!(on_disk == input, "{name} differs from the generator's");
    }
}

#[test]
fn every_corpus_chain_passes_the_checks_and_comes_to_what_its_name_says() {
    let mut n = 0;
    let mut by_prefix = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(corpus()).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let input = std::fs::read(&path).unwrap();
        let o = fuzzing::chain(&input);
        let prefix = name.split('_').next().unwrap().to_string();
        match prefix.as_str() {
            "ok" => {
                assert_eq!(o.status, Some(status::OK), "{name}: {o:?}");
                let data = ["_in_", "_out_", "discard", "zeroes"]
                    .iter()
                    .any(|k| name.contains(k));
                assert!(
                    !data || o.checked_bytes > 0,
                    "{name}: no data checked: {o:?}"
                );
            }
            "ioerr" => {
                assert!(matches!(o.parse, Parse::Request(_)), "{name}: {o:?}");
                assert_eq!(o.status, Some(status::IOERR), "{name}: {o:?}");
            }
            "unsupp" => assert_eq!(o.status, Some(status::UNSUPP), "{name}: {o:?}"),
            "refused" => {
                assert_eq!(o.parse, Parse::Refused, "{name}: {o:?}");
                assert_eq!((o.status, o.used), (Some(status::IOERR), 1), "{name}");
            }
            "nostatus" => {
                assert_eq!(
                    (o.parse, o.status, o.used),
                    (Parse::NoStatus, None, 0),
                    "{name}"
                )
            }
            _ => {}
        }
        *by_prefix.entry(prefix).or_insert(0) += 1;
        n += 1;
    }
    assert!(n >= 10, "only {n} chains in {}", corpus().display());
    for p in ["ok", "ioerr", "unsupp", "refused", "nostatus"] {
        assert!(by_prefix.contains_key(p), "no {p}_ seed");
    }
}

#[test]
fn used_lengths_of_the_seeds() {
    // A read reports its data and the status byte; GET_ID at most 20
    // bytes of ID; everything else the status byte alone.
    let used = |name: &str| {
        let (_, input) = seeds().into_iter().find(|(n, _)| *n == name).unwrap();
        fuzzing::chain(&input).used
    };
    assert_eq!(used("ok_in_linux"), 4097);
    assert_eq!(used("ok_in_multiseg_two_regions"), 4097);
    assert_eq!(used("ok_in_status_merged"), 513);
    assert_eq!(used("ok_get_id"), 21);
    assert_eq!(used("ok_get_id_short_merged"), 9);
    assert_eq!(used("ok_out_linux"), 1);
    assert_eq!(used("ioerr_in_past_end"), 1);
}
