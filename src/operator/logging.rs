//! The operator's log: `tracing` events on stderr, filtered by `RUST_LOG` (`target=level`
//! directives, default `warn,harness_engine=info`), as text or as one JSON object per
//! line (`--log-format json`). Events inside a reconcile carry the span's fields
//! (`kind`, `namespace`, `name`), so every reconcile line names its object.

use std::{
    fmt::Write as _,
    io::Write as _,
    sync::{Arc, Mutex},
};

use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{Layer, Registry, filter::Targets, layer::Context, registry::LookupSpan};

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The filter when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "warn,harness_engine=info";

/// The filter from `value` (a `RUST_LOG`); an unreadable value falls back to the
/// default and says why.
pub fn filter(value: Option<&str>) -> (Targets, Option<String>) {
    let default = || DEFAULT_FILTER.parse::<Targets>().unwrap_or_default();
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => (default(), None),
        Some(v) => match v.parse::<Targets>() {
            Ok(t) => (t, None),
            Err(e) => (
                default(),
                Some(format!(
                    "RUST_LOG={v:?} is not a list of target=level directives ({e}); using {DEFAULT_FILTER:?}"
                )),
            ),
        },
    }
}

/// The log layer for the process subscriber (see `telemetry::init_with_logs`).
pub fn layer(format: LogFormat) -> Box<dyn Layer<Registry> + Send + Sync> {
    let (targets, complaint) = filter(std::env::var("RUST_LOG").ok().as_deref());
    if let Some(c) = complaint {
        // The subscriber is not installed yet: this is the one line that cannot go
        // through it.
        let _ = writeln!(std::io::stderr(), "{c}");
    }
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(targets)
            .boxed(),
        LogFormat::Json => JsonLines::new(std::io::stderr())
            .with_filter(targets)
            .boxed(),
    }
}

/// Fields of one span, kept in its extensions.
struct SpanFields(serde_json::Map<String, serde_json::Value>);

struct JsonVisitor<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Visit for JsonVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        self.0.insert(field.name().to_owned(), s.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

/// One JSON object per event: `timestamp`, `level`, `target`, `message`, the event's
/// fields, and the fields of every span it happened in (outermost first, the event's
/// own fields win).
pub struct JsonLines<W> {
    out: Arc<Mutex<W>>,
}

impl<W: std::io::Write> JsonLines<W> {
    pub fn new(out: W) -> Self {
        JsonLines {
            out: Arc::new(Mutex::new(out)),
        }
    }
}

impl<S, W> Layer<S> for JsonLines<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: std::io::Write + Send + 'static,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = serde_json::Map::new();
        attrs.record(&mut JsonVisitor(&mut fields));
        span.extensions_mut().insert(SpanFields(fields));
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(SpanFields(fields)) = ext.get_mut::<SpanFields>() {
            values.record(&mut JsonVisitor(fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut line = serde_json::Map::new();
        line.insert(
            "timestamp".into(),
            k8s_openapi::jiff::Timestamp::now().to_string().into(),
        );
        line.insert(
            "level".into(),
            event.metadata().level().as_str().to_lowercase().into(),
        );
        line.insert("target".into(), event.metadata().target().into());
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(SpanFields(fields)) = span.extensions().get::<SpanFields>() {
                    for (k, v) in fields {
                        line.insert(k.clone(), v.clone());
                    }
                }
                line.insert("span".into(), span.name().into());
            }
        }
        event.record(&mut JsonVisitor(&mut line));
        if let Ok(text) = serde_json::to_string(&line)
            && let Ok(mut out) = self.out.lock()
        {
            let _ = writeln!(out, "{text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_name_the_object_of_the_reconcile() {
        let buf = Buffer::default();
        let (targets, _) = filter(Some("harness_engine=info"));
        let subscriber =
            tracing_subscriber::registry().with(JsonLines::new(buf.clone()).with_filter(targets));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                target: "harness_engine::operator",
                "reconcile",
                kind = "HarnessBinding",
                namespace = "team-a",
                name = "conversation-1"
            );
            let _in = span.enter();
            tracing::warn!(target: "harness_engine::operator", reason = "StoreUnavailable", "reconcile failed: store down");
            tracing::debug!(target: "harness_engine::operator", "filtered out");
            tracing::warn!(target: "hyper", "not ours");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        let l = &lines[0];
        assert_eq!(l["level"], "warn");
        assert_eq!(l["namespace"], "team-a");
        assert_eq!(l["name"], "conversation-1");
        assert_eq!(l["kind"], "HarnessBinding");
        assert_eq!(l["reason"], "StoreUnavailable");
        assert_eq!(l["message"], "reconcile failed: store down");
    }

    #[test]
    fn an_unreadable_rust_log_falls_back_to_the_default_and_says_so() {
        let (_, complaint) = filter(Some("harness_engine=loud"));
        assert!(complaint.is_some_and(|c| c.contains("RUST_LOG")));
        let (_, none) = filter(Some("debug,kube=warn"));
        assert!(none.is_none());
        let (_, none) = filter(None);
        assert!(none.is_none());
    }
}
