//! The web UI and the dry-run APIs (docs/ui.md): server-rendered pages over the running
//! configuration and `GET /api/v1/explain`, `POST /api/v1/normalize`.
//!
//! Nothing here is on the ingest path: the pages read the state a request would
//! (`Live::current()`), and a dry run maps pasted text on a pipeline of its own (the
//! running rules, no derive stage, no counters), so it never feeds the proxy's state
//! or its backends. Every value printed into HTML goes through [`esc`]: series names,
//! label values and HELP text come from senders.

mod api;
mod cardinality;
mod pages;
mod tap;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::routing::{get, post};

use crate::server::Live;

pub use api::{DryRun, DryRunError, MAX_DRY_RUN_BYTES, dry_run};

/// When the UI's routes were first built: the process' start, near enough, for the uptime.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// The UI's settings (`web.*` in the configuration, translated by `app`).
#[derive(Clone, Debug)]
pub struct WebOptions {
    pub enabled: bool,
    /// `""` or a path such as `/promnorm` (no trailing slash).
    pub route_prefix: String,
    pub auth: Option<WebAuth>,
    /// `web.enable_debug`: the live tap is served (else `403`).
    pub debug: bool,
}

impl Default for WebOptions {
    fn default() -> Self {
        WebOptions {
            enabled: true,
            route_prefix: String::new(),
            auth: None,
            debug: false,
        }
    }
}

/// Credentials every page and API of the UI asks for.
#[derive(Clone)]
pub enum WebAuth {
    Bearer(String),
    Basic { username: String, password: String },
}

impl std::fmt::Debug for WebAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WebAuth::Bearer(_) => "Bearer(<secret>)",
            WebAuth::Basic { .. } => "Basic(<secret>)",
        })
    }
}

/// The handlers' state.
pub(crate) struct Ui {
    live: Arc<Live>,
    /// From the UI's root to the server's (`/metrics`): "../" per prefix segment.
    root: String,
    /// The live tap is on (`web.enable_debug`).
    debug: bool,
}

/// The UI's routes and APIs around the live state, under `opts.route_prefix`; merged
/// beside `server::router_live`. Disabled: no routes.
pub fn router(live: Arc<Live>, opts: &WebOptions) -> Router {
    STARTED.get_or_init(Instant::now);
    if !opts.enabled {
        return Router::new();
    }
    let p = opts.route_prefix.trim_end_matches('/');
    let ui = Arc::new(Ui {
        live,
        root: "../".repeat(p.split('/').filter(|s| !s.is_empty()).count()),
        debug: opts.debug,
    });
    let mut r = Router::new()
        .route(&format!("{p}/"), get(pages::status))
        .route(&format!("{p}/rules"), get(pages::rules))
        .route(&format!("{p}/explain"), get(pages::explain))
        .route(&format!("{p}/queries"), get(pages::queries))
        .route(&format!("{p}/cardinality"), get(cardinality::cardinality))
        .route(&format!("{p}/targets"), get(pages::targets))
        .route(
            &format!("{p}/debug/normalize"),
            get(pages::normalize_form).post(pages::normalize_post),
        )
        .route(&format!("{p}/static/promnorm.css"), get(pages::css))
        .route(&format!("{p}/api/v1/explain"), get(api::explain))
        .route(&format!("{p}/api/v1/normalize"), post(api::normalize))
        .route(&format!("{p}/debug/tap"), get(tap::page_route))
        .route(&format!("{p}/api/v1/tap"), get(tap::api));
    if !p.is_empty() {
        // The status page's relative links need the trailing slash.
        let to = format!("{p}/");
        r = r.route(
            p,
            get(move || async move { axum::response::Redirect::permanent(&to) }),
        );
    }
    if let Some(auth) = opts.auth.clone() {
        r = r.route_layer(axum::middleware::from_fn_with_state(
            Arc::new(expected_credentials(&auth)),
            check_auth,
        ));
    }
    r.with_state(ui)
}

/// The `Authorization` value the UI accepts, and the challenge a refusal carries.
struct Expected {
    scheme: &'static str,
    credentials: String,
}

fn expected_credentials(auth: &WebAuth) -> Expected {
    match auth {
        WebAuth::Bearer(t) => Expected {
            scheme: "Bearer",
            credentials: t.trim().to_string(),
        },
        WebAuth::Basic { username, password } => Expected {
            scheme: "Basic",
            credentials: base64(format!("{username}:{password}").as_bytes()),
        },
    }
}

async fn check_auth(
    axum::extract::State(exp): axum::extract::State<Arc<Expected>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(exp.scheme))
        .map(|(_, c)| c.trim());
    match given {
        Some(c) if constant_time_eq(c.as_bytes(), exp.credentials.as_bytes()) => {
            next.run(req).await
        }
        _ => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                if exp.scheme == "Basic" {
                    "Basic realm=\"promnorm\", charset=\"UTF-8\""
                } else {
                    "Bearer realm=\"promnorm\""
                },
            )],
            "promnorm's web UI needs credentials (web.auth)\n",
        )
            .into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Standard base64 with padding (RFC 4648), for the expected basic credentials.
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
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

/// Percent-encodes `s` for a query string value.
pub(crate) fn url_enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
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

/// The running backends as `explain` describes them (what `promnorm explain --config`
/// prints for the same file).
pub(crate) fn explain_backends(
    st: &crate::server::AppState,
) -> Vec<crate::explain::ExplainBackend> {
    use crate::forward::NativeHistogramsPolicy;
    st.forwarder
        .backends()
        .map(|s| crate::explain::ExplainBackend {
            name: s.name().to_string(),
            protocol: match (s.needs_v1(), s.wants_v2()) {
                (true, true) => "auto",
                (false, _) => "v2",
                (true, false) => "v1",
            },
            native_histograms: match s.native_histograms() {
                NativeHistogramsPolicy::Auto => "auto",
                NativeHistogramsPolicy::AsIs => "as_is",
                NativeHistogramsPolicy::Classic => "classic",
            },
        })
        .collect()
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
    fn base64_is_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(
            base64(b"Aladdin:open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
    }

    #[test]
    fn form_values_are_decoded() {
        let f = "a=1&name=foo%7Ba%3D%22b%22%7D+x&bad=%zz%4";
        assert_eq!(form_value(f, "name").as_deref(), Some("foo{a=\"b\"} x"));
        assert_eq!(form_value(f, "bad").as_deref(), Some("%zz%4"));
        assert_eq!(form_value(f, "missing"), None);
        assert_eq!(form_value("x", "x").as_deref(), Some(""));
        let odd = "a b&c=d\"<é";
        assert_eq!(
            form_value(&format!("k={}", url_enc(odd)), "k").as_deref(),
            Some(odd)
        );
    }
}
