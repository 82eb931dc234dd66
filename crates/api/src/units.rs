//! Sizes and times on the command line and in output.

use strata_block::throttle::IoLimits;
use strata_block::{Error, Kind as ErrorKind};

/// A value on the command line or in a request that makes no sense.
pub fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, message)
}

/// The bytes of a size as qemu-img reads it: a number, a fraction too
/// (`1.5G`), with an optional suffix in powers of 1024: `K`, `M`, `G`, `T`,
/// `P`, `E` (any case), also written `KiB`..`EiB`, or `B` for bytes. `KB`,
/// `GB` and the like are refused: they mean 1000s to some readers and
/// 1024s to others, and qemu-img refuses them too.
pub fn parse_size(s: &str) -> Result<u64, Error> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let not_a_size = || {
        invalid(format!(
            "'{s}' is not a size (examples: 512, 64K, 10G, 1.5T)"
        ))
    };
    if num.is_empty() {
        return Err(not_a_size());
    }
    let upper = unit.trim().to_ascii_uppercase();
    let power = match upper.trim_end_matches("IB") {
        _ if upper == "B" || upper.is_empty() => 0,
        "K" => 1,
        "M" => 2,
        "G" => 3,
        "T" => 4,
        "P" => 5,
        "E" => 6,
        _ if upper.len() == 2 && upper.ends_with('B') => {
            let p = &upper[..1];
            return Err(invalid(format!(
                "'{s}': sizes are in powers of 1024, as qemu-img reads them: write {num}{p} \
                 ({num} {p}iB), or the size in bytes for decimal units"
            )));
        }
        _ => {
            return Err(invalid(format!(
                "unknown size unit '{unit}' in '{s}' (use K, M, G, T, P or E: powers of 1024)"
            )))
        }
    };
    let mult = 1u64 << (10 * power);
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| invalid(format!("size '{s}' is too large")));
    }
    let f: f64 = num.parse().map_err(|_| not_a_size())?;
    let v = f * mult as f64;
    if !(0.0..1.8e19).contains(&v) {
        return Err(invalid(format!("size '{s}' is out of range")));
    }
    Ok(v.round() as u64)
}

/// A disk's new size on the command line: `SIZE`, or `+SIZE` for that
/// much more than it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewSize {
    To(u64),
    By(u64),
}

impl NewSize {
    /// `10G` or `+1G` ([`parse_size`]).
    pub fn parse(s: &str) -> Result<NewSize, Error> {
        match s.trim().strip_prefix('+') {
            Some(more) => parse_size(more).map(NewSize::By),
            None => parse_size(s).map(NewSize::To),
        }
    }
}

/// A disk size rounded up to whole 512-byte sectors, with a note saying so
/// when it was not one (`1.3G`); None when it is 0 or too large.
pub fn sectors_up(bytes: u64) -> Option<(u64, Option<String>)> {
    let up = bytes.checked_next_multiple_of(512).filter(|&b| b > 0)?;
    let note = (up != bytes).then(|| {
        format!("note: {bytes} bytes is not a whole number of 512-byte sectors; rounded up to {up}")
    });
    Some((up, note))
}

/// `1.5 GiB`-style rendering.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else if (v - v.round()).abs() < 0.05 {
        format!("{:.0} {}", v, UNITS[i])
    } else {
        format!("{:.1} {}", v, UNITS[i])
    }
}

/// A size in a message where the exact figure matters: `8 MiB (8388608
/// bytes)`; a whole number of bytes under 1 KiB is just `512 B`. Every
/// message writes sizes with [`human`] or this, so units are one style.
pub fn human_exact(bytes: u64) -> String {
    if bytes < 1024 {
        return human(bytes);
    }
    format!("{} ({bytes} bytes)", human(bytes))
}

/// I/O limits for people: `200 IOPS, 4 MiB/s, burst 1 s`.
pub fn limits_text(l: &IoLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = l.iops {
        parts.push(format!("{n} IOPS"));
    }
    if let Some(b) = l.bps {
        parts.push(format!("{}/s", human(b)));
    }
    parts.push(format!("burst {} s", l.burst_seconds.unwrap_or(1)));
    parts.join(", ")
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_refuse_garbage() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("2E").unwrap(), 2 << 60);
        assert_eq!(parse_size("7b").unwrap(), 7);
        // Decimal-looking units are refused, as qemu-img refuses them.
        let e = parse_size("10GB").unwrap_err().message;
        assert!(e.contains("write 10G (10 GiB)"), "{e}");
        assert!(parse_size("1kb").is_err());
        assert_eq!(NewSize::parse("+1G").unwrap(), NewSize::By(1 << 30));
        assert_eq!(NewSize::parse("64M").unwrap(), NewSize::To(64 << 20));
        assert!(NewSize::parse("+").is_err());
        assert_eq!(sectors_up(4096), Some((4096, None)));
        let (up, note) = sectors_up(parse_size("1.3G").unwrap()).unwrap();
        assert_eq!(up, 1_395_864_576);
        assert!(note.unwrap().contains("rounded up to 1395864576"));
        assert_eq!(sectors_up(0), None);
        assert_eq!(sectors_up(u64::MAX), None);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("10X").is_err());
        assert!(parse_size("99999999999P").is_err());
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
    }

    #[test]
    fn times_are_civil_dates_in_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_000_000_123), "2026-11-18 11:06:40 UTC");
    }
}
