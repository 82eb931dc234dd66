//! LUKS1 images (docs/FORMAT.md §16.6): the header, keyslots opened and
//! made with PBKDF2 and the anti-forensic splitter, and the payload cipher.
//!
//! Only what QEMU's `luks` driver and cryptsetup write by default is
//! accepted: AES-256-XTS (`aes`, `xts-plain64` or `xts-plain`, 64-byte
//! keys) with SHA-1, SHA-256 or SHA-512 as the hash. Everything a header
//! says is checked before a key is derived from it.

use std::num::NonZeroU32;
use std::time::Instant;

use aws_lc_rs::{digest, pbkdf2};
use zeroize::Zeroizing;

use crate::{CryptError, Result, SecretBytes, Xts, DEK_BYTES, SECTOR_BYTES};

/// The first six bytes of every LUKS image.
pub const LUKS_MAGIC: &[u8; 6] = b"LUKS\xba\xbe";
/// Length of the LUKS1 header proper.
pub const HEADER_BYTES: usize = 592;
const SLOTS: usize = 8;
const SLOT_ACTIVE: u32 = 0x00AC_71F3;
const SLOT_DISABLED: u32 = 0x0000_DEAD;
const DIGEST_BYTES: usize = 20;
const SALT_BYTES: usize = 32;
/// Stripes every LUKS1 tool writes; the most an image may ask for.
const STRIPES: u32 = 4000;
/// Where export puts slot 0's material, and the distance between slots
/// (4000 × 64 bytes, rounded up to 4 KiB), in sectors.
const FIRST_MATERIAL: u32 = 8;
const MATERIAL_STEP: u32 = 504;
/// Export's payload offset: 2 MiB, cryptsetup's default alignment.
const PAYLOAD_SECTORS: u32 = 4096;
/// PBKDF2 rounds for key material and for the master-key digest.
const MIN_ITERATIONS: u32 = 1000;
/// Most PBKDF2 rounds an image may ask for (a slot or the digest), so a
/// crafted header cannot hold a worker for hours.
pub const MAX_ITERATIONS: u32 = 20_000_000;
/// A passphrase slot made here costs about this long to open.
const PASSPHRASE_MILLIS: u128 = 1000;

/// The hash a LUKS1 image names for PBKDF2 and the splitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LuksHash {
    Sha1,
    Sha256,
    Sha512,
}

impl LuksHash {
    fn parse(name: &str) -> Option<LuksHash> {
        match name {
            "sha1" => Some(LuksHash::Sha1),
            "sha256" => Some(LuksHash::Sha256),
            "sha512" => Some(LuksHash::Sha512),
            _ => None,
        }
    }

    /// The name as LUKS spells it.
    pub fn name(self) -> &'static str {
        match self {
            LuksHash::Sha1 => "sha1",
            LuksHash::Sha256 => "sha256",
            LuksHash::Sha512 => "sha512",
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            LuksHash::Sha1 => pbkdf2::PBKDF2_HMAC_SHA1,
            LuksHash::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            LuksHash::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            LuksHash::Sha1 => &digest::SHA1_FOR_LEGACY_USE_ONLY,
            LuksHash::Sha256 => &digest::SHA256,
            LuksHash::Sha512 => &digest::SHA512,
        }
    }

    fn derive(self, iterations: u32, salt: &[u8], secret: &[u8], out: &mut [u8]) {
        let rounds = NonZeroU32::new(iterations).unwrap_or(NonZeroU32::MIN);
        pbkdf2::derive(self.pbkdf2(), rounds, salt, secret, out);
    }
}

/// One keyslot of the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuksSlot {
    pub active: bool,
    pub iterations: u32,
    pub salt: [u8; SALT_BYTES],
    /// Sector of the slot's material.
    pub material_offset: u32,
    pub stripes: u32,
}

impl LuksSlot {
    /// Sectors the slot's material takes for a key of `key_bytes`.
    fn material_sectors(&self, key_bytes: u32) -> u64 {
        (u64::from(self.stripes) * u64::from(key_bytes)).div_ceil(SECTOR_BYTES as u64)
    }

    fn disabled(material_offset: u32) -> LuksSlot {
        LuksSlot {
            active: false,
            iterations: 0,
            salt: [0; SALT_BYTES],
            material_offset,
            stripes: STRIPES,
        }
    }
}

/// A LUKS1 header that passed every check of [`LuksHeader::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuksHeader {
    /// `xts-plain` (32-bit tweaks) rather than `xts-plain64`.
    pub plain32: bool,
    pub hash: LuksHash,
    /// Sector of the payload's first byte.
    pub payload_offset: u32,
    pub key_bytes: u32,
    pub mk_digest: [u8; DIGEST_BYTES],
    pub mk_digest_salt: [u8; SALT_BYTES],
    pub mk_digest_iter: u32,
    pub uuid: String,
    pub slots: Vec<LuksSlot>,
}

fn damaged(why: String) -> CryptError {
    CryptError::Damaged(why)
}

/// A NUL-padded text field: printable ASCII up to the first NUL.
fn text(field: &[u8], what: &str) -> Result<String> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    let s = &field[..end];
    if !s.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return Err(damaged(format!("the {what} field is not printable text")));
    }
    Ok(String::from_utf8_lossy(s).into_owned())
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("N bytes")
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    aws_lc_rs::rand::fill(&mut out)
        .map_err(|_| CryptError::Io("the random generator failed".into()))?;
    Ok(out)
}

/// Whether `bytes` start like a LUKS image (any version).
pub fn is_luks(bytes: &[u8]) -> bool {
    bytes.starts_with(LUKS_MAGIC)
}

impl LuksHeader {
    /// Parse and check the first [`HEADER_BYTES`] of an image of
    /// `file_bytes` bytes.
    pub fn parse(b: &[u8], file_bytes: u64) -> Result<LuksHeader> {
        if b.len() < HEADER_BYTES || !is_luks(b) {
            return Err(damaged("not a LUKS image (no LUKS magic)".into()));
        }
        let version = u16::from_be_bytes([b[6], b[7]]);
        if version != 1 {
            return Err(CryptError::Invalid(format!(
                "LUKS version {version}: only LUKS1 is read (QEMU's luks driver writes LUKS1; \
                 'cryptsetup convert --type luks1' converts a LUKS2 image)"
            )));
        }
        let (cipher, mode) = (text(&b[8..40], "cipher")?, text(&b[40..72], "mode")?);
        let hash_name = text(&b[72..104], "hash")?;
        let key_bytes = be32(b, 108);
        let plain32 = match (cipher.as_str(), mode.as_str(), key_bytes) {
            ("aes", "xts-plain64", 64) => false,
            ("aes", "xts-plain", 64) => true,
            _ => {
                return Err(CryptError::Invalid(format!(
                    "cipher {cipher}-{mode} with a {}-bit key: only aes-xts-plain64 with a \
                     512-bit key (AES-256-XTS) is read; convert the image with 'qemu-img \
                     convert --object secret,... -O raw' and import the raw file with --encrypt",
                    u64::from(key_bytes) * 8
                )))
            }
        };
        let hash = LuksHash::parse(&hash_name).ok_or_else(|| {
            CryptError::Invalid(format!(
                "hash {hash_name:?}: only sha1, sha256 and sha512 are read"
            ))
        })?;
        let slots = (0..SLOTS)
            .map(|i| Self::parse_slot(b, i))
            .collect::<Result<Vec<_>>>()?;
        let h = LuksHeader {
            plain32,
            hash,
            payload_offset: be32(b, 104),
            key_bytes,
            mk_digest: array(b, 112),
            mk_digest_salt: array(b, 132),
            mk_digest_iter: be32(b, 164),
            uuid: text(&b[168..208], "uuid")?,
            slots,
        };
        h.check_layout(file_bytes)?;
        Ok(h)
    }

    fn parse_slot(b: &[u8], i: usize) -> Result<LuksSlot> {
        let at = 208 + 48 * i;
        let active = match be32(b, at) {
            SLOT_ACTIVE => true,
            SLOT_DISABLED => false,
            other => {
                return Err(damaged(format!(
                    "keyslot {i}: state {other:#010x} is neither active nor disabled"
                )))
            }
        };
        let slot = LuksSlot {
            active,
            iterations: be32(b, at + 4),
            salt: array(b, at + 8),
            material_offset: be32(b, at + 40),
            stripes: be32(b, at + 44),
        };
        if active && !(1..=MAX_ITERATIONS).contains(&slot.iterations) {
            return Err(damaged(format!(
                "keyslot {i}: {} PBKDF2 iterations, not in 1..={MAX_ITERATIONS}",
                slot.iterations
            )));
        }
        if active && !(1..=STRIPES).contains(&slot.stripes) {
            return Err(damaged(format!(
                "keyslot {i}: {} stripes, not in 1..={STRIPES}",
                slot.stripes
            )));
        }
        Ok(slot)
    }

    /// The digest's cost, the payload inside the file, and every active
    /// slot's material between the header and the payload, apart.
    fn check_layout(&self, file_bytes: u64) -> Result<()> {
        if !(1..=MAX_ITERATIONS).contains(&self.mk_digest_iter) {
            return Err(damaged(format!(
                "{} master-key digest iterations, not in 1..={MAX_ITERATIONS}",
                self.mk_digest_iter
            )));
        }
        let payload = u64::from(self.payload_offset);
        if payload == 0 || payload * SECTOR_BYTES as u64 > file_bytes {
            return Err(damaged(format!(
                "payload offset {payload} sectors is not inside the {file_bytes}-byte file"
            )));
        }
        let mut used: Vec<(u64, u64, usize)> = Vec::new();
        for (i, s) in self.slots.iter().enumerate().filter(|(_, s)| s.active) {
            let start = u64::from(s.material_offset);
            let end = start + s.material_sectors(self.key_bytes);
            if start == 0 || end > payload {
                return Err(damaged(format!(
                    "keyslot {i}: material at sectors {start}..{end} is not between the header \
                     and the payload (sector {payload})"
                )));
            }
            if let Some((_, _, j)) = used.iter().find(|(a, b, _)| start < *b && *a < end) {
                return Err(damaged(format!(
                    "keyslot {i}: material overlaps keyslot {j}'s"
                )));
            }
            used.push((start, end, i));
        }
        if used.is_empty() {
            return Err(damaged("no keyslot is active".into()));
        }
        Ok(())
    }

    /// Byte offset of the payload in the image.
    pub fn payload_byte(&self) -> u64 {
        u64::from(self.payload_offset) * SECTOR_BYTES as u64
    }

    /// Open a keyslot with `secret`, reading slot material through
    /// `read_at(offset, buf)`. `WrongKey` when no active slot opens.
    pub fn open(
        &self,
        secret: &[u8],
        read_at: &mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>,
    ) -> Result<(LuksPayload, usize)> {
        for (i, slot) in self.slots.iter().enumerate().filter(|(_, s)| s.active) {
            let len = slot.material_sectors(self.key_bytes) as usize * SECTOR_BYTES;
            let mut material = Zeroizing::new(vec![0u8; len]);
            read_at(
                u64::from(slot.material_offset) * SECTOR_BYTES as u64,
                &mut material,
            )
            .map_err(|e| CryptError::Io(format!("reading keyslot {i}'s material: {e}")))?;
            let mut slot_key = SecretBytes::zeroed(self.key_bytes as usize)?;
            self.hash
                .derive(slot.iterations, &slot.salt, secret, slot_key.expose_mut());
            let Ok(xts) = Xts::new(&slot_key) else {
                continue; // equal key halves: not this slot's key
            };
            xts.decrypt(&mut material, 0);
            let stripes = &material[..(slot.stripes * self.key_bytes) as usize];
            let mk = af_merge(stripes, self.key_bytes as usize, self.hash)?;
            if self.digest_matches(&mk) {
                let xts = Xts::new(&mk)?;
                return Ok((
                    LuksPayload {
                        xts,
                        plain32: self.plain32,
                    },
                    i,
                ));
            }
        }
        Err(CryptError::WrongKey)
    }

    fn digest_matches(&self, mk: &SecretBytes) -> bool {
        let mut d = [0u8; DIGEST_BYTES];
        self.hash.derive(
            self.mk_digest_iter,
            &self.mk_digest_salt,
            mk.expose(),
            &mut d,
        );
        aws_lc_rs::constant_time::verify_slices_are_equal(&d, &self.mk_digest).is_ok()
    }

    /// The header's 592 bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..6].copy_from_slice(LUKS_MAGIC);
        b[6..8].copy_from_slice(&1u16.to_be_bytes());
        let mode = if self.plain32 {
            "xts-plain"
        } else {
            "xts-plain64"
        };
        for (at, s) in [(8, "aes"), (40, mode), (72, self.hash.name())] {
            b[at..at + s.len()].copy_from_slice(s.as_bytes());
        }
        b[104..108].copy_from_slice(&self.payload_offset.to_be_bytes());
        b[108..112].copy_from_slice(&self.key_bytes.to_be_bytes());
        b[112..132].copy_from_slice(&self.mk_digest);
        b[132..164].copy_from_slice(&self.mk_digest_salt);
        b[164..168].copy_from_slice(&self.mk_digest_iter.to_be_bytes());
        let uuid = &self.uuid.as_bytes()[..self.uuid.len().min(40)];
        b[168..168 + uuid.len()].copy_from_slice(uuid);
        for (i, s) in self.slots.iter().enumerate() {
            let at = 208 + 48 * i;
            let state = if s.active { SLOT_ACTIVE } else { SLOT_DISABLED };
            b[at..at + 4].copy_from_slice(&state.to_be_bytes());
            b[at + 4..at + 8].copy_from_slice(&s.iterations.to_be_bytes());
            b[at + 8..at + 40].copy_from_slice(&s.salt);
            b[at + 40..at + 44].copy_from_slice(&s.material_offset.to_be_bytes());
            b[at + 44..at + 48].copy_from_slice(&s.stripes.to_be_bytes());
        }
        b
    }
}

/// The payload cipher of an opened or new image: sector `s` of the disk
/// (at [`LuksHeader::payload_byte`] + 512·s) under tweak `s`.
pub struct LuksPayload {
    xts: Xts,
    plain32: bool,
}

impl LuksPayload {
    /// Runs `f(part, tweak)` over `buf` cut where a 32-bit tweak wraps.
    fn each_run(&self, buf: &mut [u8], first_sector: u64, f: &dyn Fn(&mut [u8], u64)) {
        if !self.plain32 {
            return f(buf, first_sector);
        }
        let mut sector = first_sector;
        let mut rest = buf;
        while !rest.is_empty() {
            let room = (1u64 << 32) - (sector & 0xffff_ffff);
            let n = (room.saturating_mul(SECTOR_BYTES as u64)).min(rest.len() as u64) as usize;
            let (part, tail) = rest.split_at_mut(n);
            f(part, sector & 0xffff_ffff);
            sector += (n / SECTOR_BYTES) as u64;
            rest = tail;
        }
    }

    /// Decrypt whole sectors of the payload in place.
    pub fn decrypt(&self, buf: &mut [u8], first_sector: u64) {
        self.each_run(buf, first_sector, &|b, s| self.xts.decrypt(b, s));
    }

    /// Encrypt whole sectors of the payload in place.
    pub fn encrypt(&self, buf: &mut [u8], first_sector: u64) {
        self.each_run(buf, first_sector, &|b, s| self.xts.encrypt(b, s));
    }
}

/// A new image's first [`LuksNew::area`] bytes (header and keyslot
/// material, up to the payload) and its payload cipher.
pub struct LuksNew {
    pub header: LuksHeader,
    /// Everything before the payload, to write at offset 0.
    pub area: Vec<u8>,
    pub payload: LuksPayload,
}

/// PBKDF2-SHA256 rounds for a new slot opened by a secret of `len` bytes:
/// [`MIN_ITERATIONS`] for key material (32 bytes or more), else what takes
/// about a second on this host (measured now), at least that.
pub fn slot_iterations(len: usize) -> u32 {
    if crate::kdf::is_key_material(len) {
        return MIN_ITERATIONS;
    }
    let trial = 20_000u32;
    let started = Instant::now();
    let mut out = [0u8; DEK_BYTES];
    LuksHash::Sha256.derive(trial, &[0u8; SALT_BYTES], b"calibration", &mut out);
    let took = started.elapsed().as_micros().max(1);
    let rounds = u128::from(trial) * PASSPHRASE_MILLIS * 1000 / took;
    rounds.clamp(u128::from(MIN_ITERATIONS), u128::from(MAX_ITERATIONS)) as u32
}

/// Make a LUKS1 image's header for `secret` with a fresh random master
/// key: keyslot 0 active with `iterations` PBKDF2-SHA256 rounds, 1–7
/// disabled, the payload at 2 MiB (docs/FORMAT.md §16.6).
pub fn create(secret: &[u8], iterations: u32) -> Result<LuksNew> {
    let layout = Layout {
        hash: LuksHash::Sha256,
        plain32: false,
        stripes: STRIPES,
        step: MATERIAL_STEP,
        payload: PAYLOAD_SECTORS,
    };
    create_with(secret, iterations, &layout)
}

/// The shape of a new image: what [`create`] uses, or smaller ones for
/// the fuzz target's seeds.
pub(crate) struct Layout {
    pub hash: LuksHash,
    pub plain32: bool,
    pub stripes: u32,
    /// Sectors from one slot's material to the next.
    pub step: u32,
    /// The payload's first sector.
    pub payload: u32,
}

pub(crate) fn create_with(secret: &[u8], iterations: u32, l: &Layout) -> Result<LuksNew> {
    if secret.is_empty() {
        return Err(CryptError::Invalid("the secret is empty".into()));
    }
    let mk = fresh_xts_key()?;
    let mut header = LuksHeader {
        plain32: l.plain32,
        hash: l.hash,
        payload_offset: l.payload,
        key_bytes: DEK_BYTES as u32,
        mk_digest: [0; DIGEST_BYTES],
        mk_digest_salt: random()?,
        mk_digest_iter: MIN_ITERATIONS,
        uuid: uuid_v4()?,
        slots: (0..SLOTS as u32)
            .map(|i| LuksSlot {
                stripes: l.stripes,
                ..LuksSlot::disabled(FIRST_MATERIAL + l.step * i)
            })
            .collect(),
    };
    l.hash.derive(
        MIN_ITERATIONS,
        &header.mk_digest_salt,
        mk.expose(),
        &mut header.mk_digest,
    );
    let slot = &mut header.slots[0];
    slot.active = true;
    slot.iterations = iterations.clamp(1, MAX_ITERATIONS);
    slot.salt = random()?;
    let material = slot_material(secret, slot, &mk, l.hash)?;
    let mut area = vec![0u8; l.payload as usize * SECTOR_BYTES];
    area[..HEADER_BYTES].copy_from_slice(&header.encode());
    let at = FIRST_MATERIAL as usize * SECTOR_BYTES;
    area[at..at + material.len()].copy_from_slice(&material);
    let payload = LuksPayload {
        xts: Xts::new(&mk)?,
        plain32: l.plain32,
    };
    Ok(LuksNew {
        header,
        area,
        payload,
    })
}

/// `mk` split into `slot`'s stripes and encrypted under the slot's key
/// from `secret`, whole sectors.
fn slot_material(
    secret: &[u8],
    slot: &LuksSlot,
    mk: &SecretBytes,
    hash: LuksHash,
) -> Result<Vec<u8>> {
    let mut stripes = af_split(mk, slot.stripes as usize, hash)?;
    let mut slot_key = SecretBytes::zeroed(DEK_BYTES)?;
    hash.derive(slot.iterations, &slot.salt, secret, slot_key.expose_mut());
    stripes.resize(
        slot.material_sectors(DEK_BYTES as u32) as usize * SECTOR_BYTES,
        0,
    );
    Xts::new(&slot_key)?.encrypt(&mut stripes, 0);
    Ok(stripes)
}

/// A random 64-byte XTS key whose halves differ.
fn fresh_xts_key() -> Result<SecretBytes> {
    loop {
        let k = SecretBytes::random(DEK_BYTES)?;
        let (a, b) = k.expose().split_at(DEK_BYTES / 2);
        if a != b {
            return Ok(k);
        }
    }
}

fn uuid_v4() -> Result<String> {
    let mut r: [u8; 16] = random()?;
    r[6] = (r[6] & 0x0f) | 0x40;
    r[8] = (r[8] & 0x3f) | 0x80;
    let h = crate::hex::encode(&r);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// LUKS's diffusion: each hash-length piece `j` of `block` replaced by
/// `H(be32(j) ‖ piece)`, truncated to the piece's length.
fn diffuse(block: &mut [u8], hash: LuksHash) {
    let alg = hash.digest();
    let size = alg.output_len();
    for (j, piece) in block.chunks_mut(size).enumerate() {
        let mut ctx = digest::Context::new(alg);
        ctx.update(&(j as u32).to_be_bytes());
        ctx.update(piece);
        let d = ctx.finish();
        let n = piece.len();
        piece.copy_from_slice(&d.as_ref()[..n]);
    }
}

fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// The anti-forensic split of `key` into `stripes` blocks.
fn af_split(key: &SecretBytes, stripes: usize, hash: LuksHash) -> Result<Vec<u8>> {
    let n = key.len();
    let mut out = vec![0u8; n * stripes];
    aws_lc_rs::rand::fill(&mut out[..n * (stripes - 1)])
        .map_err(|_| CryptError::Io("the random generator failed".into()))?;
    let mut d = Zeroizing::new(vec![0u8; n]);
    for s in out[..n * (stripes - 1)].chunks(n) {
        xor_into(&mut d, s);
        diffuse(&mut d, hash);
    }
    let last = &mut out[n * (stripes - 1)..];
    last.copy_from_slice(&d);
    xor_into(last, key.expose());
    Ok(out)
}

/// The key that [`af_split`] split into `material` (whole stripes of `n`).
fn af_merge(material: &[u8], n: usize, hash: LuksHash) -> Result<SecretBytes> {
    let stripes = material.len() / n;
    let mut d = SecretBytes::zeroed(n)?;
    for s in material[..n * (stripes - 1)].chunks(n) {
        xor_into(d.expose_mut(), s);
        diffuse(d.expose_mut(), hash);
    }
    xor_into(d.expose_mut(), &material[n * (stripes - 1)..]);
    Ok(d)
}

#[cfg(test)]
mod tests;
