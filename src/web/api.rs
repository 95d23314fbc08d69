//! `GET /api/v1/explain` and `POST /api/v1/normalize`, and the dry run behind the
//! normalize API and page.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde::Serialize;

use super::Ui;
use crate::explain::{self, Outcome};
use crate::exposition::{self, ParseError};
use crate::mapping::compile::ScaleTarget;
use crate::normalize;
use crate::pipeline::{Pipeline, PipelineLimits};
use crate::server::AppState;

/// The largest exposition text a dry run takes (`413` beyond, unread).
pub const MAX_DRY_RUN_BYTES: usize = 1 << 20;

/// Dry runs at once (`429` beyond): each one holds up to a few times its input.
const MAX_DRY_RUNS: usize = 2;
static DRY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// What a dry run did to pasted exposition text.
#[derive(Debug, Serialize)]
pub struct DryRun {
    /// The input samples, one `name{labels} value [timestamp]` line each.
    pub input: Vec<String>,
    /// What a backend would receive, as `promnorm normalize` prints it.
    pub output: Vec<String>,
    /// Per input sample: the rules that applied and what it became.
    pub trace: Vec<Trace>,
}

#[derive(Debug, Serialize)]
pub struct Trace {
    pub input: String,
    /// The rules of the plan (pack, rule, what it does), in phase order; empty when no
    /// rule applies.
    pub rules: Vec<String>,
    /// The original is forwarded too (`keep_original`).
    pub keep_original: bool,
    /// The series it leaves as (then its copies), or why it is dropped.
    pub results: Vec<TraceResult>,
}

#[derive(Debug, Serialize, Default)]
pub struct TraceResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The factor its values (or `le` bounds) are multiplied by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<String>,
    /// A `copy: true` rule's result.
    pub copy: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DryRunError {
    #[error("no samples in the input")]
    Empty,
    #[error("input {0}")]
    Parse(#[from] ParseError),
    #[error("{0}")]
    Pipeline(String),
}

/// Runs `text` through the running rules on a pipeline of its own: nothing reaches the
/// derive stage, the backends or the proxy's counters.
pub fn dry_run(st: &AppState, text: &str) -> Result<DryRun, DryRunError> {
    let scrape = exposition::parse(text)?;
    if scrape.samples.is_empty() {
        return Err(DryRunError::Empty);
    }
    let rules = st.pipeline.rules();
    let mut pipeline = Pipeline::new(
        st.pipeline.shared_rules().clone(),
        PipelineLimits::default(),
    );
    if st.pipeline.counter_families().is_some() {
        pipeline = pipeline.with_metadata_total_fix();
    }
    let output = normalize::normalize(&pipeline, &[("input".into(), text.to_string())], 0)
        .map_err(|e| DryRunError::Pipeline(e.to_string()))?
        .lines()
        .map(str::to_string)
        .collect();
    let mut input = Vec::with_capacity(scrape.samples.len());
    let mut trace = Vec::with_capacity(scrape.samples.len());
    for s in &scrape.samples {
        let mut head = vec![("__name__".to_string(), s.name.clone())];
        head.extend(s.labels.iter().cloned());
        let mut series = String::new();
        explain::write_selector(&mut series, &head);
        let mut line = series.clone();
        line.push(' ');
        let mut num = Vec::new();
        crate::mapping::number::write_float(
            &mut num,
            s.value,
            crate::mapping::number::FloatStyle::Go,
        );
        line.push_str(&String::from_utf8_lossy(&num));
        if let Some(ts) = s.timestamp_ms {
            line.push_str(&format!(" {ts}"));
        }
        input.push(line);
        let Some(plan) = explain::plan_of(rules, &s.name) else {
            trace.push(Trace {
                input: series.clone(),
                rules: Vec::new(),
                keep_original: false,
                results: vec![TraceResult {
                    output: Some(series),
                    ..Default::default()
                }],
            });
            continue;
        };
        let mut results = vec![result(
            explain::simulate(rules, &plan, &s.name, &s.labels),
            false,
        )];
        for c in &plan.copies {
            results.push(result(
                explain::simulate(rules, &c.plan, &s.name, &s.labels),
                true,
            ));
        }
        trace.push(Trace {
            input: series,
            rules: plan.trace.clone(),
            keep_original: plan.keep_original,
            results,
        });
    }
    Ok(DryRun {
        input,
        output,
        trace,
    })
}

fn result(o: Outcome, copy: bool) -> TraceResult {
    match o {
        Outcome::Dropped { reason } => TraceResult {
            dropped: Some(reason),
            copy,
            ..Default::default()
        },
        Outcome::NotCopied => TraceResult {
            dropped: Some("not made: the copy rule's labels do not match".into()),
            copy,
            ..Default::default()
        },
        Outcome::Kept { labels, scale } => {
            let mut s = String::new();
            explain::write_selector(&mut s, &labels);
            TraceResult {
                output: Some(s),
                scale: scale.map(|(f, t)| match t {
                    ScaleTarget::Value => format!("values {f}"),
                    ScaleTarget::Le => format!("le values {f}"),
                }),
                dropped: None,
                copy,
            }
        }
    }
}

/// A slot among the [`MAX_DRY_RUNS`], given back when dropped.
pub(super) struct DryRunSlot(());

impl DryRunSlot {
    pub(super) fn take() -> Option<DryRunSlot> {
        DRY_RUNS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_DRY_RUNS).then_some(n + 1)
            })
            .ok()
            .map(|_| DryRunSlot(()))
    }
}

impl Drop for DryRunSlot {
    fn drop(&mut self) {
        DRY_RUNS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a posted body was not taken.
pub(super) enum BodyRefused {
    TooLarge,
    Read(String),
}

/// Reads a body of at most `limit` bytes; stops reading at the first byte beyond, and
/// refuses a `Content-Length` beyond it before reading anything.
pub(super) async fn read_limited(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<Vec<u8>, BodyRefused> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyRefused::TooLarge);
    }
    let mut out = Vec::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyRefused::Read(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > limit {
                    return Err(BodyRefused::TooLarge);
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(())
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), read)
        .await
        .map_err(|_| BodyRefused::Read("body not received within 30s".into()))??;
    Ok(out)
}

/// A Prometheus-style JSON answer: `{"status":"success","data":…}` or
/// `{"status":"error","errorType":…,"error":…}`.
pub(super) fn json(status: StatusCode, value: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

pub(super) fn json_error(status: StatusCode, kind: &str, msg: &str) -> Response {
    json(
        status,
        serde_json::json!({"status": "error", "errorType": kind, "error": msg}),
    )
}

/// `GET /api/v1/explain?name=QUERY`: the text `promnorm explain QUERY` prints, against
/// the running configuration.
pub(super) async fn explain(State(ui): State<Arc<Ui>>, uri: Uri) -> Response {
    let query = uri.query().and_then(|q| super::form_value(q, "name"));
    let Some(query) = query else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_data",
            "missing parameter name (a metric name or selector)",
        );
    };
    let st = ui.live.current();
    match explain::explain_for(
        st.pipeline.rules(),
        st.pipeline.deriver().map(|d| &**d),
        &query,
        &super::explain_backends(&st),
    ) {
        Ok(text) => json(
            StatusCode::OK,
            serde_json::json!({"status": "success", "data": {"text": text}}),
        ),
        Err(e) => json_error(StatusCode::BAD_REQUEST, "bad_data", &e.to_string()),
    }
}

/// `POST /api/v1/normalize`: exposition text in, `{input, output, trace}` out.
pub(super) async fn normalize(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(slot) = DryRunSlot::take() else {
        return json_error(
            StatusCode::TOO_MANY_REQUESTS,
            "unavailable",
            "too many dry runs at once; retry later",
        );
    };
    let bytes = match read_limited(&headers, body, MAX_DRY_RUN_BYTES).await {
        Ok(b) => b,
        Err(BodyRefused::TooLarge) => {
            return json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "bad_data",
                &format!("input is over the limit of {MAX_DRY_RUN_BYTES} bytes"),
            );
        }
        Err(BodyRefused::Read(e)) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "bad_data",
                &format!("reading body: {e}"),
            );
        }
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return json_error(StatusCode::BAD_REQUEST, "bad_data", "input is not UTF-8");
    };
    if text.trim().is_empty() {
        return json_error(StatusCode::BAD_REQUEST, "bad_data", "empty input");
    }
    let st = ui.live.current();
    let run = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        dry_run(&st, &text)
    })
    .await;
    match run {
        Ok(Ok(r)) => json(
            StatusCode::OK,
            serde_json::json!({"status": "success", "data": r}),
        ),
        Ok(Err(e @ (DryRunError::Empty | DryRunError::Parse(_)))) => {
            json_error(StatusCode::BAD_REQUEST, "bad_data", &e.to_string())
        }
        Ok(Err(e)) => json_error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "execution",
            &e.to_string(),
        ),
        Err(e) => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &e.to_string(),
        ),
    }
}
