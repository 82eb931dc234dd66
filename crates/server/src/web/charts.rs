//! `GET /api/v1/charts` and `GET /api/v1/stats/{export}?window=SECONDS`:
//! performance over time, from the charts a sampler thread keeps while
//! the HTTP listener runs ([`strata_stats::charts`], docs/API.md).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use strata_stats::charts::{interval_from_env, Range, Sampler, Space};
use strata_stats::{Charts, StatsRegistry};

use super::{error_response, json_response, query_params, Resp, Web};

/// How old the datastore's space figures may be (an object store's cost
/// requests).
const SPACE_MAX_AGE: Duration = Duration::from_secs(60);
/// The longest window asked for: the oldest copy the charts keep.
const WINDOW_MAX_S: u64 = 360;

/// The charts of `ds`'s exports, and the thread that samples them (it
/// stops when dropped).
pub(crate) fn start(
    registry: Arc<StatsRegistry>,
    ds: crate::placement::Store,
) -> std::io::Result<(Arc<Charts>, Sampler)> {
    let charts = Arc::new(Charts::new(interval_from_env()));
    let used_ds = ds.clone();
    let space = Space {
        used: Box::new(move || {
            used_ds
                .space_recent(SPACE_MAX_AGE)
                .ok()
                .map(|i| i.used_bytes)
        }),
        stored: Box::new(move |export: &str| ds.stored_bytes(export)),
    };
    let sampler = Sampler::start(charts.clone(), registry, space)?;
    Ok((charts, sampler))
}

/// `GET /api/v1/charts?range=hour|day[&export=NAME]`.
pub(super) fn chart_response(web: &Web, query: Option<&str>) -> Resp {
    let q = match query_params(query) {
        Ok(q) => q,
        Err(r) => return r.response(),
    };
    let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let Some(range) = Range::parse(get("range").unwrap_or("hour")) else {
        return error_response(400, "invalid_argument", "range is hour or day");
    };
    let Some(charts) = &web.charts else {
        return error_response(404, "not_found", "this server keeps no charts");
    };
    let export = get("export").filter(|e| !e.is_empty());
    match charts.points(export, range) {
        Some(points) => json_response(
            200,
            &json!({
                "interval_s": charts.interval(range).as_secs_f64(),
                "points": points,
            }),
        ),
        None => error_response(
            404,
            "not_found",
            &format!(
                "no chart of export '{}' (no client has used it yet, or it is gone)",
                export.unwrap_or("")
            ),
        ),
    }
}

/// The `window` of a query, if one is asked for.
pub(super) fn window_asked(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|p| p.starts_with("window=")))
}

/// `GET /api/v1/stats/{export}?window=SECONDS`: the statistics of about
/// the last SECONDS (at most [`WINDOW_MAX_S`]), in `stats`' shape.
pub(super) fn window_response(web: &Web, export: &str, query: Option<&str>) -> Resp {
    let q = match query_params(query) {
        Ok(q) => q,
        Err(r) => return r.response(),
    };
    let secs = q
        .iter()
        .find(|(n, _)| n == "window")
        .and_then(|(_, v)| v.parse::<u64>().ok())
        .filter(|s| (1..=WINDOW_MAX_S).contains(s));
    let Some(secs) = secs else {
        return error_response(
            400,
            "invalid_argument",
            &format!("window is a number of seconds from 1 to {WINDOW_MAX_S}"),
        );
    };
    let (Some(charts), Some(now)) = (&web.charts, web.registry.snapshot(export)) else {
        return error_response(404, "not_found", &format!("no statistics of '{export}'"));
    };
    match charts.window(export, &now, Duration::from_secs(secs)) {
        Some(w) => {
            let mut out = serde_json::Map::new();
            out.insert(
                export.to_string(),
                serde_json::to_value(&w).unwrap_or(Value::Null),
            );
            json_response(200, &Value::Object(out))
        }
        None => error_response(
            404,
            "not_found",
            &format!("no window of '{export}' yet: the first sample is taken after an interval"),
        ),
    }
}
