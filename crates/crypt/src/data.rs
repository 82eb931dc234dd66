//! [`DataCipher`]: the cipher a disk lineage's data is under at one moment
//! (FORMAT.md §16.4): one data key, or, while a deep rekey runs, two split
//! at a virtual sector (below it the new key, from it on the old one).

use std::sync::Arc;

use crate::Xts;

/// The data cipher of a lineage. Same calls as [`Xts`]; a buffer that
/// straddles the split is cut there.
pub struct DataCipher {
    below: Arc<Xts>,
    above: Arc<Xts>,
    /// The first sector under `above`.
    split: u64,
    /// The own keys of an own-key clone: `own[j - 1]` for key index `j`
    /// (FORMAT.md §16.4). Empty elsewhere.
    own: Vec<Arc<Xts>>,
    /// The key index writes go under (0, or one of `own`'s).
    write: u8,
}

/// The key of the grains of one key index: the keyring's data cipher
/// (index 0) or one own key.
#[derive(Clone, Copy)]
pub enum Keyed<'a> {
    Base(&'a DataCipher),
    Own(&'a Xts),
}

impl Keyed<'_> {
    /// Encrypt in place, as [`Xts::encrypt`].
    pub fn encrypt(&self, buf: &mut [u8], first_sector: u64) {
        match self {
            Keyed::Base(c) => c.encrypt(buf, first_sector),
            Keyed::Own(x) => x.encrypt(buf, first_sector),
        }
    }

    /// Decrypt in place, as [`Xts::decrypt`].
    pub fn decrypt(&self, buf: &mut [u8], first_sector: u64) {
        match self {
            Keyed::Base(c) => c.decrypt(buf, first_sector),
            Keyed::Own(x) => x.decrypt(buf, first_sector),
        }
    }

    /// Encrypt `src` into `dst`, as [`Xts::encrypt_to`].
    pub fn encrypt_to(&self, src: &[u8], dst: &mut [u8], first_sector: u64) {
        match self {
            Keyed::Base(c) => c.encrypt_to(src, dst, first_sector),
            Keyed::Own(x) => x.encrypt_to(src, dst, first_sector),
        }
    }
}

impl DataCipher {
    /// Every sector under one key.
    pub fn single(x: Arc<Xts>) -> DataCipher {
        DataCipher {
            below: x.clone(),
            above: x,
            split: 0,
            own: Vec::new(),
            write: 0,
        }
    }

    /// Sectors before `split` under `below`, the rest under `above`.
    pub fn split(below: Arc<Xts>, above: Arc<Xts>, split: u64) -> DataCipher {
        DataCipher {
            below,
            above,
            split,
            own: Vec::new(),
            write: 0,
        }
    }

    /// The same with the own keys of an own-key clone, by key index from
    /// 1, writing under the newest.
    pub fn with_own(self, own: Vec<Arc<Xts>>) -> DataCipher {
        let write = own.len() as u8;
        DataCipher { own, write, ..self }
    }

    /// The same, writing under key index `bits` (0 during a deep rekey);
    /// an index it has no key for is refused by `writer`.
    pub fn writing(self, bits: u8) -> DataCipher {
        DataCipher {
            write: bits,
            ..self
        }
    }

    /// The key index new grains get.
    pub fn write_bits(&self) -> u8 {
        self.write
    }

    /// The key of the grains whose entries carry key index `bits`; None
    /// when this keyring has no such key (the entry is damaged).
    pub fn keyed(&self, bits: u8) -> Option<Keyed<'_>> {
        match bits {
            0 => Some(Keyed::Base(self)),
            j => self.own.get(usize::from(j) - 1).map(|x| Keyed::Own(x)),
        }
    }

    /// The key new grains are written under.
    pub fn writer(&self) -> Keyed<'_> {
        self.keyed(self.write)
            .expect("the write key index names a key of the table")
    }

    /// The key of sectors `[first, first + n)` as (key, n) runs, at most two.
    fn parts(&self, first: u64, len: usize) -> [(&Xts, u64, usize); 2] {
        let sectors = (len / crate::SECTOR_BYTES) as u64;
        let cut = self.split.clamp(first, first + sectors);
        let lo = ((cut - first) as usize) * crate::SECTOR_BYTES;
        [(&*self.below, first, lo), (&*self.above, cut, len - lo)]
    }

    /// Encrypt in place, as [`Xts::encrypt`].
    pub fn encrypt(&self, buf: &mut [u8], first_sector: u64) {
        let [(a, s, n), (b, t, _)] = self.parts(first_sector, buf.len());
        let (lo, hi) = buf.split_at_mut(n);
        a.encrypt(lo, s);
        b.encrypt(hi, t);
    }

    /// Decrypt in place, as [`Xts::decrypt`].
    pub fn decrypt(&self, buf: &mut [u8], first_sector: u64) {
        let [(a, s, n), (b, t, _)] = self.parts(first_sector, buf.len());
        let (lo, hi) = buf.split_at_mut(n);
        a.decrypt(lo, s);
        b.decrypt(hi, t);
    }

    /// Encrypt `src` into `dst`, as [`Xts::encrypt_to`].
    pub fn encrypt_to(&self, src: &[u8], dst: &mut [u8], first_sector: u64) {
        let [(a, s, n), (b, t, _)] = self.parts(first_sector, src.len());
        let (lo, hi) = dst.split_at_mut(n);
        a.encrypt_to(&src[..n], lo, s);
        b.encrypt_to(&src[n..], hi, t);
    }
}

impl std::fmt::Debug for DataCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataCipher")
            .field("split", &self.split)
            .field("own", &self.own.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SecretBytes, DEK_BYTES, SECTOR_BYTES};

    fn key(seed: u8) -> Arc<Xts> {
        let k: Vec<u8> = (0..DEK_BYTES as u8)
            .map(|i| i.wrapping_mul(seed) ^ i)
            .collect();
        Arc::new(Xts::new(&SecretBytes::from_slice(&k).unwrap()).unwrap())
    }

    /// Each sector is under the key its side of the split gives it,
    /// whatever the buffer's start, length and split.
    #[test]
    fn a_buffer_across_the_split_is_cut_there() {
        let (old, new) = (key(3), key(7));
        let plain: Vec<u8> = (0..8 * SECTOR_BYTES)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for split in [0u64, 1, 100, 103, 104, 108, 200] {
            let c = DataCipher::split(new.clone(), old.clone(), split);
            let mut a = plain.clone();
            c.encrypt(&mut a, 100);
            let mut b = vec![0u8; plain.len()];
            c.encrypt_to(&plain, &mut b, 100);
            assert_eq!(a, b);
            for (i, s) in a.chunks(SECTOR_BYTES).enumerate() {
                let sector = 100 + i as u64;
                let mut want = plain[i * SECTOR_BYTES..(i + 1) * SECTOR_BYTES].to_vec();
                let k = if sector < split { &new } else { &old };
                k.encrypt(&mut want, sector);
                assert_eq!(s, &want[..], "sector {sector}, split {split}");
            }
            c.decrypt(&mut a, 100);
            assert_eq!(a, plain);
        }
    }

    #[test]
    fn one_key_is_the_key_itself() {
        let k = key(5);
        let c = DataCipher::single(k.clone());
        let mut a = vec![9u8; 2 * SECTOR_BYTES];
        let mut b = a.clone();
        c.encrypt(&mut a, 42);
        k.encrypt(&mut b, 42);
        assert_eq!(a, b);
    }
}
