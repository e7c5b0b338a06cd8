//! Numbers in graph files and in `tapegrad grad` output: printing so that every value reads back
//! exactly (shortest round-trip text; `-0.0` keeps its sign; NaN and infinities as the strings
//! `"nan"`, `"inf"`, `"-inf"`), and reading decimals exactly.
//!
//! serde_json without its `float_roundtrip` feature may round a decimal one unit in the last place
//! off, so `quote_decimals` turns every decimal number token into a string before serde_json sees
//! it, and `number` parses those strings with the standard library's correctly rounded parser.
//! With `float_roundtrip` enabled on serde_json this pre-pass could be removed.

use serde_json::Value;
use tapegrad_tensor::{DType, Scalar};

/// `v` as JSON text that reads back to the same f64 bits.
pub fn format_f64(v: f64) -> String {
    if v.is_nan() {
        return "\"nan\"".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "\"inf\"" } else { "\"-inf\"" }.into();
    }
    if v == 0.0 {
        // "-0" would read back as the integer 0.
        return if v.is_sign_negative() { "-0.0" } else { "0" }.into();
    }
    shortest(format!("{v}"), format!("{v:e}"))
}

/// `v` as JSON text that reads back to the same f32 bits.
pub fn format_f32(v: f32) -> String {
    if !v.is_finite() || v == 0.0 {
        return format_f64(v as f64);
    }
    shortest(format!("{v}"), format!("{v:e}"))
}

/// A scalar of either dtype, printed in its own precision.
pub fn format_scalar<S: Scalar>(v: S) -> String {
    match S::DTYPE {
        DType::F32 => format_f32(v.to_f64() as f32),
        DType::F64 => format_f64(v.to_f64()),
    }
}

/// Both forms are shortest round-trip; the plain one unless the exponent form is shorter (1e300).
fn shortest(plain: String, exp: String) -> String {
    if exp.len() < plain.len() {
        exp
    } else {
        plain
    }
}

/// Rewrites every number token that serde_json would parse as a float (it has a fraction or an
/// exponent, or too many digits for an integer) into a string holding the same text.
pub(super) fn quote_decimals(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let (mut i, mut copied) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() {
                    match bytes[i] {
                        b'\\' => i += 2,
                        b'"' => {
                            i += 1;
                            break;
                        }
                        _ => i += 1,
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < bytes.len()
                    && matches!(bytes[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                let token = &text[start..i];
                let digits = token.bytes().filter(u8::is_ascii_digit).count();
                let decimal = token.bytes().any(|c| matches!(c, b'.' | b'e' | b'E'));
                if decimal || digits > 18 {
                    out.push_str(&text[copied..start]);
                    out.push('"');
                    out.push_str(token);
                    out.push('"');
                    copied = i;
                }
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// A JSON value as a number: an integer, or a string holding a decimal, `nan`, `inf` or `-inf`.
pub(super) fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
}

/// A JSON value as an integer (a fraction or exponent is not an integer).
pub(super) fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// A short description of a JSON value for error messages.
pub(super) fn describe(v: &Value) -> String {
    let text = match v {
        // A decimal the pre-pass quoted reads as the number it was.
        Value::String(s) if number(v).is_some() => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() > 40 {
        format!("{}...", text.chars().take(40).collect::<String>())
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_numbers_read_back_to_the_same_bits() {
        let values = [
            0.1,
            -0.0,
            0.0,
            1.0,
            -2.5,
            1e300,
            1e-300,
            0.30000000000000004,
            f64::MIN_POSITIVE,
            5e-324,
            123456789.123,
        ];
        for v in values {
            let text = format!("[{}]", format_f64(v));
            let parsed: Value = serde_json::from_str(&quote_decimals(&text)).unwrap();
            let back = number(&parsed[0]).unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v} printed as {text}");
        }
        for v in [0.1f32, -0.0, 3.4028235e38, 1e-45, 16777217.0] {
            let text = format_f32(v);
            let back: f32 = text.parse().unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v} printed as {text}");
        }
        assert_eq!(format_f64(f64::NAN), "\"nan\"");
        assert_eq!(
            number(&Value::String("-inf".into())),
            Some(f64::NEG_INFINITY)
        );
    }

    #[test]
    fn quoting_leaves_strings_and_integers_alone() {
        let text = r#"{"a": "1.5 \" 2.5", "b": [1, -2, 3.5e-3], "c": -0.0}"#;
        assert_eq!(
            quote_decimals(text),
            r#"{"a": "1.5 \" 2.5", "b": [1, -2, "3.5e-3"], "c": "-0.0"}"#
        );
    }
}
