//! Where in the configuration's text a value is written, to put `file:line:column: ` in
//! front of an error about it (a default or a flag has no position).

use super::*;

impl Config {
    /// `file:line:column: ` of the first value `value` written after `key:` in the
    /// configuration's text (`file: ` when it is not written there, e.g. a default or a
    /// command-line flag), to put in front of an error about that value.
    pub fn position(&self, key: &str, value: &str) -> String {
        self.position_nth(key, value, 0)
    }

    /// Like [`Config::position`], for the `nth` (from 0) such value.
    pub fn position_nth(&self, key: &str, value: &str, mut nth: usize) -> String {
        let Some(src) = &self.source else {
            return String::new();
        };
        if !value.is_empty() {
            let mut after_key = false;
            for (i, line) in src.text.lines().enumerate() {
                let code = line.split(" #").next().unwrap_or(line);
                let key_col = code.find(&format!("{key}:"));
                if key_col.is_some() {
                    after_key = true;
                }
                // The value on the key's line, or (lists) on a later line.
                let from = key_col.map_or(0, |k| k + key.len() + 1);
                if after_key && let Some(col) = code.get(from..).and_then(|r| r.find(value)) {
                    if nth == 0 {
                        return format!("{}:{}:{}: ", src.file, i + 1, from + col + 1);
                    }
                    nth -= 1;
                    after_key = false;
                }
            }
        }
        format!("{}: ", src.file)
    }

    /// An error about the value `value` of `key`, with its position.
    pub fn invalid_at(
        &self,
        key: &str,
        value: &str,
        message: impl std::fmt::Display,
    ) -> ConfigError {
        ConfigError::Value {
            at: self.position(key, value),
            key: key.to_string(),
            reason: message.to_string(),
        }
    }

    pub(super) fn secret_position(&self, secret: &Secret) -> String {
        match (&secret.file, &secret.env) {
            (Some(f), _) => self.position("file", &f.display().to_string()),
            (_, Some(v)) => self.position("env", v),
            _ => self.position("bearer_token", ""),
        }
    }

    /// Where the size `n` of `key` is written, however it is spelt (`1048576`, `1MiB`,
    /// `1024 KiB`).
    pub fn size_position(&self, key: &str, n: u64) -> String {
        let fallback = self.position(key, "");
        for text in [n.to_string(), format_byte_size(n)] {
            let p = self.position(key, &text);
            if p != fallback {
                return p;
            }
        }
        let Some(src) = &self.source else {
            return fallback;
        };
        let pattern = format!("{key}:");
        for (i, line) in src.text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or(line);
            if let Some(k) = code.find(&pattern) {
                let after = &code[k + pattern.len()..];
                let col = k + pattern.len() + (after.len() - after.trim_start().len());
                return format!("{}:{}:{}: ", src.file, i + 1, col + 1);
            }
        }
        fallback
    }
}
