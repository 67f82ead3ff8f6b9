//! The committed OpenAPI document (`docs/openapi.json`) is what the code generates; a
//! change to the API without `make openapi` fails here.

use harness_engine::server::openapi;
use serde_json::Value;

fn committed() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn committed_document_matches_the_code() {
    let generated = openapi::to_json(&openapi::document());
    if generated != committed() {
        panic!(
            "docs/openapi.json is out of date: run `make openapi` (harness-engine openapi --out docs/openapi.json) and commit it"
        );
    }
}

#[test]
fn every_operation_documents_auth_errors_and_trace_context() {
    let doc: Value = serde_json::from_str(&committed()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
    let paths = doc["paths"]
        .as_object()
        .unwrap_or_else(|| panic!("no paths"));
    let mut operations = 0;
    for (path, item) in paths {
        assert!(path.starts_with("/v1/"), "{path}");
        for (method, op) in item.as_object().into_iter().flatten() {
            operations += 1;
            let responses = op["responses"]
                .as_object()
                .unwrap_or_else(|| panic!("{method} {path}: no responses"));
            for status in ["401", "403", "404", "413", "422", "429", "503", "504"] {
                assert!(
                    responses.contains_key(status),
                    "{method} {path} does not document {status}"
                );
            }
            let params: Vec<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str())
                .collect();
            assert!(params.contains(&"traceparent"), "{method} {path}");
            // Search is a read that takes a JSON body, hence POST.
            let mutating =
                matches!(method.as_str(), "post" | "put" | "delete") && path != "/v1/memory/search";
            assert_eq!(
                params.contains(&"Idempotency-Key"),
                mutating,
                "{method} {path}: Idempotency-Key on every mutating call, and only there"
            );
            assert_eq!(
                op["security"][0]["bearer"],
                Value::Array(vec![]),
                "{method} {path}"
            );
        }
    }
    // 28 state, object, stream, interrupt and memory operations (memory listing, stats
    // and promotion among them); 7 run-ledger operations (begin among them).
    assert_eq!(operations, 37, "operations in the document");
}
