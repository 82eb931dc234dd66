//! Text, Prometheus and JSON renderings of snapshots.

use std::fmt::Write as _;

use serde::{Serialize, Serializer};
use strata_api::stats::{ArrivalHistograms, HistogramSnapshot, Op, StatsSnapshot};

/// Width of the longest bar in [`render_text`].
pub const BAR_WIDTH: u64 = 40;

// ---------------------------------------------------------------------------
// Text

/// The per-op table of commands, bytes and errors, with their totals.
fn text_counters(out: &mut String, s: &StatsSnapshot) {
    let _ = writeln!(
        out,
        "{:<14} {:>14} {:>20} {:>10}",
        "op", "commands", "bytes", "errors"
    );
    let mut total = (0u64, 0u64, 0u64);
    for op in Op::ALL {
        let c = s.counters(op);
        let _ = writeln!(
            out,
            "{:<14} {:>14} {:>20} {:>10}",
            op.name(),
            c.commands,
            c.bytes,
            c.errors
        );
        total.0 += c.commands;
        total.1 += c.bytes;
        total.2 += c.errors;
    }
    let _ = writeln!(
        out,
        "{:<14} {:>14} {:>20} {:>10}",
        "total", total.0, total.1, total.2
    );
}

/// A terminal report of one disk: the per-op counters, then every histogram
/// as a table of bucket, count, percent and a bar of `#` scaled so the
/// fullest bucket gets [`BAR_WIDTH`] characters.
pub fn render_text(s: &StatsSnapshot) -> String {
    let mut out = String::new();
    let secs = s.elapsed_ns as f64 / 1e9;
    let _ = writeln!(
        out,
        "Statistics over {secs:.3} s; {} command(s) in flight now",
        s.in_flight
    );
    if !s.recording {
        let _ = writeln!(
            out,
            "Recording is paused (strata stats --resume): new commands are not counted"
        );
    }
    out.push('\n');
    text_counters(&mut out, s);

    for (family, hs) in [
        ("I/O length", &s.io_length),
        ("Seek distance", &s.seek_distance),
        (
            "Seek distance to the closest of the last 16",
            &s.seek_distance_closest,
        ),
    ] {
        for (what, h) in [
            ("all reads and writes", &hs.all),
            ("reads", &hs.read),
            ("writes", &hs.write),
        ] {
            text_histogram(&mut out, &format!("{family}, {what}"), h);
        }
    }
    text_histogram(&mut out, "Latency, all commands", &s.latency.all);
    for op in Op::ALL {
        text_histogram(
            &mut out,
            &format!("Latency, {}", op.name()),
            s.latency.get(op),
        );
    }
    for (family, hs) in [
        ("Outstanding I/Os at arrival", &s.outstanding),
        ("Interarrival time", &s.interarrival),
    ] {
        for (what, h) in [
            ("all commands", &hs.all),
            ("reads", &hs.read),
            ("writes", &hs.write),
        ] {
            text_histogram(&mut out, &format!("{family}, {what}"), h);
        }
    }
    out
}

fn text_histogram(out: &mut String, title: &str, h: &HistogramSnapshot) {
    out.push('\n');
    let _ = write!(out, "{title} ({})", h.unit);
    let Some(mean) = h.mean() else {
        let _ = writeln!(out, ": no commands");
        return;
    };
    let _ = writeln!(out, ": count {}, mean {mean:.1}", h.count);
    let label_w = h
        .buckets
        .iter()
        .map(|b| b.label.len())
        .max()
        .unwrap_or(0)
        .max("bucket".len());
    let count_w = h.count.to_string().len().max("count".len());
    let max = h.buckets.iter().map(|b| b.count).max().unwrap_or(0).max(1);
    let _ = writeln!(
        out,
        "  {:>label_w$}  {:>count_w$}  {:>6}",
        "bucket", "count", "%"
    );
    for b in &h.buckets {
        let pct = b.count as f64 * 100.0 / h.count as f64;
        let _ = write!(
            out,
            "  {:>label_w$}  {:>count_w$}  {pct:>6.2}",
            b.label, b.count
        );
        let bar = bar_len(b.count, max) as usize;
        if bar > 0 {
            out.push_str("  ");
            out.push_str(&"#".repeat(bar));
        }
        out.push('\n');
    }
}

/// Bar length for `count` when `max` gets [`BAR_WIDTH`]; any non-zero
/// count gets at least one `#`.
fn bar_len(count: u64, max: u64) -> u64 {
    ((count as u128 * BAR_WIDTH as u128).div_ceil(max as u128)) as u64
}

// ---------------------------------------------------------------------------
// Prometheus

/// A gauge sample to add to [`render_prometheus`] output (e.g. datastore
/// space). Samples with the same name form one family; its HELP text is
/// taken from the first. Invalid characters in names become `_`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauge {
    pub name: String,
    pub help: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Gauge {
    pub fn new(name: impl Into<String>, help: impl Into<String>, value: f64) -> Self {
        Self {
            name: name.into(),
            help: help.into(),
            labels: Vec::new(),
            value,
        }
    }

    /// Add a label.
    pub fn label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((name.into(), value.into()));
        self
    }
}

/// Decimal places of a time histogram's `le` (µs → s) and `_sum` (ns → s).
const US_DECIMALS: u32 = 6;
const NS_DECIMALS: u32 = 9;

/// How a histogram's numbers are written: how many places the decimal
/// point of its bucket edges (`le`) and of its `_sum` moves left.
#[derive(Clone, Copy)]
struct Scale {
    le_decimals: u32,
    sum_decimals: u32,
}

/// Counts, lengths and distances: written as they are.
const AS_IS: Scale = Scale {
    le_decimals: 0,
    sum_decimals: 0,
};
/// Times: edges in µs and a sum in ns, written in seconds.
const SECONDS: Scale = Scale {
    le_decimals: US_DECIMALS,
    sum_decimals: NS_DECIMALS,
};

/// Every disk's statistics, then `extra_gauges`, in the Prometheus text
/// exposition format 0.0.4.
///
/// Families: `strata_disk_commands_total`, `strata_disk_bytes_total`,
/// `strata_disk_errors_total` (counters, labels `disk` and `op`),
/// `strata_disk_in_flight` and `strata_disk_stats_recording` (gauges), and
/// histograms
/// `strata_disk_io_size_bytes`, `strata_disk_seek_distance_sectors` and
/// `strata_disk_seek_distance_closest_sectors` (`op` = read / write),
/// `strata_disk_latency_seconds` (every op), and
/// `strata_disk_outstanding_ios` and `strata_disk_interarrival_seconds`
/// (`op` = read / write / all). The combined histograms of the first
/// three are left out (they are sums of the per-op series); those of the
/// last two are not sums, so `op="all"` is a series of its own, counting
/// every command (do not add it to the read and write series).
pub fn render_prometheus(disks: &[(String, StatsSnapshot)], extra_gauges: &[Gauge]) -> String {
    let mut out = String::new();
    if !disks.is_empty() {
        render_disks(&mut out, disks);
    }
    render_gauges(&mut out, extra_gauges);
    out
}

#[expect(clippy::too_many_lines)]
fn render_disks(out: &mut String, disks: &[(String, StatsSnapshot)]) {
    const BYTE_OPS: [Op; 4] = [Op::Read, Op::Write, Op::Unmap, Op::WriteZeroes];
    const RW: [Op; 2] = [Op::Read, Op::Write];

    family(
        out,
        "strata_disk_commands_total",
        "Commands completed, failed ones included.",
        "counter",
    );
    for (disk, s) in disks {
        for op in Op::ALL {
            sample(
                out,
                "strata_disk_commands_total",
                &[("disk", disk), ("op", op.name())],
                &s.counters(op).commands.to_string(),
            );
        }
    }

    family(
        out,
        "strata_disk_bytes_total",
        "Bytes requested by commands, failed ones included.",
        "counter",
    );
    for (disk, s) in disks {
        for op in BYTE_OPS {
            sample(
                out,
                "strata_disk_bytes_total",
                &[("disk", disk), ("op", op.name())],
                &s.counters(op).bytes.to_string(),
            );
        }
    }

    family(
        out,
        "strata_disk_errors_total",
        "Commands that returned an error.",
        "counter",
    );
    for (disk, s) in disks {
        for op in Op::ALL {
            sample(
                out,
                "strata_disk_errors_total",
                &[("disk", disk), ("op", op.name())],
                &s.counters(op).errors.to_string(),
            );
        }
    }

    disk_gauge(
        out,
        disks,
        "strata_disk_in_flight",
        "Commands in progress.",
        |s| s.in_flight,
    );
    disk_gauge(
        out,
        disks,
        "strata_disk_stats_recording",
        "1 while statistics are recorded, 0 while paused.",
        |s| u64::from(s.recording),
    );

    let name = "strata_disk_io_size_bytes";
    family(out, name, "Request length in bytes.", "histogram");
    for (disk, s) in disks {
        for op in RW {
            let h = s.io_length.get(op).expect("read or write");
            prom_histogram(out, name, &[("disk", disk), ("op", op.name())], h, AS_IS);
        }
    }

    let name = "strata_disk_latency_seconds";
    family(
        out,
        name,
        "Time from a command's arrival to its completion.",
        "histogram",
    );
    for (disk, s) in disks {
        for op in Op::ALL {
            let labels = [("disk", disk.as_str()), ("op", op.name())];
            prom_histogram(out, name, &labels, s.latency.get(op), SECONDS);
        }
    }

    let name = "strata_disk_seek_distance_sectors";
    family(
        out,
        name,
        "Signed distance in 512-byte sectors from the end of the previous read or write to the start of this one.",
        "histogram",
    );
    for (disk, s) in disks {
        for op in RW {
            let h = s.seek_distance.get(op).expect("read or write");
            prom_histogram(out, name, &[("disk", disk), ("op", op.name())], h, AS_IS);
        }
    }

    let name = "strata_disk_seek_distance_closest_sectors";
    family(
        out,
        name,
        "Signed distance in 512-byte sectors from the closest of the last 16 reads and writes (their last sector) to the first sector of this one.",
        "histogram",
    );
    for (disk, s) in disks {
        for op in RW {
            let h = s.seek_distance_closest.get(op).expect("read or write");
            prom_histogram(out, name, &[("disk", disk), ("op", op.name())], h, AS_IS);
        }
    }

    let name = "strata_disk_outstanding_ios";
    family(
        out,
        name,
        "Commands outstanding when a command arrives, the arriving one included: reads at a read, writes at a write, every command at any (op=\"all\", not the sum of the others).",
        "histogram",
    );
    for (disk, s) in disks {
        for (op, h) in arrival_series(&s.outstanding) {
            prom_histogram(out, name, &[("disk", disk), ("op", op)], h, AS_IS);
        }
    }

    let name = "strata_disk_interarrival_seconds";
    family(
        out,
        name,
        "Time since the previous arrival: of a read at a read, of a write at a write, of any command at any (op=\"all\", not the sum of the others).",
        "histogram",
    );
    for (disk, s) in disks {
        for (op, h) in arrival_series(&s.interarrival) {
            let labels = [("disk", disk.as_str()), ("op", op)];
            prom_histogram(out, name, &labels, h, SECONDS);
        }
    }
}

/// The `op` label and histogram of each series of an arrival family.
fn arrival_series(h: &ArrivalHistograms) -> [(&'static str, &HistogramSnapshot); 3] {
    [("read", &h.read), ("write", &h.write), ("all", &h.all)]
}

fn render_gauges(out: &mut String, gauges: &[Gauge]) {
    let mut names: Vec<String> = Vec::new();
    for g in gauges {
        let name = sanitize_name(&g.name, true);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    for name in &names {
        let mut members = gauges
            .iter()
            .filter(|g| &sanitize_name(&g.name, true) == name)
            .peekable();
        let help = members.peek().map(|g| g.help.as_str()).unwrap_or("");
        // Prometheus' naming rule: a `_total` is a counter (only grows, and
        // resets when the server restarts); anything else is a gauge.
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        family(out, name, help, kind);
        for g in members {
            let labels: Vec<(String, &str)> = g
                .labels
                .iter()
                .map(|(k, v)| (sanitize_name(k, false), v.as_str()))
                .collect();
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            sample(out, name, &labels, &format_float(g.value));
        }
    }
}

/// `# HELP` and `# TYPE` lines.
/// A gauge family with one sample per disk, labelled `disk`.
fn disk_gauge(
    out: &mut String,
    disks: &[(String, StatsSnapshot)],
    name: &str,
    help: &str,
    value: impl Fn(&StatsSnapshot) -> u64,
) {
    family(out, name, help, "gauge");
    for (disk, s) in disks {
        sample(out, name, &[("disk", disk)], &value(s).to_string());
    }
}

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: &str) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(value);
    out.push('\n');
}

/// `_bucket` lines (cumulative, ending with `+Inf`), `_sum` and `_count`,
/// the edges and the sum written at `scale` (to turn µs and ns into
/// seconds).
fn prom_histogram(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    h: &HistogramSnapshot,
    scale: Scale,
) {
    let bucket_name = format!("{name}_bucket");
    let mut cumulative = 0u64;
    for b in &h.buckets {
        cumulative += b.count;
        let le = match b.le {
            Some(edge) => format_decimal(edge as i128, scale.le_decimals),
            None => "+Inf".to_string(),
        };
        let mut with_le = labels.to_vec();
        with_le.push(("le", &le));
        sample(out, &bucket_name, &with_le, &cumulative.to_string());
    }
    sample(
        out,
        &format!("{name}_sum"),
        labels,
        &format_decimal(h.sum, scale.sum_decimals),
    );
    sample(
        out,
        &format!("{name}_count"),
        labels,
        &cumulative.to_string(),
    );
}

/// `value / 10^decimals` written exactly, without trailing zeros.
fn format_decimal(value: i128, decimals: u32) -> String {
    let sign = if value < 0 { "-" } else { "" };
    let magnitude = value.unsigned_abs();
    let divisor = 10u128.pow(decimals);
    let whole = magnitude / divisor;
    let frac = magnitude % divisor;
    if frac == 0 {
        return format!("{sign}{whole}");
    }
    let frac = format!("{frac:0width$}", width = decimals as usize);
    format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
}

fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{v}")
    }
}

/// Label values: backslash, double quote and newline are escaped.
pub fn escape_label_value(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// HELP text: backslash and newline are escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Make `name` a valid metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) or, with
/// `metric` false, a valid label name (no colons).
fn sanitize_name(name: &str, metric: bool) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || (metric && c == ':') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

// ---------------------------------------------------------------------------
// JSON

/// Every disk's snapshot as one JSON object keyed by disk name, in the
/// order given.
pub fn render_json(disks: &[(String, StatsSnapshot)]) -> String {
    struct Disks<'a>(&'a [(String, StatsSnapshot)]);
    impl Serialize for Disks<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_map(self.0.iter().map(|(name, s)| (name, s)))
        }
    }
    serde_json::to_string_pretty(&Disks(disks)).expect("snapshots serialize")
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn decimals_are_exact_and_trimmed() {
        assert_eq!(format_decimal(1, 6), "0.000001");
        assert_eq!(format_decimal(100_000, 6), "0.1");
        assert_eq!(format_decimal(15_000, 6), "0.015");
        assert_eq!(format_decimal(1_234_567_891, 9), "1.234567891");
        assert_eq!(format_decimal(-500_000, 0), "-500000");
        assert_eq!(format_decimal(0, 9), "0");
        assert_eq!(format_decimal(-1_500, 3), "-1.5");
    }

    #[test]
    fn names_are_sanitized() {
        assert_eq!(
            sanitize_name("strata:space-free", true),
            "strata:space_free"
        );
        assert_eq!(sanitize_name("data store", false), "data_store");
        assert_eq!(sanitize_name("a:b", false), "a_b");
        assert_eq!(sanitize_name("9lives", true), "_9lives");
        assert_eq!(sanitize_name("", false), "_");
    }

    #[test]
    fn bars_scale_to_the_largest_bucket() {
        assert_eq!(bar_len(1000, 1000), BAR_WIDTH);
        assert_eq!(bar_len(500, 1000), BAR_WIDTH / 2);
        assert_eq!(bar_len(1, 1000), 1);
        assert_eq!(bar_len(0, 1000), 0);
    }
}
