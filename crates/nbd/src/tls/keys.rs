//! The server's private key, loaded for the crypto provider and paired
//! with its certificate. A key that cannot be used is refused by cause,
//! naming the file: a file that holds no key in a form strata reads, a
//! key of a kind or size the provider does not sign with (which kind,
//! which size), or a key that is not the certificate's.
//!
//! The key is the certificate's when the public key the provider derives
//! from it is the certificate's SubjectPublicKeyInfo, byte for byte. The
//! provider only says that it could not use a key, not why; the kind and
//! size are read here from the key's DER (PKCS#1, SEC1 or PKCS#8) and the
//! certificate's SubjectPublicKeyInfo, only to tell people.

use std::fmt;
use std::io;
use std::path::Path;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use x509_cert::der::asn1::{AnyRef, ContextSpecific, ObjectIdentifier, OctetStringRef, UintRef};
use x509_cert::der::{Decode, Encode, SliceReader, Tag, TagNumber, Tagged};
use x509_cert::spki::{AlgorithmIdentifierRef, SubjectPublicKeyInfoOwned};

/// A problem with the credentials file `path`, for people.
pub(super) fn creds_error(path: &Path, what: impl fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {what}", path.display()),
    )
}

/// The RSA sizes the provider (aws-lc-rs) signs with, in bits.
const RSA_BITS_MIN: usize = 2048;
const RSA_BITS_MAX: usize = 8192;

/// Object identifiers of the key algorithms and curves named in messages.
mod oid {
    use x509_cert::der::asn1::ObjectIdentifier as Oid;
    pub const RSA: Oid = Oid::new_unwrap("1.2.840.113549.1.1.1");
    pub const RSA_PSS: Oid = Oid::new_unwrap("1.2.840.113549.1.1.10");
    pub const DSA: Oid = Oid::new_unwrap("1.2.840.10040.4.1");
    pub const EC: Oid = Oid::new_unwrap("1.2.840.10045.2.1");
    pub const ED25519: Oid = Oid::new_unwrap("1.3.101.112");
    pub const ED448: Oid = Oid::new_unwrap("1.3.101.113");
    pub const P256: Oid = Oid::new_unwrap("1.2.840.10045.3.1.7");
    pub const P384: Oid = Oid::new_unwrap("1.3.132.0.34");
    pub const P521: Oid = Oid::new_unwrap("1.3.132.0.35");
    pub const SECP256K1: Oid = Oid::new_unwrap("1.3.132.0.10");
}

/// What a key is, as far as a message needs: its algorithm and size.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyKind {
    Rsa {
        bits: usize,
    },
    /// An RSA key restricted to PSS (`id-RSASSA-PSS`), as `openssl
    /// genpkey -algorithm RSA-PSS` makes.
    RsaPss {
        bits: usize,
    },
    Dsa,
    Ecdsa {
        curve: ObjectIdentifier,
    },
    Ed25519,
    Ed448,
    Other {
        algorithm: ObjectIdentifier,
    },
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyKind::Rsa { bits } => write!(f, "RSA {bits} bits"),
            KeyKind::RsaPss { bits } => write!(f, "RSA-PSS {bits} bits"),
            KeyKind::Dsa => write!(f, "DSA"),
            KeyKind::Ecdsa { curve } => match *curve {
                oid::P256 => write!(f, "ECDSA P-256"),
                oid::P384 => write!(f, "ECDSA P-384"),
                oid::P521 => write!(f, "ECDSA P-521"),
                oid::SECP256K1 => write!(f, "ECDSA secp256k1"),
                c => write!(f, "ECDSA on curve {c}"),
            },
            KeyKind::Ed25519 => write!(f, "Ed25519"),
            KeyKind::Ed448 => write!(f, "Ed448"),
            KeyKind::Other { algorithm } => write!(f, "algorithm {algorithm}"),
        }
    }
}

impl KeyKind {
    /// Why the provider cannot sign with a key of this kind (None: it can).
    fn unsupported(&self) -> Option<String> {
        match self {
            KeyKind::Rsa { bits } if *bits < RSA_BITS_MIN => {
                Some(format!("RSA keys need at least {RSA_BITS_MIN} bits"))
            }
            KeyKind::Rsa { bits } if *bits > RSA_BITS_MAX => {
                Some(format!("RSA keys may have at most {RSA_BITS_MAX} bits"))
            }
            KeyKind::Rsa { .. } | KeyKind::Ed25519 => None,
            KeyKind::Ecdsa { curve } if [oid::P256, oid::P384, oid::P521].contains(curve) => None,
            KeyKind::Ecdsa { .. } => Some("ECDSA keys must be on P-256, P-384 or P-521".into()),
            KeyKind::RsaPss { .. } => Some(
                "use a plain RSA key (rsaEncryption, as `openssl genpkey -algorithm RSA` makes), \
                 which signs with PSS all the same"
                    .into(),
            ),
            KeyKind::Dsa | KeyKind::Ed448 | KeyKind::Other { .. } => {
                Some("strata signs with RSA, ECDSA or Ed25519 keys".into())
            }
        }
    }
}

/// The key in `key_path` with the chain `certs` (from `cert_path`), as the
/// provider will sign with them, checked to belong together.
pub(super) fn certified_key(
    provider: &CryptoProvider,
    certs: Vec<CertificateDer<'static>>,
    cert_path: &Path,
    key_path: &Path,
) -> io::Result<CertifiedKey> {
    let key = read_key(key_path)?;
    let signer = provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| unusable(key_path, &key, e))?;
    let certified = CertifiedKey::new(certs, signer);
    // Not rustls's CertifiedKey::keys_match, which compares the same bytes
    // but has webpki parse the certificate, and webpki refuses X.509 v1
    // certificates: 'openssl x509 -req' without extensions makes those,
    // and qemu-nbd serves them.
    let cert = x509_cert::Certificate::from_der(&certified.cert[0])
        .map_err(|e| creds_error(cert_path, format!("cannot parse the certificate: {e}")))?;
    let spki = &cert.tbs_certificate.subject_public_key_info;
    let spki_der = spki.to_der().map_err(|e| creds_error(cert_path, e))?;
    match certified.key.public_key() {
        // A signer that cannot tell its public key (none of the
        // provider's): taken as it is, as rustls's own loading does.
        None => Ok(certified),
        Some(ours) if ours.as_ref() == spki_der.as_slice() => Ok(certified),
        Some(_) => {
            let ours = private_key_kind(&key).map(|k| k.to_string());
            let theirs = spki_kind(spki).map(|k| k.to_string());
            let kinds = match (ours, theirs) {
                (Ok(a), Ok(b)) if a == b => format!(" (both are {a}, but not the same key)"),
                (Ok(a), Ok(b)) => format!(" (the key is {a}, the certificate's {b})"),
                _ => String::new(),
            };
            Err(creds_error(
                key_path,
                format!(
                    "the key does not match the certificate in {}{kinds}",
                    cert_path.display()
                ),
            ))
        }
    }
}

/// The first private key in the PEM file `path`.
fn read_key(path: &Path) -> io::Result<PrivateKeyDer<'static>> {
    let text =
        std::fs::read(path).map_err(|e| creds_error(path, format!("cannot read it: {e}")))?;
    match PrivateKeyDer::from_pem_slice(&text) {
        Ok(key) => Ok(key),
        Err(pem::Error::NoItemsFound) if contains(&text, b"BEGIN ENCRYPTED PRIVATE KEY") => {
            Err(creds_error(
                path,
                "the key is encrypted; strata reads keys in the clear \
                 (`openssl pkey -in KEY -out server-key.pem` decrypts one)",
            ))
        }
        Err(pem::Error::NoItemsFound) => Err(creds_error(
            path,
            "cannot parse it: no private key in it (strata reads PEM: \
             BEGIN PRIVATE KEY, BEGIN RSA PRIVATE KEY or BEGIN EC PRIVATE KEY)",
        )),
        Err(e) => Err(creds_error(
            path,
            format!("cannot parse it as PEM: {}", pem_problem(&e)),
        )),
    }
}

/// `e` for people: the PEM lines it names as text, not bytes.
pub(super) fn pem_problem(e: &pem::Error) -> String {
    let text = String::from_utf8_lossy;
    match e {
        pem::Error::MissingSectionEnd { end_marker } => {
            format!("no -----END {}----- line", text(end_marker))
        }
        pem::Error::IllegalSectionStart { line } => {
            format!("a malformed BEGIN line: {}", text(line))
        }
        e => e.to_string(),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Why the provider refused `key` (its error `e` says only that it did).
fn unusable(path: &Path, key: &PrivateKeyDer<'_>, e: rustls::Error) -> io::Error {
    match private_key_kind(key) {
        Err(why) => creds_error(
            path,
            format!("cannot parse the {} private key in it: {why}", form(key)),
        ),
        Ok(kind) => match kind.unsupported() {
            Some(why) => creds_error(path, format!("unsupported key, {kind}: {why}")),
            None => creds_error(path, format!("cannot use the {kind} key: {e}")),
        },
    }
}

/// The encoding of `key`, as its PEM label says it.
fn form(key: &PrivateKeyDer<'_>) -> &'static str {
    match key {
        PrivateKeyDer::Pkcs1(_) => "PKCS#1 (BEGIN RSA PRIVATE KEY)",
        PrivateKeyDer::Sec1(_) => "SEC1 (BEGIN EC PRIVATE KEY)",
        PrivateKeyDer::Pkcs8(_) => "PKCS#8 (BEGIN PRIVATE KEY)",
        _ => "PEM",
    }
}

type Parsed<T> = Result<T, String>;

fn der_error(e: x509_cert::der::Error) -> String {
    e.to_string()
}

/// The kind of a private key, from its DER.
fn private_key_kind(key: &PrivateKeyDer<'_>) -> Parsed<KeyKind> {
    match key {
        PrivateKeyDer::Pkcs1(k) => Ok(KeyKind::Rsa {
            bits: rsa_bits(k.secret_pkcs1_der(), Side::Private)?,
        }),
        PrivateKeyDer::Sec1(k) => Ok(KeyKind::Ecdsa {
            curve: sec1_curve(k.secret_sec1_der())?,
        }),
        PrivateKeyDer::Pkcs8(k) => pkcs8_kind(k.secret_pkcs8_der()),
        _ => Err("an encoding strata does not know".into()),
    }
}

/// The kind of the public key a certificate certifies.
fn spki_kind(spki: &SubjectPublicKeyInfoOwned) -> Parsed<KeyKind> {
    let params = spki.algorithm.parameters.as_ref().map(AnyRef::from);
    let key = spki.subject_public_key.raw_bytes();
    kind(
        spki.algorithm.oid,
        params,
        || rsa_bits(key, Side::Public),
        || Err("no curve named".into()),
    )
}

/// `PrivateKeyInfo` (RFC 5208): version, algorithm, the key itself.
fn pkcs8_kind(der: &[u8]) -> Parsed<KeyKind> {
    let mut r = sequence(der)?;
    UintRef::decode(&mut r).map_err(der_error)?;
    let algorithm = AlgorithmIdentifierRef::decode(&mut r).map_err(der_error)?;
    let inner = OctetStringRef::decode(&mut r)
        .map_err(der_error)?
        .as_bytes();
    kind(
        algorithm.oid,
        algorithm.parameters,
        || rsa_bits(inner, Side::Private),
        || sec1_curve(inner),
    )
}

/// The kind of a key of `algorithm` with `params`; an RSA key's size and
/// (without a curve in `params`) an EC key's curve come from the key.
fn kind(
    algorithm: ObjectIdentifier,
    params: Option<AnyRef<'_>>,
    rsa_bits: impl FnOnce() -> Parsed<usize>,
    key_curve: impl FnOnce() -> Parsed<ObjectIdentifier>,
) -> Parsed<KeyKind> {
    Ok(match algorithm {
        oid::RSA => KeyKind::Rsa { bits: rsa_bits()? },
        oid::RSA_PSS => KeyKind::RsaPss { bits: rsa_bits()? },
        oid::DSA => KeyKind::Dsa,
        oid::EC => KeyKind::Ecdsa {
            curve: match params.filter(|p| p.tag() == Tag::ObjectIdentifier) {
                Some(p) => p.decode_as().map_err(der_error)?,
                None => key_curve()?,
            },
        },
        oid::ED25519 => KeyKind::Ed25519,
        oid::ED448 => KeyKind::Ed448,
        algorithm => KeyKind::Other { algorithm },
    })
}

#[derive(Clone, Copy)]
enum Side {
    /// `RSAPrivateKey` (RFC 8017): version, modulus, ...
    Private,
    /// `RSAPublicKey`: modulus, public exponent.
    Public,
}

/// An RSA key's size: its modulus's, in bits.
fn rsa_bits(der: &[u8], side: Side) -> Parsed<usize> {
    let mut r = sequence(der)?;
    if let Side::Private = side {
        UintRef::decode(&mut r).map_err(der_error)?;
    }
    let modulus = UintRef::decode(&mut r).map_err(der_error)?.as_bytes();
    Ok(match modulus.first() {
        Some(top) => modulus.len() * 8 - top.leading_zeros() as usize,
        None => 0,
    })
}

/// The curve an `ECPrivateKey` (RFC 5915) names: version, the key, then
/// `[0]` the curve (which PKCS#8 may leave to its own parameters).
fn sec1_curve(der: &[u8]) -> Parsed<ObjectIdentifier> {
    let mut r = sequence(der)?;
    UintRef::decode(&mut r).map_err(der_error)?;
    OctetStringRef::decode(&mut r).map_err(der_error)?;
    match ContextSpecific::<ObjectIdentifier>::decode_explicit(&mut r, TagNumber::N0) {
        Ok(Some(c)) => Ok(c.value),
        Ok(None) => Err("the EC key names no curve".into()),
        Err(e) => Err(der_error(e)),
    }
}

/// A reader of the contents of the SEQUENCE that is all of `der`.
fn sequence(der: &[u8]) -> Parsed<SliceReader<'_>> {
    let any = AnyRef::from_der(der).map_err(der_error)?;
    any.tag().assert_eq(Tag::Sequence).map_err(der_error)?;
    SliceReader::new(any.value()).map_err(der_error)
}
