//! The one allowlist of what may leave the process in a span (spec 000 "Attribute and
//! baggage policy"), and the scrubbing step that applies it to every span right before
//! export.
//!
//! Everything not named in [`ATTRIBUTES`] is dropped: span attributes, event
//! attributes, link attributes and resource attributes alike. A named key keeps its value
//! only if the value also passes the key's [`Rule`], so a raw subject or a prompt put
//! into an allowed key by mistake is still dropped. Span names outside [`SPAN_NAMES`]
//! are replaced, events outside [`EVENT_NAMES`] are removed, status descriptions and
//! `tracestate` (caller-supplied vendor data) are cleared.

use std::borrow::Cow;

use opentelemetry::{
    KeyValue, Value,
    trace::{SpanContext, Status, TraceState},
};
use opentelemetry_sdk::trace::SpanData;

use super::spans;

/// What a value of an allowed key must look like.
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    /// One of a fixed set of strings (outcomes, error categories, operations).
    OneOf(&'static [&'static str]),
    /// An opaque identifier: `prefix` then 8 to 64 lowercase hex digits (keyed digests
    /// such as binding ids `hb_...`; never a raw subject).
    Digest(&'static str),
    /// A non-negative integer (sizes, counts, durations, generations).
    Count,
    /// A boolean.
    Flag,
    /// A low-cardinality name set by the operator (service name, version, route
    /// template): 1 to `max` of `[A-Za-z0-9._/{}:-]`.
    Name(usize),
}

/// One allowed attribute key.
#[derive(Clone, Copy, Debug)]
pub struct Allowed {
    pub key: &'static str,
    pub rule: Rule,
    /// Why it is allowed, in the contract's words.
    pub note: &'static str,
}

/// Stable error codes of the data-plane API (DESIGN §6), the only `error.type` values.
pub const ERROR_TYPES: &[&str] = &[
    "stale_lease",
    "stale_epoch",
    "revision_conflict",
    "idempotency_mismatch",
    "run_uncertain",
    "conflict",
    "invalid",
    "too_large",
    "rate_limited",
    "forbidden_scope",
    "unauthenticated",
    "not_found",
    "method_not_allowed",
    "unsupported_media_type",
    "unavailable",
    "timeout",
    "internal",
];

/// Outcomes a span may report.
pub const OUTCOMES: &[&str] = &[
    "ok",
    "error",
    "created",
    "existing",
    "replayed",
    "continued",
    "restarted",
    "replaced",
    "absent",
    "claimed",
    "reused",
    "bound",
    "requeued",
];

/// Operations a span may name (what the step did to thread state, memory or a sandbox).
pub const OPERATIONS: &[&str] = &[
    "binding.create",
    "binding.get",
    "state.head",
    "state.read",
    "state.pending",
    "state.commit",
    "state.uncertain",
    "object.get",
    "object.put",
    "object.list",
    "object.delete",
    "stream.append",
    "stream.load",
    "stream.list",
    "stream.delete",
    "interrupt.get",
    "interrupt.resume",
    "memory.put",
    "memory.get",
    "memory.search",
    "memory.list",
    "memory.delete",
    "memory.approve",
    "memory.reject",
    "reconcile.binding",
    "reconcile.profile",
    "reconcile.memory_policy",
];

/// The allowlist: every attribute key that may be exported, and the shape of its value.
/// This is the single table; nothing else decides what leaves the process.
pub const ATTRIBUTES: &[Allowed] = &[
    // Resource (who exports).
    Allowed {
        key: "service.name",
        rule: Rule::Name(64),
        note: "deployment-chosen service name",
    },
    Allowed {
        key: "service.version",
        rule: Rule::Name(64),
        note: "harness engine version",
    },
    Allowed {
        key: "service.namespace",
        rule: Rule::Name(64),
        note: "deployment-chosen grouping",
    },
    Allowed {
        key: "service.instance.id",
        rule: Rule::Name(128),
        note: "opaque instance id",
    },
    Allowed {
        key: "deployment.environment.name",
        rule: Rule::Name(64),
        note: "environment id",
    },
    Allowed {
        key: "telemetry.sdk.name",
        rule: Rule::Name(64),
        note: "SDK identity",
    },
    Allowed {
        key: "telemetry.sdk.language",
        rule: Rule::Name(32),
        note: "SDK identity",
    },
    Allowed {
        key: "telemetry.sdk.version",
        rule: Rule::Name(32),
        note: "SDK identity",
    },
    // Request shape: templates, never concrete paths (a path carries ids and keys).
    Allowed {
        key: "http.request.method",
        rule: Rule::OneOf(&[
            "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "other",
        ]),
        note: "operation",
    },
    Allowed {
        key: "http.route",
        rule: Rule::Name(128),
        note: "route template",
    },
    Allowed {
        key: "http.response.status_code",
        rule: Rule::Count,
        note: "outcome",
    },
    // Outcomes and categories.
    Allowed {
        key: "harness.outcome",
        rule: Rule::OneOf(OUTCOMES),
        note: "outcome",
    },
    Allowed {
        key: "error.type",
        rule: Rule::OneOf(ERROR_TYPES),
        note: "error category",
    },
    Allowed {
        key: "harness.operation",
        rule: Rule::OneOf(OPERATIONS),
        note: "operation",
    },
    Allowed {
        key: "harness.caller.kind",
        rule: Rule::OneOf(&["principal", "service", "worker"]),
        note: "capability level of the caller",
    },
    Allowed {
        key: "harness.trace_ingress",
        rule: Rule::OneOf(&["continued", "restarted", "replaced", "absent"]),
        note: "what ingress policy did with the caller's context",
    },
    // Opaque / keyed identifiers.
    Allowed {
        key: "harness.binding.id",
        rule: Rule::Digest("hb_"),
        note: "hmac binding id",
    },
    Allowed {
        key: "harness.kind",
        rule: Rule::OneOf(&["harness_binding", "sandbox_profile", "memory_policy"]),
        note: "reconciled kind",
    },
    Allowed {
        key: "harness.harness",
        rule: Rule::OneOf(&["deepagents", "claude_agent_sdk", "strands", "agentcore"]),
        note: "harness id",
    },
    // Numbers: generations, retries, counts, sizes, durations.
    Allowed {
        key: "harness.epoch",
        rule: Rule::Count,
        note: "conversation epoch",
    },
    Allowed {
        key: "harness.lease.generation",
        rule: Rule::Count,
        note: "lease generation",
    },
    Allowed {
        key: "harness.revision",
        rule: Rule::Count,
        note: "durable revision",
    },
    Allowed {
        key: "harness.retry.count",
        rule: Rule::Count,
        note: "retry count",
    },
    Allowed {
        key: "harness.attempt",
        rule: Rule::Count,
        note: "attempt under one anchor",
    },
    Allowed {
        key: "harness.size_bytes",
        rule: Rule::Count,
        note: "size",
    },
    Allowed {
        key: "harness.count",
        rule: Rule::Count,
        note: "entry / object / memory count",
    },
    Allowed {
        key: "harness.duration_ms",
        rule: Rule::Count,
        note: "duration",
    },
    Allowed {
        key: "harness.created",
        rule: Rule::Flag,
        note: "outcome",
    },
];

/// Span names that may be exported: the contract topology (see [`spans`]).
pub const SPAN_NAMES: &[&str] = spans::ALL;

/// What a span with a name outside [`SPAN_NAMES`] is exported as.
pub const UNLISTED_SPAN: &str = "harness.unlisted";

/// Span event names that may be exported (their attributes pass the same table).
pub const EVENT_NAMES: &[&str] = &["harness.trace_context_replaced"];

/// The allowlist entry for `key`, if any.
pub fn lookup(key: &str) -> Option<&'static Allowed> {
    ATTRIBUTES.iter().find(|a| a.key == key)
}

fn is_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `value` passes `rule`.
pub fn value_allowed(rule: Rule, value: &Value) -> bool {
    match (rule, value) {
        (Rule::OneOf(set), Value::String(s)) => set.contains(&s.as_str()),
        (Rule::Digest(prefix), Value::String(s)) => s
            .as_str()
            .strip_prefix(prefix)
            .is_some_and(|hex| (8..=64).contains(&hex.len()) && is_hex(hex)),
        (Rule::Count, Value::I64(n)) => *n >= 0,
        (Rule::Flag, Value::Bool(_)) => true,
        (Rule::Name(max), Value::String(s)) => {
            let s = s.as_str();
            !s.is_empty()
                && s.len() <= max
                && s.bytes().all(|b| {
                    b.is_ascii_alphanumeric()
                        || matches!(b, b'.' | b'_' | b'/' | b'{' | b'}' | b':' | b'-')
                })
        }
        _ => false,
    }
}

/// Whether one attribute may be exported.
pub fn attribute_allowed(kv: &KeyValue) -> bool {
    lookup(kv.key.as_str()).is_some_and(|a| value_allowed(a.rule, &kv.value))
}

/// Keeps only allowed attributes; returns how many were dropped.
pub fn scrub_attributes(attributes: &mut Vec<KeyValue>) -> u32 {
    let before = attributes.len();
    attributes.retain(attribute_allowed);
    u32::try_from(before - attributes.len()).unwrap_or(u32::MAX)
}

fn without_trace_state(cx: &SpanContext) -> SpanContext {
    SpanContext::new(
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags(),
        cx.is_remote(),
        TraceState::default(),
    )
}

/// Applies the allowlist to one span, in place.
pub fn scrub_span(span: &mut SpanData) {
    if !SPAN_NAMES.contains(&span.name.as_ref()) {
        span.name = Cow::Borrowed(UNLISTED_SPAN);
    }
    span.span_context = without_trace_state(&span.span_context);
    let dropped = scrub_attributes(&mut span.attributes);
    span.dropped_attributes_count = span.dropped_attributes_count.saturating_add(dropped);

    let before = span.events.events.len();
    span.events
        .events
        .retain(|e| EVENT_NAMES.contains(&e.name.as_ref()));
    let removed = u32::try_from(before - span.events.events.len()).unwrap_or(u32::MAX);
    span.events.dropped_count = span.events.dropped_count.saturating_add(removed);
    for event in &mut span.events.events {
        let dropped = scrub_attributes(&mut event.attributes);
        event.dropped_attributes_count = event.dropped_attributes_count.saturating_add(dropped);
    }

    for link in &mut span.links.links {
        link.span_context = without_trace_state(&link.span_context);
        let dropped = scrub_attributes(&mut link.attributes);
        link.dropped_attributes_count = link.dropped_attributes_count.saturating_add(dropped);
    }

    // A status description is free text (an error message may quote input): keep only
    // the code.
    if let Status::Error { .. } = span.status {
        span.status = Status::error("");
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use opentelemetry::{
        InstrumentationScope,
        trace::{Event, Link, SpanId, SpanKind, TraceFlags, TraceId},
    };
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};

    use super::*;

    #[test]
    fn every_key_is_listed_once() {
        let mut keys: Vec<&str> = ATTRIBUTES.iter().map(|a| a.key).collect();
        keys.sort_unstable();
        let n = keys.len();
        keys.dedup();
        assert_eq!(n, keys.len(), "duplicate allowlist key");
    }

    #[test]
    fn values_must_fit_their_rule() {
        let ok = |k: &'static str, v: Value| attribute_allowed(&KeyValue::new(k, v));
        assert!(ok(
            "harness.binding.id",
            "hb_0123456789abcdef0123456789abcdef".into()
        ));
        assert!(!ok("harness.binding.id", "user:alice@example.com".into()));
        assert!(!ok("harness.binding.id", "hb_XYZ".into()));
        assert!(ok("harness.outcome", "ok".into()));
        assert!(!ok(
            "harness.outcome",
            "ok but the prompt was: hello".into()
        ));
        assert!(ok("harness.size_bytes", Value::I64(12)));
        assert!(!ok("harness.size_bytes", Value::I64(-1)));
        assert!(!ok("harness.size_bytes", "12".into()));
        assert!(ok(
            "http.route",
            "/v1/bindings/{binding_id}/state/head".into()
        ));
        assert!(!ok("http.route", "/v1/bindings/x?key=secret value".into()));
        assert!(!ok("enduser.id", "alice".into()), "unlisted key");
        assert!(!ok("authorization", "Bearer abc".into()), "unlisted key");
    }

    #[test]
    fn scrubbing_a_span_removes_everything_unlisted() {
        let cx = SpanContext::new(
            TraceId::from_bytes([1; 16]),
            SpanId::from_bytes([2; 8]),
            TraceFlags::SAMPLED,
            false,
            "vendor=secret-canary".parse().unwrap_or_default(),
        );
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            "prompt: secret-canary",
            SystemTime::now(),
            vec![KeyValue::new("message", "secret-canary")],
            0,
        ));
        events.events.push(Event::new(
            "harness.trace_context_replaced",
            SystemTime::now(),
            vec![
                KeyValue::new("harness.trace_ingress", "replaced"),
                KeyValue::new("traceparent", "secret-canary"),
            ],
            0,
        ));
        let mut links = SpanLinks::default();
        links.links.push(Link::new(
            cx.clone(),
            vec![KeyValue::new("token", "secret-canary")],
            0,
        ));
        let mut span = SpanData {
            span_context: cx,
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: Cow::Borrowed("GET /v1/secret-canary"),
            start_time: SystemTime::now(),
            end_time: SystemTime::now(),
            attributes: vec![
                KeyValue::new("harness.outcome", "ok"),
                KeyValue::new("enduser.id", "secret-canary"),
                KeyValue::new("harness.operation", "secret-canary"),
            ],
            dropped_attributes_count: 0,
            events,
            links,
            status: Status::error("secret-canary"),
            instrumentation_scope: InstrumentationScope::builder("harness-engine").build(),
        };
        scrub_span(&mut span);
        let text = format!("{span:?}");
        assert!(!text.contains("secret-canary"), "{text}");
        assert_eq!(span.name, UNLISTED_SPAN);
        assert_eq!(
            span.attributes,
            vec![KeyValue::new("harness.outcome", "ok")]
        );
        assert_eq!(span.dropped_attributes_count, 2);
        assert_eq!(span.events.events.len(), 1);
        assert_eq!(span.events.events[0].attributes.len(), 1);
        assert!(span.links.links[0].attributes.is_empty());
        assert_eq!(span.status, Status::error(""));
    }
}
