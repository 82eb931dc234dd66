//! Encrypted disks' keys on the command line (docs/SECURITY.md,
//! "Encryption at rest"): where a secret comes from (`--key-file`,
//! `--key-keyring`, `--key-helper`, and their `--new-key-*` twins for a
//! keyslot being added), and `unlock`, `key list|add|remove`, `rekey` as
//! requests. The secret is read here, in the CLI's process, so a server
//! never opens a file or runs a command on a client's say-so.

use clap::{Args, Subcommand};
use strata_api::units::invalid;
use strata_api::{Error, ErrorKind, KeyGrant, KeyRequest, Request, Secret};
use strata_crypt::source::KeySource;

/// The secret that opens a disk (one of the three).
#[derive(Args, Debug, Default, Clone)]
pub struct KeyArgs {
    /// A file holding the secret: its raw bytes (QEMU's secret file=); mode 0600 or stricter
    #[arg(long, value_name = "FILE", group = "key")]
    pub key_file: Option<std::path::PathBuf>,
    /// A kernel keyring key ('user' type description, or its serial number)
    #[arg(long, value_name = "NAME", group = "key")]
    pub key_keyring: Option<String>,
    /// A command that prints the secret on stdout (a KMS or TPM client)
    #[arg(long, value_name = "CMD", group = "key")]
    pub key_helper: Option<String>,
}

/// The secret of a keyslot being made (`key add`, `rekey`).
#[derive(Args, Debug, Default, Clone)]
pub struct NewKeyArgs {
    /// A file holding the new secret (raw bytes; mode 0600 or stricter)
    #[arg(long, value_name = "FILE", group = "new_key")]
    pub new_key_file: Option<std::path::PathBuf>,
    /// A kernel keyring key holding the new secret
    #[arg(long, value_name = "NAME", group = "new_key")]
    pub new_key_keyring: Option<String>,
    /// A command that prints the new secret
    #[arg(long, value_name = "CMD", group = "new_key")]
    pub new_key_helper: Option<String>,
    /// A label shown by 'key list' for the new keyslot
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
}

fn source(
    file: &Option<std::path::PathBuf>,
    keyring: &Option<String>,
    helper: &Option<String>,
) -> Option<KeySource> {
    if let Some(f) = file {
        return Some(KeySource::File(f.clone()));
    }
    if let Some(k) = keyring {
        return Some(KeySource::Keyring(k.clone()));
    }
    helper.as_ref().map(|h| KeySource::Helper(h.clone()))
}

/// Read a secret from its source, as the API carries it.
fn read(src: &KeySource) -> Result<Secret, Error> {
    let bytes = src.read().map_err(|e| {
        let kind = match e {
            strata_crypt::CryptError::Io(_) => ErrorKind::Io,
            _ => ErrorKind::InvalidArgument,
        };
        Error::new(kind, format!("the key ({}): {e}", src.kind()))
    })?;
    Ok(Secret::new(bytes.expose().to_vec()))
}

impl KeyArgs {
    /// Whether a source was given (nothing read).
    pub fn secret_given(&self) -> bool {
        self.key_file.is_some() || self.key_keyring.is_some() || self.key_helper.is_some()
    }

    /// The secret, if a source was given.
    pub fn secret(&self) -> Result<Option<Secret>, Error> {
        source(&self.key_file, &self.key_keyring, &self.key_helper)
            .map(|s| read(&s))
            .transpose()
    }

    /// The secret and its source as a first keyslot (`create --encrypt`).
    pub fn grant(&self, label: Option<&String>) -> Result<Option<KeyGrant>, Error> {
        let Some(src) = source(&self.key_file, &self.key_keyring, &self.key_helper) else {
            return Ok(None);
        };
        Ok(Some(KeyGrant {
            secret: read(&src)?,
            source: src.kind().to_string(),
            label: label.cloned(),
        }))
    }

    fn required(&self, what: &str) -> Result<Secret, Error> {
        self.secret()?.ok_or_else(|| {
            invalid(format!(
                "{what} needs the disk's key: --key-file FILE, --key-keyring NAME or \
                 --key-helper CMD"
            ))
        })
    }
}

/// The LUKS passphrase of `export --format luks`, which needs one; VMDK
/// export takes none (and no chain goes with LUKS).
pub fn export_key(format: &str, key: &KeyArgs, chain: bool) -> Result<Option<Secret>, Error> {
    if format != "luks" {
        if key.secret_given() {
            return Err(invalid(
                "a key goes with --format luks (to export a locked encrypted disk as VMDK, \
                 'strata unlock' it on the running server first)",
            ));
        }
        return Ok(None);
    }
    if chain {
        return Err(invalid(
            "a LUKS image holds one version: --chain goes with VMDK",
        ));
    }
    key.required("export --format luks").map(Some)
}

impl NewKeyArgs {
    fn grant(&self, what: &str) -> Result<KeyGrant, Error> {
        let src = source(
            &self.new_key_file,
            &self.new_key_keyring,
            &self.new_key_helper,
        )
        .ok_or_else(|| {
            invalid(format!(
                "{what} needs the new secret: --new-key-file FILE, --new-key-keyring NAME or \
                 --new-key-helper CMD"
            ))
        })?;
        Ok(KeyGrant {
            secret: read(&src)?,
            source: src.kind().to_string(),
            label: self.label.clone(),
        })
    }
}

/// `strata key`: an encrypted disk's keyslots.
#[derive(Subcommand)]
pub enum KeyCmd {
    /// List the keyslots of an encrypted disk (never a key)
    #[command(visible_alias = "ls")]
    List { disk: String },
    /// Add a keyslot: another secret that opens the disk
    #[command(
        long_about = "Add a keyslot: another secret (--new-key-*) that opens the disk, \
up to 8. The disk must be unlocked (by the running server) or opened here with one of its \
keys (--key-*). Writes no data."
    )]
    Add {
        disk: String,
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        new: NewKeyArgs,
    },
    /// Remove a keyslot (the last one is refused)
    #[command(visible_alias = "rm")]
    Remove {
        disk: String,
        /// The keyslot's number ('strata key list')
        slot: u32,
        #[command(flatten)]
        key: KeyArgs,
    },
}

/// `strata unlock`, `strata key ...`, `strata rekey` as requests.
pub fn unlock(disk: &str, key: &KeyArgs) -> Result<Request, Error> {
    Ok(Request::Key(KeyRequest::Unlock {
        name: disk.to_string(),
        key: key.required("unlock")?,
    }))
}

pub fn key(cmd: &KeyCmd) -> Result<Request, Error> {
    Ok(Request::Key(match cmd {
        KeyCmd::List { disk } => KeyRequest::List { name: disk.clone() },
        KeyCmd::Add { disk, key, new } => KeyRequest::Add {
            name: disk.clone(),
            key: key.secret()?,
            new: new.grant("key add")?,
        },
        KeyCmd::Remove { disk, slot, key } => KeyRequest::Remove {
            name: disk.clone(),
            slot: *slot,
            key: key.secret()?,
        },
    }))
}

pub fn rekey(disk: &str, key: &KeyArgs, new: &NewKeyArgs, deep: bool) -> Result<Request, Error> {
    Ok(Request::Key(KeyRequest::Rekey {
        name: disk.to_string(),
        key: key.secret()?,
        new: new.grant("rekey")?,
        deep,
    }))
}
