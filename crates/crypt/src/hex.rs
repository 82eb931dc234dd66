//! Lowercase hexadecimal, as the key records store uuids and salts.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex.
pub(crate) fn encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Decodes exactly `N` bytes from `2 * N` lowercase hex digits; `None` for
/// any other length or character (upper case included).
pub(crate) fn decode_exact<const N: usize>(s: &str) -> Option<[u8; N]> {
    let raw = s.as_bytes();
    if raw.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(raw.chunks_exact(2)) {
        *o = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_strictness() {
        let b = [0u8, 1, 0x7f, 0x80, 0xab, 0xff];
        let s = encode(&b);
        assert_eq!(s, "00017f80abff");
        assert_eq!(decode_exact::<6>(&s), Some(b));
        assert_eq!(decode_exact::<6>("00017F80ABFF"), None);
        assert_eq!(decode_exact::<5>(&s), None);
        assert_eq!(decode_exact::<1>("g0"), None);
        assert_eq!(decode_exact::<1>("é"), None);
    }
}
