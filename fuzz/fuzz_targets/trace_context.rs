//! The W3C trace-context ingress: `traceparent`, `tracestate` and `baggage` as any caller
//! may send them (one per line of the input). Never panics; a traceparent the parser
//! accepts yields a remote span context under the continue policy.
#![no_main]

use harness_engine::telemetry::propagation::{IngressPolicy, extract, valid_traceparent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.splitn(3, '\n');
    let traceparent = lines.next().unwrap_or_default();
    let tracestate = lines.next();
    let baggage = lines.next();
    let get = |name: &str| match name {
        "traceparent" => Some(traceparent),
        "tracestate" => tracestate,
        "baggage" => baggage,
        _ => None,
    };
    let valid = valid_traceparent(traceparent);
    let continued = extract(get, IngressPolicy::Continue);
    if valid {
        assert!(continued.remote.is_some(), "a valid traceparent is continued");
    }
    let _ = extract(get, IngressPolicy::Restart);
});
