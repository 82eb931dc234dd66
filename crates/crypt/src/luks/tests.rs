use super::*;

/// An image in memory: the new header area and `sectors` of payload.
fn image(secret: &[u8], sectors: usize) -> (Vec<u8>, Vec<u8>) {
    let new = create(secret, 1000).unwrap();
    let mut plain = vec![0u8; sectors * SECTOR_BYTES];
    for (i, b) in plain.iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    let mut file = new.area.clone();
    let mut payload = plain.clone();
    new.payload.encrypt(&mut payload, 0);
    file.extend_from_slice(&payload);
    (file, plain)
}

fn reader(file: &[u8]) -> impl FnMut(u64, &mut [u8]) -> std::io::Result<()> + '_ {
    move |at, buf| {
        let at = at as usize;
        let src = file
            .get(at..at + buf.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

#[test]
fn a_new_image_opens_with_its_secret_only() {
    let (file, plain) = image(b"a key file's bytes", 16);
    let h = LuksHeader::parse(&file[..HEADER_BYTES], file.len() as u64).unwrap();
    assert_eq!(h.payload_offset, PAYLOAD_SECTORS);
    assert_eq!(h.hash, LuksHash::Sha256);
    assert_eq!(h.slots.iter().filter(|s| s.active).count(), 1);
    assert_eq!(h.uuid.len(), 36);
    assert_eq!(h.encode().as_slice(), &file[..HEADER_BYTES]);
    let (payload, slot) = h.open(b"a key file's bytes", &mut reader(&file)).unwrap();
    assert_eq!(slot, 0);
    let mut data = file[h.payload_byte() as usize..].to_vec();
    payload.decrypt(&mut data, 0);
    assert_eq!(data, plain);
    let wrong = h.open(b"a key file's byteS", &mut reader(&file));
    assert!(matches!(wrong, Err(CryptError::WrongKey)));
}

#[test]
fn split_and_merge_are_inverse_for_every_hash() {
    let key = SecretBytes::random(64).unwrap();
    for hash in [LuksHash::Sha1, LuksHash::Sha256, LuksHash::Sha512] {
        for stripes in [1, 2, 4000] {
            let m = af_split(&key, stripes, hash).unwrap();
            assert_eq!(m.len(), 64 * stripes);
            let back = af_merge(&m, 64, hash).unwrap();
            assert_eq!(back.expose(), key.expose());
        }
    }
    // One changed byte anywhere in the material gives another key.
    let m = af_split(&key, 10, LuksHash::Sha256).unwrap();
    let mut bad = m.clone();
    bad[3] ^= 1;
    assert_ne!(
        af_merge(&bad, 64, LuksHash::Sha256).unwrap().expose(),
        key.expose()
    );
}

#[test]
fn diffusion_matches_the_specification() {
    // SHA-1 of be32(0) || 20 bytes of 0xaa, then of be32(1) || the 12-byte tail.
    let mut block = [0xaau8; 32];
    diffuse(&mut block, LuksHash::Sha1);
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(&[0, 0, 0, 0]);
    ctx.update(&[0xaa; 20]);
    assert_eq!(&block[..20], ctx.finish().as_ref());
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(&[0, 0, 0, 1]);
    ctx.update(&[0xaa; 12]);
    assert_eq!(&block[20..], &ctx.finish().as_ref()[..12]);
}

fn refused(mut hdr: Vec<u8>, len: u64, expect: &str) {
    hdr.truncate(HEADER_BYTES);
    let e = LuksHeader::parse(&hdr, len).unwrap_err().to_string();
    assert!(e.contains(expect), "{e:?} does not say {expect:?}");
}

#[test]
fn hostile_headers_are_refused_before_any_key_is_derived() {
    let (file, _) = image(b"secret", 1);
    let len = file.len() as u64;
    let at =
        |f: &mut Vec<u8>, off: usize, v: u32| f[off..off + 4].copy_from_slice(&v.to_be_bytes());
    let mut f = file.clone();
    f[0] = b'X';
    refused(f, len, "no LUKS magic");
    let mut f = file.clone();
    f[7] = 2;
    refused(f, len, "LUKS version 2");
    let mut f = file.clone();
    f[40..72].fill(0);
    f[40..51].copy_from_slice(b"cbc-essiv:s");
    refused(f, len, "only aes-xts-plain64");
    let mut f = file.clone();
    at(&mut f, 108, 32);
    refused(f, len, "256-bit key");
    let mut f = file.clone();
    f[72..78].copy_from_slice(b"md5\0\0\0");
    refused(f, len, "hash \"md5\"");
    let mut f = file.clone();
    at(&mut f, 104, u32::MAX);
    refused(f, len, "payload offset");
    let mut f = file.clone();
    at(&mut f, 104, 100);
    refused(f, len, "not between the header and the payload");
    let mut f = file.clone();
    at(&mut f, 164, MAX_ITERATIONS + 1);
    refused(f, len, "digest iterations");
    let mut f = file.clone();
    at(&mut f, 208 + 4, 0);
    refused(f, len, "0 PBKDF2 iterations");
    let mut f = file.clone();
    at(&mut f, 208 + 44, STRIPES + 1);
    refused(f, len, "stripes");
    let mut f = file.clone();
    at(&mut f, 208 + 48, SLOT_ACTIVE);
    at(&mut f, 208 + 48 + 4, 1000);
    at(&mut f, 208 + 48 + 40, FIRST_MATERIAL + 10);
    refused(f, len, "overlaps keyslot 0");
    let mut f = file.clone();
    at(&mut f, 208, 7);
    refused(f, len, "neither active nor disabled");
    let mut f = file.clone();
    at(&mut f, 208, SLOT_DISABLED);
    refused(f, len, "no keyslot is active");
    let mut f = file.clone();
    f[170] = 0x07;
    refused(f, len, "uuid field");
}

#[test]
fn thirty_two_bit_tweaks_wrap() {
    let key = fresh_xts_key().unwrap();
    let p32 = LuksPayload {
        xts: Xts::new(&key).unwrap(),
        plain32: true,
    };
    let x = Xts::new(&key).unwrap();
    let first = (1u64 << 32) - 1;
    let mut a = vec![0x5au8; 3 * SECTOR_BYTES];
    let mut b = a.clone();
    p32.encrypt(&mut a, first);
    // Sector 2^32 - 1 keeps its tweak; the next two wrap to 0 and 1.
    x.encrypt(&mut b[..SECTOR_BYTES], first);
    x.encrypt(&mut b[SECTOR_BYTES..], 0);
    assert_eq!(a, b);
    p32.decrypt(&mut a, first);
    assert_eq!(a, vec![0x5au8; 3 * SECTOR_BYTES]);
}

#[test]
fn calibration_gives_key_material_the_floor() {
    assert_eq!(slot_iterations(32), MIN_ITERATIONS);
    assert_eq!(slot_iterations(64), MIN_ITERATIONS);
}
