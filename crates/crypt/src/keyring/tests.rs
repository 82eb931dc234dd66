use super::*;

const TINY: Argon2Params = Argon2Params {
    m_kib: 8192,
    t: 1,
    p: 1,
};
const FILE_KEY: &[u8; 32] = b"0123456789abcdef0123456789ABCDEF";
const NOW: u64 = 1_700_000_000;

fn slot<'a>(secret: &'a [u8], source: &'a str) -> NewSlot<'a> {
    NewSlot {
        secret,
        source,
        label: None,
        argon2: TINY,
        now_unix: NOW,
    }
}

fn sample_data() -> Vec<u8> {
    (0..4096u32).map(|i| (i * 7 + 3) as u8).collect()
}

/// What `keys` makes of the sample data at sector 42 under its current key.
fn cipher_of(keys: &Unlocked) -> Vec<u8> {
    let mut d = sample_data();
    keys.current().encrypt(&mut d, 42);
    d
}

#[test]
fn create_with_key_file_and_unlock() {
    let (rec, keys) = KeyringRec::create(7, &slot(FILE_KEY, "file")).unwrap();
    rec.validate().unwrap();
    assert_eq!(rec.id, 7);
    assert_eq!(rec.uuid.len(), 32);
    assert_eq!(rec.uuid, keys.uuid());
    assert_eq!(rec.cipher, "aes-xts-plain64");
    assert_eq!(rec.sector_bytes, 512);
    assert_eq!(rec.keys.len(), 1);
    assert_eq!(rec.slots[0].slot, 0);
    assert_eq!(rec.slots[0].source, "file");
    assert!(matches!(rec.slots[0].kdf, KdfRec::HkdfSha256 { .. }));
    assert_eq!(keys.current_index(), 0);
    assert!(keys.key(0).is_some() && keys.key(1).is_none());

    let again = rec.unlock(FILE_KEY).unwrap();
    assert_eq!(cipher_of(&again), cipher_of(&keys));
    assert_eq!(rec.slot_of(FILE_KEY).unwrap(), 0);
    let dbg = format!("{again:?}");
    assert!(dbg.contains("redacted") && dbg.contains(&rec.uuid), "{dbg}");
    let dbg = format!("{:?}", slot(FILE_KEY, "file"));
    assert!(
        dbg.contains("<32 bytes, redacted>") && !dbg.contains("0123456789abcdef"),
        "{dbg}"
    );
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Unlocked>();
    send_sync::<Xts>();
    send_sync::<KeyringRec>();
}

#[test]
fn create_with_passphrase_and_unlock() {
    let mut new = slot(b"correct horse", "passphrase");
    new.label = Some("ops");
    let (rec, keys) = KeyringRec::create(1, &new).unwrap();
    assert!(matches!(
        rec.slots[0].kdf,
        KdfRec::Argon2id {
            m_kib: 8192,
            t: 1,
            p: 1,
            ..
        }
    ));
    assert_eq!(rec.slots[0].label.as_deref(), Some("ops"));
    let again = rec.unlock(b"correct horse").unwrap();
    assert_eq!(cipher_of(&again), cipher_of(&keys));
}

#[test]
fn wrong_secrets() {
    let (rec, _) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    let mut other = *FILE_KEY;
    other[31] ^= 1;
    assert!(matches!(rec.unlock(&other), Err(CryptError::WrongKey)));
    assert!(matches!(rec.unlock(b"short"), Err(CryptError::WrongKey)));
    assert!(matches!(
        rec.unlock(&[FILE_KEY.as_slice(), b"x"].concat()),
        Err(CryptError::WrongKey)
    ));
    assert!(matches!(rec.unlock(b""), Err(CryptError::Invalid(_))));
    assert!(matches!(rec.slot_of(&other), Err(CryptError::WrongKey)));

    let (rec, _) = KeyringRec::create(1, &slot(b"pass", "passphrase")).unwrap();
    assert!(matches!(rec.unlock(b"pasS"), Err(CryptError::WrongKey)));
    assert!(matches!(rec.unlock(FILE_KEY), Err(CryptError::WrongKey)));
}

#[test]
fn add_and_remove_slots() {
    let (mut rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    let n = rec.add_slot(&keys, &slot(b"pass", "passphrase")).unwrap();
    assert_eq!(n, 1);
    rec.validate().unwrap();
    let a = rec.unlock(FILE_KEY).unwrap();
    let b = rec.unlock(b"pass").unwrap();
    assert_eq!(cipher_of(&a), cipher_of(&keys));
    assert_eq!(cipher_of(&b), cipher_of(&keys));
    assert_eq!(rec.slot_of(b"pass").unwrap(), 1);

    // Lowest free number, up to eight slots.
    rec.remove_slot(0).unwrap();
    assert!(matches!(rec.unlock(FILE_KEY), Err(CryptError::WrongKey)));
    let long2 = [5u8; 40];
    assert_eq!(rec.add_slot(&keys, &slot(&long2, "helper")).unwrap(), 0);
    for want in 2..8 {
        assert_eq!(rec.add_slot(&keys, &slot(&long2, "keyring")).unwrap(), want);
    }
    assert_eq!(rec.slots.len(), MAX_SLOTS);
    let e = rec.add_slot(&keys, &slot(&long2, "file")).unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("remove one")),
        "{e}"
    );
    rec.validate().unwrap();

    for s in 0..7 {
        rec.remove_slot(s).unwrap();
    }
    let e = rec.remove_slot(7).unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("last")),
        "{e}"
    );
    assert!(matches!(rec.remove_slot(3), Err(CryptError::Invalid(_))));
    assert_eq!(
        rec.unlock(&long2).map(|u| cipher_of(&u)).unwrap(),
        cipher_of(&keys)
    );
}

#[test]
fn slot_inputs_are_checked() {
    let (mut rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    assert!(matches!(
        rec.add_slot(&keys, &slot(b"", "file")),
        Err(CryptError::Invalid(_))
    ));
    assert!(matches!(
        rec.add_slot(&keys, &slot(FILE_KEY, "usb")),
        Err(CryptError::Invalid(_))
    ));
    let mut huge = slot(b"pw", "passphrase");
    huge.argon2.m_kib = u32::MAX;
    assert!(matches!(
        rec.add_slot(&keys, &huge),
        Err(CryptError::Invalid(_))
    ));
    assert!(matches!(
        KeyringRec::create(1, &slot(b"", "file")),
        Err(CryptError::Invalid(_))
    ));
    assert_eq!(rec.slots.len(), 1);
}

#[test]
fn foreign_keys_are_refused() {
    let (mut rec, _) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    let (_, foreign) = KeyringRec::create(2, &slot(FILE_KEY, "file")).unwrap();
    let e = rec
        .add_slot(&foreign, &slot(b"pw", "passphrase"))
        .unwrap_err();
    assert!(matches!(e, CryptError::Invalid(_)), "{e}");
    assert!(rec
        .rekey_shallow(&foreign, &slot(b"pw", "passphrase"))
        .is_err());
    // Same uuid but another KK (a forged Unlocked) is refused too.
    let forged = Unlocked {
        uuid: hex::decode_exact::<16>(&rec.uuid).unwrap(),
        kk: SecretBytes::random(32).unwrap(),
        keys: foreign.keys.clone(),
    };
    let e = rec
        .add_slot(&forged, &slot(b"pw", "passphrase"))
        .unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("do not open")),
        "{e}"
    );
    assert_eq!(rec.slots.len(), 1);
}

#[test]
fn rekey_shallow_keeps_data_keys() {
    let (mut rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    rec.add_slot(&keys, &slot(b"pass", "passphrase")).unwrap();
    let before = cipher_of(&keys);
    let wrapped_keys = rec.keys.clone();
    let new_secret = [0xa5u8; 64];
    rec.rekey_shallow(&keys, &slot(&new_secret, "helper"))
        .unwrap();
    rec.validate().unwrap();
    assert_eq!(rec.slots.len(), 1);
    assert_eq!(rec.slots[0].slot, 0);
    assert_eq!(rec.keys, wrapped_keys);
    assert!(matches!(rec.unlock(FILE_KEY), Err(CryptError::WrongKey)));
    assert!(matches!(rec.unlock(b"pass"), Err(CryptError::WrongKey)));
    let after = rec.unlock(&new_secret).unwrap();
    assert_eq!(cipher_of(&after), before);
}

/// Three keys; the highest index is current, each key opens by index.
#[test]
fn several_data_keys() {
    let (rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    let uuid = hex::decode_exact::<16>(&rec.uuid).unwrap();
    let mut rec2 = rec.clone();
    for index in [5u32, 2] {
        let dek = SecretBytes::random(DEK_BYTES).unwrap();
        let w = wrap_secret(&keys.kk, dek.expose(), &dek_aad(&uuid, index)).unwrap();
        rec2.keys.push(WrappedKey {
            index,
            created_unix: NOW,
            wrapped: B64.encode(w),
        });
    }
    let u = rec2.unlock(FILE_KEY).unwrap();
    assert_eq!(u.current_index(), 5);
    assert!(u.key(0).is_some() && u.key(2).is_some() && u.key(5).is_some() && u.key(3).is_none());
    assert!(Arc::ptr_eq(u.current(), u.key(5).unwrap()));

    // A DEK stored under another index's AAD fails its tag: Damaged.
    let mut moved = rec2.clone();
    moved.keys[1].index = 9;
    let e = moved.unlock(FILE_KEY).unwrap_err();
    assert!(
        matches!(e, CryptError::Damaged(ref m) if m.contains("key 9")),
        "{e}"
    );
    // A slot copied under another number fails too: its AAD names the slot.
    let mut renumbered = rec.clone();
    renumbered.slots[0].slot = 3;
    assert!(matches!(
        renumbered.unlock(FILE_KEY),
        Err(CryptError::WrongKey)
    ));
}

fn damaged_msg(rec: &KeyringRec) -> String {
    match rec.validate() {
        Err(CryptError::Damaged(m)) => m,
        other => panic!("expected Damaged, got {other:?}"),
    }
}

#[test]
fn validate_rejects() {
    let (mut rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    rec.add_slot(&keys, &slot(b"pass", "passphrase")).unwrap();
    rec.validate().unwrap();

    for bad_uuid in [
        "",
        "xyz",
        &rec.uuid.to_uppercase(),
        &rec.uuid[..30],
        &format!("{}00", rec.uuid),
    ] {
        let mut r = rec.clone();
        r.uuid = bad_uuid.to_string();
        assert!(damaged_msg(&r).contains("uuid"));
    }
    let mut r = rec.clone();
    r.cipher = "aes-cbc-essiv:sha256".into();
    assert!(damaged_msg(&r).contains("cipher"));
    let mut r = rec.clone();
    r.sector_bytes = 4096;
    assert!(damaged_msg(&r).contains("sector"));

    let mut r = rec.clone();
    r.slots.clear();
    assert!(damaged_msg(&r).contains("0 keyslots"));
    let mut r = rec.clone();
    while r.slots.len() < 9 {
        let mut s = r.slots[0].clone();
        s.slot = r.slots.len() as u32;
        r.slots.push(s);
    }
    assert!(damaged_msg(&r).contains("9 keyslots"));
    let mut r = rec.clone();
    r.slots[1].slot = 0;
    assert!(damaged_msg(&r).contains("slot 0 appears twice"));
    let mut r = rec.clone();
    r.slots[1].slot = 8;
    assert!(damaged_msg(&r).contains("slot 8"));
    let mut r = rec.clone();
    r.slots[1].source = "usb".into();
    assert!(damaged_msg(&r).contains("source"));

    let mut r = rec.clone();
    r.keys.clear();
    assert!(damaged_msg(&r).contains("0 data keys"));
    let mut r = rec.clone();
    r.keys.push(r.keys[0].clone());
    assert!(damaged_msg(&r).contains("key 0 appears twice"));
}

#[test]
fn validate_rejects_bad_wrapped_and_kdf() {
    let (mut rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    rec.add_slot(&keys, &slot(b"pass", "passphrase")).unwrap();

    let mut r = rec.clone();
    r.keys[0].wrapped.replace_range(0..1, "*");
    assert!(damaged_msg(&r).contains("key 0: bad base64"));
    let mut r = rec.clone();
    r.slots[1].wrapped.replace_range(4..5, "!");
    assert!(damaged_msg(&r).contains("slot 1: bad base64"));
    let mut r = rec.clone();
    r.slots[0].wrapped = B64.encode([0u8; 61]);
    assert!(damaged_msg(&r).contains("slot 0"));
    let mut r = rec.clone();
    r.keys[0].wrapped = "A".repeat(1_000_000);
    assert!(damaged_msg(&r).contains("key 0"));

    for (m_kib, t, p, what) in [
        (u32::MAX, 1, 1, "memory"),
        (5 * 1024 * 1024, 1, 1, "memory"),
        (8192, 1000, 1, "passes"),
        (8192, 1, 64, "lanes"),
        (8, 1, 2, "memory"),
    ] {
        let mut r = rec.clone();
        if let KdfRec::Argon2id { salt, .. } = &r.slots[1].kdf {
            r.slots[1].kdf = KdfRec::Argon2id {
                salt: salt.clone(),
                m_kib,
                t,
                p,
            };
        }
        let m = damaged_msg(&r);
        assert!(m.contains("slot 1") && m.contains(what), "{m}");
        // unlock refuses before deriving anything.
        assert!(matches!(r.unlock(b"pass"), Err(CryptError::Damaged(_))));
    }
    let mut r = rec.clone();
    r.slots[0].kdf = KdfRec::HkdfSha256 { salt: "00".into() };
    assert!(damaged_msg(&r).contains("salt"));
}

#[test]
fn json_round_trip_and_no_key_bytes() {
    let mut new = slot(FILE_KEY, "file");
    new.label = Some("primary");
    let (mut rec, keys) = KeyringRec::create(3, &new).unwrap();
    rec.add_slot(&keys, &slot(b"pass", "passphrase")).unwrap();
    let json = serde_json::to_string_pretty(&rec).unwrap();
    let back: KeyringRec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, rec);
    back.validate().unwrap();
    assert!(json.contains(r#""name": "hkdf-sha256""#), "{json}");
    assert!(json.contains(r#""name": "argon2id""#), "{json}");
    assert!(json.contains(r#""label": "primary""#));
    assert_eq!(
        json.matches("\"label\"").count(),
        1,
        "None labels are left out"
    );

    // Neither the KK nor the DEK appears in any encoding.
    let dek = {
        let uuid = hex::decode_exact::<16>(&rec.uuid).unwrap();
        let w = B64.decode(&rec.keys[0].wrapped).unwrap();
        unwrap_secret(&keys.kk, &w, &dek_aad(&uuid, 0)).unwrap()
    };
    for secret in [
        keys.kk.expose(),
        dek.expose(),
        &dek.expose()[..32],
        &dek.expose()[32..],
    ] {
        for needle in [
            hex::encode(secret),
            hex::encode(secret).to_uppercase(),
            B64.encode(secret),
        ] {
            assert!(
                !json.contains(&needle[..needle.len().min(24)]),
                "key bytes leaked"
            );
        }
    }
    assert!(!json.contains(&hex::encode(FILE_KEY)) && !json.contains("pass\""));

    // A record without a label field parses.
    let stripped = json.replace(r#""label": "primary","#, "");
    let r: KeyringRec = serde_json::from_str(&stripped).unwrap();
    assert_eq!(r.slots[0].label, None);
}

/// A deep rekey: a new KK and DEK, one slot for the new secret; a copy of
/// the record from before opens with the old secret only and holds only
/// the old DEK; the cursor splits the data cipher; the end drops the old
/// key.
#[test]
fn deep_rekey_begins_splits_and_ends() {
    const NEW_KEY: &[u8; 32] = b"fedcba9876543210FEDCBA9876543210";
    let (mut rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    let before = rec.clone();
    let both = rec.begin_deep(&keys, &slot(NEW_KEY, "file")).unwrap();
    rec.validate().unwrap();
    assert_eq!(rec.keys.len(), 2);
    assert_eq!(
        rec.deep_rekey,
        Some(DeepRekey {
            from: 0,
            to: 1,
            next_grain: 0
        })
    );
    assert!(matches!(rec.unlock(FILE_KEY), Err(CryptError::WrongKey)));
    let reopened = rec.unlock(NEW_KEY).unwrap();
    assert_eq!(cipher_of(&reopened), cipher_of(&both));
    // The old key is kept, under the new KK; the new one is new.
    let mut d = sample_data();
    reopened.key(0).unwrap().encrypt(&mut d, 42);
    assert_eq!(d, cipher_of(&keys));
    assert_ne!(cipher_of(&both), cipher_of(&keys));
    // The old record knows nothing of the new key.
    assert!(before.unlock(FILE_KEY).unwrap().key(1).is_none());
    assert!(matches!(
        rec.begin_deep(&both, &slot(NEW_KEY, "file")),
        Err(CryptError::Invalid(_))
    ));

    // Grain 3 onwards is still under the old key.
    rec.deep_rekey.as_mut().unwrap().next_grain = 3;
    let c = rec.data_cipher(&reopened).unwrap();
    let mut below = sample_data();
    c.encrypt(&mut below, 2 * crate::GRAIN_SECTORS);
    let mut want = sample_data();
    both.key(1)
        .unwrap()
        .encrypt(&mut want, 2 * crate::GRAIN_SECTORS);
    assert_eq!(below, want);
    let mut above = sample_data();
    c.encrypt(&mut above, 3 * crate::GRAIN_SECTORS);
    let mut want = sample_data();
    keys.current().encrypt(&mut want, 3 * crate::GRAIN_SECTORS);
    assert_eq!(above, want);

    let after = rec.finish_deep(&reopened).unwrap();
    rec.validate().unwrap();
    assert_eq!(rec.deep_rekey, None);
    assert_eq!(rec.keys.len(), 1);
    assert!(after.key(0).is_none());
    assert_eq!(rec.unlock(NEW_KEY).unwrap().current_index(), 1);
    assert!(rec.finish_deep(&after).is_err());
}

#[test]
fn a_deep_rekey_that_does_not_fit_its_keys_is_damage() {
    let (mut rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    rec.begin_deep(&keys, &slot(FILE_KEY, "file")).unwrap();
    for (from, to) in [(1, 0), (0, 0), (0, 2), (5, 1)] {
        let mut r = rec.clone();
        r.deep_rekey = Some(DeepRekey {
            from,
            to,
            next_grain: 0,
        });
        assert!(
            matches!(r.validate(), Err(CryptError::Damaged(_))),
            "{from} -> {to}"
        );
    }
}

/// What `c` makes of the sample data at grain 3.
fn sealed_by(c: &crate::DataCipher) -> Vec<u8> {
    let mut d = sample_data();
    c.encrypt(&mut d, 3 * crate::GRAIN_SECTORS);
    d
}

#[test]
fn an_own_key_clone_reads_what_it_inherits_and_writes_under_its_own() {
    const CLONE_KEY: &[u8; 32] = b"clone-key-000000clone-key-000000";
    const GRAND_KEY: &[u8; 32] = b"grand-key-000000grand-key-000000";
    let (rec, keys) = KeyringRec::create(4, &slot(FILE_KEY, "file")).unwrap();
    assert_eq!((rec.base_index(), rec.write_bits()), (0, 0));
    let (clone, ckeys) = rec.own_key_clone(&keys, &slot(CLONE_KEY, "file")).unwrap();
    clone.validate().unwrap();
    assert_eq!(clone.id, 0);
    assert_ne!(clone.uuid, rec.uuid);
    assert_eq!(
        clone.own,
        [OwnKey {
            bits: 1,
            key: 1,
            from: rec.uuid.clone()
        }]
    );
    assert!(clone.descends_from(&rec.uuid) && !rec.descends_from(&clone.uuid));
    assert_eq!((clone.base_index(), clone.write_bits()), (0, 1));
    // Index 0 is the source's data key in both records: what the source
    // wrote reads the same through the clone.
    let base = sealed_by(&rec.data_cipher(&keys).unwrap());
    assert_eq!(sealed_by(&clone.data_cipher(&ckeys).unwrap()), base);
    // The clone's own key is new, and only its secret opens the clone.
    let own = clone.own_cipher(&ckeys, 1).unwrap();
    let mine = sealed_by(&crate::DataCipher::single(own));
    assert_ne!(mine, base);
    assert!(matches!(clone.unlock(FILE_KEY), Err(CryptError::WrongKey)));
    let reopened = clone.unlock(CLONE_KEY).unwrap();
    assert_eq!(
        sealed_by(&crate::DataCipher::single(
            clone.own_cipher(&reopened, 1).unwrap()
        )),
        mine
    );
    assert!(matches!(
        rec.own_cipher(&keys, 1),
        Err(CryptError::Damaged(_))
    ));
    // A clone of the clone with a key of its own: index 2, and 0 and 1
    // still mean what they meant.
    let (grand, gkeys) = clone
        .own_key_clone(&ckeys, &slot(GRAND_KEY, "file"))
        .unwrap();
    grand.validate().unwrap();
    assert!(grand.descends_from(&rec.uuid) && grand.descends_from(&clone.uuid));
    assert_eq!(grand.own.len(), 2);
    assert_eq!(grand.write_bits(), 2);
    assert_eq!(sealed_by(&grand.data_cipher(&gkeys).unwrap()), base);
    let g1 = grand.own_cipher(&gkeys, 1).unwrap();
    assert_eq!(sealed_by(&crate::DataCipher::single(g1)), mine);
    // The record survives JSON; a plain record does not grow an `own`.
    let back: KeyringRec = serde_json::from_str(&serde_json::to_string(&grand).unwrap()).unwrap();
    assert_eq!(back, grand);
    assert!(!serde_json::to_string(&rec).unwrap().contains("own"));
}

#[test]
fn a_deep_rekey_of_an_own_key_clone_ends_with_one_key_and_no_own_table() {
    const NEW_KEY: &[u8; 32] = b"fedcba9876543210FEDCBA9876543210";
    const THIRD: &[u8; 32] = b"third-key-000000third-key-000000";
    let (mut rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    let (mut c, ckeys) = rec.own_key_clone(&keys, &slot(NEW_KEY, "file")).unwrap();
    assert_eq!(c.write_bits(), 1);
    let own = sealed_by(&crate::DataCipher::single(c.own_cipher(&ckeys, 1).unwrap()));
    let during = c.begin_deep(&ckeys, &slot(THIRD, "file")).unwrap();
    c.validate().unwrap();
    // During it writes go under index 0 (the cursor's split says the key),
    // and the own key still reads what was written under it.
    assert_eq!(c.write_bits(), 0);
    let d = c.deep_rekey.unwrap();
    assert_eq!((d.from, d.to), (0, 2));
    let cipher = c.data_cipher(&during).unwrap();
    assert_eq!(cipher.write_bits(), 0);
    assert_eq!(
        sealed_by(&crate::DataCipher::single(
            c.own_cipher(&during, 1).unwrap()
        )),
        own
    );
    let after = c.finish_deep(&during).unwrap();
    c.validate().unwrap();
    assert!(c.own.is_empty() && c.keys.len() == 1 && c.keys[0].index == 2);
    assert_eq!(c.write_bits(), 0);
    assert!(c.data_cipher(&after).unwrap().keyed(1).is_none());
    // An own-key clone is not made during a deep rekey of its source.
    let both = rec.begin_deep(&keys, &slot(NEW_KEY, "file")).unwrap();
    let e = rec
        .own_key_clone(&both, &slot(FILE_KEY, "file"))
        .unwrap_err();
    assert!(e.to_string().contains("deep rekey is under way"), "{e}");
}

#[test]
fn a_bad_own_table_is_damage() {
    const NEW_KEY: &[u8; 32] = b"fedcba9876543210FEDCBA9876543210";
    let (rec, keys) = KeyringRec::create(1, &slot(FILE_KEY, "file")).unwrap();
    let (good, _) = rec.own_key_clone(&keys, &slot(NEW_KEY, "file")).unwrap();
    type Breaker = fn(&mut KeyringRec);
    let cases: [(&str, Breaker); 7] = [
        ("count from 1", |r| r.own[0].bits = 0),
        ("no other keyring's uuid", |r| {
            r.own[0].from = r.uuid.clone()
        }),
        ("no other keyring's uuid", |r| r.own[0].from = "ABC".into()),
        ("count from 1", |r| r.own[0].bits = 2),
        ("which it lacks", |r| r.own[0].key = 9),
        ("none for key index 0", |r| r.keys.retain(|k| k.index == 1)),
        ("from or to own key", |r| {
            r.deep_rekey = Some(DeepRekey {
                from: 0,
                to: 1,
                next_grain: 0,
            })
        }),
    ];
    for (want, break_it) in cases {
        let mut r = good.clone();
        break_it(&mut r);
        let msg = damaged_msg(&r);
        assert!(msg.contains(want), "{want}: {msg}");
    }
}
