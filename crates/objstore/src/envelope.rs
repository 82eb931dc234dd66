//! The envelope around the JSON objects of an object-store datastore (the
//! root object, manifests, names, holds; docs/FORMAT.md §11.3, §11.5):
//! an 8-byte magic naming the kind, the body's length (u32 LE) and its
//! CRC-32C (u32 LE), then the body. A short, long or altered object fails
//! with a message that names its key.

use crate::corrupt;

pub const HEADER_BYTES: usize = 16;

/// Wrap `body` for storing under the kind `magic`.
pub fn seal(magic: &[u8; 8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The body of `obj` (stored under `key`), checked against `magic`.
pub fn open<'a>(magic: &[u8; 8], key: &str, obj: &'a [u8]) -> crate::Result<&'a [u8]> {
    if obj.len() < HEADER_BYTES {
        return Err(corrupt(format!(
            "{key}: {} bytes, shorter than the 16-byte header (torn or not strata's)",
            obj.len()
        )));
    }
    if &obj[..8] != magic {
        return Err(corrupt(format!(
            "{key}: magic {:?} where {:?} belongs (not this kind of object)",
            String::from_utf8_lossy(&obj[..8]),
            String::from_utf8_lossy(magic)
        )));
    }
    let len = u32::from_le_bytes(obj[8..12].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(obj[12..16].try_into().unwrap());
    let body = &obj[HEADER_BYTES..];
    if body.len() != len {
        return Err(corrupt(format!(
            "{key}: the header gives a {len}-byte body, the object has {} (torn)",
            body.len()
        )));
    }
    let actual = crc32c::crc32c(body);
    if actual != crc {
        return Err(corrupt(format!(
            "{key}: checksum mismatch (stored {crc:#010x}, computed {actual:#010x})"
        )));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_body_opens_and_any_damage_is_named() {
        let s = seal(b"STRTEST1", b"{\"a\": 1}");
        assert_eq!(open(b"STRTEST1", "k", &s).unwrap(), b"{\"a\": 1}");
        let e = open(b"STRMAN01", "k", &s).unwrap_err();
        assert!(e.message.contains("magic"), "{e}");
        let e = open(b"STRTEST1", "k", &s[..s.len() - 1]).unwrap_err();
        assert!(e.message.contains("torn"), "{e}");
        let e = open(b"STRTEST1", "k", &s[..7]).unwrap_err();
        assert!(e.message.contains("shorter"), "{e}");
        for i in 8..s.len() {
            let mut d = s.clone();
            d[i] ^= 0x10;
            assert!(
                open(b"STRTEST1", "k", &d).is_err(),
                "flip at {i} not caught"
            );
        }
    }
}
