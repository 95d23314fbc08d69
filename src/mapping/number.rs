//! Exact rational factors and Prometheus-compatible float text (`le` values, outputs).

use std::fmt::Write as _;

/// An exact rational factor `num / den`, applied as `value * num / den` so that e.g.
/// `100 ms` becomes exactly `0.1 s` (dividing by 1000 rounds once; multiplying by 0.001
/// would round twice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Factor {
    pub num: u64,
    pub den: u64,
}

impl Factor {
    pub const ONE: Factor = Factor { num: 1, den: 1 };

    /// Parses `"1/1000"`, `"1048576"`, `"1e9"`, `"60"`.
    pub fn parse(text: &str) -> Result<Factor, String> {
        let text = text.trim();
        let (n, d) = match text.split_once('/') {
            Some((n, d)) => (n.trim(), d.trim()),
            None => (text, "1"),
        };
        let num = parse_integer(n)?;
        let den = parse_integer(d)?;
        if num == 0 || den == 0 {
            return Err(format!("factor {text:?} must be a non-zero rational"));
        }
        let g = gcd(num, den);
        Ok(Factor {
            num: num / g,
            den: den / g,
        })
    }

    #[inline]
    pub fn apply(self, v: f64) -> f64 {
        if self.den == 1 {
            v * self.num as f64
        } else if self.num == 1 {
            v / self.den as f64
        } else {
            v * self.num as f64 / self.den as f64
        }
    }

    pub fn then(self, other: Factor) -> Factor {
        let num = self.num.saturating_mul(other.num);
        let den = self.den.saturating_mul(other.den);
        let g = gcd(num, den);
        Factor {
            num: num / g,
            den: den / g,
        }
    }

    pub fn is_one(self) -> bool {
        self.num == self.den
    }
}

/// `k` when `f` is exactly `2^k` (`×2^20`, `×4`, `÷1024`).
pub fn power_of_two(f: Factor) -> Option<i32> {
    match (f.num, f.den) {
        (n, 1) if n.is_power_of_two() => Some(n.trailing_zeros() as i32),
        (1, d) if d.is_power_of_two() => Some(-(d.trailing_zeros() as i32)),
        _ => None,
    }
}

/// `÷1000`, `×2^20`, `×4`, `÷10^6`, `×60`, `×3/2`: the exact factor as `explain` and
/// rewritten HELP texts show it. Writes through the formatter only (no allocation).
impl std::fmt::Display for Factor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.den == 1 {
            f.write_str("×")?;
            write_integer(f, self.num)
        } else if self.num == 1 {
            f.write_str("÷")?;
            write_integer(f, self.den)
        } else {
            f.write_str("×")?;
            write_integer(f, self.num)?;
            f.write_str("/")?;
            write_integer(f, self.den)
        }
    }
}

/// Large powers read as powers: binary units from 2^10 (MiB is 2^20, not 1048576),
/// decimal ones from 10^6 (1000 and 100 stay as they are written in mappings).
fn write_integer(f: &mut std::fmt::Formatter<'_>, n: u64) -> std::fmt::Result {
    if n >= 1024 && n.is_power_of_two() {
        return write!(f, "2^{}", n.trailing_zeros());
    }
    let mut exp = 0;
    let mut rest = n;
    while rest >= 10 && rest % 10 == 0 {
        rest /= 10;
        exp += 1;
    }
    if rest == 1 && exp >= 6 {
        write!(f, "10^{exp}")
    } else {
        write!(f, "{n}")
    }
}

fn parse_integer(s: &str) -> Result<u64, String> {
    if let Ok(v) = s.parse::<u64>() {
        return Ok(v);
    }
    // Accept exact powers written as 1e9 or 2^30.
    if let Some((b, e)) = s.split_once('^') {
        let b: u64 = b.parse().map_err(|_| format!("bad factor {s:?}"))?;
        let e: u32 = e.parse().map_err(|_| format!("bad factor {s:?}"))?;
        return b
            .checked_pow(e)
            .ok_or_else(|| format!("factor {s:?} overflows"));
    }
    let f: f64 = s.parse().map_err(|_| format!("bad factor {s:?}"))?;
    if f.fract() == 0.0 && f > 0.0 && f < 1.8e19 {
        Ok(f as u64)
    } else {
        Err(format!(
            "factor {s:?} is not a whole number; write it as num/den"
        ))
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// How an exporter writes whole numbers in `le`: Go clients `1`, Python clients `1.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatStyle {
    Go,
    Python,
}

/// What an `le` text says about its writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StyleEvidence {
    Known(FloatStyle),
    /// Non-whole decimals look the same from both writers.
    Ambiguous,
}

pub fn style_of(text: &str) -> StyleEvidence {
    let t = text.strip_prefix('-').unwrap_or(text);
    if t.is_empty() || !t.as_bytes()[0].is_ascii_digit() {
        return StyleEvidence::Ambiguous;
    }
    match t.split_once('.') {
        None if t.bytes().all(|b| b.is_ascii_digit()) => StyleEvidence::Known(FloatStyle::Go),
        Some((int, frac)) if int.bytes().all(|b| b.is_ascii_digit()) && frac == "0" => {
            StyleEvidence::Known(FloatStyle::Python)
        }
        // C's %f (Mooncake/yalantinglibs: "500.000000") is no Python repr: write Go style.
        Some((int, frac))
            if int.bytes().all(|b| b.is_ascii_digit())
                && frac.len() > 1
                && frac.bytes().all(|b| b == b'0') =>
        {
            StyleEvidence::Known(FloatStyle::Go)
        }
        _ => StyleEvidence::Ambiguous,
    }
}

/// A tiny fixed buffer for `{:e}` output, so formatting never allocates.
struct StackBuf {
    buf: [u8; 40],
    len: usize,
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let b = s.as_bytes();
        if self.len + b.len() > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        Ok(())
    }
}

/// Writes `v` the way Go's `strconv.FormatFloat(v, 'g', -1, 64)` does (Prometheus'
/// own formatting), or Python's `repr(float)` for [`FloatStyle::Python`].
pub fn write_float(out: &mut Vec<u8>, v: f64, style: FloatStyle) {
    if v.is_nan() {
        out.extend_from_slice(b"NaN");
        return;
    }
    if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"+Inf" } else { b"-Inf" });
        return;
    }
    if v == 0.0 {
        out.extend_from_slice(match (style, v.is_sign_negative()) {
            (FloatStyle::Go, false) => b"0",
            (FloatStyle::Go, true) => b"-0",
            (FloatStyle::Python, false) => b"0.0",
            (FloatStyle::Python, true) => b"-0.0",
        });
        return;
    }
    // Shortest round-trip digits and decimal exponent, from Rust's own `{:e}`.
    let mut sb = StackBuf {
        buf: [0; 40],
        len: 0,
    };
    let _ = write!(sb, "{:e}", v.abs());
    let s = &sb.buf[..sb.len];
    let epos = s.iter().position(|&b| b == b'e').unwrap_or(s.len());
    let mantissa = &s[..epos];
    let exp: i32 = std::str::from_utf8(&s[epos + 1..])
        .ok()
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let mut digits = [0u8; 24];
    let mut nd = 0;
    for &b in mantissa {
        if b.is_ascii_digit() && nd < digits.len() {
            digits[nd] = b;
            nd += 1;
        }
    }
    let digits = &digits[..nd];
    if v < 0.0 {
        out.push(b'-');
    }
    let exp_limit = match style {
        FloatStyle::Go => 6,
        FloatStyle::Python => 16,
    };
    if exp < -4 || exp >= exp_limit {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let a = exp.unsigned_abs();
        if a < 10 {
            out.push(b'0');
        }
        let mut tmp = StackBuf {
            buf: [0; 40],
            len: 0,
        };
        let _ = write!(tmp, "{a}");
        out.extend_from_slice(&tmp.buf[..tmp.len]);
        return;
    }
    if exp < 0 {
        out.extend_from_slice(b"0.");
        for _ in 0..(-exp - 1) {
            out.push(b'0');
        }
        out.extend_from_slice(digits);
        return;
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        out.extend_from_slice(digits);
        for _ in digits.len()..int_len {
            out.push(b'0');
        }
        if style == FloatStyle::Python {
            out.extend_from_slice(b".0");
        }
    } else {
        out.extend_from_slice(&digits[..int_len]);
        out.push(b'.');
        out.extend_from_slice(&digits[int_len..]);
    }
}

/// Parses a Prometheus float text (`+Inf`, `-Inf`, `NaN` included).
pub fn parse_float(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

pub fn float_string(v: f64, style: FloatStyle) -> String {
    let mut out = Vec::new();
    write_float(&mut out, v, style);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go(v: f64) -> String {
        float_string(v, FloatStyle::Go)
    }
    fn py(v: f64) -> String {
        float_string(v, FloatStyle::Python)
    }

    #[test]
    fn go_g_format_matches_strconv() {
        for (v, want) in [
            (0.1, "0.1"),
            (0.0025, "0.0025"),
            (0.0005, "0.0005"),
            (0.0001, "0.0001"),
            (5e-05, "5e-05"),
            (1.25e-05, "1.25e-05"),
            (1.0, "1"),
            (250.0, "250"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (1e21, "1e+21"),
            (-2.5, "-2.5"),
            (1e-300, "1e-300"),
            (0.0, "0"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go(v), want, "{v:e}");
        }
    }

    #[test]
    fn python_repr_keeps_trailing_zero() {
        assert_eq!(py(1.0), "1.0");
        assert_eq!(py(250.0), "250.0");
        assert_eq!(py(1e6), "1000000.0");
        assert_eq!(py(0.1), "0.1");
        assert_eq!(py(5e-05), "5e-05");
        assert_eq!(py(1e16), "1e+16");
    }

    #[test]
    fn factor_arithmetic_is_exact() {
        let ms = Factor::parse("1/1000").unwrap();
        assert_eq!(ms.apply(100.0), 0.1);
        assert_eq!(go(ms.apply(100.0)), "0.1");
        assert_eq!(go(ms.apply(2.5)), "0.0025");
        assert_eq!(py(ms.apply(1000.0)), "1.0");
        let us = Factor::parse("1/1000000").unwrap();
        assert_eq!(go(us.apply(50.0)), "5e-05");
        assert_eq!(go(us.apply(125.0)), "0.000125");
        assert_eq!(Factor::parse("1048576").unwrap().apply(2.0), 2097152.0);
        assert_eq!(Factor::parse("2^30").unwrap().num, 1 << 30);
        assert_eq!(Factor::parse("1e9").unwrap().num, 1_000_000_000);
        assert_eq!(
            Factor::parse("10/1000").unwrap(),
            Factor { num: 1, den: 100 }
        );
        assert!(Factor::parse("0.001").is_err());
        assert!(Factor::parse("0").is_err());
    }

    #[test]
    fn factors_display_exactly_with_readable_powers() {
        let show = |t: &str| Factor::parse(t).unwrap().to_string();
        assert_eq!(show("1/1000"), "÷1000");
        assert_eq!(show("1048576"), "×2^20");
        assert_eq!(show("2^30"), "×2^30");
        assert_eq!(show("4"), "×4");
        assert_eq!(show("60"), "×60");
        assert_eq!(show("1/100"), "÷100");
        assert_eq!(show("1/1000000"), "÷10^6");
        assert_eq!(show("1e9"), "×10^9");
        assert_eq!(show("3/2"), "×3/2");
        assert_eq!(show("1000/1024"), "×125/128");
    }

    #[test]
    fn le_style_evidence() {
        assert_eq!(style_of("1.0"), StyleEvidence::Known(FloatStyle::Python));
        assert_eq!(style_of("5000.0"), StyleEvidence::Known(FloatStyle::Python));
        assert_eq!(style_of("100"), StyleEvidence::Known(FloatStyle::Go));
        assert_eq!(style_of("500.000000"), StyleEvidence::Known(FloatStyle::Go));
        assert_eq!(style_of("2.5"), StyleEvidence::Ambiguous);
        assert_eq!(style_of("+Inf"), StyleEvidence::Ambiguous);
    }
}
