//! Identities as keyed digests (HMAC-SHA256 with an environment-held key).
//!
//! Raw subjects, emails and client idempotency keys never appear in an id, a key or an
//! index: `spec/001_78d7ff78f70a2a2a.txt` §2 ("_id: keyed digest of environment, owner
//! subject, agent, and conversation") and §4 ("last_idempotency_key_hash: keyed digest").

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Smallest accepted key: 32 bytes, the HMAC-SHA256 block-size recommendation's floor.
pub const MIN_KEY_LEN: usize = 32;

/// Errors building a keyring.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("the identity key must be at least {MIN_KEY_LEN} bytes, got {0}")]
    TooShort(usize),
    #[error("the environment id must be 1 to 63 characters of [a-z0-9-], got {0:?}")]
    BadEnvironment(String),
}

/// The environment-held key and the environment it belongs to. Every identity derives
/// from both, so two environments sharing a database never collide.
#[derive(Clone)]
pub struct Keyring {
    key: Vec<u8>,
    environment: String,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("environment", &self.environment)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl Keyring {
    pub fn new(key: impl Into<Vec<u8>>, environment: &str) -> Result<Self, KeyError> {
        let key = key.into();
        if key.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort(key.len()));
        }
        let valid_env = !environment.is_empty()
            && environment.len() <= 63
            && environment
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid_env {
            return Err(KeyError::BadEnvironment(environment.to_owned()));
        }
        Ok(Keyring {
            key,
            environment: environment.to_owned(),
        })
    }

    pub fn environment(&self) -> &str {
        &self.environment
    }

    /// HMAC over length-prefixed parts, so ("ab","c") and ("a","bc") never collide.
    fn mac(&self, domain: &str, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = match HmacSha256::new_from_slice(&self.key) {
            Ok(mac) => mac,
            // HMAC accepts keys of any length; this arm cannot be reached.
            Err(_) => unreachable!("HMAC-SHA256 accepts every key length"),
        };
        for part in std::iter::once(domain.as_bytes())
            .chain(std::iter::once(self.environment.as_bytes()))
            .chain(parts.iter().copied())
        {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// The binding id of a conversation: deterministic for (environment, subject, agent,
    /// conversation), opaque to anyone without the key.
    pub fn binding_id(&self, subject: &str, agent_id: &str, conversation_id: &str) -> BindingId {
        self.binding_id_for_ref(
            self.subject_ref(subject).as_str(),
            agent_id,
            conversation_id,
        )
    }

    /// The binding id from the subject's keyed reference (what a `HarnessBinding` holds
    /// in `spec.subjectRef`): the operator and the data plane derive the same id.
    pub fn binding_id_for_ref(
        &self,
        subject_ref: &str,
        agent_id: &str,
        conversation_id: &str,
    ) -> BindingId {
        let d = self.mac(
            "binding/v2",
            &[
                subject_ref.as_bytes(),
                agent_id.as_bytes(),
                conversation_id.as_bytes(),
            ],
        );
        BindingId(format!("hb_{}", hex::encode(&d[..16])))
    }

    /// The subject reference stored in `HarnessBinding.spec.subjectRef`.
    pub fn subject_ref(&self, subject: &str) -> SubjectRef {
        SubjectRef(format!(
            "hmac-sha256:{}",
            hex::encode(self.mac("subject/v1", &[subject.as_bytes()]))
        ))
    }

    /// The keyed namespace of long-term memory for one scope and its components
    /// (`spec/001_78d7ff78f70a2a2a.txt` §5 `namespace_key`): `mn_` and 64 hex digits.
    pub fn memory_namespace(&self, scope: &str, parts: &[&str]) -> String {
        let mut all: Vec<&[u8]> = vec![scope.as_bytes()];
        all.extend(parts.iter().map(|p| p.as_bytes()));
        format!("mn_{}", hex::encode(self.mac("memory-namespace/v1", &all)))
    }

    /// A keyed signature of `bytes` in a domain of its own (recall receipts).
    pub fn sign(&self, domain: &str, bytes: &[u8]) -> [u8; 32] {
        self.mac(domain, &[bytes])
    }

    /// A signed token: `prefix` + base64url(`json`) + `.` + the hex [`Self::sign`] of
    /// `json` in `domain` (recall and verification receipts).
    pub fn seal(&self, prefix: &str, domain: &str, json: &str) -> String {
        use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
        let mac = self.sign(domain, json.as_bytes());
        format!(
            "{prefix}{}.{}",
            URL_SAFE_NO_PAD.encode(json.as_bytes()),
            hex::encode(mac)
        )
    }

    /// The JSON a [`Self::seal`]ed token carries, if it has the prefix and this server's
    /// signature in `domain`.
    pub fn open(&self, prefix: &str, domain: &str, token: &str) -> Option<Vec<u8>> {
        use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
        let (body, mac) = token.strip_prefix(prefix)?.split_once('.')?;
        let json = URL_SAFE_NO_PAD.decode(body).ok()?;
        let mut presented = [0u8; 32];
        hex::decode_to_slice(mac, &mut presented).ok()?;
        self.verify(domain, &json, &presented).then_some(json)
    }

    /// Whether `mac` is [`Self::sign`] of `bytes`, compared in constant time.
    pub fn verify(&self, domain: &str, bytes: &[u8], mac: &[u8; 32]) -> bool {
        let expected = self.sign(domain, bytes);
        expected
            .iter()
            .zip(mac.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// A server-minted handle (run, work item, artifact: `spec/003_bab976795353d872.txt`
    /// "Stateless Run Handles"): `prefix` and 32 hex digits of a keyed digest of the
    /// binding, its epoch, what is minted and the request's idempotency digest. 128 bits
    /// no caller can predict without the key, and the same for an idempotent retry, so a
    /// retried request names the same handle.
    pub fn mint_handle(
        &self,
        prefix: &str,
        binding: &BindingId,
        epoch: u64,
        what: &str,
        idempotency: &str,
    ) -> String {
        let d = self.mac(
            "handle/v1",
            &[
                binding.0.as_bytes(),
                &epoch.to_be_bytes(),
                what.as_bytes(),
                idempotency.as_bytes(),
            ],
        );
        format!("{prefix}{}", hex::encode(&d[..16]))
    }

    /// The stored form of a client idempotency key, bound to the binding and operation
    /// so one key reused across bindings or operations never aliases.
    pub fn idempotency_digest(
        &self,
        binding: &BindingId,
        operation: &str,
        key: &str,
    ) -> IdempotencyDigest {
        IdempotencyDigest(hex::encode(self.mac(
            "idempotency/v1",
            &[binding.0.as_bytes(), operation.as_bytes(), key.as_bytes()],
        )))
    }
}

/// Opaque binding id: `hb_` and 32 hex digits.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct BindingId(String);

impl BindingId {
    /// Accepts only the shape `Keyring::binding_id` produces.
    pub fn parse(s: &str) -> Option<Self> {
        let hex_part = s.strip_prefix("hb_")?;
        (hex_part.len() == 32
            && hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| BindingId(s.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BindingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Keyed digest of a subject: `hmac-sha256:` and 64 hex digits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct SubjectRef(String);

impl SubjectRef {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Accepts only the shape `Keyring::subject_ref` produces.
    pub fn parse(s: &str) -> Option<Self> {
        let hex_part = s.strip_prefix("hmac-sha256:")?;
        (hex_part.len() == 64
            && hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| SubjectRef(s.to_owned()))
    }
}

/// Keyed digest of a client idempotency key (64 hex digits). The raw key is never stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct IdempotencyDigest(String);

impl IdempotencyDigest {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Rebuilds a digest read back from a store.
    pub fn from_stored(s: String) -> Self {
        IdempotencyDigest(s)
    }
}

/// Plain SHA-256 of content, `sha256:` and 64 hex digits: detects a different payload
/// under a reused idempotency key, and is the content hash of stored bodies.
pub fn content_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring(env: &str) -> Keyring {
        Keyring::new(vec![7u8; 32], env).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn binding_ids_are_deterministic_and_opaque() {
        let k = keyring("primary");
        let a = k.binding_id("user:alice@example.com", "agent-1", "conv-1");
        assert_eq!(
            a,
            k.binding_id("user:alice@example.com", "agent-1", "conv-1")
        );
        assert!(BindingId::parse(a.as_str()).is_some());
        assert!(!a.as_str().contains("alice"));
        let cases = [
            ("user:bob", "agent-1", "conv-1"),
            ("user:alice@example.com", "agent-2", "conv-1"),
            ("user:alice@example.com", "agent-1", "conv-2"),
        ];
        for (s, ag, c) in cases {
            assert_ne!(a, k.binding_id(s, ag, c), "{s} {ag} {c}");
        }
        assert_ne!(
            a,
            keyring("staging").binding_id("user:alice@example.com", "agent-1", "conv-1"),
            "environments never collide"
        );
        assert_ne!(
            a,
            Keyring::new(vec![8u8; 32], "primary")
                .unwrap_or_else(|e| panic!("{e}"))
                .binding_id("user:alice@example.com", "agent-1", "conv-1"),
            "another key, another id"
        );
    }

    #[test]
    fn parts_are_length_prefixed() {
        let k = keyring("primary");
        assert_ne!(k.binding_id("ab", "c", "d"), k.binding_id("a", "bc", "d"));
    }

    #[test]
    fn subject_refs_match_the_crd_pattern() {
        let r = keyring("primary").subject_ref("user:alice@example.com");
        assert!(SubjectRef::parse(r.as_str()).is_some(), "{}", r.as_str());
        assert!(SubjectRef::parse("user:alice@example.com").is_none());
        assert!(!r.as_str().contains("alice"));
    }

    #[test]
    fn idempotency_digests_are_scoped() {
        let k = keyring("primary");
        let b1 = k.binding_id("s", "a", "c1");
        let b2 = k.binding_id("s", "a", "c2");
        let d = k.idempotency_digest(&b1, "state.write", "key-1");
        assert_eq!(d, k.idempotency_digest(&b1, "state.write", "key-1"));
        assert_ne!(d, k.idempotency_digest(&b2, "state.write", "key-1"));
        assert_ne!(d, k.idempotency_digest(&b1, "interrupt.resume", "key-1"));
        assert!(!d.as_str().contains("key-1"));
    }

    #[test]
    fn weak_keys_and_bad_environments_are_refused() {
        assert_eq!(
            Keyring::new(vec![1u8; 31], "primary").err(),
            Some(KeyError::TooShort(31))
        );
        for env in ["", "Prod", "a b", "x".repeat(64).as_str()] {
            assert!(
                matches!(
                    Keyring::new(vec![1u8; 32], env),
                    Err(KeyError::BadEnvironment(_))
                ),
                "{env:?}"
            );
        }
        assert!(
            !format!("{:?}", keyring("primary")).contains("7, 7"),
            "Debug never prints the key"
        );
    }

    #[test]
    fn binding_id_parse_rejects_other_shapes() {
        for s in [
            "",
            "hb_",
            "hb_XYZ",
            "hs_0123456789abcdef0123456789abcdef",
            "hb_0123456789ABCDEF0123456789abcdef",
            "hb_0123456789abcdef0123456789abcde",
        ] {
            assert!(BindingId::parse(s).is_none(), "{s:?}");
        }
    }
}
