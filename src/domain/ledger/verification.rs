//! Verification receipts (`spec/003_bab976795353d872.txt` "complete_run": "Governed-v2
//! strong success requires a current server-minted receipt tied to approved preflight,
//! acceptance criteria, current artifacts, run configuration, evaluator, and database
//! epoch").
//!
//! A receipt is `hvr1.` + base64url(canonical JSON of [`VerificationReceipt`]) + `.` +
//! the hex HMAC of that JSON under the server's key. The server mints one when the
//! preflight's evaluator records a passing `verification_evaluated`; a governed-v2
//! `verified_success` presents it, the server checks the signature, the workspace, epoch
//! and run, and records only its hash and the bound digests. Whether it is still
//! current (the latest evaluation, a pass, the same preflight, the same artifacts) is
//! decided in the append's atomic step ([`super::episode`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{canonical_json, episode::Verification};
use crate::domain::{ids::Keyring, state::Rejection};

pub const PREFIX: &str = "hvr1.";
const MAC_DOMAIN: &str = "verification-receipt/v1";
const MAX_RECEIPT_BYTES: usize = 4096;

/// What a verification receipt binds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerificationReceipt {
    pub binding_id: String,
    pub epoch: u64,
    pub run_id: String,
    pub evaluated_seq: u64,
    pub preflight_seq: u64,
    pub criteria_digest: String,
    pub artifacts_digest: String,
    pub run_configuration_digest: String,
    pub evaluator: String,
}

/// Signs a receipt.
pub fn encode(keyring: &Keyring, receipt: &VerificationReceipt) -> String {
    let json = canonical_json(&serde_json::to_value(receipt).unwrap_or(Value::Null));
    keyring.seal(PREFIX, MAC_DOMAIN, &json)
}

/// Checks a receipt's signature and shape. Errors never contain the receipt.
pub fn decode(keyring: &Keyring, receipt: &str) -> Result<VerificationReceipt, Rejection> {
    let bad =
        || Rejection::Invalid("the verification receipt is not one this server signed".into());
    if receipt.len() > MAX_RECEIPT_BYTES {
        return Err(bad());
    }
    let json = keyring.open(PREFIX, MAC_DOMAIN, receipt).ok_or_else(bad)?;
    serde_json::from_slice(&json).map_err(|_| bad())
}

/// What an outcome records in place of the receipt.
pub fn recorded(receipt: &str, r: VerificationReceipt) -> Verification {
    Verification {
        receipt_hash: crate::domain::ids::content_digest(receipt.as_bytes()),
        evaluated_seq: r.evaluated_seq,
        preflight_seq: r.preflight_seq,
        criteria_digest: r.criteria_digest,
        artifacts_digest: r.artifacts_digest,
        run_configuration_digest: r.run_configuration_digest,
        evaluator: r.evaluator,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};

    fn receipt() -> VerificationReceipt {
        VerificationReceipt {
            binding_id: "hb_0123456789abcdef0123456789abcdef".into(),
            epoch: 1,
            run_id: "run_1".into(),
            evaluated_seq: 9,
            preflight_seq: 4,
            criteria_digest: format!("sha256:{}", "a".repeat(64)),
            artifacts_digest: format!("sha256:{}", "b".repeat(64)),
            run_configuration_digest: format!("sha256:{}", "c".repeat(64)),
            evaluator: "ci-suite".into(),
        }
    }

    #[test]
    fn a_receipt_round_trips_and_any_change_breaks_it() {
        let k = Keyring::new(vec![7u8; 32], "primary").unwrap_or_else(|e| panic!("{e}"));
        let signed = encode(&k, &receipt());
        assert_eq!(decode(&k, &signed).expect("valid"), receipt());
        let (body, mac) = signed.rsplit_once('.').expect("dot");
        let mut forged = receipt();
        forged.evaluated_seq = 10;
        let json = canonical_json(&serde_json::to_value(&forged).expect("json"));
        let swapped = format!("{PREFIX}{}.{mac}", URL_SAFE_NO_PAD.encode(json.as_bytes()));
        for bad in [
            swapped,
            format!("{body}.{}", "0".repeat(64)),
            "hvr1.x".into(),
        ] {
            let err = decode(&k, &bad).expect_err("refused");
            assert!(!err.to_string().contains("hvr1."), "{err}");
        }
        let other = Keyring::new(vec![8u8; 32], "primary").unwrap_or_else(|e| panic!("{e}"));
        assert!(decode(&other, &signed).is_err(), "another server's key");
    }
}
