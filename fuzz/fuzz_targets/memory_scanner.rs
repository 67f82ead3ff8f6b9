//! The memory write pipeline's scanner and redactor on any text: never panics, and what
//! redaction leaves is a fixed point: redacting it again changes nothing (the corpus keeps
//! `regression_redaction_fixed_point`, the input that once broke it: docs/reliability.md
//! "Fuzzing").
#![no_main]

use harness_engine::domain::memory::{scan, secrets};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = scan::scan(text);
    let (redacted, _) = scan::redact(text);
    let (again, _) = scan::redact(&redacted);
    assert_eq!(again, redacted, "redaction left a secret behind");
    let _ = secrets::redact_with_findings(text);
});
