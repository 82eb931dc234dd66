//! The API's actions (POST, DELETE): which path is which request, and
//! what it answers on success (docs/API.md). A vhost-user-blk socket is
//! added and removed through the control socket only: over HTTP a token
//! would let its holder bind sockets, and replace those of other
//! programs, anywhere the server may write.

use axum::http::Method;
use serde_json::Value;
use strata_api::units::parse_size;
use strata_api::{JobAction, PackCodec, Request};
use strata_engine::Provisioning;

use super::Refusal;

pub(super) fn field<'a>(body: &'a Value, name: &str) -> Result<&'a str, Refusal> {
    body.get(name).and_then(Value::as_str).ok_or_else(|| {
        Refusal::new(
            400,
            "invalid_argument",
            &format!("the body needs \"{name}\" (a string)"),
        )
    })
}

/// An optional string member of a body (absent: empty).
pub(super) fn optional_text(body: &Value, name: &str) -> String {
    body.get(name)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// An optional boolean member of a body (absent: false).
pub(super) fn flag(body: &Value, name: &str) -> bool {
    body.get(name).and_then(Value::as_bool).unwrap_or(false)
}

/// The status an action answers on success, None when `segs` names none.
pub(super) fn action_status(method: &Method, segs: &[&str]) -> Option<u16> {
    let (post, delete) = (method == Method::POST, method == Method::DELETE);
    Some(match segs {
        ["disks"] if post => 201,
        ["disks", _] if delete => 200,
        ["imports"] if post => 202,
        ["dedup" | "compress"] if post => 202,
        ["disks", _, "snapshots"] if post => 201,
        ["disks", _, "snapshots", _, "revert"] if post => 200,
        ["disks", _, "snapshots", _] if delete => 200,
        ["disks", _, "clones"] if post => 201,
        ["disks", _, "extend"] if post => 200,
        ["disks", _, "rename"] if post => 200,
        ["disks", _, "snapshots", _, "rename"] if post => 200,
        ["disks", _, "convert" | "defrag"] if post => 202,
        ["jobs", _, "pause" | "resume" | "cancel"] if post => 200,
        ["groups", _, "snapshots"] if post => 201,
        ["groups", _, "snapshots", _, "revert"] if post => 200,
        ["groups", _, "snapshots", _] if delete => 200,
        _ => return None,
    })
}

/// The body's "size": bytes, or a size with a unit ("20G").
fn size_field(b: &Value) -> Result<u64, Refusal> {
    match b.get("size") {
        Some(Value::Number(n)) => n.as_u64().ok_or("a size in bytes".to_string()),
        Some(Value::String(s)) => parse_size(s).map_err(|e| e.message),
        _ => Err("the body needs \"size\" (\"20G\" or bytes)".to_string()),
    }
    .map_err(|e| Refusal::new(400, "invalid_argument", &e))
}

/// `POST /api/disks/{d}/extend`: `"size"` the new size, or `"+1G"` for
/// that much more (the CLI's `extend --size +1G`).
fn extend(d: &str, b: &Value) -> Result<Request, Refusal> {
    let more = match b.get("size") {
        Some(Value::String(s)) => s.trim().strip_prefix('+'),
        _ => None,
    };
    Ok(Request::Extend {
        name: d.to_string(),
        size_bytes: match more {
            Some(m) => size_field(&serde_json::json!({ "size": m }))?,
            None => size_field(b)?,
        },
        by: more.is_some(),
    })
}

/// The request of action `segs` (which [`action_status`] matched) with
/// body `b`, and the status it answers on success.
pub(super) fn action(method: &Method, segs: &[&str], b: &Value) -> Result<(Request, u16), Refusal> {
    let status = action_status(method, segs).expect("checked by the caller");
    let req = match segs {
        ["disks"] => Request::Create {
            name: field(b, "name")?.to_string(),
            size_bytes: whole_sectors(size_field(b)?),
            provisioning: provisioning(b)?,
            // Secrets do not travel over HTTP: encrypted disks are made
            // and unlocked on the control socket (docs/API.md).
            encrypt: None,
        },
        ["imports"] => import(b)?,
        ["dedup"] => dedup(b)?,
        ["compress"] => compress(b)?,
        ["disks", d, rest @ ..] => disk_action(d, rest, b)?,
        // The group's own quiesce hook only: a command named over HTTP
        // would let a token run programs as the server.
        ["groups", g, "snapshots"] => Request::GroupSnapshotCreate {
            group: g.to_string(),
            snapshot: field(b, "name")?.to_string(),
            description: optional_text(b, "description"),
            quiesce_hook: None,
            no_quiesce: flag(b, "no_quiesce"),
            ignore_quiesce_error: flag(b, "ignore_quiesce_error"),
            timeout_s: b.get("timeout_s").and_then(Value::as_u64),
            max_pause_ms: b.get("max_pause_ms").and_then(Value::as_u64),
        },
        ["groups", g, "snapshots", s, "revert"] => Request::GroupSnapshotRevert {
            group: g.to_string(),
            snapshot: s.to_string(),
            force: flag(b, "force"),
        },
        ["groups", g, "snapshots", s] => Request::GroupSnapshotDelete {
            group: g.to_string(),
            snapshot: s.to_string(),
        },
        ["jobs", id, act] => Request::JobControl {
            id: id
                .parse()
                .map_err(|_| Refusal::new(400, "invalid_argument", "a job id is a number"))?,
            action: match *act {
                "pause" => JobAction::Pause,
                "resume" => JobAction::Resume,
                _ => JobAction::Cancel,
            },
        },
        _ => unreachable!("action_status matched"),
    };
    Ok((req, status))
}

/// An action on disk `d`: `rest` is the path after `/disks/{d}`.
fn disk_action(d: &str, rest: &[&str], b: &Value) -> Result<Request, Refusal> {
    Ok(match rest {
        [] => Request::Remove {
            name: d.to_string(),
            force: flag(b, "force"),
        },
        ["snapshots"] => Request::SnapshotCreate {
            disk: d.to_string(),
            snapshot: field(b, "name")?.to_string(),
            description: optional_text(b, "description"),
        },
        ["snapshots", s, "revert"] => Request::SnapshotRevert {
            disk: d.to_string(),
            snapshot: s.to_string(),
            force: flag(b, "force"),
        },
        ["snapshots", s, "rename"] => Request::SnapshotRename {
            disk: d.to_string(),
            snapshot: s.to_string(),
            to: field(b, "to")?.to_string(),
        },
        ["snapshots", s] => Request::SnapshotDelete {
            disk: d.to_string(),
            snapshot: s.to_string(),
            force: flag(b, "force"),
        },
        // A full clone is a job (202): of the disk, or of a snapshot.
        ["clones"] if flag(b, "full") => Request::CloneFull {
            source: match b.get("snapshot").and_then(Value::as_str) {
                Some(s) => format!("{d}@{s}"),
                None => d.to_string(),
            },
            name: field(b, "name")?.to_string(),
            provisioning: provisioning(b)?,
            to: None,
            rate_bytes_per_sec: None,
        },
        ["clones"] => Request::CloneLinked {
            source: format!("{d}@{}", field(b, "snapshot")?),
            name: field(b, "name")?.to_string(),
            own_key: None,
        },
        ["extend"] => extend(d, b)?,
        ["rename"] => Request::Rename {
            name: d.to_string(),
            to: field(b, "to")?.to_string(),
        },
        ["convert"] => Request::Convert {
            name: d.to_string(),
            provisioning: Provisioning::parse(field(b, "type")?)
                .map_err(|e| Refusal::new(400, "invalid_argument", &e.message))?,
            rate_bytes_per_sec: None,
        },
        ["defrag"] => Request::Defrag {
            name: d.to_string(),
            dry_run: false,
            rate_bytes_per_sec: None,
        },
        _ => unreachable!("action_status matched"),
    })
}

/// `POST /dedup`: `{"estimate": true}` for what sharing would free (the
/// CLI's `dedup --estimate`), else the pass; `"disks"` the names (absent
/// or empty: every disk), `"rate"` bytes per second or `"100M"`; a job.
fn dedup(b: &Value) -> Result<Request, Refusal> {
    let (disks, rate_bytes_per_sec) = disks_and_rate(b)?;
    Ok(if flag(b, "estimate") {
        Request::DedupEstimate {
            disks,
            rate_bytes_per_sec,
        }
    } else {
        Request::Dedup {
            disks,
            rate_bytes_per_sec,
        }
    })
}

/// `POST /compress`: the CLI's `compress`; `"disks"` and `"rate"` as for
/// `/dedup`, `"codec"`: `"lz4"` (the default) or `"zstd"`; a job.
fn compress(b: &Value) -> Result<Request, Refusal> {
    let (disks, rate_bytes_per_sec) = disks_and_rate(b)?;
    let codec = match b.get("codec") {
        None | Some(Value::Null) => PackCodec::default(),
        Some(Value::String(s)) => PackCodec::parse(s).map_err(|e| bad_body(&e.to_string()))?,
        Some(_) => return Err(bad_body("\"codec\" is \"lz4\" or \"zstd\"")),
    };
    Ok(Request::Compress {
        disks,
        codec,
        rate_bytes_per_sec,
    })
}

/// A space pass's `"disks"` (absent, null or empty: every disk) and
/// `"rate"` (bytes per second, or a size such as `"100M"`).
fn disks_and_rate(b: &Value) -> Result<(Vec<String>, Option<u64>), Refusal> {
    let disks = match b.get("disks") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| n.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad_body("\"disks\" is a list of disk names"))?,
        Some(_) => return Err(bad_body("\"disks\" is a list of disk names")),
    };
    let rate = match b.get("rate") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.as_u64().ok_or_else(|| bad_body("a rate in bytes"))?),
        Some(Value::String(s)) => Some(parse_size(s).map_err(|e| bad_body(&e.message))?),
        Some(_) => {
            return Err(bad_body(
                "\"rate\" is bytes per second or a size (\"100M\")",
            ))
        }
    };
    Ok((disks, rate))
}

/// A 400 for a body that does not say what it should.
fn bad_body(why: &str) -> Refusal {
    Refusal::new(400, "invalid_argument", why)
}

/// A body's `type` (absent: thin), as the CLI's `--type`.
fn provisioning(b: &Value) -> Result<Provisioning, Refusal> {
    match b.get("type").and_then(Value::as_str) {
        None => Ok(Provisioning::Thin),
        Some(t) => {
            Provisioning::parse(t).map_err(|e| Refusal::new(400, "invalid_argument", &e.message))
        }
    }
}

/// A size rounded up to whole 512-byte sectors, as the CLI rounds it.
fn whole_sectors(bytes: u64) -> u64 {
    strata_api::units::sectors_up(bytes).map_or(bytes, |(b, _)| b)
}

/// `POST /imports`: an image at a path the server reads (absolute), as a
/// new disk; a job.
fn import(b: &Value) -> Result<Request, Refusal> {
    let path = std::path::PathBuf::from(field(b, "path")?);
    if !path.is_absolute() {
        let why = "\"path\" is a path on the server, absolute (e.g. /srv/images/vm.vmdk)";
        return Err(Refusal::new(400, "invalid_argument", why));
    }
    Ok(Request::Import {
        path,
        name: field(b, "name")?.to_string(),
        provisioning: provisioning(b)?,
        format: match b.get("format").and_then(Value::as_str) {
            Some(f) => Some(
                strata_api::ImageFormat::parse(f)
                    .map_err(|e| Refusal::new(400, "invalid_argument", &e.message))?,
            ),
            None => None,
        },
        encrypt: None,
        base: b.get("base").and_then(Value::as_str).map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn post(segs: &[&str], b: &Value) -> Result<(Request, u16), Refusal> {
        action(&Method::POST, segs, b)
    }

    #[test]
    fn compress_is_a_job_with_the_body_of_dedup() {
        let b = json!({"disks": ["a", "b"], "codec": "zstd", "rate": "100M"});
        let (r, s) = post(&["compress"], &b).ok().unwrap();
        assert_eq!(s, 202);
        assert!(
            matches!(r, Request::Compress { ref disks, codec: PackCodec::Zstd, rate_bytes_per_sec: Some(n) }
            if disks == &["a", "b"] && n == 100 << 20),
            "{r:?}"
        );
        let (r, _) = post(&["compress"], &json!({})).ok().unwrap();
        assert!(
            matches!(r, Request::Compress { ref disks, codec: PackCodec::Lz4, rate_bytes_per_sec: None }
            if disks.is_empty()),
            "{r:?}"
        );
        for bad in [
            json!({"disks": "a"}),
            json!({"disks": [1]}),
            json!({"rate": true}),
            json!({"rate": "fast"}),
            json!({"codec": true}),
            json!({"codec": "gzip"}),
        ] {
            assert!(post(&["compress"], &bad).is_err(), "{bad}");
        }
        assert!(action_status(&Method::DELETE, &["compress"]).is_none());
        let (r, _) = post(&["dedup"], &json!({"disks": ["a"], "rate": 4096}))
            .ok()
            .unwrap();
        assert!(matches!(
            r,
            Request::Dedup {
                rate_bytes_per_sec: Some(4096),
                ..
            }
        ));
    }
}
