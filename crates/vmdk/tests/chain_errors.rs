//! Broken chains are refused with messages that say what is wrong: cycles,
//! chains deeper than the limit, missing parents, CID mismatches, a parent
//! CID without a file name hint.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_storage::{Backend, SimBackend};
use strata_vmdk::{create_image, ImageSpec, OpenOptions, Subformat, VmdkImage};

fn put(b: &SimBackend, name: &str, text: &str) {
    let f = b.open(name, true).unwrap();
    f.set_len(0).unwrap();
    f.write_at(text.as_bytes(), 0).unwrap();
}

fn delta(cid: u32, parent_cid: u32, hint: &str, extent: &str) -> String {
    format!(
        "# Disk DescriptorFile\nversion=1\nCID={cid:08x}\nparentCID={parent_cid:08x}\ncreateType=\"vmfsSparse\"\nparentFileNameHint=\"{hint}\"\n\n# Extent description\nRW 2048 VMFSSPARSE \"{extent}\"\n"
    )
}

fn open(b: &SimBackend, name: &str, max_depth: usize) -> Result<VmdkImage, String> {
    VmdkImage::open_in(
        Arc::new(b.clone()),
        name,
        &OpenOptions {
            writable: false,
            max_depth,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())
}

/// Two COWD extents to point descriptors at.
fn extents(b: &SimBackend) {
    for n in ["x", "y"] {
        let img = create_image(
            Arc::new(b.clone()),
            &format!("{n}.vmdk"),
            &ImageSpec::new(Subformat::VmfsSparse, 2048),
        )
        .unwrap();
        drop(img);
    }
}

#[test]
fn cycles_are_refused() {
    let b = SimBackend::new();
    extents(&b);
    put(&b, "a.vmdk", &delta(1, 2, "b.vmdk", "x-delta.vmdk"));
    put(&b, "b.vmdk", &delta(2, 1, "a.vmdk", "y-delta.vmdk"));
    let e = open(&b, "a.vmdk", 255).err().expect("must be refused");
    assert!(e.contains("cycle"), "{e}");
    // A file naming itself, through a path that normalises to it.
    put(
        &b,
        "c.vmdk",
        &delta(3, 3, "./sub/../c.vmdk", "x-delta.vmdk"),
    );
    let e = open(&b, "c.vmdk", 255).err().expect("must be refused");
    assert!(e.contains("cycle"), "{e}");
}

#[test]
fn chains_deeper_than_the_limit_are_refused() {
    let b = SimBackend::new();
    extents(&b);
    let base = "# Disk DescriptorFile\nversion=1\nCID=00000000\nparentCID=ffffffff\ncreateType=\"vmfsSparse\"\n\n# Extent description\nRW 2048 VMFSSPARSE \"x-delta.vmdk\"\n";
    put(&b, "l0.vmdk", base);
    for i in 1..=10u32 {
        put(
            &b,
            &format!("l{i}.vmdk"),
            &delta(i, i - 1, &format!("l{}.vmdk", i - 1), "y-delta.vmdk"),
        );
    }
    let img = open(&b, "l10.vmdk", 255).unwrap();
    assert_eq!(img.links.len(), 11);
    let mut buf = vec![0u8; 4096];
    img.read_at(&mut buf, 0).unwrap();
    let e = open(&b, "l10.vmdk", 5).err().expect("must be refused");
    assert!(e.contains("deeper than 5"), "{e}");
}

#[test]
fn missing_parents_and_cid_mismatches_say_which_file() {
    let b = SimBackend::new();
    extents(&b);
    put(&b, "orphan.vmdk", &delta(1, 2, "gone.vmdk", "x-delta.vmdk"));
    let e = open(&b, "orphan.vmdk", 255).err().expect("must be refused");
    assert!(e.contains("orphan.vmdk") && e.contains("gone.vmdk"), "{e}");
    let base = "# Disk DescriptorFile\nversion=1\nCID=0000abcd\nparentCID=ffffffff\ncreateType=\"vmfsSparse\"\n\n# Extent description\nRW 2048 VMFSSPARSE \"x-delta.vmdk\"\n";
    put(&b, "p.vmdk", base);
    put(
        &b,
        "child.vmdk",
        &delta(5, 0x1234, "p.vmdk", "y-delta.vmdk"),
    );
    let e = open(&b, "child.vmdk", 255).err().expect("must be refused");
    assert!(
        e.contains("parentCID is 00001234") && e.contains("0000abcd"),
        "{e}"
    );
    let nohint = "# Disk DescriptorFile\nversion=1\nCID=00000005\nparentCID=0000abcd\ncreateType=\"vmfsSparse\"\n\n# Extent description\nRW 2048 VMFSSPARSE \"y-delta.vmdk\"\n";
    put(&b, "nohint.vmdk", nohint);
    let e = open(&b, "nohint.vmdk", 255).err().expect("must be refused");
    assert!(e.contains("parentFileNameHint"), "{e}");
    // An extent declared as one kind but holding another.
    let wrong = "# Disk DescriptorFile\nversion=1\nCID=00000005\nparentCID=ffffffff\ncreateType=\"seSparse\"\n\n# Extent description\nRW 2048 SESPARSE \"x-delta.vmdk\"\n";
    put(&b, "wrong.vmdk", wrong);
    let e = open(&b, "wrong.vmdk", 255).err().expect("must be refused");
    assert!(e.contains("declared SESPARSE"), "{e}");
    // Raw device mappings are refused, not misread.
    let rdm = "# Disk DescriptorFile\nversion=1\nCID=00000005\nparentCID=ffffffff\ncreateType=\"vmfsRawDeviceMap\"\n\n# Extent description\nRW 2048 VMFSRDM \"x-delta.vmdk\"\n";
    put(&b, "rdm.vmdk", rdm);
    let e = open(&b, "rdm.vmdk", 255).err().expect("must be refused");
    assert!(e.contains("raw device mapping"), "{e}");
}
