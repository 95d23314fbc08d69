//! The web UI and the dry-run APIs (docs/ui.md): server-rendered pages over the running
//! configuration and `GET /api/v1/explain`, `POST /api/v1/normalize`.
//!
//! Nothing here is on the ingest path: the pages read the state a request would
//! (`Live::current()`), and a dry run maps pasted text on a pipeline of its own (the
//! running rules, no derive stage, no counters), so it never feeds the proxy's state
//! or its backends. Every value printed into HTML goes through [`esc`]: series names,
//! label values and HELP text come from senders.

mod api;
mod pages;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::routing::get;

use crate::server::Live;

pub use api::{DryRun, DryRunError, MAX_DRY_RUN_BYTES, dry_run};

/// When the UI's routes were built: the process' start, near enough, for the uptime.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// The UI's routes and APIs around the live state; merged beside `server::router_live`.
pub fn router(live: Arc<Live>) -> Router {
    STARTED.get_or_init(Instant::now);
    Router::new()
        .route("/", get(pages::status))
        .route("/rules", get(pages::rules))
        .route("/explain", get(pages::explain))
        .route(
            "/debug/normalize",
            get(pages::normalize_form).post(pages::normalize_post),
        )
        .route("/static/promnorm.css", get(pages::css))
        .route("/api/v1/explain", get(api::explain))
        .route("/api/v1/normalize", axum::routing::post(api::normalize))
        .with_state(live)
}

/// HTML-escapes `s` for text and attribute values (quotes included).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The value of `key` in a query string or an `application/x-www-form-urlencoded` body.
pub(crate) fn form_value(form: &str, key: &str) -> Option<String> {
    form.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (url_decode(k) == key).then(|| url_decode(v))
    })
}

/// Percent-decoding with `+` as a space; invalid escapes are kept as written.
fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn form_values_are_decoded() {
        let f = "a=1&name=foo%7Ba%3D%22b%22%7D+x&bad=%zz%4";
        assert_eq!(form_value(f, "name").as_deref(), Some("foo{a=\"b\"} x"));
        assert_eq!(form_value(f, "bad").as_deref(), Some("%zz%4"));
        assert_eq!(form_value(f, "missing"), None);
        assert_eq!(form_value("x", "x").as_deref(), Some(""));
    }
}
