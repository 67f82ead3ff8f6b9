//! Schema fragments that schemars cannot derive on its own: Kubernetes list semantics
//! and free-form objects. Kept in one place so every CRD uses them the same way.

use schemars::{Schema, SchemaGenerator, json_schema};

/// `conditions`: a list-map keyed by `type`, as the Kubernetes API conventions ask, so
/// server-side apply merges one condition at a time.
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let item =
        generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>();
    json_schema!({
        "type": "array",
        "description": "Conditions in the standard Kubernetes shape, one per type. `Ready` is the summary.",
        "items": item,
        "maxItems": 16,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"]
    })
}

/// Harness options: a free-form JSON object owned by the harness adapter. The API server
/// only checks it is an object with a bounded number of top-level keys; the admission
/// webhook checks its encoded size and that it names no secrets, commands or code.
pub fn harness_options(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "Adapter-owned options, validated by the adapter's JSON schema. At most 32 KiB encoded; never secrets, tokens, credentials, environment dictionaries, module paths, commands or code (those are refused at admission).",
        "maxProperties": 64,
        "x-kubernetes-preserve-unknown-fields": true
    })
}
