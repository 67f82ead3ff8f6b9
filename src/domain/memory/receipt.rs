//! Signed recall receipts (`spec/003_bab976795353d872.txt` "Receipt-Bound Memory
//! Attribution"): what a memory search returned, to whom, at which exact content
//! versions, signed by the server so a later claim "this memory helped" can be checked
//! against what was really shown.
//!
//! A receipt is `hrr1.` + base64url(canonical JSON of [`RecallReceipt`]) + `.` + the hex
//! HMAC-SHA256 of that JSON under the deployment's identity key. Only its SHA-256
//! ([`receipt_hash`]) is ever stored; receipt-shaped strings anywhere else in a stored
//! payload are refused ([`find_receipt_shaped`]) and never echoed in an error.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::domain::{ids::Keyring, ledger::canonical_json, state::Rejection};

/// The prefix of every receipt.
pub const PREFIX: &str = "hrr1.";

/// Largest receipt accepted (a receipt of 100 results is about 20 KiB).
pub const MAX_RECEIPT_BYTES: usize = 64 << 10;

/// One result as it was shown: the memory, its rank (1 = first) and the exact content
/// version (`sha256:` of the content) at that moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptItem {
    pub memory_id: String,
    pub rank: u32,
    pub content_hash: String,
    /// The scope's namespace key the record lives in.
    pub namespace: String,
    pub memory_key: String,
}

/// What a recall showed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecallReceipt {
    /// The workspace (binding) the recall was made in, and its epoch then (a clear
    /// invalidates the receipts of the old epoch).
    pub binding_id: String,
    pub epoch: u64,
    /// The namespaces searched, in order.
    pub namespaces: Vec<String>,
    pub items: Vec<ReceiptItem>,
    pub issued_at_ms: i64,
}

const MAC_DOMAIN: &str = "recall-receipt/v1";

/// Signs a receipt.
pub fn encode(keyring: &Keyring, receipt: &RecallReceipt) -> String {
    let json = canonical_json(&serde_json::to_value(receipt).unwrap_or(Value::Null));
    keyring.seal(PREFIX, MAC_DOMAIN, &json)
}

/// Checks a receipt's signature and shape. Errors never contain the receipt.
pub fn decode(keyring: &Keyring, receipt: &str) -> Result<RecallReceipt, Rejection> {
    let bad = || Rejection::Invalid("the recall receipt is not one this server signed".into());
    if receipt.len() > MAX_RECEIPT_BYTES {
        return Err(Rejection::Invalid(format!(
            "the recall receipt is longer than {MAX_RECEIPT_BYTES} bytes"
        )));
    }
    let json = keyring.open(PREFIX, MAC_DOMAIN, receipt).ok_or_else(bad)?;
    serde_json::from_slice(&json).map_err(|_| bad())
}

/// What is stored in place of a receipt: `sha256:` of its text.
pub fn receipt_hash(receipt: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(receipt.as_bytes())))
}

/// The dotted path of the first string in `value` that looks like a receipt, if any.
/// Receipts are checked and reduced to their hash before anything is stored; one found
/// elsewhere would put the signed list of what a user was shown into durable storage.
pub fn find_receipt_shaped(value: &Value) -> Option<String> {
    fn walk(value: &Value, path: &mut Vec<String>) -> bool {
        match value {
            Value::String(s) => s.trim_start().starts_with(PREFIX),
            Value::Array(items) => items.iter().enumerate().any(|(i, v)| {
                path.push(i.to_string());
                let found = walk(v, path);
                if !found {
                    path.pop();
                }
                found
            }),
            Value::Object(map) => map.iter().any(|(k, v)| {
                path.push(k.clone());
                let found = walk(v, path);
                if !found {
                    path.pop();
                }
                found
            }),
            _ => false,
        }
    }
    let mut path = Vec::new();
    walk(value, &mut path).then(|| path.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring() -> Keyring {
        Keyring::new(vec![7u8; 32], "test").expect("keyring")
    }

    fn receipt() -> RecallReceipt {
        RecallReceipt {
            binding_id: "hb_0123456789abcdef0123456789abcdef".into(),
            epoch: 2,
            namespaces: vec!["mn_a".into()],
            items: vec![ReceiptItem {
                memory_id: "hm_1".into(),
                rank: 1,
                content_hash: "sha256:ab".into(),
                namespace: "mn_a".into(),
                memory_key: "prefs/language".into(),
            }],
            issued_at_ms: 1,
        }
    }

    #[test]
    fn a_receipt_round_trips_and_any_change_breaks_it() {
        let k = keyring();
        let signed = encode(&k, &receipt());
        assert!(signed.starts_with(PREFIX));
        assert_eq!(decode(&k, &signed).expect("valid"), receipt());
        // Flip one character of the body: the signature no longer matches.
        let (head, mac) = signed.rsplit_once('.').expect("dot");
        let mut body: Vec<char> = head.chars().collect();
        let i = PREFIX.len() + 10;
        body[i] = if body[i] == 'A' { 'B' } else { 'A' };
        let tampered = format!("{}.{mac}", body.into_iter().collect::<String>());
        let err = decode(&k, &tampered).expect_err("tampered");
        assert!(!err.to_string().contains(&tampered));
        // Another deployment's key does not verify it either.
        let other = Keyring::new(vec![8u8; 32], "test").expect("keyring");
        assert!(decode(&other, &signed).is_err());
        assert!(decode(&k, "hrr1.x.y").is_err());
    }

    #[test]
    fn receipt_shaped_values_are_found_at_any_depth() {
        let signed = encode(&keyring(), &receipt());
        let payload = serde_json::json!({"a": [1, {"note": signed}]});
        assert_eq!(find_receipt_shaped(&payload).as_deref(), Some("a.1.note"));
        assert_eq!(
            find_receipt_shaped(&serde_json::json!({"a": "hrr2.x"})),
            None
        );
    }
}
