//! The one place that parses YAML. serde_yaml is archived upstream; swapping it for a
//! maintained fork means changing this file (and Cargo.toml) only.

use serde::de::DeserializeOwned;

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
    serde_yaml::from_str(text).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        YamlError {
            line,
            column,
            message: e.to_string(),
        }
    })
}
