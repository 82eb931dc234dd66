//! Unit tests of format/src/lib.rs.

use super::*;
use proptest::prelude::*;

fn sb() -> Superblock {
    Superblock {
        version: FORMAT_VERSION,
        generation: 9,
        capacity_bytes: 1 << 40,
        pool_grains: 1234,
        catalog_bytes: 77,
        catalog_checksum: 0xdead_beef,
        uuid: [7; 16],
        created_unix_secs: 42,
        ro_compat: 0,
        compat: 0,
        incompat: 0,
    }
}

#[test]
fn superblock_round_trips_and_offsets_match_the_spec() {
    let b = sb().encode();
    assert_eq!(&b[0..8], b"STRATASB");
    assert_eq!(u64_at(&b, 32), 9, "generation at 32");
    assert_eq!(u32_at(&b, 40), 4096, "grain_bytes at 40");
    assert_eq!(u32_at(&b, 44), 256, "block_grains at 44");
    assert_eq!(u64_at(&b, 56), 1234, "pool_grains at 56");
    assert_eq!(Superblock::decode(&b).unwrap(), sb());
}

#[test]
fn superblock_refuses_flipped_bits_unknown_features_and_versions() {
    let mut b = sb().encode();
    b[60] ^= 1;
    assert!(matches!(
        Superblock::decode(&b),
        Err(FormatError::BadChecksum { .. })
    ));
    let mut b = sb().encode();
    b[12] = 32; // unknown incompat bit (the first past PACKED); fix checksum
    b[28..32].fill(0);
    let crc = crc32c::crc32c(&b[..128]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        Superblock::decode(&b),
        Err(FormatError::IncompatFeatures(32))
    );
}

#[test]
fn pick_prefers_newer_valid_slot() {
    let a = sb();
    let mut b2 = sb();
    b2.generation = 10;
    let pa = a.encode();
    let pb = b2.encode();
    assert_eq!(Superblock::pick(&pa, &pb).unwrap().generation, 10);
    let mut torn = pb.clone();
    torn[100] ^= 0xff;
    assert_eq!(Superblock::pick(&pa, &torn).unwrap().generation, 9);
    assert!(Superblock::pick(&[0u8; 4096], &[0u8; 4096]).is_err());
}

#[test]
fn levels_cover_disk_sizes() {
    assert_eq!(levels_for(1), 1);
    assert_eq!(levels_for(512), 1);
    assert_eq!(levels_for(513), 2);
    assert_eq!(levels_for(512 * 512), 2);
    assert_eq!(levels_for((1u64 << 40) / 4096), 4); // 1 TiB
    assert_eq!(levels_for(u64::MAX), MAP_LEVELS_MAX);
}

fn arb_record() -> impl Strategy<Value = Record> {
    prop_oneof![
        (any::<u64>(), any::<u8>()).prop_map(|(g, b)| Record::PageImage {
            grain: g,
            data: Box::new([b; 4096])
        }),
        (any::<u64>(), 0u8..5).prop_map(|(grain, level)| Record::PageNew { grain, level }),
        (any::<u64>(), any::<u8>()).prop_map(|(page, b)| Record::RefPageImage {
            page,
            data: Box::new([b; 4096])
        }),
        any::<u64>().prop_map(|next| Record::GenerationEnd { next }),
        (any::<u64>(), 0u16..512, any::<u64>()).prop_map(|(grain, index, value)| {
            Record::MapSet {
                grain,
                index,
                value,
            }
        }),
        (any::<u64>(), any::<u32>()).prop_map(|(grain, count)| Record::RefSet { grain, count }),
        (any::<u64>(), 0u16..512, 1u16..=512, 1u64..1 << 48).prop_map(
            |(grain, index, n, value)| Record::MapRun {
                grain,
                index: index.min(512 - n),
                n,
                value,
            }
        ),
        (0u64..1 << 48, 1u32..=REF_RUN_MAX, any::<u32>())
            .prop_map(|(grain, n, count)| Record::RefRun { grain, n, count }),
        (
            any::<u64>(),
            any::<u64>(),
            1u8..=5,
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(
                |(version, root, levels, mapped_grains, nb)| Record::Version(VersionState {
                    version,
                    root,
                    levels,
                    mapped_grains,
                    nb
                })
            ),
        proptest::collection::vec(any::<u8>(), 0..100).prop_map(Record::Catalog),
    ]
}

#[test]
fn run_records_out_of_range_are_refused_by_name() {
    let enc = |r: Record| {
        let mut b = Vec::new();
        r.encode_into(&mut b);
        b
    };
    let bad = [
        enc(Record::MapRun {
            grain: 9,
            index: 500,
            n: 13,
            value: 1,
        }),
        enc(Record::MapRun {
            grain: 9,
            index: 0,
            n: 0,
            value: 1,
        }),
        enc(Record::MapRun {
            grain: 9,
            index: 0,
            n: 2,
            value: 0,
        }),
        enc(Record::MapRun {
            grain: 9,
            index: 0,
            n: 2,
            value: u64::MAX,
        }),
        enc(Record::RefRun {
            grain: 9,
            n: 0,
            count: 1,
        }),
        enc(Record::RefRun {
            grain: 9,
            n: REF_RUN_MAX + 1,
            count: 1,
        }),
        enc(Record::RefRun {
            grain: u64::MAX,
            n: 2,
            count: 1,
        }),
    ];
    for b in bad {
        let e = Record::decode_all(&b).unwrap_err().to_string();
        assert!(e.contains("run of"), "{e}");
    }
    // A version-1 log has no run records.
    let b = enc(Record::RefRun {
        grain: 9,
        n: 2,
        count: 1,
    });
    assert!(Record::decode_all_v1(&b).is_err());
}

#[test]
fn superblocks_this_build_writes_say_they_may_hold_run_records() {
    let b = sb().encode();
    assert_eq!(
        u32::from_le_bytes(b[12..16].try_into().unwrap()),
        INCOMPAT_RUN_RECORDS
    );
    assert!(Superblock::decode(&b).is_ok());
}

#[test]
fn map_nodes_round_trip_and_name_their_grain_and_level() {
    let mut e = Box::new([0u64; MAP_FANOUT]);
    e[0] = 77;
    e[511] = ENTRY_GRAIN_MASK;
    let mut b = vec![0u8; 4096];
    encode_map_node(&e, 4242, 3, &mut b);
    let n = decode_map_node(&b, 4242).unwrap();
    assert_eq!(n.level, 3);
    assert_eq!(n.entries, e);
    // The same bytes read at another grain: misdirected.
    assert!(matches!(
        decode_map_node(&b, 4243),
        Err(FormatError::Invalid { .. })
    ));
    // An all-zero page (a hole, a lost write) is not a node.
    assert!(matches!(
        decode_map_node(&[0u8; 4096], 4242),
        Err(FormatError::BadChecksum { .. })
    ));
    // Version 1 reads the entries whatever the lanes hold.
    assert_eq!(decode_map_node_v1(&b).unwrap(), e);
}

#[test]
fn count_pages_round_trip_and_blank_pages_only_past_the_pool() {
    let mut c = Box::new([0u32; REFS_PER_PAGE]);
    c[0] = 1;
    c[1019] = u32::MAX;
    let mut b = vec![0u8; 4096];
    encode_ref_page(7, &c, &mut b);
    assert_eq!(decode_ref_page(&b, 7, false).unwrap(), c);
    assert!(decode_ref_page(&b, 8, false).is_err());
    assert!(decode_ref_page(&[0u8; 4096], 7, false).is_err());
    assert_eq!(
        decode_ref_page(&[0u8; 4096], 7, true).unwrap(),
        Box::new([0u32; REFS_PER_PAGE])
    );
}

proptest! {
    #[test]
    fn any_bit_flip_in_a_map_node_is_caught(bit in 0usize..4096 * 8, grain in 1u64..(1 << 40), level in 0u8..5, seed in any::<u64>()) {
        let mut e = Box::new([0u64; MAP_FANOUT]);
        for (i, x) in e.iter_mut().enumerate() {
            *x = (seed.wrapping_mul(i as u64 + 1)) & ENTRY_GRAIN_MASK;
        }
        let mut b = vec![0u8; 4096];
        encode_map_node(&e, grain, level, &mut b);
        b[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode_map_node(&b, grain).is_err());
    }

    #[test]
    fn any_bit_flip_in_a_count_page_is_caught(bit in 0usize..4096 * 8, page in any::<u64>(), seed in any::<u32>()) {
        let mut c = Box::new([0u32; REFS_PER_PAGE]);
        for (i, x) in c.iter_mut().enumerate() {
            *x = seed.wrapping_mul(i as u32);
        }
        let mut b = vec![0u8; 4096];
        encode_ref_page(page, &c, &mut b);
        b[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode_ref_page(&b, page, true).is_err());
    }

    #[test]
    fn node_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 4096..=4096), grain in any::<u64>()) {
        let _ = decode_map_node(&bytes, grain);
    }

    #[test]
    fn records_round_trip(recs in proptest::collection::vec(arb_record(), 0..20)) {
        let mut buf = Vec::new();
        for r in &recs { r.encode_into(&mut buf); }
        prop_assert_eq!(Record::decode_all(&buf).unwrap(), recs);
    }

    #[test]
    fn record_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let _ = Record::decode_all(&bytes);
    }

    #[test]
    fn superblock_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
        let _ = Superblock::decode(&bytes);
    }

    #[test]
    fn batches_verify_and_detect_any_flip(payload in proptest::collection::vec(any::<u8>(), 0..300), flip in 0usize..332) {
        let b = encode_batch(3, 4, &payload);
        prop_assert_eq!(b.len() as u64 % BATCH_ALIGN, 0);
        let h = decode_batch_header(&b).unwrap();
        prop_assert_eq!(h, BatchHeader { generation: 3, sequence: 4, payload_bytes: payload.len() as u32 });
        let used = BATCH_HEADER_BYTES + payload.len();
        prop_assert!(batch_checksum_ok(&b[..used]));
        let mut c = b.clone();
        let at = flip % used;
        c[at] ^= 0x40;
        prop_assert!(!batch_checksum_ok(&c[..used]) || decode_batch_header(&c).is_none());
    }

    #[test]
    fn a_batch_sealed_in_place_is_the_batch_encoded(payload in proptest::collection::vec(any::<u8>(), 0..9000), junk in any::<u8>()) {
        // Header room of any contents, in a buffer that held more before.
        let mut b = vec![junk; 12_000];
        b.truncate(BATCH_HEADER_BYTES);
        b.extend_from_slice(&payload);
        seal_batch(&mut b, 7, 9);
        prop_assert_eq!(b, encode_batch(7, 9, &payload));
    }
}
