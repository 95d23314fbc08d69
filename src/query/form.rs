//! `application/x-www-form-urlencoded`, both ways: how Grafana sends a query (`POST`)
//! and how a query string carries one (`GET`). `match[]` repeats, so the pairs stay a
//! list in their order.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// What a form value keeps unescaped (as the WHATWG form encoder: `*-._` and letters).
const FORM: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'*')
    .remove(b'-')
    .remove(b'.')
    .remove(b'_');

/// The pairs of a form or query string; `+` is a space. A pair that is not UTF-8 once
/// decoded is kept with replacement characters (the upstream would refuse it anyway).
pub fn decode(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (unescape(k), unescape(v))
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let plus = s.replace('+', " ");
    percent_decode_str(&plus).decode_utf8_lossy().into_owned()
}

/// The pairs as a form body or query string.
pub fn encode(pairs: &[(String, String)]) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if !out.is_empty() {
            out.push('&');
        }
        out.extend(utf8_percent_encode(k, FORM));
        out.push('=');
        out.extend(utf8_percent_encode(v, FORM));
    }
    out
}

/// One value escaped for a URL's path or query.
pub fn component(s: &str) -> String {
    utf8_percent_encode(s, FORM).to_string()
}

/// The first value of `key`.
pub fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Every value of `key` (`match[]`).
pub fn all<'a>(pairs: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    pairs
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The pairs with every `key` replaced by `values` (at the place of the first one).
pub fn with(pairs: &[(String, String)], key: &str, values: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = pairs.iter().filter(|(k, _)| k != key).cloned().collect();
    let at = pairs
        .iter()
        .position(|(k, _)| k == key)
        .unwrap_or(out.len())
        .min(out.len());
    for (i, v) in values.iter().enumerate() {
        out.insert(at + i, (key.to_string(), v.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grafana_form_round_trips() {
        let text = "query=sum+by+(le)+(rate(x%7Ba%3D%22b%22%7D%5B5m%5D))&start=1&match%5B%5D=up&match%5B%5D=x";
        let pairs = decode(text);
        assert_eq!(pairs[0].1, "sum by (le) (rate(x{a=\"b\"}[5m]))");
        assert_eq!(all(&pairs, "match[]"), ["up", "x"]);
        assert_eq!(decode(&encode(&pairs)), pairs);
        let replaced = with(&pairs, "match[]", &["y".into()]);
        assert_eq!(all(&replaced, "match[]"), ["y"]);
        assert_eq!(get(&replaced, "start"), Some("1"));
    }
}
