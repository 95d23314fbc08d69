//! A parser for the Prometheus text exposition format (0.0.4), for `normalize` and the
//! golden tests. Not on the network path.

use crate::mapping::number::parse_float;

#[derive(Debug, Clone, PartialEq)]
pub struct TextSample {
    pub name: String,
    /// Labels without `__name__`, in the order written.
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TextMetadata {
    pub family: String,
    pub metric_type: String,
    pub help: String,
}

#[derive(Debug, Default, Clone)]
pub struct Scrape {
    pub samples: Vec<TextSample>,
    pub metadata: Vec<TextMetadata>,
}

#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

pub fn parse(text: &str) -> Result<Scrape, ParseError> {
    let mut scrape = Scrape::default();
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let err = |m: String| ParseError {
            line: line_no,
            message: m,
        };
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, char::is_whitespace);
            let kw = words.next().unwrap_or("");
            if kw == "TYPE" || kw == "HELP" {
                let family = words
                    .next()
                    .ok_or_else(|| err(format!("# {kw} without a metric name")))?;
                let rest = words.next().unwrap_or("").trim().to_string();
                let idx = match scrape.metadata.iter().position(|m| m.family == family) {
                    Some(i) => i,
                    None => {
                        scrape.metadata.push(TextMetadata {
                            family: family.to_string(),
                            metric_type: "unknown".into(),
                            help: String::new(),
                        });
                        scrape.metadata.len() - 1
                    }
                };
                if kw == "TYPE" {
                    scrape.metadata[idx].metric_type = rest;
                } else {
                    scrape.metadata[idx].help = rest;
                }
            }
            continue;
        }
        scrape.samples.push(parse_sample(line).map_err(err)?);
    }
    Ok(scrape)
}

fn parse_sample(line: &str) -> Result<TextSample, String> {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len()
        && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':')
    {
        i += 1;
    }
    if i == 0 || bytes[0].is_ascii_digit() {
        return Err(format!("expected a metric name at {:?}", truncate(line)));
    }
    let name = line[..i].to_string();
    let mut labels = Vec::new();
    if bytes.get(i) == Some(&b'{') {
        i += 1;
        loop {
            while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
                i += 1;
            }
            match bytes.get(i) {
                Some(b'}') => {
                    i += 1;
                    break;
                }
                None => return Err("unterminated label set".into()),
                _ => {}
            }
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            if start == i {
                return Err(format!("expected a label name at column {}", i + 1));
            }
            let lname = line[start..i].to_string();
            if bytes.get(i) != Some(&b'=') || bytes.get(i + 1) != Some(&b'"') {
                return Err(format!("expected =\" after label {lname}"));
            }
            i += 2;
            let mut value = String::new();
            loop {
                match bytes.get(i) {
                    None => return Err(format!("unterminated value of label {lname}")),
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        match bytes.get(i + 1) {
                            Some(b'n') => value.push('\n'),
                            Some(b'\\') => value.push('\\'),
                            Some(b'"') => value.push('"'),
                            _ => return Err(format!("bad escape in value of label {lname}")),
                        }
                        i += 2;
                    }
                    Some(_) => {
                        let ch = line[i..].chars().next().unwrap_or('\u{fffd}');
                        value.push(ch);
                        i += ch.len_utf8();
                    }
                }
            }
            labels.push((lname, value));
            while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
                i += 1;
            }
            match bytes.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                _ => return Err("expected , or } in label set".into()),
            }
        }
    }
    let rest = line[i..].trim();
    let mut parts = rest.split_whitespace();
    let value_text = parts.next().ok_or("missing sample value")?;
    let value =
        parse_float(value_text).ok_or_else(|| format!("bad sample value {value_text:?}"))?;
    let timestamp_ms = match parts.next() {
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| format!("bad timestamp {t:?}"))?,
        ),
        None => None,
    };
    if parts.next().is_some() {
        return Err("trailing text after timestamp".into());
    }
    Ok(TextSample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

fn truncate(s: &str) -> &str {
    let end = s.char_indices().nth(40).map(|(i, _)| i).unwrap_or(s.len());
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_labels_and_types() {
        let s = parse(
            "# HELP x help text\n# TYPE x counter\nx_total{a=\"1\",b=\"q\\\"\\\\\\n\"} 3.5 1700\nup 1\nh_bucket{le=\"+Inf\"} +Inf\n",
        )
        .unwrap();
        assert_eq!(s.samples.len(), 3);
        assert_eq!(s.samples[0].labels[1].1, "q\"\\\n");
        assert_eq!(s.samples[0].timestamp_ms, Some(1700));
        assert_eq!(s.metadata[0].metric_type, "counter");
        assert_eq!(s.metadata[0].help, "help text");
        assert!(s.samples[2].value.is_infinite());
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("ok 1\nbad{a=1} 2\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(parse("x{a=\"1\" 2\n").is_err());
        assert!(parse("x notanumber\n").is_err());
    }
}
