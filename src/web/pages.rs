//! The HTML pages: plain server-rendered HTML and one embedded stylesheet, readable
//! without JavaScript. Links are relative, so the pages work behind a path prefix an
//! ingress strips.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::Ui;
use super::api::{BodyRefused, DryRunSlot, Trace, read_limited};
use super::{MAX_DRY_RUN_BYTES, esc, form_value};
use crate::explain;

const CSS: &str = "body{font-family:system-ui,sans-serif;margin:0 1.5em 2em;color:#222}\
nav{padding:.6em 0;border-bottom:1px solid #ccc;margin-bottom:1em}nav a{margin-right:1.2em}\
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ddd;padding:.25em .6em;\
text-align:left;vertical-align:top}th{background:#f4f4f4}pre,code{font-family:ui-monospace,monospace;\
font-size:.9em}pre{background:#f8f8f8;padding:.6em;overflow-x:auto;white-space:pre-wrap}\
.bad{color:#b00}.ok{color:#070}.side{display:flex;gap:1em}.side>div{flex:1;min-width:0}\
textarea{width:100%;font-family:ui-monospace,monospace}";

pub(super) async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        CSS,
    )
        .into_response()
}

/// One whole page; `base` leads from the page's path back to the UI's root ("./" or
/// "../"), so every link stays relative.
///
/// `root` leads from the UI's root to the server's (`/metrics`): "" without a route
/// prefix, "../" per segment of one.
pub(super) fn page(
    status: StatusCode,
    title: &str,
    base: &str,
    root: &str,
    body: &str,
) -> Response {
    let mut html = String::with_capacity(body.len() + 1024);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{t} - promnorm</title>\
         <link rel=\"stylesheet\" href=\"{base}static/promnorm.css\"></head><body>\
         <nav><b>promnorm</b> <a href=\"{base}\">Status</a><a href=\"{base}rules\">Rules</a>\
         <a href=\"{base}explain\">Explain</a><a href=\"{base}debug/normalize\">Normalize</a><a href=\"{base}debug/tap\">Tap</a>\
         <a href=\"{base}queries\">Queries</a><a href=\"{base}cardinality\">Cardinality</a><a href=\"{base}targets\">Targets</a><a href=\"{base}{root}metrics\">Metrics</a></nav><h1>{t}</h1>\n{body}</body></html>\n",
        t = esc(title),
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing on these pages is meant to run scripts or be framed.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        html,
    )
        .into_response()
}

pub(super) fn ago(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

/// `/`: version, uptime, the last configuration load, packs, backends, derived state.
pub(super) async fn status(State(ui): State<Arc<Ui>>) -> Response {
    let st = ui.live.current();
    let mut b = String::new();
    let uptime = super::STARTED
        .get()
        .map(|t| t.elapsed())
        .unwrap_or_default();
    let _ = write!(
        b,
        "<table><tr><th>Version</th><td>{}</td></tr><tr><th>Revision</th><td>{}</td></tr>\
         <tr><th>Uptime</th><td>{}</td></tr>",
        esc(env!("CARGO_PKG_VERSION")),
        esc(env!("PROMNORM_REVISION")),
        ago(uptime),
    );
    match crate::telemetry::last_config_load() {
        Some((ok, at)) => {
            let when = SystemTime::now().duration_since(at).unwrap_or_default();
            let _ = write!(
                b,
                "<tr><th>Last configuration load</th><td class=\"{}\">{} {} ago</td></tr>",
                if ok { "ok" } else { "bad" },
                if ok {
                    "succeeded"
                } else {
                    "failed (the running configuration was kept; see the log)"
                },
                ago(when),
            );
        }
        None => b.push_str("<tr><th>Last configuration load</th><td>not recorded</td></tr>"),
    }
    let ready = st.ready.load(std::sync::atomic::Ordering::Relaxed);
    let _ = write!(
        b,
        "<tr><th>Ready</th><td>{}</td></tr>",
        if ready { "yes" } else { "no (shutting down)" }
    );
    match st.pipeline.deriver() {
        Some(d) => {
            let _ = write!(
                b,
                "<tr><th>Derived series state</th><td>{} series</td></tr>",
                d.series_count()
            );
        }
        None => b.push_str("<tr><th>Derived series</th><td>off</td></tr>"),
    }
    b.push_str("</table>\n");
    let _ = writeln!(
        b,
        "<details><summary>Effective configuration (as <code>promnorm check-config --print</code> \
         writes it; secrets hidden)</summary><pre id=\"config\">{}</pre></details>",
        esc(&st.config_text)
    );
    b.push_str("<h2>Packs</h2>\n<table><tr><th>Pack</th><th>Rules</th><th>keep_original</th></tr>");
    let rules = st.pipeline.rules();
    let list = rules.rule_list();
    for p in rules.packs() {
        let n = list.iter().filter(|r| r.pack == p.name).count();
        let _ = write!(
            b,
            "<tr><td><a href=\"rules?pack={}\">{}</a></td><td>{n}</td><td>{}</td></tr>",
            esc(&super::url_enc(&p.name)),
            esc(&p.name),
            p.keep_original
        );
    }
    b.push_str(
        "</table>\n<h2>Backends</h2>\n<table><tr><th>Backend</th><th>Protocol</th>\
         <th>Tenancy</th><th>Queue</th></tr>",
    );
    for s in st.forwarder.backends() {
        let protocol = match (s.needs_v1(), s.wants_v2()) {
            (true, true) => "auto (2.0, falls back to 1.0)",
            (false, _) => "2.0",
            (true, false) => "1.0",
        };
        let tenancy = match s.tenancy() {
            Some(t) => format!(
                "by label <code>{}</code> → header <code>{}</code>",
                esc(&t.label),
                esc(t.header.as_str())
            ),
            None => "none".into(),
        };
        let queue = match s.queue_state() {
            Some(q) => format!(
                "{} ({}): {} of {} bytes, {} requests, oldest {}",
                if q.durable { "disk" } else { "memory" },
                if q.refusing {
                    "<span class=\"bad\">refusing: full</span>"
                } else {
                    "accepting"
                },
                q.bytes,
                q.max_bytes,
                q.requests,
                q.oldest_age.map(ago).unwrap_or_else(|| "-".into()),
            ),
            None => "none (sent directly)".into(),
        };
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{protocol}</td><td>{tenancy}</td><td>{queue}</td></tr>",
            esc(s.name())
        );
    }
    b.push_str(
        &"</table>\n<p>Own telemetry: <a href=\"{r}metrics\">/metrics</a>, \
         <a href=\"{r}-/healthy\">/-/healthy</a>, <a href=\"{r}-/ready\">/-/ready</a>, \
         <a href=\"{r}api/v1/renames\">/api/v1/renames</a>. Docs: docs/ui.md, docs/telemetry.md.</p>\n"
            .replace("{r}", &ui.root),
    );
    page(StatusCode::OK, "Status", "./", &ui.root, &b)
}

/// `/targets`: every scrape target, its labels and its last scrape (docs/scrape.md);
/// the same table as `/api/v1/targets`.
pub(super) async fn targets(State(ui): State<Arc<Ui>>) -> Response {
    use crate::scrape::Host as _;
    let list = ui.live.targets().snapshot();
    let mut b = String::new();
    if ui.live.current().scrape.is_none() {
        b.push_str("<p>Scraping is off (no <code>scrape:</code> in the configuration; docs/scrape.md).</p>\n");
    }
    let up = list
        .iter()
        .filter(|(_, t)| t.health == crate::scrape::status::Health::Up)
        .count();
    let _ = write!(
        b,
        "<p>{} targets, {up} up. As JSON: <a href=\"{}api/v1/targets\">/api/v1/targets</a>.</p>\n\
         <table><tr><th>Endpoint</th><th>State</th><th>Labels</th><th>Last scrape</th>\
         <th>Duration</th><th>Samples</th><th>Error</th></tr>",
        list.len(),
        ui.root
    );
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    for (_, t) in &list {
        let labels: Vec<String> = t
            .labels
            .iter()
            .map(|(k, v)| format!("{}=\"{}\"", esc(k), esc(v)))
            .collect();
        let last = t.last_scrape_ms.map_or_else(
            || "never".to_string(),
            |ms| {
                format!(
                    "{} ago",
                    ago(Duration::from_millis(
                        now_ms.saturating_sub(ms).max(0) as u64
                    ))
                )
            },
        );
        let class = match t.health {
            crate::scrape::status::Health::Up => "ok",
            crate::scrape::status::Health::Down => "bad",
            crate::scrape::status::Health::Unknown => "",
        };
        let _ = write!(
            b,
            "<tr><td>{}</td><td class=\"{class}\">{}</td><td><code>{}</code></td><td>{last}</td>\
             <td>{:.3}s</td><td>{}</td><td class=\"bad\">{}</td></tr>",
            esc(&t.scrape_url),
            t.health.as_str(),
            labels.join(", "),
            t.last_duration_seconds,
            t.last_samples,
            esc(&t.last_error),
        );
    }
    b.push_str("</table>\n");
    page(StatusCode::OK, "Targets", "./", &ui.root, &b)
}

/// `/rules?q=NAME`: every rule of the running configuration in phase order; `q` keeps
/// those whose names, pack or description contain it, `pack` those of one pack.
pub(super) async fn rules(State(ui): State<Arc<Ui>>, uri: Uri) -> Response {
    let st = ui.live.current();
    let query = uri.query().unwrap_or("");
    let q = form_value(query, "q").unwrap_or_default();
    let pack = form_value(query, "pack").unwrap_or_default();
    let list = st.pipeline.rules().rule_list();
    let families = st.pipeline.rules().families().snapshot();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut b = format!(
        "<form method=\"get\" action=\"rules\"><label>Filter <input name=\"q\" value=\"{}\" \
         size=\"40\"></label> <button>Filter</button></form>\n",
        esc(&q)
    );
    let shown: Vec<_> = list
        .iter()
        .filter(|r| pack.is_empty() || r.pack == pack)
        .filter(|r| q.is_empty() || r.matches.contains(&q) || r.describe.contains(&q))
        .collect();
    let _ = write!(
        b,
        "<p>{} of {} rules{}.</p>\n<table><tr><th>Phase</th><th>Pack</th><th>Rule</th><th>Matches</th>\
         <th>Series since start</th><th>Samples since start</th><th>Last seen</th></tr>",
        shown.len(),
        list.len(),
        if pack.is_empty() {
            String::new()
        } else {
            format!(" in pack {}", esc(&pack))
        }
    );
    for r in shown {
        // The per-family counters count per plan, keyed by the plan's trace: a rule's
        // own counts are those of the plans whose traces name it.
        let (series, samples, last) = families
            .iter()
            .filter(|x| names_rule(&x.rule, &r.describe))
            .fold((0u64, None::<u64>, None::<f64>), |(k, n, t), x| {
                (
                    k + x.series,
                    Some(n.unwrap_or(0) + x.samples),
                    match (t, x.last_seen) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        (a, b) => a.or(b),
                    },
                )
            });
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.phase,
            esc(&r.pack),
            esc(&r.describe),
            esc(&r.matches),
            if samples.is_some() {
                series.to_string()
            } else {
                "-".to_string()
            },
            samples.map_or_else(|| "-".to_string(), |n| n.to_string()),
            match (samples, last) {
                (_, Some(t)) => format!("{} ago", ago(Duration::from_secs_f64((now - t).max(0.0)))),
                (Some(_), None) => "not since start".into(),
                (None, _) => "-".into(),
            }
        );
    }
    b.push_str(
        "</table>\n<p>Counted per family (the input name a plan applies to), once per \
         request: a rule's counts are those of the families it applies to, so a series two \
         rules touch counts for both. Series are series per request (a series sent in ten \
         requests counts ten times). -: the rule applies to no name seen or planned yet \
         (prefix and regex rules are planned at a name's first sight). Renamed old names: \
         <code>api/v1/renames</code>.</p>\n",
    );
    page(StatusCode::OK, "Rules", "./", &ui.root, &b)
}

/// Whether a plan's trace (`a; b`) has a line of the rule `describe` (`pack P rule N`
/// is not `pack P rule N0`).
fn names_rule(trace: &str, describe: &str) -> bool {
    trace.match_indices(describe).any(|(i, _)| {
        let starts_line = i == 0 || trace[..i].ends_with("; ");
        let next = trace[i + describe.len()..].chars().next();
        starts_line && matches!(next, None | Some(':' | ';' | ' '))
    })
}

/// `/explain?name=QUERY`: the form, and what `promnorm explain QUERY` prints.
pub(super) async fn explain(State(ui): State<Arc<Ui>>, uri: Uri) -> Response {
    let st = ui.live.current();
    let name = uri
        .query()
        .and_then(|q| form_value(q, "name"))
        .unwrap_or_default();
    let mut b = format!(
        "<form method=\"get\" action=\"explain\"><label>Metric name or selector \
         <input name=\"name\" value=\"{}\" size=\"60\" placeholder=\"vllm:e2e_request_latency_seconds{{le=&quot;0.5&quot;}}\">\
         </label> <button>Explain</button></form>\n",
        esc(&name)
    );
    let mut status = StatusCode::OK;
    if !name.trim().is_empty() {
        match explain::explain_for(
            st.pipeline.rules(),
            st.pipeline.deriver().map(|d| &**d),
            &name,
            &super::explain_backends(&st),
        ) {
            Ok(text) => {
                let _ = writeln!(b, "<pre id=\"explain\">{}</pre>", esc(&text));
            }
            Err(e) => {
                status = StatusCode::BAD_REQUEST;
                let _ = writeln!(
                    b,
                    "<p class=\"bad\" id=\"error\">{}</p>",
                    esc(&e.to_string())
                );
            }
        }
    }
    b.push_str("<p>The same as JSON: <code>GET api/v1/explain?name=…</code>.</p>\n");
    page(status, "Explain", "./", &ui.root, &b)
}

const NORMALIZE_HELP: &str = "<p>Paste Prometheus text exposition (several metrics at once). \
It runs through the running rules on a pipeline of its own: nothing is forwarded, derived \
series are not computed. The same as JSON: <code>POST api/v1/normalize</code>.</p>\n";

fn normalize_page(ui: &Ui, status: StatusCode, text: &str, result: &str) -> Response {
    let b = format!(
        "{NORMALIZE_HELP}<form method=\"post\" action=\"normalize\" enctype=\"multipart/form-data\">\
         <textarea name=\"text\" rows=\"12\">{}</textarea><br><label>or upload a file \
         <input type=\"file\" name=\"file\" accept=\".txt,.prom,text/plain\"></label> \
         <button>Normalize</button></form>\n{result}",
        esc(text)
    );
    page(status, "Normalize (dry run)", "../", &ui.root, &b)
}

pub(super) async fn normalize_form(State(ui): State<Arc<Ui>>) -> Response {
    normalize_page(&ui, StatusCode::OK, "", "")
}

/// `POST /debug/normalize` (a form): input and output side by side, then the trace.
pub(super) async fn normalize_post(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(slot) = DryRunSlot::take() else {
        return normalize_page(
            &ui,
            StatusCode::TOO_MANY_REQUESTS,
            "",
            "<p class=\"bad\">Too many dry runs at once; retry later.</p>",
        );
    };
    // Form encoding can triple the text's size.
    let bytes = match read_limited(&headers, body, 3 * MAX_DRY_RUN_BYTES).await {
        Ok(b) => b,
        Err(BodyRefused::TooLarge) => {
            return normalize_page(
                &ui,
                StatusCode::PAYLOAD_TOO_LARGE,
                "",
                &format!(
                    "<p class=\"bad\">The input is over the limit of {MAX_DRY_RUN_BYTES} bytes.</p>"
                ),
            );
        }
        Err(BodyRefused::Read(e)) => {
            return normalize_page(
                &ui,
                StatusCode::BAD_REQUEST,
                "",
                &format!("<p class=\"bad\">Reading the form: {}</p>", esc(&e)),
            );
        }
    };
    let text = match multipart_boundary(&headers) {
        // The form as browsers send it (it has a file input): an uploaded file wins
        // over the text area.
        Some(boundary) => {
            let fields = multipart_fields(&bytes, &boundary);
            let field = |n: &str| {
                fields
                    .iter()
                    .find(|(k, v)| k == n && !v.is_empty())
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            };
            field("file").or_else(|| field("text")).unwrap_or_default()
        }
        None => form_value(&String::from_utf8_lossy(&bytes), "text").unwrap_or_default(),
    };
    if text.len() > MAX_DRY_RUN_BYTES {
        return normalize_page(
            &ui,
            StatusCode::PAYLOAD_TOO_LARGE,
            "",
            &format!(
                "<p class=\"bad\">The input is over the limit of {MAX_DRY_RUN_BYTES} bytes.</p>"
            ),
        );
    }
    if text.trim().is_empty() {
        return normalize_page(
            &ui,
            StatusCode::BAD_REQUEST,
            "",
            "<p class=\"bad\" id=\"error\">Empty input.</p>",
        );
    }
    let st = ui.live.current();
    let run = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let r = super::dry_run(&st, &text);
        (text, r)
    })
    .await;
    let Ok((text, run)) = run else {
        return normalize_page(
            &ui,
            StatusCode::INTERNAL_SERVER_ERROR,
            "",
            "<p class=\"bad\">The dry run failed.</p>",
        );
    };
    let r = match run {
        Ok(r) => r,
        Err(e) => {
            return normalize_page(
                &ui,
                StatusCode::BAD_REQUEST,
                &text,
                &format!("<p class=\"bad\" id=\"error\">{}</p>", esc(&e.to_string())),
            );
        }
    };
    let mut out = String::from("<div class=\"side\"><div><h2>Input</h2><pre id=\"input\">");
    for l in &r.input {
        out.push_str(&esc(l));
        out.push('\n');
    }
    out.push_str("</pre></div><div><h2>Output</h2><pre id=\"output\">");
    for l in &r.output {
        out.push_str(&esc(l));
        out.push('\n');
    }
    out.push_str(
        "</pre></div></div>\n<h2>Trace</h2>\n<table id=\"trace\"><tr><th>Input series</th>\
         <th>Rules</th><th>Result</th></tr>",
    );
    for t in &r.trace {
        let (rules, res) = trace_cells(t);
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{rules}</td><td>{res}</td></tr>",
            esc(&t.input)
        );
    }
    out.push_str("</table>\n");
    normalize_page(&ui, StatusCode::OK, &text, &out)
}

/// The "Rules" and "Result" cells of one input series' trace (escaped HTML), for the
/// normalize page and the tap.
pub(super) fn trace_cells(t: &Trace) -> (String, String) {
    let rules = if t.rules.is_empty() {
        "no rule applies; forwarded unchanged".to_string()
    } else {
        t.rules
            .iter()
            .map(|l| esc(l))
            .collect::<Vec<_>>()
            .join("<br>")
    };
    let mut res = String::new();
    if t.keep_original {
        res.push_str("original kept too<br>");
    }
    for x in &t.results {
        if x.copy {
            res.push_str("copy: ");
        }
        match (&x.output, &x.dropped) {
            (Some(o), _) => {
                let _ = write!(res, "<code>{}</code>", esc(o));
                if let Some(s) = &x.scale {
                    let _ = write!(res, " ({})", esc(s));
                }
            }
            (None, Some(d)) => {
                let _ = write!(res, "<span class=\"bad\">dropped ({})</span>", esc(d));
            }
            (None, None) => {}
        }
        res.push_str("<br>");
    }
    (rules, res)
}

/// The boundary of a `multipart/form-data` body.
fn multipart_boundary(headers: &HeaderMap) -> Option<String> {
    let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let (kind, params) = ct.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty() && b.len() <= 70)
    })
}

/// The named fields of a `multipart/form-data` body (RFC 7578); a malformed part is
/// skipped.
fn multipart_fields(body: &[u8], boundary: &str) -> Vec<(String, Vec<u8>)> {
    // Every delimiter is CRLF "--" boundary; the first one's CRLF is implied.
    let delim = format!("\r\n--{boundary}");
    let d = delim.as_bytes();
    let body = [b"\r\n".as_slice(), body].concat();
    let find = |from: usize| {
        body.get(from..)?
            .windows(d.len())
            .position(|w| w == d)
            .map(|i| i + from)
    };
    let mut out = Vec::new();
    let Some(mut at) = find(0) else {
        return out;
    };
    loop {
        let start = at + d.len();
        if body.get(start..start + 2) == Some(b"--") {
            break;
        }
        let Some(next) = find(start) else {
            break;
        };
        let part = &body[start..next];
        // The rest of the delimiter's line (transport padding), then the headers.
        let Some(eol) = part.windows(2).position(|w| w == b"\r\n") else {
            at = next;
            continue;
        };
        let part = &part[eol + 2..];
        if let Some(h) = part.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&part[..h]);
            let name = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                if !k.trim().eq_ignore_ascii_case("content-disposition") {
                    return None;
                }
                v.split(';').find_map(|p| {
                    p.trim()
                        .strip_prefix("name=")
                        .map(|n| n.trim_matches('"').to_string())
                })
            });
            if let Some(name) = name {
                out.push((name, part[h + 4..].to_vec()));
            }
        }
        at = next;
    }
    out
}

/// `GET /queries`: the query API's recent translated queries beside their originals
/// (docs/query.md), and the old names queries still read.
pub(super) async fn queries(State(ui): State<Arc<Ui>>) -> Response {
    let st = ui.live.current();
    let Some(api) = st.query.as_ref() else {
        return page(
            StatusCode::OK,
            "Queries",
            "./",
            &ui.root,
            "<p>The query API is off: set <code>query.upstream</code> in the configuration \
             to serve old dashboards from normalised data.</p>\n",
        );
    };
    let now = SystemTime::now();
    let mut b = format!(
        "<p>Upstream <code>{}</code>. Queries are answered in their own terms; these are the \
         last ones the rules rewrote or warned about, newest first.</p>\n",
        esc(api.upstream())
    );
    let recent = api.usage().recent();
    if recent.is_empty() {
        b.push_str("<p>No query has been rewritten since start.</p>\n");
    } else {
        b.push_str(
            "<table><tr><th>When</th><th>Endpoint</th><th>Original</th><th>Asked upstream</th>\
             <th>Warnings</th></tr>",
        );
        for q in &recent {
            let when = now.duration_since(q.at).unwrap_or_default();
            let _ = write!(
                b,
                "<tr><td>{} ago</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td></tr>",
                ago(when),
                esc(q.endpoint),
                esc(&q.original),
                esc(&q.rewritten),
                q.warnings
                    .iter()
                    .map(|w| esc(w))
                    .collect::<Vec<_>>()
                    .join("<br>"),
            );
        }
        b.push_str("</table>\n");
    }
    let names = api.usage().names();
    if !names.is_empty() {
        b.push_str(
            "<h2>Old names still queried</h2>\n<table><tr><th>Old name</th><th>Queries since start</th>\
             <th>Last queried</th></tr>",
        );
        let unix = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        for (name, count, last) in names {
            let _ = write!(
                b,
                "<tr><td><code>{}</code></td><td>{count}</td><td>{} ago</td></tr>",
                esc(&name),
                ago(Duration::from_secs_f64((unix - last).max(0.0))),
            );
        }
        b.push_str("</table>\n");
    }
    page(StatusCode::OK, "Queries", "./", &ui.root, &b)
}

#[cfg(test)]
mod tests {
    use super::{multipart_fields, names_rule};

    #[test]
    fn multipart_fields_are_read() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\n\r\n\
--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\
Content-Type: text/plain\r\n\r\nup 1\r\nx--XyZ y\r\n--XyZ--\r\n";
        let f = multipart_fields(body, "XyZ");
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0], ("text".to_string(), Vec::new()));
        assert_eq!(f[1].0, "file");
        assert_eq!(f[1].1, b"up 1\r\nx--XyZ y");
        assert!(multipart_fields(b"garbage", "XyZ").is_empty());
        assert!(multipart_fields(b"--XyZ\r\nno end", "XyZ").is_empty());
    }

    #[test]
    fn a_trace_names_a_rule_by_its_whole_number() {
        let trace = "pack p: logical family; pack p rule 10: values ÷1000 → x";
        assert!(names_rule(trace, "pack p rule 10"));
        assert!(!names_rule(trace, "pack p rule 1"));
        assert!(names_rule("pack p rule 1 → y", "pack p rule 1"));
        assert!(names_rule("pack p rule 1", "pack p rule 1"));
        assert!(!names_rule("pack pp rule 1 → y", "pack p rule 1"));
        assert!(!names_rule("xpack p rule 1 → y", "pack p rule 1"));
    }
}
