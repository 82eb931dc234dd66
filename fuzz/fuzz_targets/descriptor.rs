//! Descriptor text: parsing never panics, and whatever parses renders to
//! text that parses again to the same disk (`strata_vmdk::fuzzing::descriptor`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_vmdk::fuzzing::descriptor(data);
});
