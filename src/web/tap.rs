//! `/debug/tap` and `GET /api/v1/tap`: the live tap (docs/ui.md). The next series that
//! match a name or selector, as they arrived (copied by `server::tap` off the request
//! path) and as they leave: the captured samples run through the running rules as a
//! dry run does, with its trace. Off unless `web.enable_debug`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use serde::Serialize;

use super::api::{json, json_error};
use super::pages::page;
use super::{DryRun, Ui, esc, form_value};
use crate::explain;
use crate::mapping::number::{FloatStyle, write_float};
use crate::server::tap::{MAX_TAP_DURATION, MAX_TAP_SERIES, TapMatch, TapResult};

const OFF: &str = "the live tap is off: it shows the data promnorm forwards. Turn it on with \
`web.enable_debug: true` in the configuration, then restart promnorm (docs/ui.md)";

/// Series captured when `limit` is not given.
const DEFAULT_LIMIT: usize = 10;
/// How long a tap waits when `timeout` is not given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A tap's parameters from a query string.
struct Ask {
    selector: String,
    matcher: TapMatch,
    limit: usize,
    timeout: Duration,
}

fn parse_ask(query: &str) -> Result<Ask, String> {
    let selector = form_value(query, "match").unwrap_or_default();
    if selector.trim().is_empty() {
        return Err("missing parameter match (a metric name or selector)".into());
    }
    let sel = explain::parse_selector(&selector).map_err(|e| e.to_string())?;
    let limit = match form_value(query, "limit").filter(|s| !s.trim().is_empty()) {
        None => DEFAULT_LIMIT,
        Some(s) => match s.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_TAP_SERIES).contains(&n) => n,
            _ => return Err(format!("limit must be 1 to {MAX_TAP_SERIES}, not {s:?}")),
        },
    };
    let timeout = match form_value(query, "timeout").filter(|s| !s.trim().is_empty()) {
        None => DEFAULT_TIMEOUT,
        Some(s) => match parse_duration(s.trim()) {
            Some(d) if !d.is_zero() && d <= MAX_TAP_DURATION => d,
            _ => {
                return Err(format!(
                    "timeout must be a duration up to {}s (30s, 2m, 500ms), not {s:?}",
                    MAX_TAP_DURATION.as_secs()
                ));
            }
        },
    };
    Ok(Ask {
        matcher: TapMatch {
            name: sel.name,
            labels: sel.labels.unwrap_or_default(),
        },
        selector,
        limit,
        timeout,
    })
}

/// `500ms`, `30s`, `2m`, or plain seconds.
fn parse_duration(s: &str) -> Option<Duration> {
    let (num, mult_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else {
        (s, 1000)
    };
    let n: u64 = num.parse().ok()?;
    Some(Duration::from_millis(n.checked_mul(mult_ms)?))
}

/// What a tap saw, and what the running rules make of it.
struct Report {
    result: TapResult,
    /// Per captured series, its `name{labels}`.
    series: Vec<String>,
    /// The dry run of the captured samples; `Err` when they do not make exposition text
    /// the dry run reads (or none were floats).
    dry: Result<DryRun, String>,
    /// Per captured series, the index of its first sample in the dry run's trace.
    first_trace: Vec<Option<usize>>,
}

/// Opens the tap, waits, closes it, runs the dry run. `Err`: status and message.
async fn run(ui: &Ui, query: &str) -> Result<(Ask, Report), (StatusCode, String)> {
    if !ui.debug {
        return Err((StatusCode::FORBIDDEN, OFF.into()));
    }
    let ask = parse_ask(query).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    let session = match ui.live.tap().open(ask.matcher.clone(), ask.limit) {
        Ok(s) => s,
        Err(e) => {
            crate::telemetry::tap_outcome("refused");
            return Err((StatusCode::CONFLICT, e.to_string()));
        }
    };
    let result = session.wait(ask.timeout).await;
    crate::telemetry::tap_outcome(if result.filled { "filled" } else { "timed_out" });
    let mut text = String::new();
    let mut series = Vec::with_capacity(result.series.len());
    let mut first_trace = Vec::with_capacity(result.series.len());
    let mut lines = 0;
    for s in &result.series {
        // `__name__` first: the selector writer takes it as the name where it stands.
        let mut labels = s.labels.clone();
        labels.sort_by_key(|(k, _)| k != "__name__");
        let mut sel = String::new();
        explain::write_selector(&mut sel, &labels);
        first_trace.push((!s.samples.is_empty()).then_some(lines));
        for &(v, ts) in &s.samples {
            let mut num = Vec::new();
            write_float(&mut num, v, FloatStyle::Go);
            let _ = writeln!(text, "{sel} {} {ts}", String::from_utf8_lossy(&num));
            lines += 1;
        }
        series.push(sel);
    }
    let dry = if text.is_empty() {
        Err("no float samples captured".to_string())
    } else {
        let st = ui.live.current();
        tokio::task::spawn_blocking(move || super::dry_run(&st, &text).map_err(|e| e.to_string()))
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    };
    Ok((
        ask,
        Report {
            result,
            series,
            dry,
            first_trace,
        },
    ))
}

#[derive(Serialize)]
struct SeriesJson<'a> {
    series: &'a str,
    /// Unix seconds.
    arrived: f64,
    protocol: &'static str,
    /// `[value, timestamp_ms]`, at most three.
    samples: &'a [(f64, i64)],
    histograms: usize,
}

/// `GET /api/v1/tap?match=SELECTOR&limit=N&timeout=D`.
pub(super) async fn api(State(ui): State<Arc<Ui>>, uri: Uri) -> Response {
    let (ask, rep) = match run(&ui, uri.query().unwrap_or("")).await {
        Ok(r) => r,
        Err((status, msg)) => {
            let kind = match status {
                StatusCode::BAD_REQUEST => "bad_data",
                StatusCode::CONFLICT => "unavailable",
                _ => "forbidden",
            };
            return json_error(status, kind, &msg);
        }
    };
    let series: Vec<SeriesJson> = rep
        .result
        .series
        .iter()
        .zip(&rep.series)
        .map(|(s, sel)| SeriesJson {
            series: sel,
            arrived: s.arrived_ms as f64 / 1000.0,
            protocol: s.protocol,
            samples: &s.samples,
            histograms: s.histograms,
        })
        .collect();
    let (dry_run, dry_run_error) = match &rep.dry {
        Ok(d) => (serde_json::to_value(d).ok(), None),
        Err(e) => (None, Some(e.as_str())),
    };
    json(
        StatusCode::OK,
        serde_json::json!({"status": "success", "data": {
            "match": ask.selector,
            "limit": ask.limit,
            "filled": rep.result.filled,
            "requests_examined": rep.result.requests_examined,
            "over_bytes": rep.result.over_bytes,
            "series": series,
            "dry_run": dry_run,
            "dry_run_error": dry_run_error,
        }}),
    )
}

fn form(selector: &str, limit: &str, timeout: &str) -> String {
    format!(
        "<p>The next series that match a name or selector, as they arrive and as they leave \
         (the captured samples run through the running rules, as a dry run). Sampled: at \
         most one request per 100 ms is looked at; at most {MAX_TAP_SERIES} series, {}s, and \
         one tap at a time. The page answers when the series are in or the time is up. The \
         same as JSON: <code>GET api/v1/tap?match=…&amp;limit=…&amp;timeout=…</code>.</p>\n\
         <form method=\"get\" action=\"tap\"><label>Name or selector <input name=\"match\" \
         value=\"{}\" size=\"50\"></label> <label>Series <input name=\"limit\" value=\"{}\" \
         size=\"4\"></label> <label>Time limit <input name=\"timeout\" value=\"{}\" size=\"5\">\
         </label> <button>Open the tap</button></form>\n",
        MAX_TAP_DURATION.as_secs(),
        esc(selector),
        esc(limit),
        esc(timeout),
    )
}

/// `/debug/tap?match=…`: the form; with `match`, what the tap captured.
async fn page_handler(ui: Arc<Ui>, query: String) -> Response {
    let title = "Live tap";
    let selector = form_value(&query, "match").unwrap_or_default();
    let limit = form_value(&query, "limit").unwrap_or_else(|| DEFAULT_LIMIT.to_string());
    let timeout = form_value(&query, "timeout").unwrap_or_else(|| "30s".into());
    if !ui.debug {
        return page(
            StatusCode::FORBIDDEN,
            title,
            "../",
            &ui.root,
            &format!("<p class=\"bad\" id=\"error\">{}</p>\n", esc(OFF)),
        );
    }
    let mut b = form(&selector, &limit, &timeout);
    if selector.trim().is_empty() {
        return page(StatusCode::OK, title, "../", &ui.root, &b);
    }
    let (ask, rep) = match run(&ui, &query).await {
        Ok(r) => r,
        Err((status, msg)) => {
            let _ = writeln!(b, "<p class=\"bad\" id=\"error\">{}</p>", esc(&msg));
            return page(status, title, "../", &ui.root, &b);
        }
    };
    let _ = writeln!(
        b,
        "<p id=\"summary\">{} of {} series matching <code>{}</code> ({}; {} requests looked at{}).</p>",
        rep.result.series.len(),
        ask.limit,
        esc(&ask.selector),
        if rep.result.filled {
            "all in"
        } else {
            "the time ran out"
        },
        rep.result.requests_examined,
        if rep.result.over_bytes > 0 {
            format!(
                ", {} more did not fit in the tap's memory",
                rep.result.over_bytes
            )
        } else {
            String::new()
        }
    );
    b.push_str(
        "<table id=\"tap\"><tr><th>Arrived</th><th>Series as it arrived</th><th>Samples</th>\
         <th>Rules</th><th>Leaves as</th></tr>",
    );
    for (i, (s, sel)) in rep.result.series.iter().zip(&rep.series).enumerate() {
        let mut samples = String::new();
        for &(v, ts) in &s.samples {
            let mut num = Vec::new();
            write_float(&mut num, v, FloatStyle::Go);
            let _ = write!(samples, "{} @{ts}<br>", esc(&String::from_utf8_lossy(&num)));
        }
        if s.histograms > 0 {
            let _ = write!(samples, "{} native histogram(s)", s.histograms);
        }
        let trace = rep
            .dry
            .as_ref()
            .ok()
            .zip(rep.first_trace.get(i).copied().flatten())
            .and_then(|(d, t)| d.trace.get(t));
        let (rules, leaves) = match trace {
            None => (String::from("-"), String::from("-")),
            Some(t) => super::pages::trace_cells(t),
        };
        let secs = s.arrived_ms.rem_euclid(86_400_000);
        let _ = write!(
            b,
            "<tr><td>{:02}:{:02}:{:02}.{:03} UTC ({})</td><td><code>{}</code></td><td>{samples}</td>\
             <td>{rules}</td><td>{leaves}</td></tr>",
            secs / 3_600_000,
            secs / 60_000 % 60,
            secs / 1000 % 60,
            secs % 1000,
            s.protocol,
            esc(sel),
        );
    }
    b.push_str("</table>\n");
    match &rep.dry {
        Ok(d) => {
            b.push_str("<h2>Output of the captured samples</h2>\n<pre id=\"output\">");
            for l in &d.output {
                b.push_str(&esc(l));
                b.push('\n');
            }
            b.push_str("</pre>\n");
        }
        Err(e) if !rep.result.series.is_empty() => {
            let _ = writeln!(
                b,
                "<p class=\"bad\">No dry run of the captured samples: {}</p>",
                esc(e)
            );
        }
        Err(_) => {}
    }
    page(StatusCode::OK, title, "../", &ui.root, &b)
}

pub(super) async fn page_route(State(ui): State<Arc<Ui>>, uri: Uri) -> Response {
    page_handler(ui, uri.query().unwrap_or("").to_string()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_are_bounded() {
        let a = parse_ask("match=a%7Bpod%3D%22x%22%7D").unwrap();
        assert_eq!(a.matcher.name, "a");
        assert_eq!(a.matcher.labels, [("pod".into(), "x".into())]);
        assert_eq!(a.limit, DEFAULT_LIMIT);
        assert_eq!(a.timeout, DEFAULT_TIMEOUT);
        let a = parse_ask("match=a&limit=100&timeout=2m").unwrap();
        assert_eq!((a.limit, a.timeout), (100, Duration::from_secs(120)));
        assert!(parse_ask("match=a&limit=101").is_err());
        assert!(parse_ask("match=a&limit=0").is_err());
        assert!(parse_ask("match=a&timeout=121s").is_err());
        assert!(parse_ask("match=a&timeout=0").is_err());
        assert!(parse_ask("match=a&timeout=99999999999999999m").is_err());
        assert!(parse_ask("limit=3").is_err());
        assert!(parse_ask("match=a%7Bb%3D~%22c%22%7D").is_err());
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
    }
}
