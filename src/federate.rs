//! `GET /federate` (docs/federate.md): the series the exposition sink holds
//! ([`crate::forward::exposition`]), as Prometheus' federation endpoint serves them:
//! `match[]` selectors, text format 0.0.4 or OpenMetrics 1.0 by `Accept`, HELP, TYPE
//! and UNIT from the forwarded metadata, each sample with its timestamp, custom-bucket
//! native histograms as classic ones, a tenant's series only when the scrape names one.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use promql_parser::label::Matcher;

use crate::forward::exposition::{ExpositionStore, FamilyMeta, Held, KEY_SEP, Point, key_labels};
use crate::mapping::number::{FloatStyle, write_float};
use crate::wire::histogram::NativeHistogram;

/// What a scrape of `/federate` needs from the running configuration.
pub struct FederateSnapshot {
    pub store: Option<Arc<ExpositionStore>>,
    /// `ingest_auth`'s token: a scrape must present it as a bearer token too.
    pub ingest_token: Option<String>,
}

pub trait Source: Send + Sync + 'static {
    fn federate(&self) -> FederateSnapshot;
}

/// Renders at once; more scrapes wait (each holds a copy of the series it serves).
static RENDERS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Bytes of text sent to the client at a time.
const CHUNK_BYTES: usize = 64 << 10;

/// `{prefix}/federate`, merged beside the server's routes; `404` while the
/// configuration has no `exposition`.
pub fn router(live: Arc<dyn Source>, prefix: &str) -> Router {
    let p = prefix.trim_end_matches('/');
    Router::new()
        .route(&format!("{p}/federate"), get(federate))
        .with_state(live)
}

fn plain(status: StatusCode, line: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{line}\n"),
    )
        .into_response()
}

/// The output format a scrape asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text004,
    OpenMetrics,
}

impl Format {
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text004,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// One `match[]` selector: all of `matchers`, or any of `alternatives`.
#[derive(Debug)]
pub struct Selector {
    matchers: Vec<Matcher>,
    alternatives: Vec<Vec<Matcher>>,
}

impl Selector {
    /// Parses a series selector as Prometheus' `match[]` takes it.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let expr = promql_parser::parser::parse(text)
            .map_err(|e| format!("match[] {text:?}: {}", e.replace('\n', " ")))?;
        let promql_parser::parser::Expr::VectorSelector(vs) = expr else {
            return Err(format!("match[] {text:?} is not a series selector"));
        };
        let mut matchers = vs.matchers.matchers;
        if let Some(name) = vs.name {
            matchers.push(Matcher {
                op: promql_parser::label::MatchOp::Equal,
                name: "__name__".into(),
                value: name,
            });
        }
        let sel = Selector {
            matchers,
            alternatives: vs.matchers.or_matchers,
        };
        let non_empty = |ms: &[Matcher]| ms.iter().any(|m| !m.is_match(""));
        let ok = if sel.alternatives.is_empty() {
            non_empty(&sel.matchers)
        } else {
            sel.alternatives.iter().all(|a| non_empty(a))
        };
        if !ok {
            return Err(format!(
                "match[] {text:?} must contain at least one matcher that does not match the empty string"
            ));
        }
        Ok(sel)
    }

    fn all_match(ms: &[Matcher], key: &[u8]) -> bool {
        ms.iter().all(|m| {
            let value = key_labels(key)
                .find(|(n, _)| *n == m.name)
                .map_or("", |(_, v)| v);
            m.is_match(value)
        })
    }

    pub fn matches(&self, key: &[u8]) -> bool {
        if self.alternatives.is_empty() {
            Self::all_match(&self.matchers, key)
        } else {
            self.alternatives.iter().any(|a| Self::all_match(a, key))
        }
    }
}

/// The `match[]` values of a query string.
fn match_params(query: &str) -> Vec<String> {
    query
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (decode(k) == "match[]").then(|| decode(v))
        })
        .collect()
}

async fn federate(
    State(live): State<Arc<dyn Source>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let snap = live.federate();
    let Some(store) = snap.store else {
        return plain(
            StatusCode::NOT_FOUND,
            "/federate is off: the configuration has no exposition",
        );
    };
    if let Some(token) = &snap.ingest_token
        && !crate::query::bearer_token_matches(token, &headers)
    {
        let mut r = plain(
            StatusCode::UNAUTHORIZED,
            "a bearer token (ingest_auth) is required",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    let mut selectors = Vec::new();
    for m in match_params(query.as_deref().unwrap_or("")) {
        match Selector::parse(&m) {
            Ok(s) => selectors.push(s),
            Err(e) => return plain(StatusCode::BAD_REQUEST, &e),
        }
    }
    let tenancy = store.options().tenancy.clone();
    let tenant: Option<String> = tenancy.as_ref().and_then(|t| {
        headers
            .get(&t.header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let Ok(permit) = RENDERS.acquire().await else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let held = store.collect(|key, slot_tenant| {
            if let (Some(want), Some(t)) = (&tenant, &tenancy) {
                let has = key_labels(key)
                    .find(|(n, _)| *n == t.label)
                    .map(|(_, v)| v)
                    .or(slot_tenant);
                if has != Some(want.as_str()) {
                    return false;
                }
            }
            selectors.is_empty() || selectors.iter().any(|s| s.matches(key))
        });
        let hide = match (&tenant, &tenancy) {
            (Some(_), Some(t)) if !t.keep_label => Some(t.label.clone()),
            _ => None,
        };
        let mut sink = ChunkSink {
            tx,
            buf: Vec::with_capacity(CHUNK_BYTES + 4096),
        };
        render(&held, &store.families(), format, hide.as_deref(), &mut sink);
        sink.finish();
    });
    let mut resp = Response::new(Body::new(ChannelBody { rx }));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(format.content_type()),
    );
    resp
}

/// Where rendered text goes: a buffer for tests, chunks to the client when serving.
pub trait Sink {
    fn buf(&mut self) -> &mut Vec<u8>;
    /// Called after each family: a sink may pass what it holds on.
    fn flush(&mut self) {}
}

impl Sink for Vec<u8> {
    fn buf(&mut self) -> &mut Vec<u8> {
        self
    }
}

struct ChunkSink {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl Sink for ChunkSink {
    fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    fn flush(&mut self) {
        if self.buf.len() >= CHUNK_BYTES {
            let chunk = Bytes::from(std::mem::take(&mut self.buf));
            // A client gone away: the rest is rendered into nothing.
            let _ = self.tx.blocking_send(chunk);
            self.buf.reserve(CHUNK_BYTES + 4096);
        }
    }
}

impl ChunkSink {
    fn finish(mut self) {
        if !self.buf.is_empty() {
            let _ = self
                .tx
                .blocking_send(Bytes::from(std::mem::take(&mut self.buf)));
        }
    }
}

struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|c| c.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// MetricMetadata types.
const COUNTER: i32 = 1;
const GAUGE: i32 = 2;
const HISTOGRAM: i32 = 3;
const GAUGE_HISTOGRAM: i32 = 4;
const SUMMARY: i32 = 5;
const INFO: i32 = 6;
const STATESET: i32 = 7;

/// The family a series name belongs to, and its type: the name's own metadata, else a
/// family whose type has the name's suffix.
fn family_of<'a>(name: &'a str, families: &HashMap<Box<str>, FamilyMeta>) -> (&'a str, i32) {
    if let Some(m) = families.get(name) {
        return (name, m.metric_type);
    }
    for (suffix, types) in [
        ("_bucket", &[HISTOGRAM, GAUGE_HISTOGRAM][..]),
        ("_count", &[HISTOGRAM, SUMMARY][..]),
        ("_sum", &[HISTOGRAM, SUMMARY][..]),
        ("_created", &[HISTOGRAM, SUMMARY, COUNTER][..]),
        ("_total", &[COUNTER][..]),
        ("_gcount", &[GAUGE_HISTOGRAM][..]),
        ("_gsum", &[GAUGE_HISTOGRAM][..]),
        ("_info", &[INFO][..]),
    ] {
        if let Some(base) = name.strip_suffix(suffix)
            && let Some(m) = families.get(base)
            && types.contains(&m.metric_type)
        {
            return (base, m.metric_type);
        }
    }
    (name, 0)
}

/// One line to write: a float series, or one of a classic histogram's lines unrolled
/// from a native one.
struct Line<'a> {
    family: &'a str,
    metric_type: i32,
    /// The series' labels without `__name__` and `le`, as sort key.
    group: Group,
    /// The position of the name's suffix in its family (bucket, sum, count, created).
    rank: u8,
    le: f64,
    held: &'a Held,
    /// For an unrolled native histogram: which of its lines.
    part: Part,
}

#[derive(Clone, Copy, PartialEq)]
enum Part {
    Float,
    Bucket(usize),
    Sum,
    Count,
}

fn suffix_rank(name: &str, family: &str) -> u8 {
    match &name[family.len().min(name.len())..] {
        "_bucket" => 1,
        "_gsum" | "_sum" => 2,
        "_gcount" | "_count" => 3,
        "_created" => 4,
        _ => 0,
    }
}

/// A series' labels without `__name__`, `le` and the hidden tenant label: the pieces of
/// its key (byte ranges) that remain, so a million lines to sort hold no copy of their
/// labels (one allocation each would stay in the allocator's free lists after the
/// answer). Its order is the order of the pieces' bytes one after the other.
#[derive(Clone, Copy)]
struct Group {
    pieces: [(u32, u32); 4],
    len: u8,
}

impl Group {
    fn of(key: &[u8], hide: Option<&str>) -> Group {
        let mut g = Group {
            pieces: [(0, 0); 4],
            len: 0,
        };
        let mut pos = 0usize;
        let mut open = false;
        while pos < key.len() {
            let Some(name_len) = memchr::memchr(KEY_SEP, &key[pos..]) else {
                break;
            };
            let value_at = pos + name_len + 1;
            let end =
                memchr::memchr(KEY_SEP, &key[value_at..]).map_or(key.len(), |v| value_at + v + 1);
            let name = &key[pos..pos + name_len];
            let skip =
                name == b"__name__" || name == b"le" || hide.is_some_and(|h| h.as_bytes() == name);
            if skip {
                open = false;
            } else if open {
                g.pieces[usize::from(g.len) - 1].1 = end as u32;
            } else if usize::from(g.len) < g.pieces.len() {
                // Only a key with a label name twice could need a fifth piece; such a
                // key's lines may sort apart, never get lost.
                g.pieces[usize::from(g.len)] = (pos as u32, end as u32);
                g.len += 1;
                open = true;
            }
            pos = end;
        }
        g
    }

    /// The order of `self` over `key` against `other` over `other_key`.
    fn cmp(&self, key: &[u8], other: &Group, other_key: &[u8]) -> std::cmp::Ordering {
        if self.len == 1 && other.len == 1 {
            // The usual case (no `le`, `__name__` first): one range each.
            let (a, b) = (self.pieces[0], other.pieces[0]);
            let x = key.get(a.0 as usize..a.1 as usize).unwrap_or_default();
            let y = other_key
                .get(b.0 as usize..b.1 as usize)
                .unwrap_or_default();
            return x.cmp(y);
        }
        cmp_pieces(self.bytes(key), other.bytes(other_key))
    }

    fn bytes<'k>(&self, key: &'k [u8]) -> impl Iterator<Item = &'k [u8]> + use<'k> {
        let pieces = self.pieces;
        (0..usize::from(self.len)).map(move |i| {
            let (a, b) = pieces[i];
            key.get(a as usize..b as usize).unwrap_or_default()
        })
    }
}

/// Compares two byte strings given as pieces, without joining them.
fn cmp_pieces<'a>(
    mut a: impl Iterator<Item = &'a [u8]>,
    mut b: impl Iterator<Item = &'a [u8]>,
) -> std::cmp::Ordering {
    let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
    loop {
        while x.is_empty() {
            match a.next() {
                Some(p) => x = p,
                None => break,
            }
        }
        while y.is_empty() {
            match b.next() {
                Some(p) => y = p,
                None => break,
            }
        }
        match (x.is_empty(), y.is_empty()) {
            (true, true) => return std::cmp::Ordering::Equal,
            (true, false) => return std::cmp::Ordering::Less,
            (false, true) => return std::cmp::Ordering::Greater,
            (false, false) => {}
        }
        let n = x.len().min(y.len());
        match x[..n].cmp(&y[..n]) {
            std::cmp::Ordering::Equal => {
                x = &x[n..];
                y = &y[n..];
            }
            other => return other,
        }
    }
}

fn series_name(key: &[u8]) -> &str {
    key_labels(key)
        .find(|(n, _)| *n == "__name__")
        .map_or("", |(_, v)| v)
}

/// Writes `held` in `format`: families contiguous and sorted by name, each with its
/// metadata, a histogram's lines grouped by label set, buckets by `le`.
pub fn render(
    held: &[Held],
    families: &HashMap<Box<str>, FamilyMeta>,
    format: Format,
    hide: Option<&str>,
    out: &mut impl Sink,
) {
    let mut lines: Vec<Line<'_>> = Vec::with_capacity(held.len());
    let mut hist = NativeHistogram::default();
    for h in held {
        let name = series_name(&h.key);
        match &h.point {
            Point::Float(_) => {
                let (family, metric_type) = family_of(name, families);
                let le = key_labels(&h.key)
                    .find(|(n, _)| *n == "le")
                    .and_then(|(_, v)| crate::mapping::number::parse_float(v))
                    .unwrap_or(f64::NAN);
                lines.push(Line {
                    family,
                    metric_type,
                    group: Group::of(&h.key, hide),
                    rank: suffix_rank(name, family),
                    le,
                    held: h,
                    part: Part::Float,
                });
            }
            Point::Histogram(raw) => {
                if hist.parse(raw, 0, raw.len()).is_err() {
                    continue;
                }
                let group = Group::of(&h.key, hide);
                let n = hist.custom_values.len();
                for b in 0..=n {
                    let le = hist.custom_values.get(b).copied().unwrap_or(f64::INFINITY);
                    lines.push(Line {
                        family: name,
                        metric_type: HISTOGRAM,
                        group,
                        rank: 1,
                        le,
                        held: h,
                        part: Part::Bucket(b),
                    });
                }
                for (rank, part) in [(2, Part::Sum), (3, Part::Count)] {
                    lines.push(Line {
                        family: name,
                        metric_type: HISTOGRAM,
                        group,
                        rank,
                        le: f64::NAN,
                        held: h,
                        part,
                    });
                }
            }
        }
    }
    lines.sort_by(|a, b| {
        a.family
            .cmp(b.family)
            .then_with(|| a.group.cmp(&a.held.key, &b.group, &b.held.key))
            .then(a.rank.cmp(&b.rank))
            .then(a.le.total_cmp(&b.le))
    });
    let mut i = 0;
    let mut counts: Vec<f64> = Vec::new();
    while i < lines.len() {
        let family = lines[i].family;
        let metric_type = lines[i].metric_type;
        let end = i + lines[i..].partition_point(|l| l.family == family);
        write_family_header(
            out.buf(),
            family,
            metric_type,
            families.get(family),
            series_name(&lines[i].held.key),
            format,
        );
        let mut last_hist: Option<*const Held> = None;
        for line in &lines[i..end] {
            if let Part::Float = line.part {
                let name = series_name(&line.held.key);
                let Point::Float(bits) = line.held.point else {
                    continue;
                };
                write_sample(
                    out.buf(),
                    name,
                    &line.held.key,
                    None,
                    hide,
                    f64::from_bits(bits),
                    line.held.timestamp,
                    format,
                );
                continue;
            }
            let Point::Histogram(raw) = &line.held.point else {
                continue;
            };
            if last_hist != Some(line.held as *const Held) {
                last_hist = Some(line.held as *const Held);
                if hist.parse(raw, 0, raw.len()).is_err() {
                    continue;
                }
                counts.clear();
                counts.resize(hist.custom_values.len() + 1, 0.0);
                hist.for_each_bucket(false, |idx, c| {
                    if let Some(slot) = usize::try_from(idx).ok().and_then(|i| counts.get_mut(i)) {
                        *slot += c;
                    }
                });
                let mut acc = 0.0;
                for c in counts.iter_mut() {
                    acc += *c;
                    *c = acc;
                }
            }
            let family = line.family;
            let ts = line.held.timestamp;
            let key = &line.held.key;
            let mut name = String::with_capacity(family.len() + 7);
            name.push_str(family);
            match line.part {
                Part::Bucket(b) => {
                    name.push_str("_bucket");
                    let mut le = Vec::new();
                    write_float(&mut le, line.le, FloatStyle::Go);
                    let le = String::from_utf8(le).unwrap_or_default();
                    let v = counts.get(b).copied().unwrap_or(0.0);
                    write_sample(out.buf(), &name, key, Some(&le), hide, v, ts, format);
                }
                Part::Sum => {
                    name.push_str("_sum");
                    let v = f64::from_bits(hist.sum_bits);
                    write_sample(out.buf(), &name, key, None, hide, v, ts, format);
                }
                Part::Count => {
                    name.push_str("_count");
                    write_sample(out.buf(), &name, key, None, hide, hist.count(), ts, format);
                }
                Part::Float => {}
            }
        }
        out.flush();
        i = end;
    }
    if format == Format::OpenMetrics {
        out.buf().extend_from_slice(b"# EOF\n");
    }
}

fn type_word(metric_type: i32, format: Format) -> &'static str {
    match (metric_type, format) {
        (COUNTER, _) => "counter",
        (GAUGE, _) => "gauge",
        (HISTOGRAM, _) => "histogram",
        (SUMMARY, _) => "summary",
        (GAUGE_HISTOGRAM, Format::OpenMetrics) => "gaugehistogram",
        (INFO, Format::OpenMetrics) => "info",
        (STATESET, Format::OpenMetrics) => "stateset",
        (_, Format::OpenMetrics) => "unknown",
        (_, Format::Text004) => "untyped",
    }
}

fn write_family_header(
    out: &mut Vec<u8>,
    family: &str,
    metric_type: i32,
    meta: Option<&FamilyMeta>,
    first_series: &str,
    format: Format,
) {
    // 0.0.4 names a counter's family by its samples' name (`x_total`), OpenMetrics by
    // the name without `_total`; a counter whose samples lack `_total` is no OpenMetrics
    // counter.
    let (name, metric_type) = match (format, metric_type) {
        (Format::Text004, COUNTER) => (first_series, COUNTER),
        (Format::OpenMetrics, COUNTER) => match first_series.strip_suffix("_total") {
            Some(base) => (base, COUNTER),
            None => (family, 0),
        },
        (Format::OpenMetrics, INFO) => (family, INFO),
        _ => (family, metric_type),
    };
    if let Some(m) = meta.filter(|m| !m.help.is_empty()) {
        out.extend_from_slice(b"# HELP ");
        out.extend_from_slice(name.as_bytes());
        out.push(b' ');
        for c in m.help.bytes() {
            match c {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'"' if format == Format::OpenMetrics => out.extend_from_slice(b"\\\""),
                c => out.push(c),
            }
        }
        out.push(b'\n');
    }
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(type_word(metric_type, format).as_bytes());
    out.push(b'\n');
    if format == Format::OpenMetrics
        && let Some(m) = meta.filter(|m| !m.unit.is_empty())
        && name
            .strip_suffix(&*m.unit)
            .is_some_and(|b| b.ends_with('_'))
    {
        out.extend_from_slice(b"# UNIT ");
        out.extend_from_slice(name.as_bytes());
        out.push(b' ');
        out.extend_from_slice(m.unit.as_bytes());
        out.push(b'\n');
    }
}

fn escape_value(out: &mut Vec<u8>, v: &str) {
    for c in v.bytes() {
        match c {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\n' => out.extend_from_slice(b"\\n"),
            c => out.push(c),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn write_sample(
    out: &mut Vec<u8>,
    name: &str,
    key: &[u8],
    le: Option<&str>,
    hide: Option<&str>,
    value: f64,
    timestamp: i64,
    format: Format,
) {
    out.extend_from_slice(name.as_bytes());
    let mut first = true;
    let mut label = |out: &mut Vec<u8>, n: &str, v: &str| {
        out.push(if first { b'{' } else { b',' });
        first = false;
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b"=\"");
        escape_value(out, v);
        out.push(b'"');
    };
    for (n, v) in key_labels(key) {
        if n == "__name__" || Some(n) == hide || (le.is_some() && n == "le") {
            continue;
        }
        label(out, n, v);
    }
    if let Some(le) = le {
        label(out, "le", le);
    }
    if !first {
        out.push(b'}');
    }
    out.push(b' ');
    write_float(out, value, FloatStyle::Go);
    out.push(b' ');
    match format {
        Format::Text004 => out.extend_from_slice(timestamp.to_string().as_bytes()),
        Format::OpenMetrics => {
            if timestamp < 0 {
                out.push(b'-');
            }
            let t = timestamp.unsigned_abs();
            out.extend_from_slice((t / 1000).to_string().as_bytes());
            if t % 1000 != 0 {
                out.extend_from_slice(format!(".{:03}", t % 1000).trim_end_matches('0').as_bytes());
            }
        }
    }
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::exposition::ExpositionOptions;
    use crate::wire::proto::prometheus as pb;
    use prost::Message;

    fn store_with_two_families() -> ExpositionStore {
        let store = ExpositionStore::new(ExpositionOptions {
            ttl: std::time::Duration::from_secs(300),
            max_series: 100,
            tenancy: None,
        });
        let label = |n: &str, v: &str| pb::Label {
            name: n.into(),
            value: v.into(),
        };
        let body = pb::WriteRequest {
            timeseries: vec![
                pb::TimeSeries {
                    labels: vec![label("__name__", "temp_celsius")],
                    samples: vec![pb::Sample {
                        value: 21.5,
                        timestamp: 1_700_000_000_500,
                    }],
                    ..Default::default()
                },
                pb::TimeSeries {
                    labels: vec![label("__name__", "req_total"), label("a", "b\"c")],
                    samples: vec![pb::Sample {
                        value: 5.0,
                        timestamp: 1_700_000_000_000,
                    }],
                    ..Default::default()
                },
            ],
            metadata: vec![
                pb::MetricMetadata {
                    r#type: 1,
                    metric_family_name: "req_total".into(),
                    help: "Requests.".into(),
                    unit: String::new(),
                },
                pb::MetricMetadata {
                    r#type: 2,
                    metric_family_name: "temp_celsius".into(),
                    help: String::new(),
                    unit: "celsius".into(),
                },
            ],
        }
        .encode_to_vec();
        store.record(&body, None);
        store
    }

    fn rendered(store: &ExpositionStore, format: Format) -> String {
        let held = store.collect(|_, _| true);
        let mut out = Vec::new();
        render(&held, &store.families(), format, None, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn text_004_names_counters_by_their_samples() {
        let store = store_with_two_families();
        assert_eq!(
            rendered(&store, Format::Text004),
            "# HELP req_total Requests.\n# TYPE req_total counter\nreq_total{a=\"b\\\"c\"} 5 1700000000000\n\
             # TYPE temp_celsius gauge\ntemp_celsius 21.5 1700000000500\n"
        );
    }

    #[test]
    fn openmetrics_has_base_names_units_seconds_and_eof() {
        let store = store_with_two_families();
        assert_eq!(
            rendered(&store, Format::OpenMetrics),
            "# HELP req Requests.\n# TYPE req counter\nreq_total{a=\"b\\\"c\"} 5 1700000000\n\
             # TYPE temp_celsius gauge\n# UNIT temp_celsius celsius\ntemp_celsius 21.5 1700000000.5\n# EOF\n"
        );
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate(None), Format::Text004);
    }

    /// The pieces' order is the order of the labels left once `__name__`, `le` and the
    /// hidden label are taken out, joined.
    #[test]
    fn groups_order_as_their_remaining_labels_joined() {
        let key = |labels: &[(&str, &str)]| -> Vec<u8> {
            let mut k = Vec::new();
            for (n, v) in labels {
                k.extend_from_slice(n.as_bytes());
                k.push(KEY_SEP);
                k.extend_from_slice(v.as_bytes());
                k.push(KEY_SEP);
            }
            k
        };
        let joined = |k: &[u8], hide: Option<&str>| -> Vec<u8> {
            let mut g = Vec::new();
            for (n, v) in key_labels(k) {
                if n != "__name__" && n != "le" && Some(n) != hide {
                    g.extend_from_slice(n.as_bytes());
                    g.push(KEY_SEP);
                    g.extend_from_slice(v.as_bytes());
                    g.push(KEY_SEP);
                }
            }
            g
        };
        let keys = [
            key(&[
                ("A", "1"),
                ("__name__", "x_bucket"),
                ("job", "a"),
                ("le", "0.5"),
                ("t", "x"),
                ("z", ""),
            ]),
            key(&[
                ("__name__", "x_bucket"),
                ("job", "a"),
                ("le", "+Inf"),
                ("t", "y"),
            ]),
            key(&[("__name__", "x_bucket"), ("job", "a"), ("le", "1")]),
            key(&[("__name__", "x"), ("job", "ab")]),
            key(&[("__name__", "x"), ("jo", "b")]),
            key(&[("__name__", "x")]),
            key(&[("__name__", "x"), ("job", "a"), ("t", "x"), ("z", "")]),
        ];
        for hide in [None, Some("t"), Some("job")] {
            for a in &keys {
                let ga = Group::of(a, hide);
                assert_eq!(ga.bytes(a).collect::<Vec<_>>().concat(), joined(a, hide));
                for b in &keys {
                    let gb = Group::of(b, hide);
                    assert_eq!(
                        ga.cmp(a, &gb, b),
                        joined(a, hide).cmp(&joined(b, hide)),
                        "{:?} vs {:?} hiding {hide:?}",
                        String::from_utf8_lossy(a),
                        String::from_utf8_lossy(b)
                    );
                }
            }
        }
    }

    #[test]
    fn selectors_need_a_non_empty_matcher() {
        assert!(Selector::parse("{job=\"x\"}").is_ok());
        assert!(Selector::parse("up").is_ok());
        assert!(Selector::parse("{a=~\".*\"}").is_err());
        assert!(Selector::parse("rate(x[5m])").is_err());
    }
}
