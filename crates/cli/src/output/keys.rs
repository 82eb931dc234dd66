//! `unlock`, `key list|add|remove`, `rekey` for people: keyslots, never
//! keys.

use std::fmt::Write as _;

use strata_api::units::utc;
use strata_api::{Encryption, Response};

/// An answer about keys for people (`unlock`, `lock`, `key ...`,
/// `rekey`); None for any other answer.
pub(super) fn answer(out: &mut String, r: &Response) -> Option<()> {
    match r {
        Response::Unlocked { name, slot, kept } => unlocked(out, name, *slot, *kept),
        Response::Locked { name, disks, held } => locked(out, name, disks, *held),
        Response::Keys {
            name,
            encryption,
            slot,
        } => list(out, name, encryption, *slot),
        _ => return None,
    }
    Some(())
}

/// `encrypted: aes-xts-plain64, locked, 2 keyslots` (the `info` line's value).
pub(super) fn summary(e: &Encryption) -> String {
    let state = if e.locked {
        "locked (strata unlock)"
    } else {
        "unlocked"
    };
    let n = e.slots.len();
    let s = if n == 1 { "" } else { "s" };
    let rekey = match e.deep_rekey {
        Some(r) => format!(
            ", deep rekey at {}% (strata rekey --deep resumes it)",
            r.done_bytes * 100 / r.total_bytes.max(1)
        ),
        None => String::new(),
    };
    let own = if e.own_key {
        ", own key (what it inherited is under its source's)"
    } else {
        ""
    };
    format!("{}, {state}, {n} keyslot{s}{own}{rekey}", e.cipher)
}

/// The keyslots of a disk, one line each.
fn list(out: &mut String, name: &str, e: &Encryption, added: Option<u32>) {
    if let Some(s) = added {
        outln!(out, "added keyslot {s} to {name}");
    }
    outln!(out, "{name}: {}", summary(e));
    for s in &e.slots {
        let label = s
            .label
            .as_deref()
            .map(|l| format!(" \"{l}\""))
            .unwrap_or_default();
        outln!(
            out,
            "  slot {}: {} ({}), added {}{label}",
            s.slot,
            s.source,
            s.kdf,
            utc(s.created_unix * 1000)
        );
    }
}

/// `lock`: which disks are locked now, or that nothing held their keys.
fn locked(out: &mut String, name: &str, disks: &[String], held: bool) {
    let others: Vec<&str> = disks
        .iter()
        .map(String::as_str)
        .filter(|d| *d != name)
        .collect();
    let also = match others.is_empty() {
        true => String::new(),
        false => format!(" (and {}, which share its keys)", others.join(", ")),
    };
    if held {
        outln!(out, "locked {name}{also}: its keys are forgotten");
    } else {
        outln!(
            out,
            "{name}{also} was locked already: nothing here held its keys"
        );
    }
}

/// `unlock`: which keyslot opened, and whether anything keeps the keys.
fn unlocked(out: &mut String, name: &str, slot: u32, kept: bool) {
    if kept {
        outln!(
            out,
            "unlocked {name} (keyslot {slot}): the server serves it until it stops"
        );
    } else {
        outln!(
            out,
            "the key opens {name} (keyslot {slot}); no server runs, so nothing stays unlocked \
             (serve with --unlock {name}=FILE)"
        );
    }
}
