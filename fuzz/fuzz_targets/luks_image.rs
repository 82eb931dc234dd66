//! A whole LUKS1 image (header, keyslot material, payload), as `strata
//! import` reads one: parsing never panics and refuses every inconsistent
//! header before a key is derived; a parsed header re-encodes to itself;
//! when its PBKDF2 costs are small the image is opened with a fixed
//! passphrase (PBKDF2, keyslot decryption, anti-forensic merge, digest
//! check) and an opened payload round-trips (`strata_crypt::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_crypt::fuzzing::luks_image(data);
});
