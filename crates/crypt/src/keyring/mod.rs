//! Keyrings: one disk lineage's keys as a catalog record.
//!
//! A keyring has a random 32-byte keyring key (KK) and data keys (DEKs,
//! 64 bytes each, numbered). Each keyslot holds the KK wrapped under a KEK
//! derived from one user secret, with the AAD `"strata-slot" || uuid (16
//! bytes) || slot (u32 LE)`; each DEK is stored wrapped by the KK with the
//! AAD `"strata-dek" || uuid || index (u32 LE)`. Changing secrets rewraps
//! only the KK, never the data.

use std::fmt;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::kdf::{Argon2Params, KdfRec};
use crate::wrap::{unwrap_secret, wrap_secret};
use crate::{hex, CryptError, Result, SecretBytes, Xts, CIPHER_NAME, DEK_BYTES, SECTOR_BYTES};

mod validate;

/// Most keyslots a keyring holds.
pub const MAX_SLOTS: usize = 8;
/// Most data keys a keyring holds (a bound for hostile records).
pub const MAX_KEYS: usize = 4096;
/// Most own keys a keyring holds: generations of own-key clones, key
/// indexes 1 to 15 of a leaf entry (FORMAT.md §16.4).
pub const MAX_OWN_KEYS: usize = 15;
/// Length of the keyring key (KK).
pub const KEYRING_KEY_BYTES: usize = 32;
/// The keyslot sources a record may name.
const SOURCES: [&str; 4] = ["file", "keyring", "helper", "passphrase"];

/// The catalog record of one keyring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyringRec {
    /// The catalog's number for this keyring.
    pub id: u64,
    /// 32 lowercase hex chars (16 random bytes, bound into every AAD).
    pub uuid: String,
    /// "aes-xts-plain64".
    pub cipher: String,
    /// 512.
    pub sector_bytes: u32,
    /// The data keys, wrapped by the KK; at least one.
    pub keys: Vec<WrappedKey>,
    /// The keyslots; 1 to [`MAX_SLOTS`].
    pub slots: Vec<Keyslot>,
    /// A deep rekey under way (FORMAT.md §16.4): absent outside one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deep_rekey: Option<DeepRekey>,
    /// The own keys of an own-key clone and of the own-key clones it
    /// descends from (FORMAT.md §16.4), by the key index a leaf entry
    /// names them with; empty for every other keyring.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own: Vec<OwnKey>,
}

/// An own key (FORMAT.md §16.4): the grains whose leaf entry carries key
/// index `bits` are under data key `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnKey {
    /// The key index, 1 to [`MAX_OWN_KEYS`].
    pub bits: u8,
    /// The data key's index in `keys`.
    pub key: u32,
    /// The uuid of the keyring the clone was made from, whose grains it
    /// may still read under the key they were written with (§16.4).
    pub from: String,
}

/// Where a deep rekey stands: grains at virtual grain `v < next_grain` are
/// under data key `to`, the others under `from` (FORMAT.md §16.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeepRekey {
    /// The data key being replaced.
    pub from: u32,
    /// The new data key (the highest index).
    pub to: u32,
    /// The first virtual grain not re-encrypted yet.
    pub next_grain: u64,
}

/// One data key wrapped by the keyring key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrappedKey {
    /// The key's number; the highest is the one new data uses.
    pub index: u32,
    /// When the key was made (seconds since the Unix epoch).
    pub created_unix: u64,
    /// nonce || ciphertext || tag, base64 (standard alphabet, padded).
    pub wrapped: String,
}

/// One keyslot: the keyring key wrapped under one user secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keyslot {
    /// The slot's number, 0 to 7.
    pub slot: u32,
    /// How the secret was supplied ("file", "keyring", "helper",
    /// "passphrase"), for display.
    pub source: String,
    /// A free-form note for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// When the slot was made (seconds since the Unix epoch).
    pub created_unix: u64,
    /// How the KEK is derived from the secret.
    pub kdf: KdfRec,
    /// The KK wrapped under the KEK: nonce || ciphertext || tag, base64.
    pub wrapped: String,
}

/// A keyslot to make. `Debug` leaves the secret out.
#[derive(Clone, Copy)]
pub struct NewSlot<'a> {
    /// The user secret: 32 bytes or more is key material (HKDF), shorter is
    /// a passphrase (Argon2id with `argon2`).
    pub secret: &'a [u8],
    /// "file", "keyring", "helper" or "passphrase".
    pub source: &'a str,
    /// A free-form note for display.
    pub label: Option<&'a str>,
    /// Argon2id cost, used when the secret is a passphrase.
    pub argon2: Argon2Params,
    /// The creation time to record.
    pub now_unix: u64,
}

impl<'a> NewSlot<'a> {
    /// A keyslot for a key file's bytes `secret`, made at `now_unix`, with
    /// no label (Argon2id's default costs, used only if the secret is
    /// shorter than key material).
    pub fn key_file(secret: &'a [u8], now_unix: u64) -> Self {
        NewSlot {
            secret,
            source: "file",
            label: None,
            argon2: Argon2Params::default(),
            now_unix,
        }
    }
}

impl fmt::Debug for NewSlot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewSlot")
            .field(
                "secret",
                &format_args!("<{} bytes, redacted>", self.secret.len()),
            )
            .field("source", &self.source)
            .field("label", &self.label)
            .field("argon2", &self.argon2)
            .field("now_unix", &self.now_unix)
            .finish()
    }
}

/// Data keys opened, by index.
type OpenedKeys = Vec<(u32, Arc<Xts>)>;

/// The unwrapped keys of a keyring (what an unlocked disk holds).
pub struct Unlocked {
    uuid: [u8; 16],
    kk: SecretBytes,
    /// Sorted by index, never empty.
    keys: Vec<(u32, Arc<Xts>)>,
}

impl Unlocked {
    /// The data key new writes use: the highest index.
    pub fn current(&self) -> &Arc<Xts> {
        &self
            .keys
            .last()
            .expect("an Unlocked holds at least one key")
            .1
    }

    /// The data key numbered `index`, if the keyring has it.
    pub fn key(&self, index: u32) -> Option<&Arc<Xts>> {
        let at = self.keys.binary_search_by_key(&index, |(i, _)| *i).ok()?;
        Some(&self.keys[at].1)
    }

    /// The index of [`Unlocked::current`].
    pub fn current_index(&self) -> u32 {
        self.keys
            .last()
            .expect("an Unlocked holds at least one key")
            .0
    }

    /// The keyring's uuid, as in its record.
    pub fn uuid(&self) -> String {
        hex::encode(&self.uuid)
    }
}

impl fmt::Debug for Unlocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let indexes: Vec<u32> = self.keys.iter().map(|(i, _)| *i).collect();
        f.debug_struct("Unlocked")
            .field("uuid", &self.uuid())
            .field("keys", &indexes)
            .field("kk", &"<redacted>")
            .finish()
    }
}

fn slot_aad(uuid: &[u8; 16], slot: u32) -> Vec<u8> {
    [&b"strata-slot"[..], uuid, &slot.to_le_bytes()].concat()
}

fn dek_aad(uuid: &[u8; 16], index: u32) -> Vec<u8> {
    [&b"strata-dek"[..], uuid, &index.to_le_bytes()].concat()
}

fn random_uuid() -> Result<[u8; 16]> {
    let mut u = [0u8; 16];
    aws_lc_rs::rand::fill(&mut u)
        .map_err(|_| CryptError::Io("the random generator failed".into()))?;
    // Shaped as an RFC 9562 version 4 uuid.
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

/// A keyslot numbered `slot` holding `kk` wrapped for `new.secret`.
fn make_slot(uuid: &[u8; 16], slot: u32, kk: &SecretBytes, new: &NewSlot) -> Result<Keyslot> {
    if !SOURCES.contains(&new.source) {
        return Err(CryptError::Invalid(format!(
            "unknown key source {:?} (one of {})",
            new.source,
            SOURCES.join(", ")
        )));
    }
    let kdf = KdfRec::fresh(new.secret, &new.argon2)?;
    let kek = kdf.derive(new.secret)?;
    let wrapped = wrap_secret(&kek, kk.expose(), &slot_aad(uuid, slot))?;
    Ok(Keyslot {
        slot,
        source: new.source.to_string(),
        label: new.label.map(str::to_string),
        created_unix: new.now_unix,
        kdf,
        wrapped: B64.encode(wrapped),
    })
}

fn decode_b64(what: &str, s: &str) -> Result<Vec<u8>> {
    B64.decode(s)
        .map_err(|e| CryptError::Damaged(format!("{what}: bad base64: {e}")))
}

impl KeyringRec {
    /// New keyring with a random KK, DEK index 0 and one slot (slot 0).
    pub fn create(id: u64, first: &NewSlot) -> Result<(KeyringRec, Unlocked)> {
        let uuid = random_uuid()?;
        let kk = SecretBytes::random(KEYRING_KEY_BYTES)?;
        let dek = SecretBytes::random(DEK_BYTES)?;
        let xts = Arc::new(Xts::new(&dek)?);
        let wrapped = wrap_secret(&kk, dek.expose(), &dek_aad(&uuid, 0))?;
        let slot = make_slot(&uuid, 0, &kk, first)?;
        let rec = KeyringRec {
            id,
            uuid: hex::encode(&uuid),
            cipher: CIPHER_NAME.to_string(),
            sector_bytes: SECTOR_BYTES as u32,
            keys: vec![WrappedKey {
                index: 0,
                created_unix: first.now_unix,
                wrapped: B64.encode(wrapped),
            }],
            slots: vec![slot],
            deep_rekey: None,
            own: Vec::new(),
        };
        Ok((
            rec,
            Unlocked {
                uuid,
                kk,
                keys: vec![(0, xts)],
            },
        ))
    }

    fn uuid_bytes(&self) -> Result<[u8; 16]> {
        hex::decode_exact::<16>(&self.uuid).ok_or_else(|| {
            CryptError::Damaged(format!(
                "uuid {:?} is not 32 lowercase hex digits",
                self.uuid
            ))
        })
    }

    /// Try every slot (hkdf slots first, since argon2 is slow; a slot whose
    /// kdf cannot match the secret length class is skipped: secrets ≥32
    /// bytes only open hkdf slots, shorter only argon2 slots); WrongKey if
    /// none opens. Then unwrap every DEK (a DEK that fails its tag while the
    /// KK opened = Damaged naming the index).
    pub fn unlock(&self, secret: &[u8]) -> Result<Unlocked> {
        self.unlock_slot(secret).map(|(_, u)| u)
    }

    /// [`Self::unlock`], with the slot that opened (one KDF run, where
    /// `slot_of` then `unlock` would run a passphrase's Argon2 twice).
    pub fn unlock_slot(&self, secret: &[u8]) -> Result<(u32, Unlocked)> {
        self.validate()?;
        let uuid = self.uuid_bytes()?;
        let (slot, kk) = self.open_kk(&uuid, secret)?;
        let mut keys = Vec::with_capacity(self.keys.len());
        for k in &self.keys {
            keys.push((k.index, Arc::new(self.open_dek(&uuid, &kk, k)?)));
        }
        keys.sort_by_key(|(i, _)| *i);
        Ok((slot, Unlocked { uuid, kk, keys }))
    }

    /// The first slot that `secret` opens, with the KK.
    fn open_kk(&self, uuid: &[u8; 16], secret: &[u8]) -> Result<(u32, SecretBytes)> {
        if secret.is_empty() {
            return Err(CryptError::Invalid("the secret is empty".into()));
        }
        let mut order: Vec<&Keyslot> = self
            .slots
            .iter()
            .filter(|s| s.kdf.fits(secret.len()))
            .collect();
        order.sort_by_key(|s| (matches!(s.kdf, KdfRec::Argon2id { .. }), s.slot));
        for s in order {
            let kek = s.kdf.derive(secret)?;
            let wrapped = decode_b64(&format!("slot {}", s.slot), &s.wrapped)?;
            match unwrap_secret(&kek, &wrapped, &slot_aad(uuid, s.slot)) {
                Ok(kk) if kk.len() == KEYRING_KEY_BYTES => return Ok((s.slot, kk)),
                Ok(kk) => {
                    return Err(CryptError::Damaged(format!(
                        "slot {}: the keyring key is {} bytes, not {KEYRING_KEY_BYTES}",
                        s.slot,
                        kk.len()
                    )))
                }
                Err(CryptError::WrongKey) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(CryptError::WrongKey)
    }

    fn open_dek(&self, uuid: &[u8; 16], kk: &SecretBytes, k: &WrappedKey) -> Result<Xts> {
        let what = format!("key {}", k.index);
        let wrapped = decode_b64(&what, &k.wrapped)?;
        let dek = match unwrap_secret(kk, &wrapped, &dek_aad(uuid, k.index)) {
            Ok(dek) => dek,
            Err(CryptError::WrongKey) => {
                return Err(CryptError::Damaged(format!(
                    "{what} does not open with the keyring key"
                )))
            }
            Err(e) => return Err(e),
        };
        if dek.len() != DEK_BYTES {
            return Err(CryptError::Damaged(format!(
                "{what} is {} bytes, not {DEK_BYTES}",
                dek.len()
            )));
        }
        Xts::new(&dek).map_err(|e| CryptError::Damaged(format!("{what}: {e}")))
    }

    /// Checks that `keys` are this keyring's: the same uuid and a KK that
    /// opens the first data key.
    fn check_keys(&self, keys: &Unlocked) -> Result<[u8; 16]> {
        self.validate()?;
        let uuid = self.uuid_bytes()?;
        if uuid != keys.uuid {
            return Err(CryptError::Invalid(format!(
                "the unlocked keys belong to keyring {}, not {}",
                keys.uuid(),
                self.uuid
            )));
        }
        let first = &self.keys[0];
        self.open_dek(&uuid, &keys.kk, first).map_err(|_| {
            CryptError::Invalid(format!(
                "the unlocked keys do not open keyring {}",
                self.uuid
            ))
        })?;
        Ok(uuid)
    }

    /// Add a slot for another secret (lowest free slot number); Invalid
    /// when 8 exist. Returns the slot number.
    pub fn add_slot(&mut self, keys: &Unlocked, new: &NewSlot) -> Result<u32> {
        let uuid = self.check_keys(keys)?;
        if self.slots.len() >= MAX_SLOTS {
            return Err(CryptError::Invalid(format!(
                "keyring {} has {MAX_SLOTS} keyslots already; remove one first",
                self.uuid
            )));
        }
        let free = (0..MAX_SLOTS as u32)
            .find(|n| self.slots.iter().all(|s| s.slot != *n))
            .ok_or_else(|| CryptError::Invalid("no free keyslot number".into()))?;
        let slot = make_slot(&uuid, free, &keys.kk, new)?;
        self.slots.push(slot);
        self.slots.sort_by_key(|s| s.slot);
        Ok(free)
    }

    /// Remove a slot; Invalid if it is the last one or absent.
    pub fn remove_slot(&mut self, slot: u32) -> Result<()> {
        let at = self
            .slots
            .iter()
            .position(|s| s.slot == slot)
            .ok_or_else(|| {
                CryptError::Invalid(format!("keyring {} has no keyslot {slot}", self.uuid))
            })?;
        if self.slots.len() == 1 {
            return Err(CryptError::Invalid(format!(
                "keyslot {slot} is the last one of keyring {}: add another before removing it",
                self.uuid
            )));
        }
        self.slots.remove(at);
        Ok(())
    }

    /// Which slot this secret opens (for `key remove --key-file`), or
    /// WrongKey.
    pub fn slot_of(&self, secret: &[u8]) -> Result<u32> {
        self.validate()?;
        let uuid = self.uuid_bytes()?;
        Ok(self.open_kk(&uuid, secret)?.0)
    }

    /// Shallow rekey: replace ALL slots by one new slot for `new` (same KK
    /// and DEKs; no data touched).
    ///
    /// The old secrets stop opening this record, but a copy of the old
    /// record still opens with them and yields the same KK and DEKs: only a
    /// new data key (and rewriting the data) takes access away from someone
    /// who kept both.
    pub fn rekey_shallow(&mut self, keys: &Unlocked, new: &NewSlot) -> Result<()> {
        let uuid = self.check_keys(keys)?;
        let slot = make_slot(&uuid, 0, &keys.kk, new)?;
        self.slots = vec![slot];
        Ok(())
    }

    /// The data key of the grains whose entries carry key index 0: the
    /// newest key that is no own key (during a deep rekey, its new one).
    pub fn base_index(&self) -> u32 {
        self.keys
            .iter()
            .map(|k| k.index)
            .filter(|i| self.own.iter().all(|o| o.key != *i))
            .max()
            .unwrap_or(0)
    }

    /// The key index a write through this keyring's disks gives its
    /// grains: its newest own key's, or 0 (always 0 during a deep rekey:
    /// the data cipher's split then says the key, §16.4).
    pub fn write_bits(&self) -> u8 {
        if self.deep_rekey.is_some() {
            return 0;
        }
        self.own.iter().map(|o| o.bits).max().unwrap_or(0)
    }

    /// The cipher of the grains whose entries carry key index `bits` ≥ 1
    /// (an own key, FORMAT.md §16.4); Damaged when the record has none.
    pub fn own_cipher(&self, keys: &Unlocked, bits: u8) -> Result<Arc<Xts>> {
        let o = self.own.iter().find(|o| o.bits == bits).ok_or_else(|| {
            CryptError::Damaged(format!("keyring {}: no own key {bits}", self.uuid))
        })?;
        self.unlocked_key(keys, o.key)
    }

    fn unlocked_key(&self, keys: &Unlocked, i: u32) -> Result<Arc<Xts>> {
        keys.key(i).cloned().ok_or_else(|| {
            CryptError::Damaged(format!("keyring {}: key {i} is not unlocked", self.uuid))
        })
    }

    /// The cipher the lineage's data is under now (FORMAT.md §16.4), from
    /// this record and its unlocked keys: the grains of key index 0.
    /// With the own keys of an own-key clone (key indexes 1, 2, …), and
    /// its writes under the newest of them.
    pub fn data_cipher(&self, keys: &Unlocked) -> Result<crate::DataCipher> {
        let key = |i: u32| self.unlocked_key(keys, i);
        let base = match self.deep_rekey {
            None => crate::DataCipher::single(key(self.base_index())?),
            Some(d) => crate::DataCipher::split(
                key(d.to)?,
                key(d.from)?,
                d.next_grain.saturating_mul(crate::GRAIN_SECTORS),
            ),
        };
        let mut own = self.own.clone();
        own.sort_by_key(|o| o.bits);
        let own = own.iter().map(|o| key(o.key)).collect::<Result<Vec<_>>>()?;
        Ok(base.with_own(own).writing(self.write_bits()))
    }

    /// Whether keyring `uuid`'s grains may be read through this record
    /// under their old keys: this is an own-key clone made from it, or
    /// from one made from it (FORMAT.md §16.4).
    pub fn descends_from(&self, uuid: &str) -> bool {
        self.own.iter().any(|o| o.from == uuid)
    }

    /// Begin a deep rekey (FORMAT.md §16.4): a new keyring key, every data
    /// key rewrapped under it, a new data key after the highest, and the
    /// keyslots replaced by one for `new`; the cursor at grain 0. Returns
    /// the keys as they now are. Invalid while one is under way.
    pub fn begin_deep(&mut self, keys: &Unlocked, new: &NewSlot) -> Result<Unlocked> {
        let uuid = self.check_keys(keys)?;
        if self.deep_rekey.is_some() {
            return Err(CryptError::Invalid(format!(
                "keyring {}: a deep rekey is already under way",
                self.uuid
            )));
        }
        let from = self.base_index();
        // After every key, own keys included.
        let highest = self.keys.iter().map(|k| k.index).max().unwrap_or(from);
        let to = highest
            .checked_add(1)
            .filter(|_| self.keys.len() < MAX_KEYS)
            .ok_or_else(|| {
                CryptError::Invalid(format!(
                    "keyring {}: no room for another data key",
                    self.uuid
                ))
            })?;
        let kk = SecretBytes::random(KEYRING_KEY_BYTES)?;
        let (wrapped, opened) = self.rewrap_with_new(keys, (&uuid, &kk), (to, new.now_unix))?;
        self.slots = vec![make_slot(&uuid, 0, &kk, new)?];
        self.keys = wrapped;
        self.deep_rekey = Some(DeepRekey {
            from,
            to,
            next_grain: 0,
        });
        Ok(Unlocked {
            uuid,
            kk,
            keys: opened,
        })
    }

    /// Every data key of this record (opened with `keys`) wrapped under
    /// `kk` for keyring `uuid`, with the same indexes, and a new random
    /// data key `to` made at `now`; the keys wrapped and opened, by index.
    fn rewrap_with_new(
        &self,
        keys: &Unlocked,
        (uuid, kk): (&[u8; 16], &SecretBytes),
        (to, now): (u32, u64),
    ) -> Result<(Vec<WrappedKey>, OpenedKeys)> {
        let old = self.uuid_bytes()?;
        let mut wrapped = Vec::with_capacity(self.keys.len() + 1);
        let mut opened = Vec::with_capacity(self.keys.len() + 1);
        for k in &self.keys {
            let dek = unwrap_secret(
                &keys.kk,
                &decode_b64("key", &k.wrapped)?,
                &dek_aad(&old, k.index),
            )
            .map_err(|_| CryptError::Damaged(format!("key {} does not open", k.index)))?;
            wrapped.push(WrappedKey {
                wrapped: B64.encode(wrap_secret(kk, dek.expose(), &dek_aad(uuid, k.index))?),
                ..k.clone()
            });
            opened.push((k.index, Arc::new(Xts::new(&dek)?)));
        }
        let dek = SecretBytes::random(DEK_BYTES)?;
        wrapped.push(WrappedKey {
            index: to,
            created_unix: now,
            wrapped: B64.encode(wrap_secret(kk, dek.expose(), &dek_aad(uuid, to))?),
        });
        opened.push((to, Arc::new(Xts::new(&dek)?)));
        Ok((wrapped, opened))
    }

    /// The keyring of an own-key clone of a disk under this one (FORMAT.md
    /// §16.4): a new uuid and keyring key, one keyslot for `new` (this
    /// record's secrets do not open it), every data key of this record
    /// with the same index (the inherited grains stay readable), and a new
    /// data key, the clone's own, under the next key index. Its `id` is 0
    /// (the caller numbers it). Invalid during a deep rekey and past
    /// [`MAX_OWN_KEYS`] generations.
    pub fn own_key_clone(&self, keys: &Unlocked, new: &NewSlot) -> Result<(KeyringRec, Unlocked)> {
        self.check_keys(keys)?;
        if self.deep_rekey.is_some() {
            return Err(CryptError::Invalid(format!(
                "keyring {}: a deep rekey is under way; make the clone when it ends",
                self.uuid
            )));
        }
        if self.own.len() >= MAX_OWN_KEYS {
            return Err(CryptError::Invalid(format!(
                "keyring {}: {MAX_OWN_KEYS} generations of own keys already",
                self.uuid
            )));
        }
        let to = self.keys.iter().map(|k| k.index).max().unwrap_or(0);
        let to = to.checked_add(1).filter(|_| self.keys.len() < MAX_KEYS);
        let to = to.ok_or_else(|| {
            CryptError::Invalid(format!(
                "keyring {}: no room for another data key",
                self.uuid
            ))
        })?;
        let uuid = random_uuid()?;
        let kk = SecretBytes::random(KEYRING_KEY_BYTES)?;
        let (wrapped, opened) = self.rewrap_with_new(keys, (&uuid, &kk), (to, new.now_unix))?;
        let mut own = self.own.clone();
        own.push(OwnKey {
            bits: self.write_bits() + 1,
            key: to,
            from: self.uuid.clone(),
        });
        let rec = KeyringRec {
            id: 0,
            uuid: hex::encode(&uuid),
            cipher: self.cipher.clone(),
            sector_bytes: self.sector_bytes,
            keys: wrapped,
            slots: vec![make_slot(&uuid, 0, &kk, new)?],
            deep_rekey: None,
            own,
        };
        Ok((
            rec,
            Unlocked {
                uuid,
                kk,
                keys: opened,
            },
        ))
    }

    /// End a deep rekey whose cursor has passed every grain: the old data
    /// key leaves the record, and so do an own-key clone's own keys (its
    /// grains are all under the new key, index 0, now); `keys` without
    /// them are returned.
    pub fn finish_deep(&mut self, keys: &Unlocked) -> Result<Unlocked> {
        let d = self.deep_rekey.ok_or_else(|| {
            CryptError::Invalid(format!("keyring {}: no deep rekey is under way", self.uuid))
        })?;
        let gone: Vec<u32> = std::iter::once(d.from)
            .chain(self.own.iter().map(|o| o.key))
            .collect();
        self.keys.retain(|k| !gone.contains(&k.index));
        self.own.clear();
        self.deep_rekey = None;
        let mut kept = Vec::with_capacity(keys.keys.len());
        for (i, x) in &keys.keys {
            if !gone.contains(i) {
                kept.push((*i, x.clone()));
            }
        }
        Ok(Unlocked {
            uuid: keys.uuid,
            kk: keys.kk.try_clone()?,
            keys: kept,
        })
    }
}

#[cfg(test)]
mod tests;
