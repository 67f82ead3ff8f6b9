//! The OpenAPI 3.1 document, generated from the handlers' annotations.
//!
//! Served at `/openapi.json` and committed as `docs/openapi.json`
//! (`harness-engine openapi`, `make openapi`); a test fails when the two drift. What
//! every operation shares is added here once: the bearer security scheme, the optional
//! `traceparent` header, and the error responses with the one error shape.

use utoipa::{
    Modify, OpenApi,
    openapi::{
        ContentBuilder, OpenApi as Document, RefOr, Required, ResponseBuilder,
        path::{Operation, ParameterBuilder, ParameterIn},
        security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme},
    },
};

use super::error::ErrorBody;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Harness Engine data plane",
        description = "Thread state, native objects and streams, pending interrupts and the run ledger of AI-agent harness bindings. \
Errors are one JSON shape {code, message, details} with stable codes. Opaque bodies are application/octet-stream. \
Every mutating call takes an Idempotency-Key; worker calls carry Harness-Epoch and Harness-Lease-Generation. \
See docs/api.md.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    components(schemas(ErrorBody)),
    tags(
        (name = "bindings", description = "Create-or-get and read bindings"),
        (name = "state", description = "The thread-state commit protocol: load head, write pending, commit, mark uncertain"),
        (name = "objects", description = "Binding-scoped native objects"),
        (name = "streams", description = "Binding-scoped native streams"),
        (name = "interrupts", description = "Pending interrupts"),
        (name = "memory", description = "Long-term memory: get, search, put, delete, approve, reject"),
        (name = "runs", description = "The run ledger: append events, read runs, effects and snapshots (docs/ledger.md)"),
    )
)]
struct ApiDoc;

/// Error statuses every operation may answer, with what each means there.
const ERROR_RESPONSES: &[(&str, &str)] = &[
    (
        "401",
        "unauthenticated: missing, unknown, expired, forged or wrong-audience token",
    ),
    (
        "403",
        "forbidden_scope: the caller may not act for this subject or binding",
    ),
    (
        "404",
        "not_found: no such binding (or not yours), object, state or route",
    ),
    (
        "409",
        "stale_lease, stale_epoch, revision_conflict, idempotency_mismatch, run_uncertain, conflict; on the ledger also sequence_conflict, budget_exceeded, effect_confirmed, effect_unresolved, approval_required",
    ),
    (
        "413",
        "too_large: a body, key, document or count is over its limit",
    ),
    (
        "415",
        "unsupported_media_type: the body's Content-Type is not the one this operation takes",
    ),
    ("422", "invalid: a malformed header, query, path or body"),
    (
        "429",
        "rate_limited: the binding's write rate is exceeded; see Retry-After",
    ),
    (
        "500",
        "internal: a defect; the request had no effect that was acknowledged",
    ),
    (
        "503",
        "unavailable: the store or the authenticator failed; retry with the same Idempotency-Key",
    ),
    (
        "504",
        "timeout: the request deadline passed; retry with the same Idempotency-Key",
    ),
];

struct Shared;

impl Modify for Shared {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.security_schemes.insert(
            "bearer".into(),
            RefOr::T(SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("serve: a static token from the token file. Kubernetes: a projected ServiceAccount token with audience harness-engine."))
                    .build(),
            )),
        );
        for (status, description) in ERROR_RESPONSES {
            let response = ResponseBuilder::new()
                .description(*description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                            "ErrorBody",
                        ))))
                        .build(),
                )
                .build();
            components
                .responses
                .insert(error_response_name(status), RefOr::T(response));
        }
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                add_shared(op);
            }
        }
    }
}

fn error_response_name(status: &str) -> String {
    format!("Error{status}")
}

fn add_shared(op: &mut Operation) {
    let traceparent = ParameterBuilder::new()
        .name("traceparent")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "W3C Trace Context. Correlation only, never authority; a malformed value is ignored.",
        ))
        .schema(Some(
            utoipa::openapi::ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::Type::String),
        ))
        .build();
    op.parameters
        .get_or_insert_with(Vec::new)
        .push(RefOr::T(traceparent));
    for (status, _) in ERROR_RESPONSES {
        op.responses
            .responses
            .entry((*status).to_owned())
            .or_insert_with(|| {
                RefOr::Ref(utoipa::openapi::Ref::new(format!(
                    "#/components/responses/{}",
                    error_response_name(status)
                )))
            });
    }
    op.security = Some(vec![SecurityRequirement::new(
        "bearer",
        Vec::<String>::new(),
    )]);
}

/// The document, with the routes of [`super::api_routes`].
pub fn document() -> Document {
    let (_, paths) = super::api_routes().split_for_parts();
    let mut doc = ApiDoc::openapi();
    doc.merge(paths);
    // Shared parts go on after the merge, so they reach every operation.
    Shared.modify(&mut doc);
    doc
}

/// The document as committed: pretty JSON, keys sorted, trailing newline, so the output
/// does not depend on map ordering inside dependencies.
pub fn to_json(doc: &Document) -> String {
    let value = serde_json::to_value(doc)
        .map(sorted)
        .unwrap_or(serde_json::Value::Null);
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sorted).collect())
        }
        other => other,
    }
}
