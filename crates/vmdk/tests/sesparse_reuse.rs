//! An SEsparse delta whose grains region is used up reuses the slots that
//! unmaps freed instead of growing past the region its header declares,
//! and qemu-img reads the result.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::Arc;

use strata_block::{BlockDevice, ZeroOptions};
use strata_storage::FileBackend;
use strata_vmdk::{create_image, ImageSpec, OpenOptions, Subformat, VmdkImage};

const G: usize = 4096;

#[test]
fn a_full_grains_region_reuses_unmapped_slots() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(FileBackend::new(dir.path()));
    let grains = 256usize; // 1 MiB disk: the region holds exactly 256 grains
    let img = create_image(
        backend.clone(),
        "d.vmdk",
        &ImageSpec::new(Subformat::SeSparse, (grains * G / 512) as u64),
    )
    .unwrap();
    let mut model = vec![0u8; grains * G];
    let put = |img: &VmdkImage, model: &mut Vec<u8>, g: usize, v: u8| {
        let buf = vec![v; G];
        img.write_at(&buf, (g * G) as u64, false).unwrap();
        model[g * G..(g + 1) * G].copy_from_slice(&buf);
    };
    for g in 0..grains {
        put(&img, &mut model, g, 1 + (g % 200) as u8);
    }
    img.flush().unwrap();
    let full = std::fs::metadata(dir.path().join("d-sesparse.vmdk"))
        .unwrap()
        .len();
    // Three rounds of: unmap half, rewrite the other half's neighbours.
    for round in 0..3u8 {
        for g in (0..grains).filter(|g| g % 2 == (round % 2) as usize) {
            img.unmap((g * G) as u64, G as u64).unwrap();
            model[g * G..(g + 1) * G].fill(0);
        }
        for g in (0..grains).filter(|g| g % 2 == (round % 2) as usize) {
            if g % 3 == 0 {
                img.write_zeroes((g * G) as u64, G as u64, ZeroOptions::default())
                    .unwrap();
            } else {
                put(&img, &mut model, g, 100 + round);
            }
        }
        img.flush().unwrap();
    }
    let mut buf = vec![0u8; grains * G];
    img.read_at(&mut buf, 0).unwrap();
    assert!(buf == model, "content differs after reuse");
    drop(img);
    let after = std::fs::metadata(dir.path().join("d-sesparse.vmdk"))
        .unwrap()
        .len();
    assert_eq!(after, full, "the file grew past its declared grains region");
    let img = VmdkImage::open(&dir.path().join("d.vmdk"), &OpenOptions::default()).unwrap();
    img.read_at(&mut buf, 0).unwrap();
    assert!(buf == model, "content differs after reopen");
    let c = img.check(false).unwrap();
    assert!(c.iter().all(|(_, r)| r.errors.is_empty()), "{c:?}");
    if common::have(&["qemu-img"]) {
        let raw = dir.path().join("out.raw");
        let (vmdk, out) = (dir.path().join("d.vmdk"), raw.to_str().unwrap());
        let args = [
            "convert",
            "-f",
            "vmdk",
            "-O",
            "raw",
            vmdk.to_str().unwrap(),
            out,
        ];
        common::ok(dir.path(), "qemu-img", &args);
        assert!(
            std::fs::read(&raw).unwrap() == model,
            "qemu-img reads something else"
        );
    }
}
