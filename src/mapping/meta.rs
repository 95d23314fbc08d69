//! Metadata that tells the truth after a rescale: the unit a family name declares, and
//! the HELP text rewritten to state it.
//!
//! The rule (README, "Packs and the rule language"): the new unit comes from the output
//! family's name suffix (`_seconds`, `_bytes`, `_ratio`, `_bytes_per_second`, `_joules`,
//! `_hertz`, after any `_total`). In the HELP text, every recognised mention of an old
//! unit of that dimension (`in ms`, `(in MiB)`, `(in %)`, `(ms)`, `in GB/s`, `in minutes`,
//! `in 4-byte words` …) is replaced by the new unit word; when none is recognised,
//! ` (promnorm: rescaled ×F to UNIT)` is appended, F the exact factor.

use std::io::Write as _;

use super::number::Factor;

/// The unit a family name declares by its suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameUnit {
    /// The metadata `unit` field (Prometheus/OpenMetrics base unit name).
    pub unit: &'static str,
    /// How HELP text says it.
    pub word: &'static str,
    /// Mentions of other units of the same dimension: symbols match case-sensitively.
    symbols: &'static [&'static str],
    /// … and words ASCII-case-insensitively.
    words: &'static [&'static str],
}

const UNITS: &[(&str, NameUnit)] = &[
    (
        "_bytes_per_second",
        NameUnit {
            unit: "bytes_per_second",
            word: "bytes per second",
            symbols: &[
                "GB/s", "GiB/s", "MB/s", "MiB/s", "KB/s", "KiB/s", "kB/s", "TB/s", "GBps", "MBps",
            ],
            words: &[
                "gigabytes per second",
                "megabytes per second",
                "kilobytes per second",
            ],
        },
    ),
    (
        "_bytes",
        NameUnit {
            unit: "bytes",
            word: "bytes",
            symbols: &["MiB", "MB", "GiB", "GB", "KiB", "KB", "kB", "TiB", "TB"],
            words: &[
                "4-byte words",
                "dwords",
                "words",
                "mebibytes",
                "megabytes",
                "gibibytes",
                "gigabytes",
                "kibibytes",
                "kilobytes",
            ],
        },
    ),
    (
        "_seconds",
        NameUnit {
            unit: "seconds",
            word: "seconds",
            symbols: &[
                "ms", "msec", "msecs", "us", "µs", "μs", "usec", "usecs", "ns", "nsec", "min",
                "mins",
            ],
            words: &[
                "milliseconds",
                "millisecond",
                "microseconds",
                "microsecond",
                "nanoseconds",
                "nanosecond",
                "minutes",
                "minute",
                "hours",
                "hour",
            ],
        },
    ),
    (
        "_ratio",
        NameUnit {
            unit: "ratio",
            word: "ratio 0-1",
            symbols: &["%"],
            words: &["percent", "percentage", "pct"],
        },
    ),
    (
        "_joules",
        NameUnit {
            unit: "joules",
            word: "joules",
            symbols: &["mJ", "kJ"],
            words: &["millijoules", "millijoule"],
        },
    ),
    (
        "_hertz",
        NameUnit {
            unit: "hertz",
            word: "hertz",
            symbols: &["MHz", "kHz", "GHz"],
            words: &["megahertz", "kilohertz", "gigahertz"],
        },
    ),
];

/// The unit `family`'s name declares (a counter's `_total` ignored), if a known one.
pub fn unit_of_name(family: &str) -> Option<NameUnit> {
    let base = family.strip_suffix("_total").unwrap_or(family);
    UNITS
        .iter()
        .find(|(suffix, _)| base.ends_with(suffix))
        .map(|(_, u)| *u)
}

/// The known unit whose metadata `unit` field is `unit` (a rule's `unit:`).
pub fn unit_named(unit: &str) -> Option<NameUnit> {
    UNITS.iter().find(|(_, u)| u.unit == unit).map(|(_, u)| *u)
}

/// Writes `help`, restated for a family rescaled by `factor` into `unit`, to `out`
/// (cleared first). Bytes in, bytes out: non-UTF-8 text is kept as it is.
pub fn rewrite_help(help: &[u8], factor: Factor, unit: Option<NameUnit>, out: &mut Vec<u8>) {
    out.clear();
    let mut replaced = false;
    if let Some(u) = unit {
        let mut i = 0;
        while i < help.len() {
            if let Some((len, form)) = mention_at(help, i, &u) {
                write_mention(out, form, &u);
                i += len;
                replaced = true;
            } else {
                out.push(help[i]);
                i += 1;
            }
        }
    } else {
        out.extend_from_slice(help);
    }
    if replaced {
        return;
    }
    if !out.is_empty() && !out.last().is_some_and(u8::is_ascii_whitespace) {
        out.push(b' ');
    }
    // Writing into a Vec cannot fail.
    let _ = match unit {
        Some(u) => write!(out, "(promnorm: rescaled {factor} to {})", u.word),
        None => write!(out, "(promnorm: rescaled {factor})"),
    };
}

#[derive(Clone, Copy)]
enum Form {
    /// `(in X)`
    ParenIn,
    /// `(X)`
    Paren,
    /// `in X` / `In X`
    In(u8),
}

/// A recognised mention of an old unit starting at `i`: its length and form.
fn mention_at(text: &[u8], i: usize, u: &NameUnit) -> Option<(usize, Form)> {
    let rest = &text[i..];
    if let Some(r) = rest.strip_prefix(b"(in ") {
        let n = token_len(r, u)?;
        return (r.get(n) == Some(&b')')).then_some((4 + n + 1, Form::ParenIn));
    }
    if let Some(r) = rest.strip_prefix(b"(") {
        let n = token_len(r, u)?;
        return (r.get(n) == Some(&b')')).then_some((1 + n + 1, Form::Paren));
    }
    let first = *rest.first()?;
    if (first == b'i' || first == b'I')
        && rest.get(1) == Some(&b'n')
        && rest.get(2) == Some(&b' ')
        && (i == 0 || !text[i - 1].is_ascii_alphanumeric())
    {
        let r = &rest[3..];
        let n = token_len(r, u)?;
        return ends_word(r, n).then_some((3 + n, Form::In(first)));
    }
    None
}

/// The length of the old-unit token `r` starts with, when it ends at a word boundary.
fn token_len(r: &[u8], u: &NameUnit) -> Option<usize> {
    let symbol = u
        .symbols
        .iter()
        .filter(|s| r.starts_with(s.as_bytes()))
        .map(|s| s.len());
    let word = u
        .words
        .iter()
        .filter(|w| r.len() >= w.len() && r[..w.len()].eq_ignore_ascii_case(w.as_bytes()))
        .map(|w| w.len());
    symbol.chain(word).filter(|&n| ends_word(r, n)).max()
}

/// `in GB` is no mention inside `in GB/s`, nor `in us` inside `in us-east`.
fn ends_word(r: &[u8], n: usize) -> bool {
    r.get(n)
        .is_none_or(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'/' | b'-')))
}

fn write_mention(out: &mut Vec<u8>, form: Form, u: &NameUnit) {
    // "in ratio 0-1" reads wrong: a ratio is stated "as a ratio 0-1".
    let ratio = u.unit == "ratio";
    match (form, ratio) {
        (Form::ParenIn, false) => {
            out.extend_from_slice(b"(in ");
            out.extend_from_slice(u.word.as_bytes());
            out.push(b')');
        }
        (Form::ParenIn, true) => {
            out.extend_from_slice(b"(as a ");
            out.extend_from_slice(u.word.as_bytes());
            out.push(b')');
        }
        (Form::Paren, _) => {
            out.push(b'(');
            out.extend_from_slice(u.word.as_bytes());
            out.push(b')');
        }
        (Form::In(first), false) => {
            out.push(first);
            out.extend_from_slice(b"n ");
            out.extend_from_slice(u.word.as_bytes());
        }
        (Form::In(first), true) => {
            out.extend_from_slice(if first == b'I' { b"As a " } else { b"as a " });
            out.extend_from_slice(u.word.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(help: &str, factor: &str, family: &str) -> String {
        let mut out = Vec::new();
        rewrite_help(
            help.as_bytes(),
            Factor::parse(factor).unwrap(),
            unit_of_name(family),
            &mut out,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn units_come_from_the_name_suffix() {
        let unit = |n: &str| unit_of_name(n).map(|u| u.unit);
        assert_eq!(unit("sglang:kv_transfer_latency_seconds"), Some("seconds"));
        assert_eq!(unit("DCGM_FI_DEV_FB_USED_bytes"), Some("bytes"));
        assert_eq!(unit("port_rcv_data_bytes_total"), Some("bytes"));
        assert_eq!(unit("DCGM_FI_DEV_GPU_UTIL_ratio"), Some("ratio"));
        assert_eq!(
            unit("sglang:kv_transfer_speed_bytes_per_second"),
            Some("bytes_per_second")
        );
        assert_eq!(
            unit("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_joules_total"),
            Some("joules")
        );
        assert_eq!(unit("DCGM_FI_DEV_SM_CLOCK_hertz"), Some("hertz"));
        assert_eq!(unit("queue_depth"), None);
    }

    #[test]
    fn old_unit_mentions_become_the_new_unit() {
        for (help, factor, family, want) in [
            (
                "The transfer latency of the KV cache in ms.",
                "1/1000",
                "sglang:kv_transfer_latency_seconds",
                "The transfer latency of the KV cache in seconds.",
            ),
            (
                "Framebuffer memory used (in MiB).",
                "1048576",
                "DCGM_FI_DEV_FB_USED_bytes",
                "Framebuffer memory used (in bytes).",
            ),
            (
                "GPU utilization (in %).",
                "1/100",
                "DCGM_FI_DEV_GPU_UTIL_ratio",
                "GPU utilization (as a ratio 0-1).",
            ),
            (
                "Total energy consumption since boot (in mJ).",
                "1/1000",
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_joules_total",
                "Total energy consumption since boot (in joules).",
            ),
            (
                "SM clock frequency (in MHz).",
                "1000000",
                "DCGM_FI_DEV_SM_CLOCK_hertz",
                "SM clock frequency (in hertz).",
            ),
            (
                "The transfer speed of the KV cache in GB/s.",
                "2^30",
                "sglang:kv_transfer_speed_bytes_per_second",
                "The transfer speed of the KV cache in bytes per second.",
            ),
            (
                "Latest ping latency to remote backends (ms)",
                "1/1000",
                "lmcache:remote_ping_latency_seconds",
                "Latest ping latency to remote backends (seconds)",
            ),
            (
                "Lifespan of a request in the cache in minutes",
                "60",
                "lmcache:request_cache_lifespan_seconds",
                "Lifespan of a request in the cache in seconds",
            ),
            (
                "Histogram of time spent in the model forward pass in ms.",
                "1/1000",
                "vllm:model_forward_time_seconds",
                "Histogram of time spent in the model forward pass in seconds.",
            ),
            (
                "Get latency in microseconds",
                "1/1000000",
                "mooncake_transfer_get_latency_seconds",
                "Get latency in seconds",
            ),
            (
                "Data received, in 4-byte words",
                "4",
                "port_rcv_data_bytes_total",
                "Data received, in bytes",
            ),
            (
                "Bloom filter in MB, or in MB",
                "1048576",
                "x_bytes",
                "Bloom filter in bytes, or in bytes",
            ),
        ] {
            assert_eq!(rewrite(help, factor, family), want, "{help}");
        }
    }

    #[test]
    fn without_a_recognised_mention_the_factor_is_appended() {
        for (help, factor, family, want) in [
            (
                "The total number of tokens transferred in the KV cache.",
                "1048576",
                "sglang:kv_transfer_total_bytes",
                "The total number of tokens transferred in the KV cache. \
                 (promnorm: rescaled ×2^20 to bytes)",
            ),
            (
                "",
                "1048576",
                "DCGM_FI_DEV_FB_TOTAL_bytes",
                "(promnorm: rescaled ×2^20 to bytes)",
            ),
            (
                "Port data received",
                "4",
                "port_rcv_data_bytes_total",
                "Port data received (promnorm: rescaled ×4 to bytes)",
            ),
            (
                "Queue depth in ms",
                "3",
                "queue_depth_scaled",
                "Queue depth in ms (promnorm: rescaled ×3)",
            ),
            // Not a unit mention: a word that starts like one, or another dimension.
            (
                "Time spent in msgpack decoding",
                "1/1000",
                "decode_seconds",
                "Time spent in msgpack decoding (promnorm: rescaled ÷1000 to seconds)",
            ),
            (
                "Speed in GB/s",
                "1048576",
                "x_bytes",
                "Speed in GB/s (promnorm: rescaled ×2^20 to bytes)",
            ),
            (
                "Region latency in us-east",
                "1/1000000",
                "x_seconds",
                "Region latency in us-east (promnorm: rescaled ÷10^6 to seconds)",
            ),
        ] {
            assert_eq!(rewrite(help, factor, family), want, "{help}");
        }
    }
}
