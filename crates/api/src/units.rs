//! Sizes and times on the command line and in output.

use strata_block::throttle::IoLimits;
use strata_block::{Error, Kind as ErrorKind};

/// A value on the command line or in a request that makes no sense.
pub fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, message)
}

/// Parse `512`, `64K`, `256M`, `10G`, `1T`, `1.5G`, `4KiB`, `2GB` (binary units).
pub fn parse_size(s: &str) -> Result<u64, Error> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(invalid(format!(
            "'{s}' is not a size (examples: 512, 64K, 10G, 1T)"
        )));
    }
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        "P" | "PB" | "PIB" => 1 << 50,
        other => {
            return Err(invalid(format!(
                "unknown size unit '{other}' in '{s}' (use K, M, G, T or P)"
            )))
        }
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| invalid(format!("size '{s}' is too large")));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| invalid(format!("'{s}' is not a size (examples: 512, 64K, 10G, 1T)")))?;
    let v = f * mult as f64;
    if !(0.0..1.8e19).contains(&v) {
        return Err(invalid(format!("size '{s}' is out of range")));
    }
    Ok(v.round() as u64)
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
