//! Replays the committed corpora of the fuzz targets `keyring_parse` and
//! `luks_image` (fuzz/corpus/...) through `strata_crypt::fuzzing`, as the
//! fuzz targets do: none may panic, and the seeds named `opens_*` must be
//! opened by the target's secrets (so the fuzzer starts from inputs that
//! reach the unlock path).
//!
//! The seeds are written by `write_seeds` and `write_luks_seeds`
//! (ignored): `cargo test -p strata-crypt --test fuzz_corpus -- --ignored`.

use std::path::{Path, PathBuf};

use strata_crypt::fuzzing::{keyring_parse, luks_image, luks_seed, LONG_SECRET, SHORT_SECRET};
use strata_crypt::{Argon2Params, KeyringRec, NewSlot};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/keyring_parse")
}

fn slot<'a>(secret: &'a [u8], source: &'a str) -> NewSlot<'a> {
    NewSlot {
        secret,
        source,
        label: Some("seed"),
        // Small enough for the target's bound on each input's work.
        argon2: Argon2Params {
            m_kib: 8192,
            t: 1,
            p: 1,
        },
        now_unix: 1_796_000_000,
    }
}

#[test]
#[ignore = "writes the seeds; run by hand when the record changes"]
fn write_seeds() {
    let dir = corpus();
    std::fs::create_dir_all(&dir).unwrap();
    let (long, keys) = KeyringRec::create(7, &slot(LONG_SECRET, "file")).unwrap();
    let (short, _) = KeyringRec::create(8, &slot(SHORT_SECRET, "file")).unwrap();
    let mut both = long.clone();
    both.add_slot(&keys, &slot(SHORT_SECRET, "helper")).unwrap();
    // Part-way through a deep rekey: two data keys and a cursor.
    let mut deep = long.clone();
    deep.begin_deep(&keys, &slot(LONG_SECRET, "file")).unwrap();
    deep.deep_rekey.as_mut().unwrap().next_grain = 12_345;
    // An own-key clone of an own-key clone: key indexes 1 and 2.
    let (own1, k1) = long
        .own_key_clone(&keys, &slot(LONG_SECRET, "file"))
        .unwrap();
    let (own2, _) = own1.own_key_clone(&k1, &slot(LONG_SECRET, "file")).unwrap();
    // An own-key clone part-way through a deep rekey: its own key kept.
    let mut own_deep = own1.clone();
    own_deep
        .begin_deep(&k1, &slot(LONG_SECRET, "file"))
        .unwrap();
    own_deep.deep_rekey.as_mut().unwrap().next_grain = 777;
    for (name, rec) in [
        ("opens_long_secret.json", &long),
        ("opens_short_secret.json", &short),
        ("opens_two_slots.json", &both),
        ("opens_deep_rekey.json", &deep),
        ("opens_own_keys.json", &own2),
        ("opens_own_deep_rekey.json", &own_deep),
    ] {
        // Seeds already committed stay as they are.
        if !dir.join(name).exists() {
            std::fs::write(dir.join(name), serde_json::to_vec_pretty(rec).unwrap()).unwrap();
        }
    }
}

#[test]
fn the_corpus_replays_and_its_seeds_open() {
    let mut n = 0;
    for e in std::fs::read_dir(corpus()).unwrap() {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let opened = keyring_parse(&data);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("opens_") {
            assert!(opened > 0, "{name}: no secret opened it");
        }
        n += 1;
    }
    assert!(n >= 4, "only {n} seeds");
}

fn luks_corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/luks_image")
}

#[test]
#[ignore = "writes the seeds; run by hand when the image layout changes"]
fn write_luks_seeds() {
    let dir = luks_corpus();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, hash, plain32) in [
        ("opens_sha1.luks", "sha1", false),
        ("opens_sha256_plain32.luks", "sha256", true),
        ("opens_sha512.luks", "sha512", false),
    ] {
        std::fs::write(dir.join(name), luks_seed(hash, plain32, 4)).unwrap();
    }
}

#[test]
fn the_luks_corpus_replays_and_its_seeds_open() {
    let mut n = 0;
    for e in std::fs::read_dir(luks_corpus()).unwrap() {
        let path = e.unwrap().path();
        let opened = luks_image(&std::fs::read(&path).unwrap());
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            opened || !name.starts_with("opens_"),
            "{name} does not open"
        );
        n += 1;
    }
    assert!(n >= 3, "only {n} seeds");
}
