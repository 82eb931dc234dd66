//! Secrets on their way from the CLI to whoever opens an encrypted disk's
//! keys (docs/SECURITY.md, "Encryption at rest"): the CLI reads a key
//! file, a kernel keyring key or a helper's output and sends the bytes
//! over the control socket (mode 0600) to a server, or uses them in its
//! own process. A [`Secret`] never prints: its `Debug` is redacted, so a
//! request's description, an event or a log line cannot carry it.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A user's secret bytes, wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: Vec<u8>) -> Secret {
        Secret(bytes)
    }

    /// The bytes, for the code that derives a key from them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// Overwrite `bytes` with zeros, in writes the optimiser keeps.
pub fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: a valid, aligned pointer to a byte we own; volatile so
        // the wipe is not optimised away.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
}

/// Wipe, then drop, a string that held a secret (a control request's
/// line, a secret's hex).
pub fn wipe_string(s: String) {
    wipe(&mut s.into_bytes());
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} bytes, redacted>)", self.0.len())
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut text = String::with_capacity(self.0.len() * 2);
        for &b in &self.0 {
            text.push(HEX[(b >> 4) as usize] as char);
            text.push(HEX[(b & 15) as usize] as char);
        }
        let r = s.serialize_str(&text);
        // The text copy is wiped like the secret.
        wipe_string(text);
        r
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        let text = String::deserialize(d)?;
        let r = Self::from_hex(text.as_bytes());
        wipe_string(text);
        r.map_err(serde::de::Error::custom)
    }
}

impl Secret {
    /// The bytes `b` (lowercase hex) stand for.
    fn from_hex(b: &[u8]) -> Result<Secret, &'static str> {
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        if !b.len().is_multiple_of(2) {
            return Err("a secret is an even number of hex digits");
        }
        // A Secret from the start, so a half-decoded one is wiped too.
        let mut out = Secret(Vec::with_capacity(b.len() / 2));
        for pair in b.chunks(2) {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(h), Some(l)) => out.0.push(h << 4 | l),
                _ => return Err("a secret is lowercase hex"),
            }
        }
        Ok(out)
    }
}

/// A secret with how it was given, for a new keyslot (`create --encrypt`,
/// `key add`, `rekey`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGrant {
    pub secret: Secret,
    /// `file`, `keyring` or `helper` (shown by `key list`).
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_round_trips_and_never_prints() {
        let s = Secret::new(b"hunter2\x00\xff".to_vec());
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, "\"68756e7465723200ff\"");
        assert_eq!(serde_json::from_str::<Secret>(&json).unwrap(), s);
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(serde_json::from_str::<Secret>("\"6g\"").is_err());
        assert!(serde_json::from_str::<Secret>("\"abc\"").is_err());
    }
}
