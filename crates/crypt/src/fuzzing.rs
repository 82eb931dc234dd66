//! The body of the `keyring_parse` fuzz target (fuzz/fuzz_targets), here so
//! that the crate's own tests run it too.

use crate::{KdfRec, KeyringRec};

/// The passphrase the fuzz target tries (an Argon2id-class secret).
pub const SHORT_SECRET: &[u8] = b"fuzz passphrase";
/// The key material the fuzz target tries (an HKDF-class secret).
pub const LONG_SECRET: &[u8] = b"fuzz key material, 32 bytes or more";

/// Largest Argon2 memory (KiB) the target derives with, and the largest
/// memory times passes: a bound on each input's time, well inside what
/// `validate` accepts.
const FUZZ_MAX_M_KIB: u32 = 65_536;
const FUZZ_MAX_WORK: u64 = 131_072;

/// Parses `data` as a JSON [`KeyringRec`]; when it validates, checks that
/// it survives a JSON round trip and, when its Argon2 costs are small,
/// tries to unlock it with [`SHORT_SECRET`] and [`LONG_SECRET`]. Returns
/// how many of the two opened it. Panics only on a broken invariant.
pub fn keyring_parse(data: &[u8]) -> usize {
    let Ok(rec) = serde_json::from_slice::<KeyringRec>(data) else {
        return 0;
    };
    if rec.validate().is_err() {
        return 0;
    }
    let json = serde_json::to_vec(&rec).expect("a valid record serialises");
    let back: KeyringRec = serde_json::from_slice(&json).expect("a serialised record parses");
    assert_eq!(back, rec, "JSON round trip changed the record");

    let cheap = rec.slots.iter().all(|s| match s.kdf {
        KdfRec::Argon2id { m_kib, t, .. } => {
            m_kib <= FUZZ_MAX_M_KIB && u64::from(m_kib) * u64::from(t) <= FUZZ_MAX_WORK
        }
        KdfRec::HkdfSha256 { .. } => true,
    });
    if !cheap {
        return 0;
    }
    let mut opened = 0;
    for secret in [SHORT_SECRET, LONG_SECRET] {
        if let Ok(keys) = rec.unlock(secret) {
            assert!(rec.keys.iter().any(|k| k.index == keys.current_index()));
            let mut sector = [0u8; crate::SECTOR_BYTES];
            keys.current().encrypt(&mut sector, 1);
            keys.current().decrypt(&mut sector, 1);
            assert_eq!(sector, [0u8; crate::SECTOR_BYTES]);
            assert!(rec.slot_of(secret).is_ok());
            opened += 1;
        }
    }
    opened
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Argon2Params, NewSlot};

    #[test]
    fn seeds_and_junk() {
        let tiny = Argon2Params {
            m_kib: 8192,
            t: 1,
            p: 1,
        };
        let new = NewSlot {
            secret: LONG_SECRET,
            source: "file",
            label: None,
            argon2: tiny,
            now_unix: 1,
        };
        let (mut rec, keys) = KeyringRec::create(1, &new).unwrap();
        let short = NewSlot {
            secret: SHORT_SECRET,
            source: "passphrase",
            ..new
        };
        rec.add_slot(&keys, &short).unwrap();
        let json = serde_json::to_vec(&rec).unwrap();
        assert_eq!(keyring_parse(&json), 2);
        let mut one = rec.clone();
        one.remove_slot(0).unwrap();
        assert_eq!(keyring_parse(&serde_json::to_vec(&one).unwrap()), 1);
        for cut in [0, 1, json.len() / 2, json.len() - 1] {
            keyring_parse(&json[..cut]);
        }
        for i in (0..json.len()).step_by(7) {
            let mut bad = json.clone();
            bad[i] ^= 0x01;
            keyring_parse(&bad);
        }
        keyring_parse(b"{}");
        keyring_parse(b"\xff\x00");
    }
}
