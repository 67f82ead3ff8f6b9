//! Go-style durations as `SandboxProfile.spec.timeouts` spells them: one or more
//! `<digits><unit>` groups, unit `ms`, `s`, `m` or `h` (`90s`, `2m`, `1h30m`). The same
//! grammar as the CRD's pattern, so whatever the webhook admits the controller can read.

use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DurationError {
    #[error("is empty; write a duration such as 90s, 2m or 1h30m")]
    Empty,
    #[error(
        "{0:?} is not a duration; write digits and a unit (ms, s, m, h), such as 90s, 2m or 1h30m"
    )]
    Malformed(String),
    #[error("{0:?} is too large")]
    Overflow(String),
}

/// Parses `90s`, `2m`, `1h30m`, `500ms`.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let malformed = || DurationError::Malformed(text.to_owned());
    let overflow = || DurationError::Overflow(text.to_owned());
    let bytes = text.as_bytes();
    let mut total_ms: u64 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(malformed());
        }
        let number: u64 = text[start..i].parse().map_err(|_| overflow())?;
        let unit_ms: u64 = if text[i..].starts_with("ms") {
            i += 2;
            1
        } else {
            let unit = match bytes.get(i) {
                Some(b's') => 1_000,
                Some(b'm') => 60_000,
                Some(b'h') => 3_600_000,
                _ => return Err(malformed()),
            };
            i += 1;
            unit
        };
        let part = number.checked_mul(unit_ms).ok_or_else(overflow)?;
        total_ms = total_ms.checked_add(part).ok_or_else(overflow)?;
    }
    Ok(Duration::from_millis(total_ms))
}

/// `1h30m` style rendering for messages.
pub fn display(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, size) in [("h", 3_600_000u128), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_durations() {
        for (text, ms) in [
            ("90s", 90_000),
            ("2m", 120_000),
            ("1h30m", 5_400_000),
            ("500ms", 500),
            ("1m500ms", 60_500),
            ("12h", 43_200_000),
            ("0s", 0),
        ] {
            assert_eq!(parse(text), Ok(Duration::from_millis(ms)), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for text in ["", "90", "s", "1.5h", "1d", "-1s", "1h 30m", "2M", "10sec"] {
            assert!(parse(text).is_err(), "{text}");
        }
        assert!(matches!(
            parse("99999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
        assert!(matches!(
            parse("9999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn displays_compactly() {
        assert_eq!(display(Duration::from_millis(5_400_000)), "1h30m");
        assert_eq!(display(Duration::from_millis(60_500)), "1m500ms");
        assert_eq!(display(Duration::ZERO), "0s");
    }
}
