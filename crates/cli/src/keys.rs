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
    /// Ask for a passphrase at the terminal (echo off; the newline is not part of it)
    #[arg(long, group = "key")]
    pub key_prompt: bool,
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
    /// Ask for the new passphrase at the terminal, twice
    #[arg(long, group = "new_key")]
    pub new_key_prompt: bool,
    /// A label shown by 'key list' for the new keyslot
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
}

/// The one source given, of a file, a kernel key, a helper or a prompt.
struct Given<'a> {
    file: &'a Option<std::path::PathBuf>,
    keyring: &'a Option<String>,
    helper: &'a Option<String>,
    /// The prompt's label, when a passphrase is to be typed.
    prompt: Option<&'a str>,
    /// Ask twice (a new secret).
    confirm: bool,
}

fn source(g: &Given<'_>) -> Option<KeySource> {
    if let Some(f) = g.file {
        return Some(KeySource::File(f.clone()));
    }
    if let Some(k) = g.keyring {
        return Some(KeySource::Keyring(k.clone()));
    }
    if let Some(h) = g.helper {
        return Some(KeySource::Helper(h.clone()));
    }
    g.prompt.map(|label| KeySource::Prompt {
        label: label.to_string(),
        confirm: g.confirm,
    })
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
        self.given(false).is_some()
    }

    /// The source given; a prompt for a first keyslot asks twice.
    fn given(&self, new: bool) -> Option<KeySource> {
        source(&Given {
            file: &self.key_file,
            keyring: &self.key_keyring,
            helper: &self.key_helper,
            prompt: self
                .key_prompt
                .then_some(if new { "New passphrase" } else { "Passphrase" }),
            confirm: new,
        })
    }

    /// The secret, if a source was given.
    pub fn secret(&self) -> Result<Option<Secret>, Error> {
        self.given(false).map(|s| read(&s)).transpose()
    }

    /// The secret and its source as a first keyslot (`create --encrypt`,
    /// `import`): a typed one is asked for twice.
    pub fn grant(&self, label: Option<&String>) -> Result<Option<KeyGrant>, Error> {
        let Some(src) = self.given(true) else {
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
                "{what} needs the disk's key: --key-file FILE, --key-keyring NAME, \
                 --key-helper CMD or --key-prompt"
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
    /// The new secret's source, if one was named (nothing read).
    fn source(&self) -> Option<KeySource> {
        source(&Given {
            file: &self.new_key_file,
            keyring: &self.new_key_keyring,
            helper: &self.new_key_helper,
            prompt: self.new_key_prompt.then_some("New passphrase"),
            confirm: true,
        })
    }

    /// Whether a new secret or a label was named (nothing read).
    pub fn given(&self) -> bool {
        self.source().is_some() || self.label.is_some()
    }

    pub fn grant(&self, what: &str) -> Result<KeyGrant, Error> {
        let src = self.source().ok_or_else(|| {
            invalid(format!(
                "{what} needs the new secret: --new-key-file FILE, --new-key-keyring NAME, \
                 --new-key-helper CMD or --new-key-prompt"
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

/// `rekey`; `deep`: Some(the pace in bytes per second, if any) for `--deep`.
pub fn rekey(
    disk: &str,
    key: &KeyArgs,
    new: &NewKeyArgs,
    deep: Option<Option<u64>>,
) -> Result<Request, Error> {
    // `rekey --deep DISK` with no new secret resumes an interrupted one.
    let new = match deep.is_some() && new.source().is_none() {
        true => None,
        false => Some(new.grant("rekey")?),
    };
    Ok(Request::Key(KeyRequest::Rekey {
        name: disk.to_string(),
        key: key.secret()?,
        new,
        deep: deep.is_some(),
        rate_bytes_per_sec: deep.flatten(),
    }))
}
