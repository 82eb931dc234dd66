//! The bodies of the `keyring_parse` and `luks_image` fuzz targets
//! (fuzz/fuzz_targets), here so that the crate's own tests run them too.

use crate::luks::{self, LuksHash, LuksHeader};
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
            // A valid record's deep rekey names keys it holds.
            let c = rec.data_cipher(&keys).expect("a valid record's cipher");
            let mut two = [5u8; 2 * crate::SECTOR_BYTES];
            c.encrypt(
                &mut two,
                rec.deep_rekey.map_or(0, |d| d.next_grain.min(1 << 40) * 8),
            );
            c.decrypt(
                &mut two,
                rec.deep_rekey.map_or(0, |d| d.next_grain.min(1 << 40) * 8),
            );
            assert_eq!(two, [5u8; 2 * crate::SECTOR_BYTES]);
            // A valid record's own keys name keys it holds, and index 0
            // is none of them.
            for o in &rec.own {
                let x = rec
                    .own_cipher(&keys, o.bits)
                    .expect("a valid record's own key");
                x.encrypt(&mut sector, 2);
                x.decrypt(&mut sector, 2);
                assert_eq!(sector, [0u8; crate::SECTOR_BYTES]);
            }
            assert!(rec.own.iter().all(|o| o.key != rec.base_index()));
            let writes = if rec.deep_rekey.is_some() {
                0
            } else {
                rec.own.len()
            };
            assert_eq!(usize::from(rec.write_bits()), writes);
            assert_eq!(c.write_bits(), rec.write_bits());
            assert!(c.keyed(c.write_bits()).is_some());
            assert!(rec.slot_of(secret).is_ok());
            opened += 1;
        }
    }
    opened
}

/// Most PBKDF2 rounds (any slot, and the digest) for which `luks_image`
/// tries the secret: a bound on each input's time.
const FUZZ_MAX_ROUNDS: u32 = 4000;

/// The passphrase `luks_image` tries.
pub const LUKS_SECRET: &[u8] = b"fuzz luks passphrase";

/// Takes `data` as a whole LUKS1 image: a header that parses re-encodes
/// to a header that parses the same; when its PBKDF2 costs are small the
/// image is opened with [`LUKS_SECRET`] and, when it opens, its first
/// payload sectors decrypt and encrypt back to themselves. Returns whether
/// it opened. Panics only on a broken invariant.
pub fn luks_image(data: &[u8]) -> bool {
    let Some(head) = data.get(..luks::HEADER_BYTES) else {
        assert!(LuksHeader::parse(data, data.len() as u64).is_err());
        return false;
    };
    let Ok(h) = LuksHeader::parse(head, data.len() as u64) else {
        return false;
    };
    let again =
        LuksHeader::parse(&h.encode(), data.len() as u64).expect("a parsed header re-encodes");
    assert_eq!(again, h, "encode and parse changed the header");
    let cheap = h.mk_digest_iter <= FUZZ_MAX_ROUNDS
        && h.slots
            .iter()
            .all(|s| !s.active || s.iterations <= FUZZ_MAX_ROUNDS);
    if !cheap {
        return false;
    }
    let mut read = |at: u64, buf: &mut [u8]| {
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        let src = data
            .get(at..at.saturating_add(buf.len()))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    };
    let Ok((payload, slot)) = h.open(LUKS_SECRET, &mut read) else {
        return false;
    };
    assert!(h.slots[slot].active);
    let start = h.payload_byte() as usize;
    let sectors = (data.len() - start) / crate::SECTOR_BYTES;
    let n = sectors.min(8) * crate::SECTOR_BYTES;
    let mut buf = data[start..start + n].to_vec();
    payload.decrypt(&mut buf, 0);
    payload.encrypt(&mut buf, 0);
    assert_eq!(
        buf,
        &data[start..start + n],
        "the payload cipher does not round trip"
    );
    true
}

/// A small LUKS1 image that [`luks_image`] opens (4 stripes, the payload
/// at sector 40, `sectors` of payload): the fuzz target's seeds.
pub fn luks_seed(hash: &str, plain32: bool, sectors: usize) -> Vec<u8> {
    let layout = luks::Layout {
        hash: match hash {
            "sha1" => LuksHash::Sha1,
            "sha512" => LuksHash::Sha512,
            _ => LuksHash::Sha256,
        },
        plain32,
        stripes: 4,
        step: 4,
        payload: 40,
    };
    let new = luks::create_with(LUKS_SECRET, 1000, &layout).expect("a seed image");
    let mut image = new.area;
    let mut payload: Vec<u8> = (0..sectors * crate::SECTOR_BYTES)
        .map(|i| (i % 253) as u8)
        .collect();
    new.payload.encrypt(&mut payload, 0);
    image.extend_from_slice(&payload);
    image
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

    #[test]
    fn luks_seeds_open_and_damage_does_not_panic() {
        for (hash, plain32) in [("sha1", false), ("sha256", true), ("sha512", false)] {
            let img = luks_seed(hash, plain32, 4);
            assert!(luks_image(&img), "{hash} seed does not open");
            for i in (0..img.len()).step_by(97) {
                let mut bad = img.clone();
                bad[i] ^= 0x40;
                luks_image(&bad);
            }
            for cut in [0, 100, luks::HEADER_BYTES, 20 * 512, img.len() - 1] {
                luks_image(&img[..cut]);
            }
        }
    }
}
