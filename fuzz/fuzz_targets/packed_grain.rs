//! Two grains of a packed stream (docs/FORMAT.md §18.8): the first's
//! directory decoded as given and with its CRC set, each fragment read
//! (a spill's rest from the second grain) and decompressed, and what
//! decodes laid out again (`strata_engine::fuzzing::packed_grain`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_engine::fuzzing::packed_grain(data);
});
