//! Parsers for the values written inside keys: backend URLs (credentials taken out),
//! listen addresses, durations, and the headers `pass_headers` may not name.

use super::*;

/// Headers a sender's request cannot lend a backend request: they describe the framing
/// of the sender's body or the sender's hop, not the re-encoded body promnorm sends.
pub const UNPASSABLE_HEADERS: &[&str] = &[
    "content-length",
    "content-encoding",
    "content-type",
    "transfer-encoding",
    "connection",
    "host",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "x-prometheus-remote-write-version",
];

/// Why `pass_headers` may not name `header`, if it may not.
pub fn unpassable_header_reason(header: &str) -> Option<&'static str> {
    let h = header.to_ascii_lowercase();
    if h.starts_with("proxy-") || UNPASSABLE_HEADERS.contains(&h.as_str()) {
        Some(
            "framing, hop-by-hop and remote-write protocol headers are set by promnorm for the body it sends",
        )
    } else {
        None
    }
}

/// A backend URL as promnorm uses it: credentials written in it (`user:pass@`) are
/// taken out, to become basic auth, so the URL can be logged and labelled safely.
#[derive(Clone, Debug)]
pub struct BackendUrl {
    pub uri: http::Uri,
    pub userinfo: Option<(String, String)>,
}

/// Parses a backend URL: `http://` or `https://` with a host. Errors never repeat
/// credentials written in the URL.
pub fn parse_backend_url(raw: &str) -> Result<BackendUrl, UrlError> {
    let (without_userinfo, userinfo) = split_userinfo(raw);
    let shown = redact_url(raw);
    if userinfo.is_some_and(|u| u.contains(['/', '?', '#'])) {
        // Unencoded, these would move the credentials into the host or the path, and
        // the password into logs.
        return Err(UrlError::UnencodedCredentials { url: shown });
    }
    // Without a scheme, `host:port/path` is no URI form at all ("invalid format"):
    // say what is missing instead.
    if !without_userinfo.contains("://") {
        return Err(UrlError::NotHttp { url: shown });
    }
    let uri: http::Uri = without_userinfo
        .parse()
        .map_err(|e: http::uri::InvalidUri| UrlError::Unparsable {
            url: shown.clone(),
            reason: e.to_string(),
        })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(UrlError::NotHttp { url: shown });
    }
    let authority = uri.authority().map_or("", |a| a.as_str());
    let after_host = authority.rfind(']').unwrap_or(0);
    let port = authority[after_host..]
        .rfind(':')
        .map(|c| &authority[after_host + c + 1..]);
    if port.is_some_and(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
        return Err(UrlError::BadPort { url: shown });
    }
    let userinfo = userinfo.map(|u| {
        let (user, pass) = u.split_once(':').unwrap_or((u, ""));
        (percent_decode(user), percent_decode(pass))
    });
    Ok(BackendUrl { uri, userinfo })
}

/// `raw` with any credentials written in it replaced by `<secret>`, for logs and errors:
/// `scheme://user:<secret>@host/…`, or `scheme://<secret>@host/…` when the user part
/// alone (a token) or anything ambiguous is written there.
pub fn redact_url(raw: &str) -> String {
    match split_userinfo(raw) {
        (_, None) => raw.to_string(),
        (rest, Some(u)) => {
            let (scheme, after) = rest.split_once("://").unwrap_or(("", rest.as_str()));
            let shown_user = match u.split_once(':') {
                Some((user, _)) if !user.is_empty() && !user.contains(['/', '?', '#']) => {
                    format!("{user}:<secret>")
                }
                _ => "<secret>".to_string(),
            };
            if scheme.is_empty() {
                format!("{shown_user}@{after}")
            } else {
                format!("{scheme}://{shown_user}@{after}")
            }
        }
    }
}

/// Splits `scheme://user:pass@host/...` into the URL without `user:pass@` and it. The
/// last `@` ends the credentials, wherever it stands: a password may hold `@`, and an
/// unencoded `/`, `?` or `#` in it must not hide it (such URLs are then refused).
pub(super) fn split_userinfo(raw: &str) -> (String, Option<&str>) {
    let (prefix, rest) = match raw.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), raw),
    };
    match rest.rfind('@') {
        Some(at) => (format!("{prefix}{}", &rest[at + 1..]), Some(&rest[..at])),
        None => (raw.to_string(), None),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_listen(text: &str) -> Result<std::net::SocketAddr, ListenError> {
    let t = text.trim();
    let full = if t.starts_with(':') {
        format!("0.0.0.0{t}")
    } else {
        t.to_string()
    };
    if let Ok(a) = full.parse() {
        return Ok(a);
    }
    if !full.contains(':') {
        return Err(ListenError::NoPort);
    }
    use std::net::ToSocketAddrs;
    full.to_socket_addrs()
        .map_err(ListenError::Resolve)?
        .next()
        .ok_or(ListenError::NoAddress)
}

/// Parses `500ms`, `30s`, `1m`, `1h`, `1m30s`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::NoUnit { text: t.into() })?;
        let (num, after) = rest.split_at(num_len);
        let n: f64 = num
            .parse()
            .map_err(|_| DurationError::BadNumber { text: t.into() })?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => {
                return Err(DurationError::BadUnit {
                    unit: unit.into(),
                    text: t.into(),
                });
            }
        };
        total += secs;
        rest = after;
    }
    Duration::try_from_secs_f64(total).map_err(|_| DurationError::OutOfRange { text: t.into() })
}

/// Writes a duration as `parse_duration` reads it (`30s`, `5m`, `1h`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 != 0 {
        format!("{ms}ms")
    } else if ms % 3_600_000 == 0 && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1000)
    }
}

/// A scrape target's URL: `http://` or `https://` with a host (credentials in it are
/// refused: they would show on `instance` and in logs).
pub fn scrape_target_url(raw: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = raw
        .parse()
        .map_err(|e: http::uri::InvalidUri| format!("scrape target {raw:?}: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!(
            "scrape target {raw:?} must be an http:// or https:// URL with a host"
        ));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(format!(
            "scrape target {:?}: credentials in the URL are not supported",
            redact_url(raw)
        ));
    }
    Ok(uri)
}

/// A Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
