//! Configuration: the schema (`schema`), the value parsers (`parse`), the checks
//! (`checks`) and error positions (`position`); this module loads, prints and re-exports.

mod checks;
mod error;
pub mod memory;
mod parse;
mod position;
mod schema;
mod size;
pub mod yaml;

pub use error::{ByteSizeError, ConfigError, DurationError, ListenError, SecretError, UrlError};
pub use memory::{LimitSource, MemoryLimit, Sizing};
pub use parse::*;
pub use schema::*;
pub use size::{AutoCount, AutoSize, ByteSize, format_byte_size, human_bytes, parse_byte_size};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("default.yaml");

// The built-in packs (`BUILTIN_PACKS`), embedded at build time from `mappings/` by build.rs.
include!(concat!(env!("OUT_DIR"), "/builtin_packs.rs"));

impl Config {
    pub fn embedded_default() -> Config {
        let mut cfg = Config::parse(DEFAULT_CONFIG, "<embedded default>")
            .expect("embedded default configuration is valid");
        // Errors about defaults or flags have no position to show.
        cfg.source = None;
        cfg
    }

    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let mut cfg: Config = yaml::from_str(text).map_err(|source| ConfigError::Yaml {
            file: file.to_string(),
            source,
        })?;
        cfg.source = Some(ConfigSource {
            file: file.to_string(),
            text: text.to_string(),
        });
        Ok(cfg)
    }

    /// The text of the mapping file `packs.files[index]`; an error names where the entry
    /// is written and the absolute path that was tried.
    pub fn read_pack_file(&self, index: usize) -> Result<String, ConfigError> {
        let Some(f) = self.packs.files.get(index) else {
            return Err(self.invalid_at(
                "files",
                "",
                format!("packs.files[{index}]: no such entry"),
            ));
        };
        std::fs::read_to_string(f).map_err(|source| {
            // `load` joined a relative entry to the configuration's directory: find the
            // entry as written.
            let dir = self
                .source
                .as_ref()
                .and_then(|s| Path::new(&s.file).parent());
            let written = dir
                .and_then(|d| f.strip_prefix(d).ok())
                .filter(|w| !w.as_os_str().is_empty())
                .unwrap_or(f);
            ConfigError::PackFile {
                at: self.position("files", &written.display().to_string()),
                index,
                path: std::path::absolute(f)
                    .unwrap_or_else(|_| f.clone())
                    .display()
                    .to_string(),
                source,
            }
        })
    }

    /// The configuration as `check-config --print` shows it: every key, defaults filled
    /// in, credentials replaced by `<secret>`.
    pub fn to_redacted_yaml(&self) -> Result<String, ConfigError> {
        let mut c = self.clone();
        for b in &mut c.backends {
            b.url = redact_url(&b.url);
            for (k, v) in b.headers.iter_mut() {
                let k = k.to_ascii_lowercase();
                if ["auth", "token", "key", "secret", "password", "cookie"]
                    .iter()
                    .any(|w| k.contains(w))
                {
                    *v = "<secret>".into();
                }
            }
        }
        yaml::to_string(&c).map_err(|source| ConfigError::Yaml {
            file: "<printed configuration>".into(),
            source,
        })
    }

    /// [`Config::to_redacted_yaml`] with the memory limit in a comment on top and, beside
    /// each `auto` key, the value it resolves to (`max_inflight_bytes: auto # 21MiB`).
    /// Comments only: the printed text reads back as the same configuration.
    pub fn to_annotated_yaml(&self, sizing: &Sizing) -> Result<String, ConfigError> {
        let text = self.to_redacted_yaml()?;
        let mut out = format!("# {}\n", sizing.summary());
        let mut section = "";
        let mut queue = 0;
        for line in text.lines() {
            out.push_str(line);
            if !line.starts_with([' ', '-']) {
                section = line.trim_end_matches(':');
            }
            let t = line.trim_start().trim_start_matches("- ");
            let size = |n: u64| format!(" # {}", format_byte_size(n));
            let comment = match (section, t.split_once(": ")) {
                ("limits", Some((key, "auto"))) => match key {
                    "max_body_bytes" => Some(size(sizing.max_body_bytes)),
                    "max_decoded_bytes" => Some(size(sizing.max_decoded_bytes)),
                    "max_inflight_bytes" => Some(size(sizing.max_inflight_bytes)),
                    "max_tracked_series" => Some(format!(" # {}", sizing.max_tracked_series)),
                    _ => None,
                },
                ("derived", Some(("max_series", "auto"))) => {
                    Some(format!(" # {}", sizing.derived_max_series))
                }
                ("derived", Some(("max_pending_samples", "auto"))) => {
                    Some(format!(" # {}", sizing.derived_max_pending_samples))
                }
                ("backends", Some(("max_bytes", v))) => {
                    queue += 1;
                    let n = sizing.queue_max_bytes.get(queue - 1).copied();
                    (v == "auto").then(|| n.map(size)).flatten()
                }
                _ => None,
            };
            out.push_str(&comment.unwrap_or_default());
            out.push('\n');
        }
        Ok(out)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            file: path.display().to_string(),
            source: e,
        })?;
        let mut cfg = Config::parse(&text, &path.display().to_string())?;
        // Mapping files and queue directories are relative to the configuration file.
        if let Some(dir) = path.parent() {
            let queue_dirs = cfg.backends.iter_mut().filter_map(|b| b.queue.dir.as_mut());
            for f in cfg.packs.files.iter_mut().chain(queue_dirs) {
                if f.is_relative() {
                    *f = dir.join(&*f);
                }
            }
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests;
