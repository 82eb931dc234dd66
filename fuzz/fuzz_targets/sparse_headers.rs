//! The binary headers: KDMV, COWD, SEsparse constant and volatile. Decoding
//! never panics, and a decoded header encodes to bytes that decode to it
//! (`strata_vmdk::fuzzing::sparse_headers`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_vmdk::fuzzing::sparse_headers(data);
});
