//! `dedup`, `dedup --estimate` and `compress` for people.

use std::fmt::Write as _;

use strata_api::units::human;
use strata_api::{CompressReport, DedupEstimate, DedupReport};

/// The disks of a report: named when few.
fn disks(names: &[String]) -> String {
    if names.len() <= 4 {
        names.join(", ")
    } else {
        format!("{} disks", names.len())
    }
}

/// What the pass freed, and what it left for a later run.
pub(super) fn dedup(out: &mut String, r: &DedupReport) {
    outln!(
        out,
        "{} ({} versions): freed {} by sharing equal grains; used {} -> {}",
        disks(&r.disks),
        r.versions,
        human(r.freed_bytes),
        human(r.used_bytes_before),
        human(r.used_bytes_after)
    );
    outln!(
        out,
        "  compared {} in {} regions",
        human(r.read_bytes),
        r.regions
    );
    if r.packed_merged_bytes > 0 {
        outln!(
            out,
            "  {} of packed grains now share an equal packed grain: their streams' space comes back \
             as 'strata compress' repacks them",
            human(r.packed_merged_bytes)
        );
    }
    if r.regions_skipped > 0 {
        outln!(
            out,
            "  {} regions changed while compared and were left: run it again to compare them",
            r.regions_skipped
        );
    }
    if r.grains_kept > 0 {
        outln!(
            out,
            "  {} grains kept: a reference to them could not be accounted for (run 'strata check')",
            r.grains_kept
        );
    }
}

/// What the pack pass packed, into how much, and what it left raw or
/// for a later run.
pub(super) fn compress(out: &mut String, r: &CompressReport) {
    // How many times smaller the packed grains are in their streams.
    let ratio = if r.stream_bytes == 0 {
        String::new()
    } else {
        format!(" ({:.2}x)", r.packed_bytes as f64 / r.stream_bytes as f64)
    };
    outln!(
        out,
        "{} ({} versions): packed {} of {} read into {} of streams{ratio}, pairs {}, quads {}; repacked {}; \
         {} stayed raw; used {} -> {}",
        disks(&r.disks),
        r.versions,
        human(r.packed_bytes),
        human(r.read_bytes),
        human(r.stream_bytes),
        human(r.pair_bytes),
        human(r.quad_bytes),
        human(r.repacked_bytes),
        human(r.raw_bytes),
        human(r.used_bytes_before),
        human(r.used_bytes_after)
    );
    outln!(out, "  {} in {} regions", r.codec, r.regions);
    if r.unchanged_bytes > 0 {
        outln!(
            out,
            "  {} raw not read again: unchanged since an earlier run found nothing to pack there",
            human(r.unchanged_bytes)
        );
    }
    if r.regions_skipped > 0 {
        outln!(
            out,
            "  {} regions changed while packed and were left: run it again to pack them",
            r.regions_skipped
        );
    }
}

/// The figures, each with what it means, largest saving first.
pub(super) fn dedup_estimate(out: &mut String, r: &DedupEstimate) {
    let pct = |part: u64| {
        if r.stored_bytes == 0 {
            0.0
        } else {
            100.0 * part as f64 / r.stored_bytes as f64
        }
    };
    let disks = disks(&r.disks);
    outln!(
        out,
        "{disks}: {} versions map {} (logical), {} stored, {} shared already",
        r.versions,
        human(r.logical_bytes),
        human(r.stored_bytes),
        human(r.shared_bytes)
    );
    outln!(
        out,
        "  re-sharing equal grains at the same offset would free {} ({:.1}% of stored; exact)",
        human(r.same_offset_bytes),
        pct(r.same_offset_bytes)
    );
    if r.same_offset_packed_bytes > 0 {
        outln!(
            out,
            "  and would point {} of packed grains at equal packed grains (their streams' space \
             comes back when repacked)",
            human(r.same_offset_packed_bytes)
        );
    }
    outln!(
        out,
        "  sharing equal grains at any offset would free about {} ({:.1}%; from a sample of {} grains, 1 in {})",
        human(r.any_offset_bytes),
        pct(r.any_offset_bytes),
        r.sample_grains,
        r.sample_every
    );
    if r.zero_bytes > 0 {
        outln!(
            out,
            "  {} of stored grains hold only zeros ('strata punchzero DISK' unmaps them)",
            human(r.zero_bytes)
        );
    }
    packing(out, r);
    outln!(out, "  read {}", human(r.read_bytes));
}

/// The estimate's lines on packing: what is packed, what a sample would
/// pack, what needs a key.
fn packing(out: &mut String, r: &DedupEstimate) {
    if r.packed_bytes > 0 {
        outln!(
            out,
            "  {} of stored grains are packed, in {} of streams ({:.2}x; 'strata compress')",
            human(r.packed_bytes),
            human(r.packed_stored_bytes),
            r.packed_bytes as f64 / r.packed_stored_bytes.max(1) as f64
        );
    }
    if r.compress_sampled_grains > 0 {
        let n = r.compress_sampled_grains;
        let ratio = |after: u64| (n * 4096) as f64 / after.max(1) as f64;
        let packable = 100.0 * r.packable_grains as f64 / n as f64;
        outln!(
            out,
            "  a sample of {n} raw grains (a run of four in {}) as 'strata compress' packs them: {:.2}x smaller with LZ4 (the default), {:.2}x with zstd; {packable:.0}% packed",
            r.compress_sample_every.max(64),
            ratio(r.lz4_sampled_bytes_after),
            ratio(r.compress_sampled_bytes_after)
        );
    }
    if r.encrypted_bytes > 0 {
        outln!(
            out,
            "  {} stored under a key: how it compresses needs the key (compression comes before encryption)",
            human(r.encrypted_bytes)
        );
    }
}
