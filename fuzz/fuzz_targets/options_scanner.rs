//! The harness options scanner of the admission webhook (`SandboxProfile`
//! `spec.harness.options`): any JSON object, and any key and value on their own.
#![no_main]

use harness_engine::webhook::options;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(data) {
        let _ = options::validate(&map);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = options::words(text);
        let _ = options::classify_name(text);
        let _ = options::classify_value(text);
    }
});
