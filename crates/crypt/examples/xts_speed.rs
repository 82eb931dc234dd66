//! One core's AES-256-XTS throughput on 4 KiB and 1 MiB buffers, for each
//! engine this CPU runs (the one strata uses first; the passes alternate
//! between engines and the best of three is kept).
//!
//! `cargo run -p strata-crypt --release --example xts_speed [SECONDS]`

use std::time::{Duration, Instant};

use strata_crypt::{SecretBytes, Xts, XtsEngine, DEK_BYTES};

/// GB/s of `op` over `size`-byte buffers for `secs`.
fn measure(size: usize, secs: f64, mut op: impl FnMut(&mut [u8], u64)) -> f64 {
    let mut buf = vec![0x5au8; size];
    let budget = Duration::from_secs_f64(secs);
    let step = (size / 512) as u64;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..(1 << 20) / size {
            op(&mut buf, n * step);
            n += 1;
        }
    }
    (n as usize * size) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Best of three alternated passes: [encrypt, decrypt, encrypt_to] GB/s.
fn rows(xts: &[Xts], size: usize, secs: f64) -> Vec<[f64; 3]> {
    let src = vec![0xa5u8; size];
    let mut best = vec![[0f64; 3]; xts.len()];
    for _ in 0..3 {
        for (x, b) in xts.iter().zip(&mut best) {
            let e = measure(size, secs, |buf, s| x.encrypt(buf, s));
            let d = measure(size, secs, |buf, s| x.decrypt(buf, s));
            let t = measure(size, secs, |buf, s| x.encrypt_to(&src, buf, s));
            *b = [b[0].max(e), b[1].max(d), b[2].max(t)];
        }
    }
    best
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2.0);
    let key = SecretBytes::random(DEK_BYTES)?;
    let mut engines = vec![XtsEngine::best()];
    if XtsEngine::best() != XtsEngine::AwsLc {
        engines.push(XtsEngine::AwsLc);
    }
    let xts = engines
        .iter()
        .map(|&e| Xts::with_engine(&key, e))
        .collect::<Result<Vec<_>, _>>()?;
    let pass = secs / 9.0;
    let mut json = Vec::new();
    for (label, size) in [("4k", 4096usize), ("1m", 1 << 20)] {
        let got = rows(&xts, size, pass);
        for (e, [enc, dec, to]) in engines.iter().zip(&got) {
            println!(
                "{:>6} {label:>2}: encrypt {enc:6.2} GB/s, decrypt {dec:6.2} GB/s, encrypt_to {to:6.2} GB/s",
                e.name()
            );
        }
        let [enc, dec, to] = got[0];
        let p = if label == "4k" {
            String::new()
        } else {
            format!("{label}_")
        };
        json.push(format!(
            "\"{p}encrypt_gb_s\":{enc:.3},\"{p}decrypt_gb_s\":{dec:.3},\"{p}encrypt_to_gb_s\":{to:.3}"
        ));
        if let Some([lenc, ldec, _]) = got.get(1) {
            json.push(format!(
                "\"{p}aws_lc_encrypt_gb_s\":{lenc:.3},\"{p}aws_lc_decrypt_gb_s\":{ldec:.3}"
            ));
        }
    }
    // The last line, for bench/ (the `crypto` case).
    println!(
        "{{\"engine\":\"{}\",{}}}",
        engines[0].name(),
        json.join(",")
    );
    Ok(())
}
