//! Keyslot keys (KEKs) derived from user secrets.
//!
//! A secret of [`KEY_MATERIAL_BYTES`] or more is taken as key material and
//! goes through HKDF-SHA256; a shorter one is a passphrase and goes through
//! Argon2id with the parameters stored in the slot.

use aws_lc_rs::hkdf;
use serde::{Deserialize, Serialize};
use zeroize::Zeroize;

use crate::{hex, CryptError, Result, SecretBytes};

/// Secrets at least this long are key material (HKDF); shorter ones are
/// passphrases (Argon2id).
pub const KEY_MATERIAL_BYTES: usize = 32;
const KEK_BYTES: usize = 32;
const SALT_BYTES: usize = 32;
const HKDF_INFO: &[u8] = b"strata keyslot v1";

/// Most Argon2 memory a stored slot may ask for: 4 GiB.
const MAX_M_KIB: u32 = 4 * 1024 * 1024;
/// Most Argon2 passes a stored slot may ask for.
const MAX_T: u32 = 100;
/// Most Argon2 lanes a stored slot may ask for.
const MAX_P: u32 = 16;

/// How a keyslot's KEK was derived, with the salt (lowercase hex) and the
/// Argon2id cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "kebab-case")]
pub enum KdfRec {
    /// HKDF-SHA256 of key material, info "strata keyslot v1".
    HkdfSha256 {
        /// 32 random bytes, hex.
        salt: String,
    },
    /// Argon2id (version 0x13) of a passphrase.
    Argon2id {
        /// 32 random bytes, hex.
        salt: String,
        /// Memory in KiB.
        m_kib: u32,
        /// Passes over the memory.
        t: u32,
        /// Lanes.
        p: u32,
    },
}

/// Argon2id cost for a new passphrase slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argon2Params {
    /// Memory in KiB (default 262144: 256 MiB).
    pub m_kib: u32,
    /// Passes (default 3).
    pub t: u32,
    /// Lanes (default 2).
    pub p: u32,
}

impl Default for Argon2Params {
    fn default() -> Self {
        Argon2Params {
            m_kib: 262_144,
            t: 3,
            p: 2,
        }
    }
}

impl Argon2Params {
    /// Why these parameters are outside the accepted bounds (memory at most
    /// 4 GiB and at least 8 KiB per lane, 1 to 100 passes, 1 to 16 lanes),
    /// or `None` when they are fine. Unlocking refuses a stored slot
    /// outside them, so a hostile record cannot make it take all memory.
    pub fn problem(&self) -> Option<String> {
        let Argon2Params { m_kib, t, p } = *self;
        if p == 0 || p > MAX_P {
            return Some(format!("argon2 lanes p={p} not in 1..={MAX_P}"));
        }
        if t == 0 || t > MAX_T {
            return Some(format!("argon2 passes t={t} not in 1..={MAX_T}"));
        }
        if m_kib > MAX_M_KIB || u64::from(m_kib) < 8 * u64::from(p) {
            return Some(format!(
                "argon2 memory m_kib={m_kib} not in {}..={MAX_M_KIB}",
                8 * p
            ));
        }
        None
    }
}

/// Whether a secret of `len` bytes counts as key material.
pub(crate) fn is_key_material(len: usize) -> bool {
    len >= KEY_MATERIAL_BYTES
}

fn random_salt() -> Result<String> {
    let mut salt = [0u8; SALT_BYTES];
    aws_lc_rs::rand::fill(&mut salt)
        .map_err(|_| CryptError::Io("the random generator failed".into()))?;
    Ok(hex::encode(&salt))
}

impl KdfRec {
    /// A fresh record (random salt) for `secret`, by its length class.
    pub(crate) fn fresh(secret: &[u8], argon2: &Argon2Params) -> Result<KdfRec> {
        if secret.is_empty() {
            return Err(CryptError::Invalid("the secret is empty".into()));
        }
        let salt = random_salt()?;
        if is_key_material(secret.len()) {
            return Ok(KdfRec::HkdfSha256 { salt });
        }
        if let Some(why) = argon2.problem() {
            return Err(CryptError::Invalid(why));
        }
        let Argon2Params { m_kib, t, p } = *argon2;
        Ok(KdfRec::Argon2id { salt, m_kib, t, p })
    }

    /// Whether this KDF serves secrets of `len` bytes (HKDF for key
    /// material, Argon2id for passphrases).
    pub(crate) fn fits(&self, len: usize) -> bool {
        matches!(self, KdfRec::HkdfSha256 { .. }) == is_key_material(len)
    }

    /// Why the record is unusable (bad salt, cost out of bounds), if it is.
    pub(crate) fn problem(&self) -> Option<String> {
        let salt = match self {
            KdfRec::HkdfSha256 { salt } => salt,
            KdfRec::Argon2id { salt, m_kib, t, p } => {
                let why = Argon2Params {
                    m_kib: *m_kib,
                    t: *t,
                    p: *p,
                }
                .problem();
                if why.is_some() {
                    return why;
                }
                salt
            }
        };
        match hex::decode_exact::<SALT_BYTES>(salt) {
            Some(_) => None,
            None => Some(format!(
                "kdf salt is not {SALT_BYTES} bytes of lowercase hex"
            )),
        }
    }

    /// The 32-byte KEK for `secret`.
    pub(crate) fn derive(&self, secret: &[u8]) -> Result<SecretBytes> {
        if secret.is_empty() {
            return Err(CryptError::Invalid("the secret is empty".into()));
        }
        if let Some(why) = self.problem() {
            return Err(CryptError::Damaged(why));
        }
        match self {
            KdfRec::HkdfSha256 { salt } => hkdf_sha256(&decode_salt(salt)?, secret),
            KdfRec::Argon2id { salt, m_kib, t, p } => {
                let params = Argon2Params {
                    m_kib: *m_kib,
                    t: *t,
                    p: *p,
                };
                argon2id(&decode_salt(salt)?, secret, &params)
            }
        }
    }
}

fn decode_salt(salt: &str) -> Result<[u8; SALT_BYTES]> {
    hex::decode_exact::<SALT_BYTES>(salt).ok_or_else(|| CryptError::Damaged("bad kdf salt".into()))
}

struct KekLen;

impl hkdf::KeyType for KekLen {
    fn len(&self) -> usize {
        KEK_BYTES
    }
}

fn hkdf_sha256(salt: &[u8], secret: &[u8]) -> Result<SecretBytes> {
    let mut kek = SecretBytes::zeroed(KEK_BYTES)?;
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(secret);
    prk.expand(&[HKDF_INFO], KekLen)
        .and_then(|okm| okm.fill(kek.expose_mut()))
        .map_err(|_| CryptError::Io("HKDF-SHA256 failed".into()))?;
    Ok(kek)
}

fn argon2id(salt: &[u8], secret: &[u8], params: &Argon2Params) -> Result<SecretBytes> {
    let bad = |e: argon2::Error| CryptError::Invalid(format!("argon2id: {e}"));
    let p = argon2::Params::new(params.m_kib, params.t, params.p, Some(KEK_BYTES)).map_err(bad)?;
    let blocks_n = p.block_count();
    let hasher = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, p);
    // Reserved fallibly: a failure to get the memory is an error, not an
    // abort of the process.
    let mut blocks: Vec<argon2::Block> = Vec::new();
    blocks.try_reserve_exact(blocks_n).map_err(|_| {
        CryptError::Io(format!("cannot allocate {} KiB for argon2id", params.m_kib))
    })?;
    blocks.resize(blocks_n, argon2::Block::default());
    let mut kek = SecretBytes::zeroed(KEK_BYTES)?;
    let r = hasher.hash_password_into_with_memory(secret, salt, kek.expose_mut(), &mut blocks[..]);
    blocks.zeroize();
    r.map_err(bad)?;
    Ok(kek)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: Argon2Params = Argon2Params {
        m_kib: 8192,
        t: 1,
        p: 1,
    };

    #[test]
    fn classes_and_determinism() {
        let long = [9u8; 32];
        let rec = KdfRec::fresh(&long, &TINY).unwrap();
        assert!(matches!(rec, KdfRec::HkdfSha256 { .. }));
        assert!(rec.fits(32) && !rec.fits(31));
        let a = rec.derive(&long).unwrap();
        assert_eq!(a.expose(), rec.derive(&long).unwrap().expose());
        assert_ne!(a.expose(), rec.derive(&[8u8; 32]).unwrap().expose());

        let rec = KdfRec::fresh(b"pass", &TINY).unwrap();
        assert!(matches!(
            rec,
            KdfRec::Argon2id {
                m_kib: 8192,
                t: 1,
                p: 1,
                ..
            }
        ));
        assert!(rec.fits(31) && !rec.fits(32));
        let a = rec.derive(b"pass").unwrap();
        assert_eq!(a.len(), 32);
        assert_eq!(a.expose(), rec.derive(b"pass").unwrap().expose());
        assert_ne!(a.expose(), rec.derive(b"pasS").unwrap().expose());
        // A fresh salt gives a different KEK for the same passphrase.
        let other = KdfRec::fresh(b"pass", &TINY).unwrap();
        assert_ne!(a.expose(), other.derive(b"pass").unwrap().expose());
    }

    /// Outputs of the reference implementation's command line (Debian's
    /// `argon2` package): `printf password | argon2 SALT -id -t 1 -k 8192
    /// -p 1 -l 32 -r` with SALT 32 bytes of 0x01, and `printf 'correct
    /// horse' | argon2 0123456789abcdef0123456789abcdef -id -t 2 -k 8192
    /// -p 2 -l 32 -r`.
    #[test]
    fn argon2id_known_answers() {
        let a = argon2id(&[1u8; 32], b"password", &TINY).unwrap();
        assert_eq!(
            hex::encode(a.expose()),
            "8e1298379eb2f3639440145f2bcee5e8462d51eff39eee06f383a3c35651d5ea"
        );
        let params = Argon2Params {
            m_kib: 8192,
            t: 2,
            p: 2,
        };
        let b = argon2id(
            b"0123456789abcdef0123456789abcdef",
            b"correct horse",
            &params,
        )
        .unwrap();
        assert_eq!(
            hex::encode(b.expose()),
            "b5c5eed2f2fe76861280eceb64a887a2f93c0d5ad4a42a3240dc6f6d00c17805"
        );
    }

    /// HKDF-SHA256 (RFC 5869) computed independently with Python's hmac
    /// module: salt 00..1f, key material 32 bytes of 0x42, info "strata
    /// keyslot v1", 32 bytes out.
    #[test]
    fn hkdf_known_answer() {
        let salt: Vec<u8> = (0..32).collect();
        let kek = hkdf_sha256(&salt, &[0x42; 32]).unwrap();
        assert_eq!(
            hex::encode(kek.expose()),
            "21346c607685e424d61d489ce7a5a8d7556d12e912d78f7f2820989b0f19ec06"
        );
    }

    #[test]
    fn bounds() {
        assert!(Argon2Params::default().problem().is_none());
        assert!(TINY.problem().is_none());
        for bad in [
            Argon2Params {
                m_kib: MAX_M_KIB + 1,
                t: 1,
                p: 1,
            },
            Argon2Params {
                m_kib: 8192,
                t: 0,
                p: 1,
            },
            Argon2Params {
                m_kib: 8192,
                t: 101,
                p: 1,
            },
            Argon2Params {
                m_kib: 8192,
                t: 1,
                p: 0,
            },
            Argon2Params {
                m_kib: 8192,
                t: 1,
                p: 17,
            },
            Argon2Params {
                m_kib: 15,
                t: 1,
                p: 2,
            },
        ] {
            assert!(bad.problem().is_some(), "{bad:?}");
            assert!(matches!(
                KdfRec::fresh(b"pw", &bad),
                Err(CryptError::Invalid(_))
            ));
            let rec = KdfRec::Argon2id {
                salt: "00".repeat(32),
                m_kib: bad.m_kib,
                t: bad.t,
                p: bad.p,
            };
            assert!(
                matches!(rec.derive(b"pw"), Err(CryptError::Damaged(_))),
                "{bad:?}"
            );
        }
        assert!(KdfRec::HkdfSha256 {
            salt: "00".repeat(31)
        }
        .problem()
        .is_some());
        assert!(KdfRec::HkdfSha256 {
            salt: "AA".repeat(32)
        }
        .problem()
        .is_some());
        assert!(matches!(
            KdfRec::fresh(b"", &TINY),
            Err(CryptError::Invalid(_))
        ));
    }

    #[test]
    fn json_shape() {
        let rec = KdfRec::Argon2id {
            salt: "ab".repeat(32),
            m_kib: 8192,
            t: 1,
            p: 1,
        };
        let j = serde_json::to_string(&rec).unwrap();
        assert!(j.starts_with(r#"{"name":"argon2id","salt":"#), "{j}");
        let rec = KdfRec::HkdfSha256 {
            salt: "ab".repeat(32),
        };
        let j = serde_json::to_string(&rec).unwrap();
        assert!(j.starts_with(r#"{"name":"hkdf-sha256","salt":"#), "{j}");
        assert_eq!(serde_json::from_str::<KdfRec>(&j).unwrap(), rec);
    }

    /// `cargo test -p strata-crypt --release -- --ignored --nocapture argon2_default`
    #[test]
    #[ignore = "a measurement, run it with --release"]
    fn argon2_default_timing() {
        let rec = KdfRec::fresh(b"a passphrase", &Argon2Params::default()).unwrap();
        for _ in 0..3 {
            let t = std::time::Instant::now();
            rec.derive(b"a passphrase").unwrap();
            println!(
                "argon2id m=256 MiB t=3 p=2: {:.2} s",
                t.elapsed().as_secs_f64()
            );
        }
    }
}
