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
    serde_yaml::from_str(text).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        // serde_yaml repeats the position in its message; ours goes in front once.
        let mut message = e.to_string();
        if let Some(at) = message.find(" at line ") {
            message.truncate(at);
        }
        YamlError {
            line,
            column,
            message,
        }
    })
}
