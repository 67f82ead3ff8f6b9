//! What the stores read back: ledger events and heads (JSON on SQLite and in MongoDB
//! documents) and MongoDB memory documents (BSON). A corrupt document is an error, never
//! a panic; any decodable event folds without panicking.
#![no_main]

use harness_engine::{
    domain::ledger::{LedgerEvent, LedgerState},
    store::mongo::decode_memory_document,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = serde_json::from_slice::<LedgerEvent>(data) {
        let state = LedgerState::replay([&event]);
        let _ = state.projection_health(Some(state.last_seq));
    }
    if let Ok(mut head) = serde_json::from_slice::<LedgerState>(data) {
        let _ = head.check_reducer();
        if let Ok(event) = serde_json::from_slice::<LedgerEvent>(data) {
            head.apply(&event);
        }
    }
    let _ = decode_memory_document(data);
});
