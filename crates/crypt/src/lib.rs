//! The cryptographic core of strata's encryption at rest.
//!
//! - [`Xts`]: AES-256-XTS over 512-byte sectors, the same construction as
//!   LUKS1 / dm-crypt `aes-xts-plain64` (the tweak is the sector number,
//!   little-endian, in the first 8 bytes of the IV), run by aws-lc.
//! - [`SecretBytes`]: key material in locked, non-dumpable memory that is
//!   wiped when dropped.
//! - [`KeyringRec`]: the catalog record of one disk lineage's keys: a random
//!   keyring key (KK) wrapped in up to [`MAX_SLOTS`] keyslots, one per user
//!   secret, and the data keys (DEKs) wrapped by the KK. [`Unlocked`] holds
//!   the unwrapped keys.
//! - [`luks`]: LUKS1 images, for `export --format luks` and `import`.
//! - [`source::KeySource`]: where a user secret comes from (a file, the
//!   kernel keyring, a helper command).
//!
//! Small secrets are wrapped with AES-256-GCM-SIV ([`wrap_secret`]); keyslot
//! keys come from HKDF-SHA256 for key material (32 bytes or more) and from
//! Argon2id for passphrases (anything shorter).

mod data;
#[doc(hidden)]
pub mod fuzzing;
mod hex;
mod kdf;
mod keyring;
pub mod luks;
mod secret;
pub mod source;
mod wrap;
mod xts;

pub use data::{DataCipher, Keyed};
pub use kdf::{Argon2Params, KdfRec, KEY_MATERIAL_BYTES};
pub use keyring::{
    DeepRekey, KeyringRec, Keyslot, NewSlot, OwnKey, Unlocked, WrappedKey, KEYRING_KEY_BYTES,
    MAX_KEYS, MAX_OWN_KEYS, MAX_SLOTS,
};
pub use secret::SecretBytes;
pub use wrap::{unwrap_secret, wrap_secret, WRAP_KEY_BYTES, WRAP_OVERHEAD};
pub use xts::{Xts, XtsEngine};

/// The data unit of the cipher: one disk sector.
pub const SECTOR_BYTES: usize = 512;
/// Sectors per 4 KiB grain (the unit a deep rekey's cursor counts).
pub const GRAIN_SECTORS: u64 = 4096 / SECTOR_BYTES as u64;
/// Length of a data encryption key: two AES-256 keys (XTS).
pub const DEK_BYTES: usize = 64;
/// The cipher's name as dm-crypt and LUKS spell it.
pub const CIPHER_NAME: &str = "aes-xts-plain64";

/// What a read or write of an encrypted disk whose keys this process does
/// not hold is refused with (both kinds of datastore).
pub fn locked_message(disk: &str) -> String {
    format!(
        "disk '{disk}' is encrypted and locked: unlock it first ('strata unlock {disk} \
         --key-file FILE', or serve with '--unlock {disk}=FILE')"
    )
}

/// The refusal of a read or write of an encrypted disk whose keys this
/// process does not hold ([`locked_message`]).
pub fn locked_error(disk: &str) -> strata_block::Error {
    strata_block::Error::new(strata_block::Kind::Refused, locked_message(disk))
}

/// `e`, met on disk `disk`, as a storage error: a wrong key or a bad
/// argument is the user's to fix, a damaged record is corruption.
pub fn disk_error(disk: &str, e: CryptError) -> strata_block::Error {
    use strata_block::Kind;
    let kind = match e {
        CryptError::WrongKey | CryptError::Invalid(_) => Kind::InvalidArgument,
        CryptError::Damaged(_) => Kind::Corrupt,
        CryptError::Io(_) => Kind::Io,
    };
    strata_block::Error::new(kind, format!("disk '{disk}': {e}"))
}

/// What can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    /// The secret opens no keyslot (or a wrapped value fails its tag).
    #[error("wrong key: no keyslot opens with it")]
    WrongKey,
    /// A stored key record is malformed or inconsistent.
    #[error("damaged key record: {0}")]
    Damaged(String),
    /// The caller asked for something that cannot be done.
    #[error("{0}")]
    Invalid(String),
    /// The operating system or the crypto library failed.
    #[error("{0}")]
    Io(String),
}

/// This crate's result type.
pub type Result<T> = std::result::Result<T, CryptError>;
