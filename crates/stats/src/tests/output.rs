//! Prometheus, text and JSON output.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::sync::Arc;

use prometheus_parse::{Scrape, Value};
use strata_block::{BlockDevice, ZeroOptions};

use super::{sequential_writes, stats_over_mem, MemDisk};
use crate::{
    render_json, render_prometheus, render_text, Gauge, StatsDevice, StatsRegistry, StatsSnapshot,
    BAR_WIDTH,
};

const FAMILIES: [(&str, &str); 10] = [
    ("strata_disk_commands_total", "counter"),
    ("strata_disk_bytes_total", "counter"),
    ("strata_disk_errors_total", "counter"),
    ("strata_disk_in_flight", "gauge"),
    ("strata_disk_io_size_bytes", "histogram"),
    ("strata_disk_latency_seconds", "histogram"),
    ("strata_disk_seek_distance_sectors", "histogram"),
    ("strata_disk_seek_distance_closest_sectors", "histogram"),
    ("strata_disk_outstanding_ios", "histogram"),
    ("strata_disk_interarrival_seconds", "histogram"),
];

/// Two disks with known workloads, through one registry.
fn registry_with_workloads() -> StatsRegistry {
    let registry = StatsRegistry::new();
    let inner: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(8 << 20));

    let disk0 = StatsDevice::new(inner.clone(), registry.get_or_create("disk0"));
    sequential_writes(&disk0);
    disk0.flush().unwrap();

    let disk1 = StatsDevice::new(inner, registry.get_or_create("vm-1.vmdk"));
    let mut buf = [0u8; 512];
    for i in (0..100u64).rev() {
        disk1.read_at(&mut buf, i * 4096).unwrap();
    }
    disk1.read_at(&mut buf, 16 << 20).unwrap_err();
    disk1.unmap(0, 65536).unwrap();
    disk1
        .write_zeroes(65536, 8192, ZeroOptions::default())
        .unwrap();
    registry
}

fn scrape(text: &str) -> Scrape {
    Scrape::parse(text.as_bytes().lines()).expect("prometheus-parse accepts the output")
}

fn labels_match(sample: &prometheus_parse::Sample, want: &[(&str, &str)]) -> bool {
    want.iter().all(|(k, v)| sample.labels.get(k) == Some(*v)) && sample.labels.len() == want.len()
}

fn scalar(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let sample = s
        .samples
        .iter()
        .find(|x| x.metric == metric && labels_match(x, labels))
        .unwrap_or_else(|| panic!("no sample {metric} {labels:?}"));
    match sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
        _ => panic!("{metric} is not a scalar"),
    }
}

fn buckets(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let sample = s
        .samples
        .iter()
        .find(|x| x.metric == metric && labels_match(x, labels))
        .unwrap_or_else(|| panic!("no histogram {metric} {labels:?}"));
    match &sample.value {
        Value::Histogram(b) => b.iter().map(|h| (h.less_than, h.count)).collect(),
        other => panic!("{metric} is not a histogram: {other:?}"),
    }
}

#[test]
fn prometheus_output_parses_with_the_families_labels_and_counts_expected() {
    let registry = registry_with_workloads();
    let gauges = [
        Gauge::new("strata_datastore_free_bytes", "Free space.", 1.5e9).label("datastore", "main"),
        Gauge::new("strata_datastore_free_bytes", "ignored", 42.0).label("datastore", "spare"),
        Gauge::new("strata_up", "Whether the server is up.", 1.0),
    ];
    let text = render_prometheus(&registry.snapshot_all(), &gauges);
    let families = strict_parse(&text);
    let s = scrape(&text);

    for (name, kind) in FAMILIES {
        assert_eq!(families.get(name).map(String::as_str), Some(kind), "{name}");
        assert!(s.docs.contains_key(name), "HELP for {name}");
    }
    assert_eq!(s.docs["strata_datastore_free_bytes"], "Free space.");

    let d0 = ("disk", "disk0");
    let d1 = ("disk", "vm-1.vmdk");
    let cmds = "strata_disk_commands_total";
    assert_eq!(scalar(&s, cmds, &[d0, ("op", "write")]), 1000.0);
    assert_eq!(scalar(&s, cmds, &[d0, ("op", "flush")]), 1.0);
    assert_eq!(scalar(&s, cmds, &[d0, ("op", "read")]), 0.0);
    assert_eq!(scalar(&s, cmds, &[d1, ("op", "read")]), 101.0);
    assert_eq!(scalar(&s, cmds, &[d1, ("op", "unmap")]), 1.0);
    assert_eq!(scalar(&s, cmds, &[d1, ("op", "block_status")]), 0.0);
    let bytes = "strata_disk_bytes_total";
    assert_eq!(scalar(&s, bytes, &[d0, ("op", "write")]), 4_096_000.0);
    assert_eq!(scalar(&s, bytes, &[d1, ("op", "unmap")]), 65536.0);
    assert_eq!(scalar(&s, bytes, &[d1, ("op", "write_zeroes")]), 8192.0);
    assert_eq!(
        scalar(&s, "strata_disk_errors_total", &[d1, ("op", "read")]),
        1.0
    );
    assert_eq!(scalar(&s, "strata_disk_in_flight", &[d0]), 0.0);
    assert_eq!(
        scalar(&s, "strata_datastore_free_bytes", &[("datastore", "spare")]),
        42.0
    );
    assert_eq!(scalar(&s, "strata_up", &[]), 1.0);

    // Every histogram: cumulative, ending with +Inf equal to _count.
    let mut histograms = 0;
    for sample in &s.samples {
        let Value::Histogram(b) = &sample.value else {
            continue;
        };
        histograms += 1;
        let labels: Vec<(&str, &str)> = sample
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert!(b.windows(2).all(|w| w[0].less_than < w[1].less_than));
        assert!(b.windows(2).all(|w| w[0].count <= w[1].count), "{sample:?}");
        let last = b.last().unwrap();
        assert_eq!(last.less_than, f64::INFINITY);
        let count = scalar(&s, &format!("{}_count", sample.metric), &labels);
        assert_eq!(last.count, count, "{} {labels:?}", sample.metric);
        scalar(&s, &format!("{}_sum", sample.metric), &labels);
    }
    // Per disk: io size 2, latency 6, seek 2, closest seek 2, outstanding
    // 3, interarrival 3.
    assert_eq!(histograms, 2 * 18);

    // Specific histograms.
    let size = buckets(&s, "strata_disk_io_size_bytes", &[d0, ("op", "write")]);
    assert_eq!(size.len(), 18);
    assert_eq!(size[3], (4095.0, 0.0));
    assert_eq!(size[4], (4096.0, 1000.0));
    assert_eq!(size[17], (f64::INFINITY, 1000.0));
    assert_eq!(
        scalar(&s, "strata_disk_io_size_bytes_sum", &[d0, ("op", "write")]),
        4_096_000.0
    );

    let seek = buckets(
        &s,
        "strata_disk_seek_distance_sectors",
        &[d0, ("op", "write")],
    );
    assert_eq!(seek[0], (-500000.0, 0.0));
    assert_eq!(seek[16], (0.0, 0.0));
    assert_eq!(seek[17], (1.0, 999.0));
    assert_eq!(seek[33], (f64::INFINITY, 999.0));
    // disk1 reads go down by 8 sectors each, reading 1: seek -8 each.
    let seek = buckets(
        &s,
        "strata_disk_seek_distance_sectors",
        &[d1, ("op", "read")],
    );
    assert_eq!(seek[10], (-16.0, 0.0));
    assert_eq!(seek[11], (-8.0, 99.0));
    let closest = buckets(
        &s,
        "strata_disk_seek_distance_closest_sectors",
        &[d1, ("op", "read")],
    );
    assert_eq!(closest, seek, "the closest is the previous read");
    assert_eq!(
        scalar(
            &s,
            "strata_disk_seek_distance_sectors_sum",
            &[d1, ("op", "read")]
        ),
        // 99 steps of -8, then the failed read far ahead of sector 0.
        -792.0 + 32768.0
    );

    let latency = buckets(&s, "strata_disk_latency_seconds", &[d0, ("op", "write")]);
    let edges: Vec<f64> = latency.iter().map(|b| b.0).collect();
    assert_eq!(
        edges,
        [
            1e-6,
            1e-5,
            1e-4,
            5e-4,
            1e-3,
            5e-3,
            0.015,
            0.03,
            0.05,
            0.1,
            f64::INFINITY
        ]
    );
    assert_eq!(latency[10].1, 1000.0);
    let outstanding = |disk, op| buckets(&s, "strata_disk_outstanding_ios", &[disk, ("op", op)]);
    assert_eq!(outstanding(d0, "all")[0], (1.0, 1001.0));
    assert_eq!(outstanding(d0, "write")[0], (1.0, 1000.0));
    assert_eq!(outstanding(d0, "read")[0], (1.0, 0.0));
    let interarrival =
        |disk, op| buckets(&s, "strata_disk_interarrival_seconds", &[disk, ("op", op)]);
    // 101 reads, an unmap and a write_zeroes: 102 intervals among all
    // commands, 100 among reads.
    assert_eq!(interarrival(d1, "all").last().unwrap().1, 102.0);
    assert_eq!(interarrival(d1, "read").last().unwrap().1, 100.0);
    assert_eq!(interarrival(d1, "write").last().unwrap().1, 0.0);
}

#[test]
fn latency_sums_are_exact_seconds() {
    let (stats, dev) = stats_over_mem(1 << 20);
    dev.flush().unwrap();
    dev.flush().unwrap();
    let snap = stats.snapshot();
    let ns = snap.latency.flush.sum;
    let text = render_prometheus(&[("d".to_string(), snap)], &[]);
    let line = text
        .lines()
        .find(|l| l.starts_with("strata_disk_latency_seconds_sum{disk=\"d\",op=\"flush\"}"))
        .unwrap();
    let value = line.rsplit(' ').next().unwrap();
    // Written as an exact decimal: the ns digits, point moved by 9.
    let (whole, frac) = value.split_once('.').unwrap_or((value, ""));
    let frac = format!("{frac:0<9}");
    assert_eq!(
        whole.parse::<i128>().unwrap() * 1_000_000_000 + frac.parse::<i128>().unwrap(),
        ns
    );
}

#[test]
fn prometheus_label_values_are_escaped() {
    let registry = StatsRegistry::new();
    let name = "we\"ird\\disk\nname";
    registry.get_or_create(name);
    let gauge = Gauge::new("strata_thing", "Help with \\ and\nnewline.", 2.0)
        .label("path", "C:\\dir\\\"x\"");
    let text = render_prometheus(&registry.snapshot_all(), &[gauge]);

    assert!(text.contains(r#"strata_disk_in_flight{disk="we\"ird\\disk\nname"} 0"#));
    assert!(text.contains(r#"strata_thing{path="C:\\dir\\\"x\""} 2"#));
    assert!(text.contains("# HELP strata_thing Help with \\\\ and\\nnewline.\n"));
    strict_parse(&text);

    // The lenient parser leaves escapes in place; undo them and compare.
    let s = scrape(&text);
    let sample = s
        .samples
        .iter()
        .find(|x| x.metric == "strata_disk_in_flight")
        .unwrap();
    assert_eq!(unescape(sample.labels.get("disk").unwrap()), name);
}

#[test]
fn prometheus_output_without_disks_has_only_the_gauges() {
    assert_eq!(render_prometheus(&[], &[]), "");
    let text = render_prometheus(&[], &[Gauge::new("up", "Up.", 1.0)]);
    assert_eq!(text, "# HELP up Up.\n# TYPE up gauge\nup 1\n");
    // A `_total` only grows: Prometheus' rule makes it a counter.
    let text = render_prometheus(&[], &[Gauge::new("x_total", "X.", 3.0)]);
    assert_eq!(
        text,
        "# HELP x_total X.\n# TYPE x_total counter\nx_total 3\n"
    );
}

#[test]
fn snapshots_round_trip_through_json() {
    let registry = registry_with_workloads();
    for (_, snap) in registry.snapshot_all() {
        let json = serde_json::to_string(&snap).unwrap();
        let back: StatsSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snap);
    }

    let all = registry.snapshot_all();
    let json: serde_json::Value = serde_json::from_str(&render_json(&all)).unwrap();
    let disk0 = &json["disk0"];
    assert_eq!(disk0["write"]["commands"], 1000);
    assert_eq!(disk0["write"]["bytes"], 4_096_000);
    let buckets = disk0["io_length"]["write"]["buckets"].as_array().unwrap();
    assert_eq!(buckets[4]["le"], 4096);
    assert_eq!(buckets[4]["label"], "<=4096");
    assert_eq!(buckets[4]["count"], 1000);
    assert_eq!(buckets[17]["le"], serde_json::Value::Null);
    assert_eq!(buckets[17]["label"], ">524288");
    assert_eq!(json["vm-1.vmdk"]["read"]["errors"], 1);
}

#[test]
fn text_report_has_a_table_per_histogram_with_bars_scaled_to_the_largest_bucket() {
    let (stats, dev) = stats_over_mem(8 << 20);
    sequential_writes(&dev);
    for i in 0..500u64 {
        dev.write_at(&[0; 512], (4 << 20) + i * 512, false).unwrap();
    }
    let text = render_text(&stats.snapshot());

    assert!(
        text.lines().all(|l| !l.ends_with(' ')),
        "no trailing blanks"
    );
    assert!(text.contains("I/O length, writes (bytes): count 1500"));
    assert!(text.contains("Latency, read (microseconds): no commands"));
    assert!(text.contains("Seek distance, reads (sectors): no commands"));
    let full = "#".repeat(BAR_WIDTH as usize);
    let half = "#".repeat(BAR_WIDTH as usize / 2);
    let section = text
        .split("\n\n")
        .find(|s| s.starts_with("I/O length, writes"))
        .unwrap();
    let row = |label: &str| {
        section
            .lines()
            .find(|l| l.split_whitespace().next() == Some(label))
            .unwrap_or_else(|| panic!("no row {label} in\n{section}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("<=4096"), ["<=4096", "1000", "66.67", full.as_str()]);
    assert_eq!(row("<=512"), ["<=512", "500", "33.33", half.as_str()]);
    assert_eq!(row(">524288"), [">524288", "0", "0.00"]);
    // One row per bucket plus the title and the column header.
    assert_eq!(section.lines().count(), 18 + 2);
    let write_row = text
        .lines()
        .find(|l| l.starts_with("write "))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(write_row, ["write", "1500", "4352000", "0"]);
}

#[test]
fn the_registry_creates_lists_resets_and_removes() {
    let registry = StatsRegistry::new();
    let a = registry.get_or_create("b-disk");
    let again = registry.get_or_create("b-disk");
    assert!(Arc::ptr_eq(&a, &again));
    let b = registry.get_or_create("a-disk");
    assert_eq!(registry.list(), ["a-disk", "b-disk"]);
    assert!(registry.get("nope").is_none());

    a.begin(crate::Op::Flush, 0, 0).finish(true);
    b.begin(crate::Op::Flush, 0, 0).finish(true);
    assert!(registry.reset("b-disk"));
    assert!(!registry.reset("nope"));
    assert_eq!(registry.snapshot("b-disk").unwrap().flush.commands, 0);
    assert_eq!(registry.snapshot("a-disk").unwrap().flush.commands, 1);
    a.begin(crate::Op::Flush, 0, 0).finish(true);
    registry.reset_all();
    assert!(registry
        .snapshot_all()
        .iter()
        .all(|(_, s)| s.total_commands() == 0));

    let removed = registry.remove("a-disk").unwrap();
    assert!(Arc::ptr_eq(&removed, &b));
    assert_eq!(registry.list(), ["b-disk"]);
    assert!(registry.remove("a-disk").is_none());
    let fresh = registry.get_or_create("a-disk");
    assert!(!Arc::ptr_eq(&fresh, &b));
}

// ---------------------------------------------------------------------------
// A strict reader of the text format, for what the lenient parser above lets
// through: name syntax, label quoting and escapes, numeric values, TYPE
// before samples, families not interleaved, HELP/TYPE once per family.

fn unescape(v: &str) -> String {
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\\') => out.push('\\'),
                Some('"') => out.push('"'),
                Some('n') => out.push('\n'),
                other => panic!("bad escape \\{other:?} in {v:?}"),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    is_metric_name(s) && !s.contains(':')
}

/// Parse a sample line into name, labels (unescaped) and value.
fn parse_sample(line: &str) -> (String, Vec<(String, String)>, f64) {
    let name_end = line.find(['{', ' ']).expect("sample has a value");
    let name = &line[..name_end];
    assert!(is_metric_name(name), "bad metric name in {line:?}");
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=').expect("label has =");
            let key = &rest[..eq];
            assert!(is_label_name(key), "bad label name {key:?} in {line:?}");
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .expect("label value is quoted");
            let mut end = None;
            let mut escaped = false;
            for (i, c) in rest.char_indices() {
                match (escaped, c) {
                    (true, '\\' | '"' | 'n') => escaped = false,
                    (true, _) => panic!("bad escape in {line:?}"),
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    (false, '\n') => panic!("raw newline in {line:?}"),
                    _ => {}
                }
            }
            let end = end.expect("label value is closed");
            labels.push((key.to_string(), unescape(&rest[..end])));
            rest = &rest[end + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let value = rest.strip_prefix(' ').expect("one space before the value");
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}")),
    };
    (name.to_string(), labels, value)
}

/// Check the whole exposition; return family name → type.
fn strict_parse(text: &str) -> HashMap<String, String> {
    assert!(text.ends_with('\n'));
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped: HashSet<String> = HashSet::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut last_le: Option<(String, f64)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest.split_once(' ').expect("HELP has text");
            assert!(is_metric_name(name));
            assert!(helped.insert(name.to_string()), "second HELP for {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a type");
            assert!(is_metric_name(name));
            assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind));
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "second TYPE for {name}"
            );
            if let Some(prev) = current.replace(name.to_string()) {
                finished.insert(prev);
            }
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "stray line {line:?}"
        );
        let (name, labels, value) = parse_sample(line);
        let family = current.clone().expect("TYPE before samples");
        let kind = &types[&family];
        let ok_name = match kind.as_str() {
            "histogram" => [
                format!("{family}_bucket"),
                format!("{family}_sum"),
                format!("{family}_count"),
            ]
            .contains(&name),
            _ => name == family,
        };
        assert!(ok_name, "{name} under family {family} ({kind})");
        assert!(!finished.contains(&family), "{family} interleaved");
        if name.ends_with("_bucket") {
            let le = labels
                .iter()
                .find(|(k, _)| k == "le")
                .expect("bucket has le");
            let le: f64 = if le.1 == "+Inf" {
                f64::INFINITY
            } else {
                le.1.parse().expect("le is a number")
            };
            let series: String = std::iter::once(format!("{name}:"))
                .chain(
                    labels
                        .iter()
                        .filter(|(k, _)| k != "le")
                        .map(|(k, v)| format!("{k}={v:?},")),
                )
                .collect();
            if let Some((prev_series, prev_le)) = &last_le {
                if *prev_series == series {
                    assert!(le > *prev_le, "le not increasing in {line:?}");
                }
            }
            last_le = Some((series, le));
            assert!(value >= 0.0);
        }
    }
    types
}

#[test]
fn a_removed_disk_leaves_the_registry_with_its_snapshots_and_its_devices_record_unseen() {
    let registry = StatsRegistry::new();
    let inner: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(1 << 20));
    let disk = StatsDevice::new(inner, registry.get_or_create("vm"));
    for name in ["vm@s1", "vm@s2", "vm2", "vm2@s1", "v"] {
        registry.get_or_create(name);
    }
    disk.write_at(&[1; 4096], 0, false).unwrap();
    registry.remove_disk("vm");
    assert_eq!(registry.list(), ["v", "vm2", "vm2@s1"]);
    // The old device records into statistics nobody lists any more.
    disk.write_at(&[1; 4096], 0, false).unwrap();
    assert_eq!(
        disk.stats().snapshot().counters(crate::Op::Write).commands,
        2
    );
    assert_eq!(registry.list(), ["v", "vm2", "vm2@s1"]);
    // A new disk of the name starts at zero.
    let new = registry.get_or_create("vm");
    assert_eq!(new.snapshot().counters(crate::Op::Write).commands, 0);
    assert!(!Arc::ptr_eq(&new, disk.stats()));
}
