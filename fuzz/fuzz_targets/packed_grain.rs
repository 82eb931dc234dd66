//! A packed grain (docs/FORMAT.md §18.2): its directory decoded as given
//! and with its CRC set, each fragment read and decompressed, and what
//! decodes laid out again (`strata_engine::fuzzing::packed_grain`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_engine::fuzzing::packed_grain(data);
});
