//! Byte sizes as the configuration writes them: `65536`, `64KiB`, `64MiB`, `1GiB`,
//! `500MB`; and `auto` for the sizes promnorm derives from its memory limit
//! (`config::memory`).

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ByteSizeError;

/// The units a size may carry, with their factors: SI (`KB` = 1000) and IEC (`KiB` =
/// 1024), as vmagent and Kubernetes read them.
const UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
];

/// Parses `1048576`, `1048576B`, `64KiB`, `64 MiB`, `1GiB`, `500MB`, `2GB`: a whole
/// number and an optional unit (see [`UNITS`]).
pub fn parse_byte_size(text: &str) -> Result<u64, ByteSizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ByteSizeError::Empty);
    }
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let unit = unit.trim_start();
    if num.is_empty() || unit.starts_with('.') {
        return Err(ByteSizeError::BadNumber { text: t.into() });
    }
    let factor = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, f)| *f)
            .ok_or_else(|| ByteSizeError::BadUnit { text: t.into() })?
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| ByteSizeError::OutOfRange { text: t.into() })
}

/// Writes a size as [`parse_byte_size`] reads it: the largest unit that divides it
/// exactly, binary first (`64MiB`, `1GiB`, `64MB`, `64KiB`), else plain bytes.
pub fn format_byte_size(n: u64) -> String {
    for (unit, f) in [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KiB", 1 << 10),
        ("KB", 1_000),
    ] {
        if n > 0 && n % f == 0 {
            return format!("{}{unit}", n / f);
        }
    }
    n.to_string()
}

/// A size for a person to read (`21.5MiB`), for logs and warnings; not parseable.
pub fn human_bytes(n: u64) -> String {
    if n % (1 << 20) == 0 || n < 1 << 20 {
        return format_byte_size(n);
    }
    if n >= 1 << 30 {
        format!("{:.1}GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1}MiB", n as f64 / (1u64 << 20) as f64)
    }
}

/// A configured byte size: a plain integer (bytes) or a string with a unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn mib(n: u64) -> ByteSize {
        ByteSize(n << 20)
    }

    pub fn bytes(self) -> u64 {
        self.0
    }

    /// The size as a `usize` (saturating: a 32-bit target cannot hold more anyway).
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format_byte_size(self.0))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = format_byte_size(self.0);
        match text.parse::<u64>() {
            Ok(n) => s.serialize_u64(n),
            Err(_) => s.serialize_str(&text),
        }
    }
}

/// Reads an integer or a string, handing strings to `word` (for `auto`) and then to
/// [`parse_byte_size`].
struct SizeVisitor<T> {
    expecting: &'static str,
    word: fn(&str) -> Option<T>,
    from_bytes: fn(u64) -> T,
}

impl<T> Visitor<'_> for SizeVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        Ok((self.from_bytes)(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        u64::try_from(v)
            .map(self.from_bytes)
            .map_err(|_| E::custom(format!("{v}: a size cannot be negative")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        Err(E::custom(format!(
            "{v}: a size is a whole number of bytes, or a whole number of KB, MB, GB, KiB, MiB, GiB"
        )))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        if let Some(t) = (self.word)(v.trim()) {
            return Ok(t);
        }
        parse_byte_size(v).map(self.from_bytes).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeVisitor {
            expecting: "a size: bytes, or a number with B, KB, MB, GB, KiB, MiB, GiB",
            word: |_| None,
            from_bytes: ByteSize,
        })
    }
}

/// A size that may be `auto`: derived from the memory limit (`config::memory::Sizing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AutoSize {
    #[default]
    Auto,
    Set(ByteSize),
}

impl AutoSize {
    /// The written size, `None` for `auto`.
    pub fn set(self) -> Option<u64> {
        match self {
            AutoSize::Auto => None,
            AutoSize::Set(b) => Some(b.0),
        }
    }
}

impl Serialize for AutoSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AutoSize::Auto => s.serialize_str("auto"),
            AutoSize::Set(b) => b.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for AutoSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeVisitor {
            expecting: "auto, or a size: bytes, or a number with B, KB, MB, GB, KiB, MiB, GiB",
            word: |w| (w == "auto").then_some(AutoSize::Auto),
            from_bytes: |n| AutoSize::Set(ByteSize(n)),
        })
    }
}

/// A count that may be `auto` (`derived.max_series`, `derived.max_pending_samples`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AutoCount {
    #[default]
    Auto,
    Set(usize),
}

impl AutoCount {
    pub fn set(self) -> Option<usize> {
        match self {
            AutoCount::Auto => None,
            AutoCount::Set(n) => Some(n),
        }
    }
}

impl Serialize for AutoCount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AutoCount::Auto => s.serialize_str("auto"),
            AutoCount::Set(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for AutoCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = AutoCount;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("auto or a whole number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<AutoCount, E> {
                usize::try_from(v)
                    .map(AutoCount::Set)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<AutoCount, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("{v}: a count cannot be negative")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AutoCount, E> {
                match v.trim() {
                    "auto" => Ok(AutoCount::Auto),
                    _ => Err(E::custom(format!("{v:?}: expected auto or a whole number"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_and_plain_bytes() {
        for (text, want) in [
            ("0", 0),
            ("1048576", 1 << 20),
            ("512B", 512),
            ("64KB", 64_000),
            ("64MB", 64_000_000),
            ("2GB", 2_000_000_000),
            ("64KiB", 64 << 10),
            ("64MiB", 64 << 20),
            ("64 MiB", 64 << 20),
            ("1GiB", 1 << 30),
        ] {
            assert_eq!(parse_byte_size(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refusals_say_why() {
        assert_eq!(
            parse_byte_size("64 MiBs").unwrap_err().to_string(),
            "\"64 MiBs\": unknown unit; use B, KB, MB, GB, KiB, MiB, GiB"
        );
        assert!(matches!(
            parse_byte_size("64mib"),
            Err(ByteSizeError::BadUnit { .. })
        ));
        assert!(matches!(
            parse_byte_size("1.5GiB"),
            Err(ByteSizeError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_byte_size("MiB"),
            Err(ByteSizeError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_byte_size("99999999999GiB"),
            Err(ByteSizeError::OutOfRange { .. })
        ));
        assert_eq!(parse_byte_size(" "), Err(ByteSizeError::Empty));
    }

    #[test]
    fn printed_sizes_read_back() {
        for n in [
            0,
            1,
            1000,
            1 << 10,
            3 << 20,
            (1 << 20) + 1,
            5 << 30,
            64_000_000,
        ] {
            let text = format_byte_size(n);
            assert_eq!(parse_byte_size(&text), Ok(n), "{text}");
        }
        assert_eq!(format_byte_size(64 << 20), "64MiB");
        assert_eq!(format_byte_size(1 << 30), "1GiB");
        assert_eq!(format_byte_size(64_000_000), "64MB");
        assert_eq!(format_byte_size(1000), "1KB");
        assert_eq!(format_byte_size(1001), "1001");
        assert_eq!(human_bytes((21 << 20) + (1 << 19)), "21.5MiB");
    }
}
