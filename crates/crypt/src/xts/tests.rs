use std::sync::Arc;
use std::time::Instant;

use super::*;

/// IEEE Std 1619-2007 XTS-AES-256 keys (vectors 10 to 14): key1 is the
/// digits of e, key2 the digits of pi.
const IEEE_KEY: &str = "27182818284590452353602874713526624977572470936999595749669676273141592653589793238462643383279502884197169399375105820974944592";

/// Vector 10: data unit sequence number 0xff, plaintext bytes 0..=255 twice.
const IEEE_CT_FF: &str = concat!(
    "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b",
    "5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd",
    "5776926c49a3095eb108fd1098baec70aaa66999a72a82f27d848b21d4a741b0",
    "c5cd4d5fff9dac89aeba122961d03a757123e9870f8acf1000020887891429ca",
    "2a3e7a7d7df7b10355165c8b9a6d0a7de8b062c4500dc4cd120c0f7418dae3d0",
    "b5781c34803fa75421c790dfe1de1834f280d7667b327f6c8cd7557e12ac3a0f",
    "93ec05c52e0493ef31a12d3d9260f79a289d6a379bc70c50841473d1a8cc81ec",
    "583e9645e07b8d9670655ba5bbcfecc6dc3966380ad8fecb17b6ba02469a020a",
    "84e18e8f84252070c13e9f1f289be54fbc481457778f616015e1327a02b140f1",
    "505eb309326d68378f8374595c849d84f4c333ec4423885143cb47bd71c5edae",
    "9be69a2ffeceb1bec9de244fbe15992b11b77c040f12bd8f6a975a44a0f90c29",
    "a9abc3d4d893927284c58754cce294529f8614dcd2aba991925fedc4ae74ffac",
    "6e333b93eb4aff0479da9a410e4450e0dd7ae4c6e2910900575da401fc07059f",
    "645e8b7e9bfdef33943054ff84011493c27b3429eaedb4ed5376441a77ed4385",
    "1ad77f16f541dfd269d50d6a5f14fb0aab1cbb4c1550be97f7ab4066193c4caa",
    "773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151",
);

/// Vector 11: data unit sequence number 0xffff, same key and plaintext.
const IEEE_CT_FFFF: &str = concat!(
    "77a31251618a15e6b92d1d66dffe7b50b50bad552305ba0217a610688eff7e11",
    "e1d0225438e093242d6db274fde801d4cae06f2092c728b2478559df58e837c2",
    "469ee4a4fa794e4bbc7f39bc026e3cb72c33b0888f25b4acf56a2a9804f1ce6d",
    "3d6e1dc6ca181d4b546179d55544aa7760c40d06741539c7e3cd9d2f6650b201",
    "3fd0eeb8c2b8e3d8d240ccae2d4c98320a7442e1c8d75a42d6e6cfa4c2eca179",
    "8d158c7aecdf82490f24bb9b38e108bcda12c3faf9a21141c3613b58367f922a",
    "aa26cd22f23d708dae699ad7cb40a8ad0b6e2784973dcb605684c08b8d6998c6",
    "9aac049921871ebb65301a4619ca80ecb485a31d744223ce8ddc2394828d6a80",
    "470c092f5ba413c3378fa6054255c6f9df4495862bbb3287681f931b687c888a",
    "bf844dfc8fc28331e579928cd12bd2390ae123cf03818d14dedde5c0c24c8ab0",
    "18bfca75ca096f2d531f3d1619e785f1ada437cab92e980558b3dce1474afb75",
    "bfedbf8ff54cb2618e0244c9ac0d3c66fb51598cd2db11f9be39791abe447c63",
    "094f7c453b7ff87cb5bb36b7c79efb0872d17058b83b15ab0866ad8a58656c5a",
    "7e20dbdf308b2461d97c0ec0024a2715055249cf3b478ddd4740de654f75ca68",
    "6e0d7345c69ed50cdc2a8b332b1f8824108ac937eb050585608ee734097fc090",
    "54fbff89eeaeea791f4a7ab1f9868294a4f9e27b42af8100cb9d59cef9645803",
);

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The engines this CPU runs: aws-lc always, strata's own where it can.
fn engines() -> Vec<XtsEngine> {
    let mut all = vec![XtsEngine::AwsLc];
    if XtsEngine::best() == XtsEngine::Vaes {
        all.push(XtsEngine::Vaes);
    } else {
        eprintln!("this CPU has no VAES/AVX-512: only the aws-lc engine is tested");
    }
    all
}

fn ieee_xts(engine: XtsEngine) -> Xts {
    Xts::with_engine(&SecretBytes::from_slice(&unhex(IEEE_KEY)).unwrap(), engine).unwrap()
}

fn ieee_plain() -> Vec<u8> {
    (0..512).map(|i| i as u8).collect()
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    aws_lc_rs::rand::fill(&mut v).unwrap();
    v
}

fn random_xts() -> Xts {
    Xts::new(&SecretBytes::random(DEK_BYTES).unwrap()).unwrap()
}

#[test]
fn ieee1619_vectors_in_place_and_to() {
    for (engine, (sector, ct)) in engines()
        .into_iter()
        .flat_map(|e| [(e, (0xffu64, IEEE_CT_FF)), (e, (0xffff, IEEE_CT_FFFF))])
    {
        let xts = ieee_xts(engine);
        let want = unhex(ct);
        let mut buf = ieee_plain();
        xts.encrypt(&mut buf, sector);
        assert_eq!(buf, want, "{engine:?} encrypt, sector {sector:#x}");
        xts.decrypt(&mut buf, sector);
        assert_eq!(buf, ieee_plain(), "{engine:?} decrypt, sector {sector:#x}");

        let src = ieee_plain();
        let mut dst = vec![0u8; 512];
        xts.encrypt_to(&src, &mut dst, sector);
        assert_eq!(dst, want);
        assert_eq!(src, ieee_plain());
        let mut back = vec![0u8; 512];
        xts.decrypt_to(&dst, &mut back, sector);
        assert_eq!(back, src);
    }
}

#[test]
fn ieee_vector_inside_a_multi_sector_buffer() {
    // Sector 0xff sits second in a buffer that starts at 0xfe: this checks
    // that re-setting only the IV between sectors works with aws-lc, and
    // that the vaes engine takes the second lane of its four tweaks. Then
    // at every position of a 9-sector buffer (two groups of four and one).
    for engine in engines() {
        let xts = ieee_xts(engine);
        let mut buf = random_bytes(3 * 512);
        buf[512..1024].copy_from_slice(&ieee_plain());
        xts.encrypt(&mut buf, 0xfe);
        assert_eq!(&buf[512..1024], &unhex(IEEE_CT_FF)[..], "{engine:?}");
        for at in 0..9u64 {
            let mut buf = random_bytes(9 * 512);
            let i = at as usize * 512;
            buf[i..i + 512].copy_from_slice(&ieee_plain());
            xts.encrypt(&mut buf, 0xff - at);
            assert_eq!(
                &buf[i..i + 512],
                &unhex(IEEE_CT_FF)[..],
                "{engine:?} at {at}"
            );
        }
    }
}

/// XTS from its definition over single AES blocks (aws-lc's AES_encrypt),
/// for one 512-byte sector with a plain64 tweak.
fn reference_sector(key: &[u8], sector: u64, data: &[u8]) -> Vec<u8> {
    fn schedule(k: &[u8]) -> ffi::AES_KEY {
        // SAFETY: AES_KEY is plain data; AES_set_encrypt_key fills it from a
        // 32-byte key.
        unsafe {
            let mut ks: ffi::AES_KEY = std::mem::zeroed();
            assert_eq!(ffi::AES_set_encrypt_key(k.as_ptr(), 256, &mut ks), 0);
            ks
        }
    }
    fn block(ks: &ffi::AES_KEY, b: &mut [u8; 16]) {
        let inp = *b;
        // SAFETY: 16-byte input and output blocks, a valid key schedule.
        unsafe { ffi::AES_encrypt(inp.as_ptr(), b.as_mut_ptr(), ks) }
    }
    let (k1, k2) = (schedule(&key[..32]), schedule(&key[32..]));
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&sector.to_le_bytes());
    block(&k2, &mut t);
    let mut out = Vec::with_capacity(data.len());
    for chunk in data.chunks_exact(16) {
        let mut b = [0u8; 16];
        for j in 0..16 {
            b[j] = chunk[j] ^ t[j];
        }
        block(&k1, &mut b);
        out.extend(b.iter().zip(&t).map(|(x, y)| x ^ y));
        // Multiply the tweak by alpha in GF(2^128), little-endian bytes.
        let carry = t[15] >> 7;
        for j in (1..16).rev() {
            t[j] = (t[j] << 1) | (t[j - 1] >> 7);
        }
        t[0] = (t[0] << 1) ^ (carry * 0x87);
    }
    out
}

#[test]
fn matches_reference_at_wide_sector_numbers() {
    let key = SecretBytes::random(DEK_BYTES).unwrap();
    for (engine, sector) in engines().into_iter().flat_map(|e| {
        [
            0u64,
            1,
            0x1234_5678_9abc_def0,
            u64::MAX - 1,
            1 << 32,
            0xff00_0000_0000_0001,
        ]
        .map(|s| (e, s))
    }) {
        let xts = Xts::with_engine(&key, engine).unwrap();
        let data = random_bytes(512);
        let mut buf = data.clone();
        xts.encrypt(&mut buf, sector);
        assert_eq!(
            buf,
            reference_sector(key.expose(), sector, &data),
            "{engine:?} sector {sector:#x}"
        );
    }
}

/// The two engines and the block-by-block reference give the same bytes
/// for buffers of 1 to 40 sectors at random and wrapping sector numbers,
/// in place and into another buffer, both ways.
#[test]
fn engines_agree_on_every_length_and_sector() {
    let all = engines();
    for round in 0..300u64 {
        let key = SecretBytes::random(DEK_BYTES).unwrap();
        let sectors = 1 + (round % 40) as usize;
        let first = match round % 3 {
            0 => u64::from_le_bytes(random_bytes(8).try_into().unwrap()),
            1 => u64::MAX - (round % 7),
            _ => round * 8,
        };
        let data = random_bytes(sectors * 512);
        let want: Vec<u8> = data
            .chunks_exact(512)
            .enumerate()
            .flat_map(|(i, c)| reference_sector(key.expose(), first.wrapping_add(i as u64), c))
            .collect();
        for &engine in &all {
            let xts = Xts::with_engine(&key, engine).unwrap();
            let what = format!("{engine:?}, {sectors} sectors from {first:#x}");
            let mut inplace = data.clone();
            xts.encrypt(&mut inplace, first);
            assert!(inplace == want, "encrypt: {what}");
            let mut to = vec![0u8; data.len()];
            xts.encrypt_to(&data, &mut to, first);
            assert!(to == want, "encrypt_to: {what}");
            xts.decrypt(&mut inplace, first);
            assert!(inplace == data, "decrypt: {what}");
            let mut back = vec![0u8; data.len()];
            xts.decrypt_to(&to, &mut back, first);
            assert!(back == data, "decrypt_to: {what}");
        }
    }
}

#[test]
fn a_key_reports_its_engine_and_aws_lc_always_runs() {
    let key = SecretBytes::random(DEK_BYTES).unwrap();
    assert_eq!(Xts::new(&key).unwrap().engine(), XtsEngine::best());
    let lc = Xts::with_engine(&key, XtsEngine::AwsLc).unwrap();
    assert_eq!(lc.engine(), XtsEngine::AwsLc);
    if XtsEngine::best() != XtsEngine::Vaes {
        let e = Xts::with_engine(&key, XtsEngine::Vaes).unwrap_err();
        assert!(e.to_string().contains("cannot run the vaes"), "{e}");
    }
}

#[test]
fn round_trip_at_many_sectors() {
    let xts = random_xts();
    let mut s = 0u64;
    for round in 0..200u64 {
        let sectors = 1 + (round % 17) as usize;
        let data = random_bytes(sectors * 512);
        let mut buf = data.clone();
        xts.encrypt(&mut buf, s);
        assert_ne!(buf, data);
        xts.decrypt(&mut buf, s);
        assert_eq!(buf, data, "round {round} at sector {s}");
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407 + round);
    }
}

#[test]
fn multi_sector_equals_one_by_one() {
    let xts = random_xts();
    let first = 0x0000_0001_ffff_fffeu64;
    let data = random_bytes(16 * 512);
    let mut whole = data.clone();
    xts.encrypt(&mut whole, first);
    for (i, chunk) in data.chunks_exact(512).enumerate() {
        let mut one = chunk.to_vec();
        xts.encrypt(&mut one, first + i as u64);
        assert_eq!(&whole[i * 512..(i + 1) * 512], &one[..], "sector {i}");
    }
    // Same sector data at different positions encrypts differently.
    let mut twice = [data[..512].to_vec(), data[..512].to_vec()].concat();
    xts.encrypt(&mut twice, 9);
    assert_ne!(twice[..512], twice[512..]);
}

#[test]
fn different_keys_differ_and_empty_is_noop() {
    let (a, b) = (random_xts(), random_xts());
    let data = random_bytes(512);
    let (mut x, mut y) = (data.clone(), data.clone());
    a.encrypt(&mut x, 5);
    b.encrypt(&mut y, 5);
    assert_ne!(x, y);
    let mut empty: [u8; 0] = [];
    a.encrypt(&mut empty, 5);
}

#[test]
fn rejects_bad_keys() {
    for len in [0usize, 32, 63, 65, 128] {
        let k = SecretBytes::random(len).unwrap();
        assert!(
            matches!(Xts::new(&k), Err(CryptError::Invalid(_))),
            "len {len}"
        );
    }
    let mut k = SecretBytes::random(64).unwrap();
    let (a, b) = k.expose_mut().split_at_mut(32);
    b.copy_from_slice(a);
    let e = Xts::new(&k).unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("differ")),
        "{e}"
    );
}

#[test]
#[should_panic(expected = "not whole 512-byte sectors")]
fn partial_sector_is_a_bug() {
    let mut buf = vec![0u8; 700];
    random_xts().encrypt(&mut buf, 0);
}

#[test]
fn shared_across_threads() {
    for engine in engines() {
        shared_across_threads_on(engine);
    }
}

fn shared_across_threads_on(engine: XtsEngine) {
    let key = SecretBytes::random(DEK_BYTES).unwrap();
    let xts = Arc::new(Xts::with_engine(&key, engine).unwrap());
    let data = random_bytes(8 * 512);
    let mut want = data.clone();
    xts.encrypt(&mut want, 77);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (xts, data, want) = (xts.clone(), data.clone(), want.clone());
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let mut b = data.clone();
                    xts.encrypt(&mut b, 77);
                    assert_eq!(b, want);
                    xts.decrypt(&mut b, 77);
                    assert_eq!(b, data);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(xts.enc.idle.lock().unwrap().len() <= 4);
}

/// The per-call alternative: a fresh context (allocation and key expansion)
/// for every call.
fn crypt_per_call(key: &SecretBytes, encrypt: bool, buf: &mut [u8], first: u64) {
    let mut ctx = Ctx::new(key.expose(), encrypt).unwrap();
    let p = buf.as_mut_ptr();
    // SAFETY: in place over one valid buffer.
    unsafe { ctx.run(p, p, buf.len(), first) };
}

fn encrypt_per_call(key: &SecretBytes, buf: &mut [u8], first: u64) {
    crypt_per_call(key, true, buf, first);
}

#[test]
fn per_call_context_agrees() {
    let key = SecretBytes::random(DEK_BYTES).unwrap();
    let xts = Xts::with_engine(&key, XtsEngine::AwsLc).unwrap();
    let data = random_bytes(4096);
    let (mut a, mut b) = (data.clone(), data.clone());
    xts.encrypt(&mut a, 1000);
    encrypt_per_call(&key, &mut b, 1000);
    assert_eq!(a, b);
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn time_4k(n: usize, mut op: impl FnMut(&mut [u8], u64)) -> f64 {
    let mut buf = random_bytes(4096);
    let t = Instant::now();
    for i in 0..n {
        op(&mut buf, i as u64 * 8);
    }
    gbps(n * 4096, t.elapsed().as_secs_f64())
}

/// `cargo test -p strata-crypt --release -- --ignored --nocapture ctx_strategies`
#[test]
#[ignore = "a measurement, run it with --release"]
fn ctx_strategies_speed() {
    let key = SecretBytes::random(DEK_BYTES).unwrap();
    let xts = Xts::with_engine(&key, XtsEngine::AwsLc).unwrap();
    let n = 500_000;
    for _ in 0..3 {
        let pe = time_4k(n, |b, s| xts.encrypt(b, s));
        let pd = time_4k(n, |b, s| xts.decrypt(b, s));
        let ce = time_4k(n, |b, s| crypt_per_call(&key, true, b, s));
        let cd = time_4k(n, |b, s| crypt_per_call(&key, false, b, s));
        println!(
            "4 KiB GB/s: pooled contexts encrypt {pe:.2} decrypt {pd:.2}; \
             per-call context encrypt {ce:.2} decrypt {cd:.2}"
        );
    }
}
