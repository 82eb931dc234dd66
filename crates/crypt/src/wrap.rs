//! Wrapping small secrets (keys) with AES-256-GCM-SIV.
//!
//! A wrapped secret is `nonce (12) || ciphertext || tag (16)` with a random
//! nonce; GCM-SIV keeps a repeated nonce from being fatal, which matters
//! little at the handful of wraps a keyring sees but costs nothing.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM_SIV, NONCE_LEN};

use crate::{CryptError, Result, SecretBytes};

/// Length of a wrapping key (AES-256).
pub const WRAP_KEY_BYTES: usize = 32;
const TAG_LEN: usize = 16;
/// Bytes a wrapped secret adds to the secret: the nonce and the tag.
pub const WRAP_OVERHEAD: usize = NONCE_LEN + TAG_LEN;

fn aead_key(key: &SecretBytes) -> Result<LessSafeKey> {
    if key.len() != WRAP_KEY_BYTES {
        return Err(CryptError::Invalid(format!(
            "a wrapping key is {WRAP_KEY_BYTES} bytes, not {}",
            key.len()
        )));
    }
    let unbound = UnboundKey::new(&AES_256_GCM_SIV, key.expose())
        .map_err(|_| CryptError::Io("aws-lc refused an AES-256-GCM-SIV key".into()))?;
    Ok(LessSafeKey::new(unbound))
}

/// Wraps `secret` under the 32-byte `key`, bound to `aad`: returns
/// `nonce || ciphertext || tag`.
pub fn wrap_secret(key: &SecretBytes, secret: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
    let key = aead_key(key)?;
    let mut nonce = [0u8; NONCE_LEN];
    aws_lc_rs::rand::fill(&mut nonce)
        .map_err(|_| CryptError::Io("the random generator failed".into()))?;
    // Sized once, so the plaintext copied in is encrypted where it lies and
    // never left behind by a reallocation.
    let mut out = Vec::with_capacity(secret.len() + WRAP_OVERHEAD);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(secret);
    let tag = key
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut out[NONCE_LEN..],
        )
        .map_err(|_| CryptError::Io("AES-256-GCM-SIV sealing failed".into()))?;
    out.extend_from_slice(tag.as_ref());
    Ok(out)
}

/// Opens what [`wrap_secret`] made with the same `key` and `aad`.
///
/// `WrongKey` when the tag does not match (wrong key, wrong `aad`, or any
/// byte changed); `Damaged` when `wrapped` is too short to hold a tag.
pub fn unwrap_secret(key: &SecretBytes, wrapped: &[u8], aad: &[u8]) -> Result<SecretBytes> {
    let key = aead_key(key)?;
    if wrapped.len() < WRAP_OVERHEAD {
        return Err(CryptError::Damaged(format!(
            "a wrapped secret of {} bytes is shorter than its nonce and tag",
            wrapped.len()
        )));
    }
    let (nonce, sealed) = wrapped.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce)
        .map_err(|_| CryptError::Damaged("bad nonce".into()))?;
    let mut work = SecretBytes::from_slice(sealed)?;
    let plain = key
        .open_in_place(nonce, Aad::from(aad), work.expose_mut())
        .map_err(|_| CryptError::WrongKey)?;
    SecretBytes::from_slice(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let key = SecretBytes::random(32).unwrap();
        for len in [0usize, 1, 32, 64, 1000] {
            let secret = SecretBytes::random(len).unwrap();
            let w = wrap_secret(&key, secret.expose(), b"aad").unwrap();
            assert_eq!(w.len(), len + WRAP_OVERHEAD);
            let back = unwrap_secret(&key, &w, b"aad").unwrap();
            assert_eq!(back.expose(), secret.expose());
        }
    }

    #[test]
    fn nonces_differ() {
        let key = SecretBytes::random(32).unwrap();
        let a = wrap_secret(&key, b"same", b"").unwrap();
        let b = wrap_secret(&key, b"same", b"").unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn any_flipped_byte_is_wrong_key() {
        let key = SecretBytes::random(32).unwrap();
        let w = wrap_secret(&key, &[7u8; 32], b"slot 0").unwrap();
        for i in 0..w.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = w.clone();
                bad[i] ^= bit;
                let e = unwrap_secret(&key, &bad, b"slot 0").unwrap_err();
                assert!(matches!(e, CryptError::WrongKey), "byte {i}: {e}");
            }
        }
    }

    #[test]
    fn wrong_aad_or_key_is_wrong_key() {
        let key = SecretBytes::random(32).unwrap();
        let w = wrap_secret(&key, b"secret", b"slot 0").unwrap();
        for aad in [&b"slot 1"[..], b"", b"slot 0 "] {
            assert!(matches!(
                unwrap_secret(&key, &w, aad),
                Err(CryptError::WrongKey)
            ));
        }
        let other = SecretBytes::random(32).unwrap();
        assert!(matches!(
            unwrap_secret(&other, &w, b"slot 0"),
            Err(CryptError::WrongKey)
        ));
    }

    #[test]
    fn short_or_bad_key_lengths() {
        let key = SecretBytes::random(32).unwrap();
        let e = unwrap_secret(&key, &[0u8; WRAP_OVERHEAD - 1], b"").unwrap_err();
        assert!(matches!(e, CryptError::Damaged(_)), "{e}");
        let short = SecretBytes::random(16).unwrap();
        assert!(matches!(
            wrap_secret(&short, b"x", b""),
            Err(CryptError::Invalid(_))
        ));
    }
}
