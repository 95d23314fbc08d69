//! The exposition formats a scrape reads, in one pass over the body's bytes: Prometheus
//! text 0.0.4 and OpenMetrics 1.0. A line is parsed into reused buffers (label ranges
//! into the body; a value with escapes unescaped into a scratch buffer), so a warm
//! scrape allocates nothing per sample.

use std::ops::Range;

use crate::mapping::number::parse_float;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text004,
    OpenMetrics,
}

impl Format {
    /// The format a response's `Content-Type` names (0.0.4 for anything else, as
    /// Prometheus falls back).
    pub fn of_content_type(ct: Option<&str>) -> Format {
        match ct {
            Some(ct) if ct.trim_start().starts_with("application/openmetrics-text") => {
                Format::OpenMetrics
            }
            _ => Format::Text004,
        }
    }
}

/// Where a label's name or value stands: in the body, or unescaped in the scratch.
#[derive(Debug, Clone, PartialEq)]
pub enum Loc {
    Body(Range<usize>),
    Scratch(Range<usize>),
}

/// One sample line, parsed: ranges into the body (or the scratch).
#[derive(Default)]
pub struct SampleLine {
    pub name: Range<usize>,
    pub labels: Vec<(Range<usize>, Loc)>,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
    pub scratch: Vec<u8>,
}

impl SampleLine {
    pub fn resolve<'a>(&'a self, body: &'a [u8], loc: &Loc) -> &'a [u8] {
        match loc {
            Loc::Body(r) => &body[r.clone()],
            Loc::Scratch(r) => &self.scratch[r.clone()],
        }
    }
}

/// A comment line that says something about a family.
#[derive(Debug, PartialEq)]
pub enum Meta<'a> {
    Help(&'a str, String),
    Type(&'a str, &'a str),
    Unit(&'a str, &'a str),
}

/// What one line holds.
pub enum Line<'a> {
    Sample,
    Meta(Meta<'a>),
    /// A blank line, any other comment.
    Nothing,
    /// OpenMetrics' `# EOF`: nothing after it is read.
    Eof,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// Walks `body` line by line; `on_line` gets each line's kind, with `sample` holding it
/// when it is a sample.
pub fn parse(
    body: &[u8],
    format: Format,
    sample: &mut SampleLine,
    mut on_line: impl FnMut(Line<'_>, &SampleLine) -> Result<(), String>,
) -> Result<(), ParseError> {
    let mut start = 0;
    let mut line_no = 0;
    while start < body.len() {
        line_no += 1;
        let end = memchr_newline(body, start);
        let err = |message: String| ParseError {
            line: line_no,
            message,
        };
        let line = parse_line(body, start, end, format, sample).map_err(err)?;
        let eof = matches!(line, Line::Eof);
        on_line(line, sample).map_err(err)?;
        if eof {
            return Ok(());
        }
        start = end + 1;
    }
    Ok(())
}

fn memchr_newline(body: &[u8], from: usize) -> usize {
    memchr::memchr(b'\n', &body[from..]).map_or(body.len(), |p| from + p)
}

/// Per byte: bit 0, it may start a metric name; bit 1, continue one; bit 2, start a
/// label name; bit 3, continue one. One load per byte instead of four compares.
static NAME_BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        let alpha = c.is_ascii_alphabetic() || c == b'_';
        let digit = c.is_ascii_digit();
        let mut v = 0;
        if alpha || c == b':' {
            v |= 1 | 2;
        }
        if digit {
            v |= 2 | 8;
        }
        if alpha {
            v |= 4 | 8;
        }
        t[b] = v;
        b += 1;
    }
    t
};

/// The end of the run of bytes from `i` that `keep` keeps (or `end`): one pass over
/// the slice, no bounds check per byte.
#[inline]
fn run_end(body: &[u8], i: usize, end: usize, keep: fn(u8) -> bool) -> usize {
    body[i..end]
        .iter()
        .position(|&b| !keep(b))
        .map_or(end, |p| i + p)
}

#[inline]
fn is_name_start(b: u8) -> bool {
    NAME_BYTES[usize::from(b)] & 1 != 0
}

#[inline]
fn is_name_char(b: u8) -> bool {
    NAME_BYTES[usize::from(b)] & 2 != 0
}

#[inline]
fn is_label_start(b: u8) -> bool {
    NAME_BYTES[usize::from(b)] & 4 != 0
}

#[inline]
fn is_label_char(b: u8) -> bool {
    NAME_BYTES[usize::from(b)] & 8 != 0
}

/// The first position from `i` that is not a space or tab (or `end`).
fn skip_blanks(body: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && (body[i] == b' ' || body[i] == b'\t') {
        i += 1;
    }
    i
}

/// The end of the word starting at `i`: the next space or tab (or `end`).
fn word_end_at(body: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && body[i] != b' ' && body[i] != b'\t' {
        i += 1;
    }
    i
}

fn text(body: &[u8], r: Range<usize>) -> Result<&str, String> {
    std::str::from_utf8(&body[r]).map_err(|_| "not UTF-8".to_string())
}

fn parse_line<'a>(
    body: &'a [u8],
    start: usize,
    mut end: usize,
    format: Format,
    sample: &mut SampleLine,
) -> Result<Line<'a>, String> {
    if end > start && body[end - 1] == b'\r' {
        end -= 1;
    }
    let mut i = start;
    while i < end && (body[i] == b' ' || body[i] == b'\t') {
        i += 1;
    }
    if i == end {
        return Ok(Line::Nothing);
    }
    if body[i] == b'#' {
        return parse_comment(body, i + 1, end, format);
    }
    parse_sample(body, i, end, format, sample)?;
    Ok(Line::Sample)
}

fn parse_comment(
    body: &[u8],
    mut i: usize,
    end: usize,
    format: Format,
) -> Result<Line<'_>, String> {
    let skip_ws = |i: usize| skip_blanks(body, i, end);
    let word_end = |i: usize| word_end_at(body, i, end);
    i = skip_ws(i);
    let kw_end = word_end(i);
    let kw = &body[i..kw_end];
    if kw == b"EOF" && format == Format::OpenMetrics {
        return Ok(Line::Eof);
    }
    if kw != b"HELP" && kw != b"TYPE" && kw != b"UNIT" {
        return Ok(Line::Nothing);
    }
    let name_start = skip_ws(kw_end);
    let name_end = word_end(name_start);
    if name_start == name_end {
        return Err(format!(
            "# {} without a metric name",
            String::from_utf8_lossy(kw)
        ));
    }
    let name = text(body, name_start..name_end)?;
    let rest_start = skip_ws(name_end);
    let rest = text(body, rest_start..end)?;
    Ok(match kw {
        b"HELP" => Line::Meta(Meta::Help(name, unescape_help(rest, format))),
        b"TYPE" => Line::Meta(Meta::Type(name, rest.trim_end())),
        _ => {
            if format == Format::Text004 {
                Line::Nothing
            } else {
                Line::Meta(Meta::Unit(name, rest.trim_end()))
            }
        }
    })
}

fn unescape_help(s: &str, format: Format) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some('"') if format == Format::OpenMetrics => out.push('"'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn parse_sample(
    body: &[u8],
    mut i: usize,
    end: usize,
    format: Format,
    s: &mut SampleLine,
) -> Result<(), String> {
    s.labels.clear();
    s.scratch.clear();
    let name_start = i;
    if !is_name_start(body[i]) {
        return Err(format!(
            "expected a metric name, found {:?}",
            String::from_utf8_lossy(&body[i..end.min(i + 40)])
        ));
    }
    i = run_end(body, i, end, is_name_char);
    s.name = name_start..i;
    if i < end && body[i] == b'{' {
        i += 1;
        loop {
            while i < end && (body[i] == b' ' || body[i] == b'\t') {
                i += 1;
            }
            if i >= end {
                return Err("unterminated label set".into());
            }
            if body[i] == b'}' {
                i += 1;
                break;
            }
            let ln_start = i;
            if !is_label_start(body[i]) {
                return Err(format!(
                    "expected a label name at column {}",
                    i - name_start + 1
                ));
            }
            i = run_end(body, i, end, is_label_char);
            let ln = ln_start..i;
            while i < end && (body[i] == b' ' || body[i] == b'\t') {
                i += 1;
            }
            if i + 1 >= end || body[i] != b'=' || body[i + 1] != b'"' {
                return Err(format!(
                    "expected =\" after label {}",
                    String::from_utf8_lossy(&body[ln])
                ));
            }
            i += 2;
            let v_start = i;
            let mut escaped = false;
            // The closing quote, past escapes: found 16 or 32 bytes at a time.
            loop {
                match memchr::memchr2(b'"', b'\\', &body[i.min(end)..end]) {
                    Some(p) if body[i + p] == b'\\' => {
                        escaped = true;
                        i += p + 2;
                    }
                    Some(p) => {
                        i += p;
                        break;
                    }
                    None => {
                        i = end;
                        break;
                    }
                }
            }
            if i >= end {
                return Err(format!(
                    "unterminated value of label {}",
                    String::from_utf8_lossy(&body[ln])
                ));
            }
            let raw = v_start..i;
            i += 1;
            if !crate::wire::decode::all_ascii(&body[raw.clone()]) {
                std::str::from_utf8(&body[raw.clone()])
                    .map_err(|_| "a label value is not UTF-8".to_string())?;
            }
            let loc = if escaped {
                let from = s.scratch.len();
                let mut k = raw.start;
                while k < raw.end {
                    let b = body[k];
                    if b == b'\\' && k + 1 < raw.end {
                        match body[k + 1] {
                            b'n' => s.scratch.push(b'\n'),
                            b'\\' => s.scratch.push(b'\\'),
                            b'"' => s.scratch.push(b'"'),
                            other => {
                                s.scratch.push(b'\\');
                                s.scratch.push(other);
                            }
                        }
                        k += 2;
                    } else {
                        s.scratch.push(b);
                        k += 1;
                    }
                }
                Loc::Scratch(from..s.scratch.len())
            } else {
                Loc::Body(raw)
            };
            s.labels.push((ln, loc));
            while i < end && (body[i] == b' ' || body[i] == b'\t') {
                i += 1;
            }
            if i < end && body[i] == b',' {
                i += 1;
            } else if i < end && body[i] == b'}' {
                i += 1;
                break;
            } else {
                return Err("expected , or } in label set".into());
            }
        }
    }
    let skip_ws = |i: usize| skip_blanks(body, i, end);
    let word_end = |i: usize| word_end_at(body, i, end);
    let v_start = skip_ws(i);
    if v_start == i && i < end {
        return Err("expected a space before the value".into());
    }
    let v_end = word_end(v_start);
    if v_start == v_end {
        return Err("missing sample value".into());
    }
    let vt = text(body, v_start..v_end)?;
    s.value = parse_float(vt).ok_or_else(|| format!("bad sample value {vt:?}"))?;
    let t_start = skip_ws(v_end);
    s.timestamp_ms = None;
    if t_start < end && body[t_start] != b'#' {
        let t_end = word_end(t_start);
        let tt = text(body, t_start..t_end)?;
        s.timestamp_ms = Some(match format {
            Format::Text004 => tt
                .parse::<i64>()
                .map_err(|_| format!("bad timestamp {tt:?}"))?,
            Format::OpenMetrics => {
                let secs: f64 = tt
                    .parse()
                    .ok()
                    .filter(|v: &f64| v.is_finite())
                    .ok_or_else(|| format!("bad timestamp {tt:?}"))?;
                (secs * 1000.0).round() as i64
            }
        });
        let after = skip_ws(t_end);
        if after < end && body[after] != b'#' {
            return Err("trailing text after the timestamp".into());
        }
        if after < end && format == Format::Text004 {
            return Err("trailing text after the timestamp".into());
        }
    } else if t_start < end && format == Format::Text004 {
        return Err("trailing text after the value".into());
    }
    // OpenMetrics: an exemplar (` # {…} v [ts]`) may follow; it is not a sample.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(body: &str, format: Format) -> Result<Vec<String>, ParseError> {
        let mut out = Vec::new();
        let mut line = SampleLine::default();
        parse(body.as_bytes(), format, &mut line, |kind, s| {
            match kind {
                Line::Sample => {
                    let b = body.as_bytes();
                    let labels: Vec<String> = s
                        .labels
                        .iter()
                        .map(|(n, v)| {
                            format!(
                                "{}={}",
                                String::from_utf8_lossy(&b[n.clone()]),
                                String::from_utf8_lossy(s.resolve(b, v))
                            )
                        })
                        .collect();
                    out.push(format!(
                        "{}{{{}}} {} {:?}",
                        String::from_utf8_lossy(&b[s.name.clone()]),
                        labels.join(","),
                        s.value,
                        s.timestamp_ms
                    ));
                }
                Line::Meta(m) => out.push(format!("{m:?}")),
                Line::Nothing | Line::Eof => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn reads_text_004() {
        let got = samples(
            "# HELP x_total Some \\\\ help\n# TYPE x_total counter\nx_total{a=\"1\",b=\"q\\\"\\n\"} 3.5 1700\n\nup 1\nh_bucket{le=\"+Inf\",} +Inf\r\n",
            Format::Text004,
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                "Help(\"x_total\", \"Some \\\\ help\")",
                "Type(\"x_total\", \"counter\")",
                "x_total{a=1,b=q\"\n} 3.5 Some(1700)",
                "up{} 1 None",
                "h_bucket{le=+Inf} inf None",
            ]
        );
    }

    #[test]
    fn reads_openmetrics_with_seconds_exemplars_and_eof() {
        let got = samples(
            "# TYPE rpc_seconds histogram\n# UNIT rpc_seconds seconds\nrpc_seconds_bucket{le=\"0.1\"} 4 1700000000.5 # {trace_id=\"a\"} 0.05 1700000000.1\nrpc_seconds_count 4 # {trace_id=\"b\"} 0.2\n# EOF\nignored 1\n",
            Format::OpenMetrics,
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                "Type(\"rpc_seconds\", \"histogram\")",
                "Unit(\"rpc_seconds\", \"seconds\")",
                "rpc_seconds_bucket{le=0.1} 4 Some(1700000000500)",
                "rpc_seconds_count{} 4 None",
            ]
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = samples("ok 1\nbad{a=1} 2\n", Format::Text004).unwrap_err();
        assert_eq!(e.line, 2);
        for bad in [
            "x{a=\"1\" 2\n",
            "x notanumber\n",
            "x 1 2 3\n",
            "x{a=\"1\"\n",
            "9x 1\n",
            "x 1 12.5\n",
            "x\n",
        ] {
            assert!(samples(bad, Format::Text004).is_err(), "{bad:?}");
        }
    }
}
