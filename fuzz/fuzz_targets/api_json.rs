//! Request bodies of the API: the structural bound every JSON body passes before a tree
//! is built, then the bodies themselves. What the bound admits is within its depth and
//! element limits.
#![no_main]

use harness_engine::server::{
    dto::BindRequest,
    extract::{MAX_JSON_DEPTH, MAX_JSON_VALUES, json_shape},
    ledger_routes::AppendEventBody,
    memory_routes::{MemoryPutRequest, MemorySearchRequest},
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn measure(v: &Value, depth: usize, count: &mut usize) -> usize {
    *count += 1;
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| measure(i, depth + 1, count))
            .max()
            .unwrap_or(depth + 1),
        Value::Object(map) => map
            .values()
            .map(|i| measure(i, depth + 1, count))
            .max()
            .unwrap_or(depth + 1),
        _ => depth,
    }
}

fuzz_target!(|data: &[u8]| {
    if json_shape(data, MAX_JSON_DEPTH, MAX_JSON_VALUES).is_err() {
        return;
    }
    if let Ok(value) = serde_json::from_slice::<Value>(data) {
        let mut count = 0;
        let depth = measure(&value, 0, &mut count);
        assert!(depth <= MAX_JSON_DEPTH + 1, "depth {depth} passed the bound");
        assert!(count <= MAX_JSON_VALUES + 1, "{count} values passed the bound");
    }
    let _ = serde_json::from_slice::<AppendEventBody>(data);
    let _ = serde_json::from_slice::<MemoryPutRequest>(data);
    let _ = serde_json::from_slice::<MemorySearchRequest>(data);
    let _ = serde_json::from_slice::<BindRequest>(data);
});
