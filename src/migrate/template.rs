//! Grafana template variables in PromQL (`$var`, `${var:fmt}`, `[[var]]`,
//! `$__rate_interval`): masked before parsing, restored after printing, so they survive
//! a rewrite untouched. Inside a range or subquery bracket (or after `offset`) a variable
//! becomes a duration no one writes by hand; elsewhere an identifier; inside a string it
//! is text already and stays as it is.

use std::time::Duration;

use promql_parser::util::display_duration;

pub struct Template {
    masked: String,
    /// (placeholder as printed, original text), longest placeholder first.
    vars: Vec<(String, String)>,
}

impl Template {
    pub fn mask(query: &str) -> Template {
        let b = query.as_bytes();
        let mut masked = String::with_capacity(query.len());
        let mut vars: Vec<(String, String)> = Vec::new();
        let mut i = 0;
        let mut quote: Option<u8> = None;
        let mut bracket = 0usize;
        let mut copied = 0;
        while i < b.len() {
            let c = b[i];
            if let Some(q) = quote {
                if c == b'\\' && q != b'`' {
                    i += 2;
                    continue;
                }
                if c == q {
                    quote = None;
                }
                i += 1;
                continue;
            }
            let var_len = variable_at(b, i);
            if var_len > 0 {
                let original = &query[i..i + var_len];
                let before = query[..i].trim_end();
                let duration = bracket > 0 || before.ends_with("offset");
                let placeholder = if duration {
                    display_duration(&placeholder_duration(vars.len()))
                } else {
                    format!("__grafana_var_{}__", vars.len())
                };
                masked.push_str(&query[copied..i]);
                masked.push_str(&placeholder);
                vars.push((placeholder, original.to_string()));
                i += var_len;
                copied = i;
                continue;
            }
            match c {
                b'"' | b'\'' | b'`' => quote = Some(c),
                b'[' => bracket += 1,
                b']' => bracket = bracket.saturating_sub(1),
                _ => {}
            }
            i += 1;
        }
        masked.push_str(&query[copied..]);
        vars.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        Template { masked, vars }
    }

    pub fn masked(&self) -> &str {
        &self.masked
    }

    pub fn has_variables(&self) -> bool {
        !self.vars.is_empty()
    }

    pub fn unmask(&self, printed: &str) -> String {
        let mut out = printed.to_string();
        for (placeholder, original) in &self.vars {
            out = out.replace(placeholder.as_str(), original);
        }
        out
    }
}

/// The length of a Grafana variable starting at `i`, or 0.
fn variable_at(b: &[u8], i: usize) -> usize {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    match b[i] {
        b'$' => match b.get(i + 1) {
            Some(b'{') => b[i..]
                .iter()
                .position(|&c| c == b'}')
                .map(|end| end + 1)
                .unwrap_or(0),
            Some(&c) if c.is_ascii_alphabetic() || c == b'_' => {
                1 + b[i + 1..].iter().take_while(|&&c| word(c)).count()
            }
            _ => 0,
        },
        b'[' if b.get(i + 1) == Some(&b'[') => {
            let rest = &b[i + 2..];
            let n = rest
                .iter()
                .take_while(|&&c| word(c) || c == b':' || c == b'.')
                .count();
            if n > 0 && rest.get(n) == Some(&b']') && rest.get(n + 1) == Some(&b']') {
                n + 4
            } else {
                0
            }
        }
        _ => 0,
    }
}

/// A duration that no query writes by hand, for Grafana's interval variables.
fn placeholder_duration(i: usize) -> Duration {
    Duration::from_millis(9_876_543_210 + i as u64 * 1_001)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_masked_by_context_and_restored() {
        let q = r#"sum by (le, $group) (rate(x_bucket{a="${b}",model=~"$model"}[$__rate_interval])) > [[thr]]"#;
        let t = Template::mask(q);
        assert!(t.has_variables());
        let m = t.masked();
        assert!(!m.contains("$__rate_interval"), "{m}");
        assert!(
            m.contains(r#"model=~"$model""#),
            "strings keep their text: {m}"
        );
        assert!(m.contains("__grafana_var_0__"), "{m}");
        let parsed = promql_parser::parser::parse(m).expect("masked query parses");
        assert_eq!(
            t.unmask(&parsed.to_string()).replace(' ', ""),
            q.replace(' ', "")
        );
    }

    #[test]
    fn subquery_step_and_offset_variables_are_durations() {
        let q = "max_over_time(rate(x[$__interval])[$__range:$__interval] offset $off)";
        let t = Template::mask(q);
        let parsed = promql_parser::parser::parse(t.masked()).expect("masked query parses");
        assert_eq!(t.unmask(&parsed.to_string()), q);
    }

    #[test]
    fn text_without_variables_is_unchanged() {
        let q = r#"label_replace(x, "a", "$1", "b", "(.*)")"#;
        let t = Template::mask(q);
        assert!(!t.has_variables());
        assert_eq!(t.masked(), q);
    }
}
