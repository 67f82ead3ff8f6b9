//! The memory write pipeline's scanner and redactor on any text: never panics, and what
//! redaction leaves holds no secret the redactor would take out again.
#![no_main]

use harness_engine::domain::memory::{scan, secrets};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = scan::scan(text);
    let (redacted, _) = scan::redact(text);
    let (again, more) = scan::redact(&redacted);
    assert_eq!(more, 0, "redaction left a secret behind: {again:?}");
    let _ = secrets::redact_with_findings(text);
});
