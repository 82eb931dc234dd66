//! docs/FORMAT.md is the source of truth: its tables must match the constants.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use strata_format::{super_off, tag, SUPER_HEADER_BYTES};

fn spec() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/FORMAT.md"))
        .expect("docs/FORMAT.md")
}

/// Rows `| a | b | c | ... |` of the table that follows `heading`.
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("FORMAT.md lacks '{heading}'"));
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn superblock_table_matches_constants() {
    let doc = spec();
    let rows = table(&doc, "## 2. Superblock");
    let find = |field: &str| -> (usize, usize) {
        let r = rows
            .iter()
            .find(|r| r[2] == field)
            .unwrap_or_else(|| panic!("no row for {field}"));
        (r[0].parse().unwrap(), r[1].parse().unwrap())
    };
    for (field, off, size) in [
        ("magic", super_off::MAGIC, 8),
        ("format_version", super_off::VERSION, 4),
        ("incompat_features", super_off::INCOMPAT, 4),
        ("ro_compat_features", super_off::RO_COMPAT, 4),
        ("compat_features", super_off::COMPAT, 4),
        ("header_bytes", super_off::HEADER_BYTES, 4),
        ("checksum", super_off::CHECKSUM, 4),
        ("generation", super_off::GENERATION, 8),
        ("grain_bytes", super_off::GRAIN_BYTES, 4),
        ("block_grains", super_off::BLOCK_GRAINS, 4),
        ("capacity_bytes", super_off::CAPACITY, 8),
        ("pool_grains", super_off::POOL_GRAINS, 8),
        ("catalog_bytes", super_off::CATALOG_BYTES, 8),
        ("catalog_checksum", super_off::CATALOG_CHECKSUM, 4),
        ("datastore_uuid", super_off::UUID, 16),
        ("created_unix_secs", super_off::CREATED, 8),
    ] {
        assert_eq!(find(field), (off, size), "superblock field {field}");
    }
    // The table covers exactly the header: the last row ends at header_bytes.
    let end = rows
        .iter()
        .map(|r| r[0].parse::<u32>().unwrap() + r[1].parse::<u32>().unwrap())
        .max()
        .unwrap();
    assert_eq!(end, SUPER_HEADER_BYTES);
}

#[test]
fn record_tags_match_constants() {
    let doc = spec();
    let rows = table(&doc, "Records: a one-byte tag");
    let tag_of = |name: &str| -> u8 {
        rows.iter()
            .find(|r| r[1] == name)
            .unwrap_or_else(|| panic!("no record {name}"))[0]
            .parse()
            .unwrap()
    };
    assert_eq!(tag_of("PAGE_IMAGE"), tag::PAGE_IMAGE);
    assert_eq!(tag_of("PAGE_NEW"), tag::PAGE_NEW);
    assert_eq!(tag_of("REF_PAGE_IMAGE"), tag::REF_PAGE_IMAGE);
    assert_eq!(tag_of("GENERATION_END"), tag::GENERATION_END);
    assert_eq!(tag_of("MAP_SET"), tag::MAP_SET);
    assert_eq!(tag_of("REF_SET"), tag::REF_SET);
    assert_eq!(tag_of("VERSION"), tag::VERSION);
    assert_eq!(tag_of("CATALOG"), tag::CATALOG);
}

#[test]
fn batch_header_table_matches_encoder() {
    let doc = spec();
    let rows = table(&doc, "as one **batch**");
    let offsets: Vec<(usize, usize)> = rows
        .iter()
        .filter_map(|r| Some((r[0].parse().ok()?, r[1].parse().ok()?)))
        .collect();
    assert_eq!(offsets, [(0, 4), (4, 4), (8, 8), (16, 8), (24, 4), (28, 4)]);
    let b = strata_format::encode_batch(0x1122, 0x33, b"xy");
    assert_eq!(
        u32::from_le_bytes(b[0..4].try_into().unwrap()),
        strata_format::BATCH_MAGIC
    );
    assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 0x1122);
    assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 0x33);
    assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 2);
    assert_eq!(&b[32..34], b"xy");
}

#[test]
fn map_node_lanes_match_the_table() {
    use strata_format::lane;
    let doc = spec();
    let rows = table(&doc, "### Map node layout");
    let lane_of = |field: &str| -> String {
        rows.iter()
            .find(|r| r[1] == field)
            .unwrap_or_else(|| panic!("no lane {field}"))[0]
            .clone()
    };
    for (field, at) in [
        ("crc_lo", lane::CRC_LO),
        ("crc_hi", lane::CRC_HI),
        ("magic", lane::MAGIC),
        ("level", lane::LEVEL),
        ("grain_lo", lane::GRAIN_LO),
        ("grain_mid", lane::GRAIN_MID),
        ("grain_hi", lane::GRAIN_HI),
    ] {
        assert_eq!(lane_of(field), at.to_string(), "lane {field}");
    }
    assert_eq!(lane_of("reserved"), format!("{}..511", lane::RESERVED_FROM));
    let magic = rows.iter().find(|r| r[1] == "magic").unwrap()[2].clone();
    assert_eq!(magic, format!("{:#06x}", strata_format::NODE_MAGIC));
}

#[test]
fn count_page_table_matches_constants() {
    use strata_format::{ref_page_off, REFS_PER_PAGE, REF_PAGE_MAGIC};
    let doc = spec();
    let rows = table(&doc, "## 4. Reference counts");
    let offsets: Vec<(usize, usize)> = rows
        .iter()
        .map(|r| (r[0].parse().unwrap(), r[1].parse().unwrap()))
        .collect();
    assert_eq!(
        offsets,
        [
            (0, REFS_PER_PAGE * 4),
            (ref_page_off::INDEX, 8),
            (ref_page_off::MAGIC, 4),
            (ref_page_off::CRC, 4)
        ]
    );
    assert!(doc.contains(&format!("({REF_PAGE_MAGIC:#x})")));
    // The page encoder puts things where the table says.
    let mut b = vec![0u8; 4096];
    let mut c = Box::new([0u32; REFS_PER_PAGE]);
    c[1] = 0xabcd;
    strata_format::encode_ref_page(9, &c, &mut b);
    assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 0xabcd);
    assert_eq!(u64::from_le_bytes(b[4080..4088].try_into().unwrap()), 9);
    assert_eq!(&b[4088..4092], b"SREF");
}
