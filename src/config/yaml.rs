//! The one place that parses YAML. serde_yaml is archived upstream; swapping it for a
//! maintained fork means changing this file (and Cargo.toml) only.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes `value` as YAML.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, YamlError> {
    serde_yaml::to_string(value).map_err(|e| YamlError {
        line: 0,
        column: 0,
        message: e.to_string(),
    })
}

/// A YAML error with the position serde reported, for messages of the form
/// `file:line:column: reason`.
#[derive(Debug, thiserror::Error)]
#[error("{line}:{column}: {message}")]
pub struct YamlError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    // A file of comments only (or nothing) is an empty mapping, not a missing document.
    let empty = text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
    let text = if empty { "{}" } else { text };
    serde_yaml::from_str(text).map_err(|typed| {
        // serde_yaml hands the schema the events libyaml produced before a syntax error,
        // so a misindented key shows as a mapping cut short ("missing field `url`" at the
        // mapping's start). Any YAML is accepted as `IgnoredAny`: an error there is the
        // syntax error, at the line that breaks the structure, and is the one to show.
        match serde_yaml::from_str::<serde::de::IgnoredAny>(text) {
            Err(syntax) => yaml_error(&syntax, Some(text)),
            Ok(_) => yaml_error(&typed, None),
        }
    })
}

/// `e` as `line:column: message`; `syntax`: the text, when `e` is a syntax error.
fn yaml_error(e: &serde_yaml::Error, syntax: Option<&str>) -> YamlError {
    let (line, column) = e
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((1, 1));
    // serde_yaml repeats the position in its message; ours goes in front once, and a
    // second one (libyaml's context) is written `line:column` too.
    let message = shorten_marks(&e.to_string()).replacen(&format!(" at {line}:{column}"), "", 1);
    let Some(text) = syntax else {
        return YamlError {
            line,
            column,
            message,
        };
    };
    // libyaml's words for a block structure that does not close where it should: almost
    // always a key indented more or less than its neighbours.
    const STRUCTURE: &[&str] = &[
        "did not find expected '-' indicator",
        "did not find expected key",
        "mapping values are not allowed in this context",
        "block sequence entries are not allowed in this context",
        "did not find expected node content",
    ];
    let message = if STRUCTURE.iter().any(|s| message.starts_with(s)) {
        format!(
            "wrong indentation or structure: line {line} does not line up with the keys above it; indent it exactly as its sibling keys (YAML: {message})"
        )
    } else if message.starts_with("found character that cannot start any token")
        && text
            .lines()
            .nth(line.saturating_sub(1))
            .is_some_and(|l| l.trim_start_matches(' ').starts_with('\t'))
    {
        format!("not valid YAML: {message}; YAML indents with spaces, not tabs")
    } else {
        format!("not valid YAML: {message}")
    };
    YamlError {
        line,
        column,
        message,
    }
}

/// `… at line 2 column 3` → `… at 2:3`.
fn shorten_marks(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(at) = rest.find(" at line ") {
        out.push_str(&rest[..at]);
        let after = &rest[at + " at line ".len()..];
        let line_len = after
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len());
        let (l, after_l) = after.split_at(line_len);
        match after_l.strip_prefix(" column ") {
            Some(col_text) if !l.is_empty() => {
                let col_len = col_text
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(col_text.len());
                out.push_str(&format!(" at {l}:{}", &col_text[..col_len]));
                rest = &col_text[col_len..];
            }
            _ => {
                out.push_str(" at line ");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}
