//! `GET /cardinality`: the cardinality guard's view (docs/limits.md) as a page: per
//! tenant its active series and limit and the metrics with most series; with
//! `?metric=NAME`, that metric's labels by distinct values.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::pages::page;
use super::{Ui, esc};
use crate::query::form;

/// Metrics listed per tenant.
const TOP: usize = 50;

fn limit(l: Option<usize>) -> String {
    l.map_or_else(|| "—".to_string(), |n| n.to_string())
}

pub(super) async fn cardinality(State(ui): State<Arc<Ui>>, RawQuery(q): RawQuery) -> Response {
    let st = ui.live.current();
    let Some(guard) = st.pipeline.guard() else {
        return page(
            StatusCode::OK,
            "Cardinality",
            "./",
            &ui.root,
            "<p>No cardinality guard.</p>\n",
        );
    };
    let pairs = form::decode(q.as_deref().unwrap_or(""));
    let tenant = form::get(&pairs, "tenant");
    let mut b = String::new();
    if let Some(metric) = form::get(&pairs, "metric") {
        let _ = write!(
            b,
            "<p><a href=\"cardinality\">All metrics</a></p>\n<h2><code>{}</code></h2>\n",
            esc(metric)
        );
        let found = guard.labels(tenant, metric);
        if found.is_empty() {
            b.push_str("<p>No active series of this metric.</p>\n");
        }
        for m in &found {
            let _ = write!(
                b,
                "<p>Tenant <code>{}</code>: {} active series, limit {}.</p>\n\
                 <table><tr><th>Label</th><th>Distinct values (estimated)</th></tr>",
                esc(&m.tenant),
                m.active_series,
                limit(m.limit)
            );
            for l in &m.labels {
                let _ = write!(
                    b,
                    "<tr><td><code>{}</code></td><td>{}</td></tr>",
                    esc(&l.name),
                    l.distinct_values
                );
            }
            b.push_str("</table>\n");
            if m.labels.is_empty() {
                b.push_str("<p>No label sketch for this metric (past the sketch budget).</p>\n");
            }
            if m.labels_truncated {
                b.push_str("<p>More label names than are sketched: the rest are not shown.</p>\n");
            }
        }
        return page(StatusCode::OK, "Cardinality", "./", &ui.root, &b);
    }
    let r = guard.report(tenant, TOP);
    let _ = writeln!(
        b,
        "<p>Active series: a sample within the last {}s. {} series tracked{}. \
         JSON: <code>/api/v1/cardinality</code> (docs/limits.md).</p>",
        r.active_series_window_seconds,
        r.tracked_series,
        if r.estimated {
            format!(
                "; counts estimated from a sample of 1 in {}",
                (1.0 / r.sample_rate).round()
            )
        } else {
            String::new()
        }
    );
    if r.tenants.is_empty() {
        b.push_str("<p>No active series yet.</p>\n");
    }
    for t in &r.tenants {
        let _ = write!(
            b,
            "<h2>Tenant <code>{}</code></h2>\n<p>{} active series, limit {}; {} metrics.</p>\n\
             <table><tr><th>Metric</th><th>Active series</th><th>Limit per metric</th></tr>",
            esc(if t.tenant.is_empty() {
                "(none)"
            } else {
                &t.tenant
            }),
            t.active_series,
            limit(t.limit),
            t.metrics_total
        );
        for m in &t.metrics {
            let link = form::encode(&[
                ("metric".to_string(), m.name.clone()),
                ("tenant".to_string(), t.tenant.clone()),
            ]);
            let _ = write!(
                b,
                "<tr><td><a href=\"cardinality?{}\"><code>{}</code></a></td><td>{}</td><td>{}</td></tr>",
                esc(&link),
                esc(&m.name),
                m.active_series,
                limit(m.limit)
            );
        }
        b.push_str("</table>\n");
    }
    page(StatusCode::OK, "Cardinality", "./", &ui.root, &b)
}
