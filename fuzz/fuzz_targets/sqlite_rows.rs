//! What the SQLite store reads back: a memory row (every column of `harness_memories` as
//! the store selects it) and a binding's head columns, each column any SQLite value
//! (null, integer, real, text, blob), as a corrupt or hand-edited database could hold.
//! A corrupt row is an error, never a panic.
//!
//! Input: one byte choosing the row (even: memory, odd: head), then per column a tag
//! (0 null, 1 integer, 2 real: 8 bytes little-endian; 3 text, 4 blob: a 2-byte
//! little-endian length and the bytes). Columns the input does not reach are null.
#![no_main]

use harness_engine::{
    domain::{ids::BindingId, state::StateScope},
    store::sqlite::{decode_head_row, decode_memory_row},
};
use libfuzzer_sys::fuzz_target;
use rusqlite::{Connection, params_from_iter, types::Value};

const MEMORY_COLUMNS: usize = 22;
const HEAD_COLUMNS: usize = 10;

fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = (data.get(..n)?, data.get(n..)?);
    *data = rest;
    Some(head)
}

fn value(data: &mut &[u8]) -> Value {
    let Some(tag) = take(data, 1).and_then(|t| t.first().copied()) else {
        return Value::Null;
    };
    let eight = |data: &mut &[u8]| take(data, 8).and_then(|b| <[u8; 8]>::try_from(b).ok());
    let bytes = |data: &mut &[u8]| {
        let len = take(data, 2).map_or(0, |l| usize::from(u16::from_le_bytes([l[0], l[1]])));
        let len = len.min(data.len());
        take(data, len).unwrap_or_default().to_vec()
    };
    match tag % 5 {
        1 => eight(data).map_or(Value::Null, |b| Value::Integer(i64::from_le_bytes(b))),
        2 => eight(data).map_or(Value::Null, |b| Value::Real(f64::from_le_bytes(b))),
        3 => Value::Text(String::from_utf8_lossy(&bytes(data)).into_owned()),
        4 => Value::Blob(bytes(data)),
        _ => Value::Null,
    }
}

thread_local! {
    static DB: Connection = Connection::open_in_memory().expect("an in-memory database");
}

fn select(columns: usize) -> String {
    let list: Vec<String> = (1..=columns).map(|i| format!("?{i}")).collect();
    format!("SELECT {}", list.join(", "))
}

fn scope() -> StateScope {
    StateScope {
        binding_id: BindingId::parse("hb_0123456789abcdef0123456789abcdef").expect("a binding id"),
        environment: "fuzz".into(),
        harness: "langgraph".into(),
        epoch: 1,
        codec: "langgraph-checkpoint-v1".into(),
        lease_generation: 2,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, mut rest)) = data.split_first() else {
        return;
    };
    let head = which % 2 == 1;
    let columns = if head { HEAD_COLUMNS } else { MEMORY_COLUMNS };
    let values: Vec<Value> = (0..columns).map(|_| value(&mut rest)).collect();
    DB.with(|db| {
        let mut stmt = db.prepare_cached(&select(columns)).expect("a SELECT of parameters");
        let decoded = stmt.query_row(params_from_iter(values.iter()), |row| {
            Ok(if head {
                decode_head_row(row, &scope()).map(|_| ())
            } else {
                decode_memory_row(row).map(|_| ())
            })
        });
        assert!(decoded.is_ok(), "selecting parameters failed: {decoded:?}");
    });
});
