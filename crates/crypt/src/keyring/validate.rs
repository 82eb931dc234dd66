//! The structural check of a keyring record.

use std::collections::HashSet;

use super::{
    decode_b64, KeyringRec, Keyslot, WrappedKey, KEYRING_KEY_BYTES, MAX_KEYS, MAX_OWN_KEYS,
    MAX_SLOTS, SOURCES,
};
use crate::wrap::WRAP_OVERHEAD;
use crate::{hex, CryptError, Result, CIPHER_NAME, DEK_BYTES, SECTOR_BYTES};

fn damaged<T>(why: String) -> Result<T> {
    Err(CryptError::Damaged(why))
}

/// Checks that `s` is base64 of exactly `len` bytes; the length is checked
/// before decoding so an oversized string is never decoded.
fn check_wrapped(what: &str, s: &str, len: usize) -> Result<()> {
    let encoded = len.div_ceil(3) * 4;
    if s.len() != encoded {
        return damaged(format!(
            "{what}: wrapped value is {} base64 characters, not {encoded}",
            s.len()
        ));
    }
    let raw = decode_b64(what, s)?;
    if raw.len() != len {
        return damaged(format!(
            "{what}: wrapped value is {} bytes, not {len}",
            raw.len()
        ));
    }
    Ok(())
}

fn check_slot(s: &Keyslot) -> Result<()> {
    let what = format!("slot {}", s.slot);
    if s.slot as usize >= MAX_SLOTS {
        return damaged(format!(
            "{what}: slot numbers run from 0 to {}",
            MAX_SLOTS - 1
        ));
    }
    if !SOURCES.contains(&s.source.as_str()) {
        return damaged(format!("{what}: unknown source {:?}", s.source));
    }
    if let Some(why) = s.kdf.problem() {
        return damaged(format!("{what}: {why}"));
    }
    check_wrapped(&what, &s.wrapped, KEYRING_KEY_BYTES + WRAP_OVERHEAD)
}

fn check_key(k: &WrappedKey) -> Result<()> {
    check_wrapped(
        &format!("key {}", k.index),
        &k.wrapped,
        DEK_BYTES + WRAP_OVERHEAD,
    )
}

impl KeyringRec {
    /// Structural check (what a catalog loader calls; also the fuzz
    /// target): uuid hex, cipher known, sector_bytes 512, 1..=8 slots with
    /// unique slot numbers, ≥1 key with unique indexes, base64 decodes to
    /// plausible lengths, kdf params sane. Damaged(what, naming slot/key)
    /// otherwise.
    pub fn validate(&self) -> Result<()> {
        let name = &self.uuid;
        if hex::decode_exact::<16>(name).is_none() {
            return damaged(format!(
                "keyring {}: uuid {name:?} is not 32 lowercase hex digits",
                self.id
            ));
        }
        if self.cipher != CIPHER_NAME {
            return damaged(format!(
                "keyring {name}: unknown cipher {:?} (only {CIPHER_NAME})",
                self.cipher
            ));
        }
        if self.sector_bytes as usize != SECTOR_BYTES {
            return damaged(format!(
                "keyring {name}: sector size {} (only {SECTOR_BYTES})",
                self.sector_bytes
            ));
        }
        let n = self.slots.len();
        if n == 0 || n > MAX_SLOTS {
            return damaged(format!(
                "keyring {name}: {n} keyslots (1 to {MAX_SLOTS} allowed)"
            ));
        }
        let n = self.keys.len();
        if n == 0 || n > MAX_KEYS {
            return damaged(format!(
                "keyring {name}: {n} data keys (1 to {MAX_KEYS} allowed)"
            ));
        }
        let mut seen = HashSet::new();
        for s in &self.slots {
            if !seen.insert(s.slot) {
                return damaged(format!("keyring {name}: slot {} appears twice", s.slot));
            }
            check_slot(s).map_err(|e| in_keyring(name, e))?;
        }
        seen.clear();
        for k in &self.keys {
            if !seen.insert(k.index) {
                return damaged(format!("keyring {name}: key {} appears twice", k.index));
            }
            check_key(k).map_err(|e| in_keyring(name, e))?;
        }
        self.check_own(&seen)?;
        if let Some(d) = self.deep_rekey {
            let highest = self.keys.iter().map(|k| k.index).max().unwrap_or(0);
            if d.from >= d.to || d.to != highest || !seen.contains(&d.from) {
                return damaged(format!(
                    "keyring {name}: a deep rekey from key {} to key {} does not fit its keys \
                     (the new one is the highest, the old one among them)",
                    d.from, d.to
                ));
            }
        }
        Ok(())
    }
}

impl KeyringRec {
    /// The own keys (FORMAT.md §16.4): indexes 1, 2, … in order, each
    /// naming a data key of the record (`indexes`), no two the same, and
    /// neither end of a deep rekey.
    fn check_own(&self, indexes: &HashSet<u32>) -> Result<()> {
        let name = &self.uuid;
        if self.own.len() > MAX_OWN_KEYS {
            return damaged(format!(
                "keyring {name}: {} own keys (at most {MAX_OWN_KEYS})",
                self.own.len()
            ));
        }
        let mut keys = HashSet::new();
        for (n, o) in self.own.iter().enumerate() {
            if usize::from(o.bits) != n + 1 {
                return damaged(format!(
                    "keyring {name}: own key {} where {} belongs (they count from 1 in order)",
                    o.bits,
                    n + 1
                ));
            }
            if o.from.len() != 32
                || !o
                    .from
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                || o.from == self.uuid
            {
                return damaged(format!(
                    "keyring {name}: own key {} says it was made from keyring '{}', which is no \
                     other keyring's uuid",
                    o.bits, o.from
                ));
            }
            if !indexes.contains(&o.key) || !keys.insert(o.key) {
                return damaged(format!(
                    "keyring {name}: own key {} names data key {}, which it lacks or another \
                     own key names",
                    o.bits, o.key
                ));
            }
        }
        if let Some(d) = self.deep_rekey {
            if self.own.iter().any(|o| o.key == d.from || o.key == d.to) {
                return damaged(format!(
                    "keyring {name}: a deep rekey from or to own key (index {} or {})",
                    d.from, d.to
                ));
            }
        }
        if keys.len() == indexes.len() {
            return damaged(format!(
                "keyring {name}: every data key is an own key (none for key index 0)"
            ));
        }
        Ok(())
    }
}

fn in_keyring(name: &str, e: CryptError) -> CryptError {
    match e {
        CryptError::Damaged(why) => CryptError::Damaged(format!("keyring {name}: {why}")),
        other => other,
    }
}
