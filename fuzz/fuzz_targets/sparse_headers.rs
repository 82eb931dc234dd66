//! The binary headers: KDMV, COWD, SEsparse constant and volatile. Decoding
//! never panics, and a decoded header encodes to bytes that decode to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_vmdk::sparse::{CowdHeader, KdmvHeader, SeSparseHeader, SeSparseVolatile};

fuzz_target!(|data: &[u8]| {
    let mut b = [0u8; 512];
    let n = data.len().min(512);
    b[..n].copy_from_slice(&data[..n]);
    if let Ok(h) = KdmvHeader::decode(&b) {
        assert_eq!(KdmvHeader::decode(&h.encode()), Ok(h));
    }
    if let Ok(h) = SeSparseHeader::decode(&b) {
        assert_eq!(SeSparseHeader::decode(&h.encode()), Ok(h));
    }
    if let Ok(v) = SeSparseVolatile::decode(&b) {
        assert_eq!(SeSparseVolatile::decode(&v.encode()), Ok(v));
    }
    if let Ok(h) = CowdHeader::decode(data) {
        assert_eq!(CowdHeader::decode(&h.encode()), Ok(h));
    }
});
