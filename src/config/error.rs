//! Why a configuration is refused: one error type per parser, and [`ConfigError`] for the
//! configuration as a whole. A variant about a written value carries `at`, the
//! `file:line:column: ` where it is written (empty for defaults and command-line flags),
//! so every message is one line that points at the value.

use super::yaml;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is not YAML of the schema (unknown key, wrong type).
    #[error("{file}:{source}")]
    Yaml {
        file: String,
        #[source]
        source: yaml::YamlError,
    },
    /// A file promnorm reads (configuration, pack) cannot be read.
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// A `packs.files` entry cannot be read: where it is written, and the path promnorm
    /// tried (made absolute, relative paths resolved against the configuration's directory).
    #[error("{at}packs.files[{index}]: cannot read {path}: {source}")]
    PackFile {
        at: String,
        index: usize,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A backend URL promnorm cannot send to.
    #[error("{at}{source}")]
    Url {
        at: String,
        #[source]
        source: UrlError,
    },
    /// A secret serve will read (bearer token, password) cannot be read; `owner` says
    /// whose (`backend NAME`, `ingest_auth`).
    #[error("{at}{owner}: {source}")]
    Secret {
        at: String,
        owner: String,
        #[source]
        source: SecretError,
    },
    /// `listen` is not an address.
    #[error("{at}listen {text:?}: {source}")]
    Listen {
        at: String,
        text: String,
        #[source]
        source: ListenError,
    },
    #[error("{at}two backends are named {name:?}: their metrics would be indistinguishable")]
    DuplicateBackend { at: String, name: String },
    #[error("two packs are named {name:?}")]
    DuplicatePack { name: String },
    #[error("{at}unknown built-in pack {name:?} (known: {known})")]
    UnknownPack {
        at: String,
        name: String,
        known: String,
    },
    #[error(
        "{at}derived.peaks[{index}]: unknown gpu {model:?} (known: {known}); give flops and bandwidth as numbers instead"
    )]
    UnknownGpu {
        at: String,
        index: usize,
        model: String,
        known: String,
    },
    /// Any other refused value: the key it is written under, and why.
    #[error("{at}{reason}")]
    Value {
        at: String,
        key: String,
        reason: String,
    },
}

impl ConfigError {
    /// The configuration key a refused value is written under, when the error is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Url { .. } => Some("url"),
            ConfigError::Listen { .. } => Some("listen"),
            ConfigError::DuplicateBackend { .. } => Some("name"),
            ConfigError::UnknownPack { .. } => Some("builtin"),
            ConfigError::UnknownGpu { .. } => Some("gpu"),
            ConfigError::PackFile { .. } => Some("files"),
            ConfigError::Value { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Why a backend URL cannot be used. URLs are shown with credentials redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error(
        "backend url {url:?}: credentials in a URL must percent-encode '/', '?' and '#' (%2F, %3F, %23), or use basic_auth"
    )]
    UnencodedCredentials { url: String },
    #[error("backend url {url:?}: {reason}")]
    Unparsable { url: String, reason: String },
    #[error(
        "backend url {url:?} must be http:// or https:// with a host{}",
        scheme_hint(url)
    )]
    NotHttp { url: String },
    #[error("backend url {url:?}: the port is not a number from 1 to 65535")]
    BadPort { url: String },
}

/// The URL to write instead of one without a scheme (`127.0.0.1:9090/api/v1/write`).
fn scheme_hint(url: &str) -> String {
    if url.contains("://") || url.is_empty() {
        String::new()
    } else {
        format!(" (write \"http://{url}\")")
    }
}

/// Why a secret cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("environment variable {var} is not set")]
    EnvUnset { var: String },
    #[error("cannot read {file}: {source}")]
    Unreadable {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("a secret needs exactly one of file or env")]
    NoSource,
}

/// Why a duration (`500ms`, `30s`, `1m30s`) cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("duration {text:?} needs a unit (ms, s, m, h)")]
    NoUnit { text: String },
    #[error("bad duration {text:?}")]
    BadNumber { text: String },
    #[error("bad duration unit {unit:?} in {text:?}")]
    BadUnit { unit: String, text: String },
    #[error("duration {text:?} is out of range")]
    OutOfRange { text: String },
}

/// Why a listen address cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("expected host:port or :port")]
    NoPort,
    #[error("{0}")]
    Resolve(#[source] std::io::Error),
    #[error("the name resolves to no address")]
    NoAddress,
}

/// Why a byte size (`64MiB`, `1GiB`, `1048576`) cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("empty size")]
    Empty,
    #[error("{text:?}: unknown unit; use B, KB, MB, GB, KiB, MiB, GiB")]
    BadUnit { text: String },
    #[error(
        "{text:?}: a size is a whole number, optionally followed by B, KB, MB, GB, KiB, MiB, GiB"
    )]
    BadNumber { text: String },
    #[error("{text:?} is out of range")]
    OutOfRange { text: String },
}
