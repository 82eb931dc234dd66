//! A keyring record (strata-crypt's `KeyringRec`) as JSON, as a catalog
//! holds it: parsing and `validate` never panic; a valid record survives a
//! JSON round trip, and when its Argon2 costs are small it is unlocked with
//! a fixed passphrase and fixed key material (`strata_crypt::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_crypt::fuzzing::keyring_parse(data);
});
