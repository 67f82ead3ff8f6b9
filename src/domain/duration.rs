//! Go-style durations as the CRDs spell them (`90s`, `2m`, `1h30m`, `250ms`): only the
//! units the CRD patterns allow, no signs, no fractions.

use std::time::Duration;

/// Parses `"1h30m"`-style durations. The error says what was wrong.
pub fn parse(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut total = Duration::ZERO;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return Err(format!("{s:?}: expected a number at position {start}"));
        }
        let n: u64 = s[start..i]
            .parse()
            .map_err(|_| format!("{s:?}: number too large"))?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = match &s[unit_start..i] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "" => return Err(format!("{s:?}: missing unit after {n} (use ms, s, m or h)")),
            other => return Err(format!("{s:?}: unknown unit {other:?} (use ms, s, m or h)")),
        };
        let part = unit
            .checked_mul(u32::try_from(n).map_err(|_| format!("{s:?}: number too large"))?)
            .ok_or_else(|| format!("{s:?}: too long"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("{s:?}: too long"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_the_crds_spell_them() {
        let ok = [
            ("250ms", Duration::from_millis(250)),
            ("90s", Duration::from_secs(90)),
            ("2m", Duration::from_secs(120)),
            ("1h30m", Duration::from_secs(5400)),
            ("12h", Duration::from_secs(43200)),
        ];
        for (s, d) in ok {
            assert_eq!(parse(s), Ok(d), "{s}");
        }
        for bad in ["", "5", "m", "1d", "-1s", "1.5h", "1h 2m"] {
            assert!(parse(bad).is_err(), "{bad} should be refused");
        }
    }
}
