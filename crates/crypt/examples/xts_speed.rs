//! One core's AES-256-XTS throughput on 4 KiB buffers.
//!
//! `cargo run -p strata-crypt --release --example xts_speed [SECONDS]`

use std::time::{Duration, Instant};

use strata_crypt::{SecretBytes, Xts, DEK_BYTES};

fn measure(label: &str, secs: f64, mut op: impl FnMut(u64)) -> f64 {
    let budget = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..1024 {
            op(n * 8);
            n += 1;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let gbps = (n * 4096) as f64 / elapsed / 1e9;
    let ns = elapsed * 1e9 / n as f64;
    println!("{label:>12}: {gbps:6.2} GB/s ({ns:.0} ns per 4 KiB)");
    gbps
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2.0);
    let xts = Xts::new(&SecretBytes::random(DEK_BYTES)?)?;
    let mut buf = vec![0x5au8; 4096];
    let src = vec![0xa5u8; 4096];
    let e = measure("encrypt", secs, |s| xts.encrypt(&mut buf, s));
    let d = measure("decrypt", secs, |s| xts.decrypt(&mut buf, s));
    let t = measure("encrypt_to", secs, |s| xts.encrypt_to(&src, &mut buf, s));
    // The last line, for bench/ (the `crypto` case).
    println!("{{\"encrypt_gb_s\":{e:.3},\"decrypt_gb_s\":{d:.3},\"encrypt_to_gb_s\":{t:.3}}}");
    Ok(())
}
