//! W3C Trace Context and baggage at the edges (spec 000 "Propagation", "Attribute and
//! baggage policy").
//!
//! Ingress: `traceparent` is validated; a valid one is continued or, under the
//! `restart` policy, only linked; a malformed one is replaced by a new root and counted.
//! `tracestate` is kept only next to a valid `traceparent` and only when well-formed and
//! bounded. Baggage members are kept only when their key is declared in [`BAGGAGE`]
//! (empty: baggage is dropped entirely by default). Nothing read here ever authorizes
//! anything: the result is used to parent a span, and for nothing else.
//!
//! Egress: [`inject`] writes context only for [`Destination::Trusted`] internal calls;
//! external or provider endpoints get nothing.

use std::{fmt, str::FromStr};

use opentelemetry::{
    Context,
    trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState},
};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{export::stats, spans::keys};

/// What to do with a well-formed incoming `traceparent`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IngressPolicy {
    /// Continue the caller's trace: `harness.request` becomes a child of the caller's
    /// span. For callers inside the trust boundary (control-plane services, workers).
    #[default]
    Continue,
    /// Start a new trace for every request and link the caller's span context to it,
    /// for deployments where callers' trace ids must not shape ours.
    Restart,
}

impl IngressPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            IngressPolicy::Continue => "continue",
            IngressPolicy::Restart => "restart",
        }
    }
}

impl fmt::Display for IngressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IngressPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "continue" => Ok(IngressPolicy::Continue),
            "restart" => Ok(IngressPolicy::Restart),
            other => Err(format!(
                "trace ingress policy must be `continue` or `restart`, not {other:?}"
            )),
        }
    }
}

/// One declared baggage key: the only baggage that may travel with a request.
#[derive(Clone, Copy, Debug)]
pub struct BaggageKey {
    pub key: &'static str,
    /// Longest value kept.
    pub max_len: usize,
}

/// The baggage schema. Empty by default (spec 000: "Baggage is empty by default"):
/// adding a key here is a reviewed change, and its value must be opaque
/// (`[A-Za-z0-9_-]`, at most `max_len`).
pub const BAGGAGE: &[BaggageKey] = &[];

/// Largest `tracestate` kept (the W3C limit on what a vendor must propagate).
pub const MAX_TRACESTATE_BYTES: usize = 512;
/// Most `tracestate` members kept.
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// What ingress did with the caller's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No `traceparent`: a new root.
    Absent,
    /// A valid one, continued.
    Continued,
    /// A valid one, not continued (policy `restart`): a new root linked to it.
    Restarted,
    /// A malformed one, replaced by a new root.
    Replaced,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Absent => "absent",
            Verdict::Continued => "continued",
            Verdict::Restarted => "restarted",
            Verdict::Replaced => "replaced",
        }
    }
}

/// The result of ingress: how to parent the request span.
#[derive(Clone, Debug)]
pub struct Ingress {
    pub verdict: Verdict,
    /// The caller's span context, when valid.
    pub remote: Option<SpanContext>,
    /// Declared baggage members kept (none unless [`BAGGAGE`] declares keys).
    pub baggage: Vec<(&'static str, String)>,
}

/// `version-traceid-parentid-flags`, lowercase hex; ids not all zero; version `ff`
/// invalid; version `00` has exactly four fields, later versions may append more.
pub fn valid_traceparent(value: &str) -> bool {
    parse_traceparent(value).is_some()
}

fn parse_traceparent(value: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
    let parts: Vec<&str> = value.trim().split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    let [version, trace, parent, flags, rest @ ..] = parts.as_slice() else {
        return None;
    };
    let ok = hex(version, 2)
        && *version != "ff"
        && (rest.is_empty() || *version != "00")
        && hex(trace, 32)
        && nonzero(trace)
        && hex(parent, 16)
        && nonzero(parent)
        && hex(flags, 2);
    if !ok {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(parent).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    // Only the sampled bit is defined; others are ignored (W3C: do not propagate them).
    Some((trace_id, span_id, TraceFlags::new(flags & 0x01)))
}

/// A bounded, well-formed `tracestate`, or none.
fn parse_tracestate(value: &str) -> Option<TraceState> {
    if value.len() > MAX_TRACESTATE_BYTES
        || value.split(',').filter(|m| !m.trim().is_empty()).count() > MAX_TRACESTATE_MEMBERS
    {
        return None;
    }
    TraceState::from_str(value).ok()
}

fn parse_baggage(value: Option<&str>) -> (Vec<(&'static str, String)>, u64) {
    let Some(value) = value else {
        return (Vec::new(), 0);
    };
    let mut kept = Vec::new();
    let mut dropped = 0;
    for member in value.split(',').filter(|m| !m.trim().is_empty()) {
        let pair = member.split(';').next().unwrap_or_default();
        let declared = pair.split_once('=').and_then(|(k, v)| {
            let (k, v) = (k.trim(), v.trim());
            BAGGAGE
                .iter()
                .find(|d| d.key == k)
                .filter(|d| {
                    !v.is_empty()
                        && v.len() <= d.max_len
                        && v.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                })
                .map(|d| (d.key, v.to_owned()))
        });
        match declared {
            Some(kv) => kept.push(kv),
            None => dropped += 1,
        }
    }
    (kept, dropped)
}

/// Reads the caller's context from request headers (`get` returns a header's value,
/// `None` when absent or not visible ASCII).
pub fn extract<'a>(get: impl Fn(&str) -> Option<&'a str>, policy: IngressPolicy) -> Ingress {
    let (baggage, dropped) = parse_baggage(get("baggage"));
    stats().count_baggage_dropped(dropped);
    let header_present = get("traceparent").is_some();
    let parsed = get("traceparent").and_then(parse_traceparent);
    let verdict;
    let remote = match parsed {
        None => {
            verdict = if header_present {
                Verdict::Replaced
            } else {
                Verdict::Absent
            };
            None
        }
        Some((trace_id, span_id, flags)) => {
            verdict = match policy {
                IngressPolicy::Continue => Verdict::Continued,
                IngressPolicy::Restart => Verdict::Restarted,
            };
            let state = get("tracestate")
                .and_then(parse_tracestate)
                .unwrap_or_default();
            Some(SpanContext::new(trace_id, span_id, flags, true, state))
        }
    };
    stats().count_ingress(verdict.as_str());
    Ingress {
        verdict,
        remote,
        baggage,
    }
}

/// Parents (or links) a fresh request span according to the ingress verdict. Must be
/// called before the span is entered.
pub fn apply(span: &Span, ingress: &Ingress) {
    span.record(keys::TRACE_INGRESS, ingress.verdict.as_str());
    match (ingress.verdict, &ingress.remote) {
        (Verdict::Continued, Some(remote)) => {
            let _ = span.set_parent(Context::new().with_remote_span_context(remote.clone()));
        }
        (Verdict::Restarted, Some(remote)) => {
            // Correlation without parenthood; the link's tracestate is cleared at export.
            span.add_link(remote.clone());
        }
        (Verdict::Replaced, _) => {
            span.add_event(
                "harness.trace_context_replaced",
                vec![opentelemetry::KeyValue::new(
                    keys::TRACE_INGRESS,
                    "replaced",
                )],
            );
        }
        _ => {}
    }
}

/// Where an outgoing call goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A trusted internal service (a sandbox worker, the store facade): propagate.
    Trusted,
    /// An external or provider endpoint: suppress internal context and baggage.
    External,
}

/// Writes `traceparent` (and `tracestate`, and declared baggage) of `span` for an
/// outgoing call to a trusted destination; writes nothing for an external one.
pub fn inject(
    span: &Span,
    baggage: &[(&'static str, String)],
    destination: Destination,
    mut set: impl FnMut(&'static str, String),
) {
    if destination == Destination::External {
        return;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return;
    }
    set(
        "traceparent",
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8() & 0x01
        ),
    );
    let state = sc.trace_state().header();
    if !state.is_empty() {
        set("tracestate", state);
    }
    let members: Vec<String> = baggage
        .iter()
        .filter(|(k, _)| BAGGAGE.iter().any(|d| d.key == *k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !members.is_empty() {
        set("baggage", members.join(","));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const OK: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_syntax() {
        assert!(valid_traceparent(OK));
        assert!(
            valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"),
            "future versions may add fields"
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            assert!(!valid_traceparent(bad), "{bad:?}");
        }
    }

    fn run(headers: &[(&str, &str)], policy: IngressPolicy) -> Ingress {
        let map: HashMap<String, String> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        extract(|k| map.get(k).map(String::as_str), policy)
    }

    #[test]
    fn policies() {
        let i = run(&[("traceparent", OK)], IngressPolicy::Continue);
        assert_eq!(i.verdict, Verdict::Continued);
        let remote = i.remote.expect("remote");
        assert_eq!(
            remote.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(remote.is_sampled());

        let i = run(&[("traceparent", OK)], IngressPolicy::Restart);
        assert_eq!(i.verdict, Verdict::Restarted);

        let i = run(&[("traceparent", "00-zz-11-01")], IngressPolicy::Continue);
        assert_eq!(i.verdict, Verdict::Replaced);
        assert!(i.remote.is_none());

        let i = run(&[], IngressPolicy::Continue);
        assert_eq!(i.verdict, Verdict::Absent);
    }

    #[test]
    fn tracestate_is_bounded_and_optional() {
        let i = run(
            &[("traceparent", OK), ("tracestate", "vendor=abc,other=def")],
            IngressPolicy::Continue,
        );
        assert_eq!(
            i.remote.expect("remote").trace_state().get("vendor"),
            Some("abc")
        );
        let long = format!("vendor={}", "a".repeat(600));
        let i = run(
            &[("traceparent", OK), ("tracestate", &long)],
            IngressPolicy::Continue,
        );
        let remote = i.remote.expect("traceparent still continued");
        assert_eq!(remote.trace_state().header(), "");
        let i = run(
            &[("traceparent", OK), ("tracestate", "Not Valid==")],
            IngressPolicy::Continue,
        );
        assert_eq!(i.verdict, Verdict::Continued);
    }

    #[test]
    fn undeclared_baggage_is_dropped() {
        let i = run(
            &[("baggage", "user.email=alice@example.com,token=abc;p=1")],
            IngressPolicy::Continue,
        );
        assert!(i.baggage.is_empty());
    }

    #[test]
    fn external_calls_get_no_context() {
        let mut set = Vec::new();
        inject(&Span::none(), &[], Destination::External, |k, v| {
            set.push((k, v))
        });
        assert!(set.is_empty());
    }
}
