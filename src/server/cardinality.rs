//! `GET /api/v1/cardinality` (docs/limits.md): the cardinality guard's counts as JSON.
//! `?tenant=T` keeps one tenant, `?limit=N` lists its N metrics with most active series
//! (default 20, at most 10,000), `?metric=NAME` that metric's labels by distinct values.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::live::Live;
use crate::query::form;

const DEFAULT_TOP: usize = 20;
const MAX_TOP: usize = 10_000;

pub(super) async fn cardinality(
    State(live): State<Arc<Live>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let st = live.current();
    if let Err(e) = super::check_auth(&st, &headers) {
        return e.into_response();
    }
    let Some(guard) = st.pipeline.guard() else {
        return json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"status": "error", "error": "the cardinality guard is not built"}),
        );
    };
    let pairs = form::decode(query.as_deref().unwrap_or(""));
    let tenant = form::get(&pairs, "tenant");
    let top = match form::get(&pairs, "limit").map(str::parse::<usize>) {
        None => DEFAULT_TOP,
        Some(Ok(n)) => n.min(MAX_TOP),
        Some(Err(_)) => {
            return json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"status": "error", "errorType": "bad_data", "error": "limit must be a number"}),
            );
        }
    };
    let data = match form::get(&pairs, "metric") {
        Some(m) => serde_json::to_value(guard.labels(tenant, m)),
        None => serde_json::to_value(guard.report(tenant, top)),
    };
    match data {
        Ok(data) => json(
            StatusCode::OK,
            serde_json::json!({"status": "success", "data": data}),
        ),
        Err(e) => json(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"status": "error", "error": e.to_string()}),
        ),
    }
}

fn json(status: StatusCode, v: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}
