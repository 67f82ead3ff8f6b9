//! Static bearer tokens for `serve` mode (no Kubernetes).
//!
//! The token file (YAML; JSON is accepted too, being YAML) lists principals:
//!
//! ```yaml
//! tokens:
//!   - principal: chat-backend
//!     token_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//!     subjects: ["user:alice@example.com", "user:bob@example.com"]
//! ```
//!
//! Only SHA-256 digests of tokens are kept, so the file (and a backup of it) never holds
//! a usable credential. Tokens are 256-bit random values, so an unsalted digest is safe:
//! there is nothing to guess.

use std::{
    collections::HashMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::Arc,
};

use async_trait::async_trait;
use base64::Engine;
use rand::TryRngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{AuthError, Authenticator, BindingVerb, Caller, MAX_TOKEN_BYTES, valid_subject};

/// Prefix of generated tokens: makes them recognisable to secret scanners.
pub const TOKEN_PREFIX: &str = "hep_";

/// Errors loading or creating a token file.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("reading token file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing token file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token file {path} is not valid YAML or JSON: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("token file {path}, entry {index}: {message}")]
    Entry {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("token file {path} lists no tokens")]
    Empty { path: PathBuf },
    #[error("the system random number generator failed: {0}")]
    Random(String),
}

/// The token file's shape.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    pub tokens: Vec<TokenEntry>,
}

/// One principal in the token file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// A name for logs and metrics; not a secret.
    pub principal: String,
    /// Lowercase hex SHA-256 of the token.
    pub token_sha256: String,
    /// End-user subjects this principal may act for (create and use their bindings).
    pub subjects: Vec<String>,
}

/// The `serve` mode authenticator.
#[derive(Debug)]
pub struct StaticTokens {
    by_digest: HashMap<[u8; 32], Caller>,
}

impl StaticTokens {
    /// Loads and validates a token file.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let text = fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, TokenFileError> {
        let file: TokenFile = serde_saphyr::from_str(text).map_err(|e| TokenFileError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        if file.tokens.is_empty() {
            return Err(TokenFileError::Empty {
                path: path.to_owned(),
            });
        }
        let mut by_digest = HashMap::new();
        for (index, entry) in file.tokens.into_iter().enumerate() {
            let bad = |message: String| TokenFileError::Entry {
                path: path.to_owned(),
                index,
                message,
            };
            if entry.principal.trim().is_empty()
                || entry.principal.len() > 128
                || entry.principal.chars().any(char::is_control)
            {
                return Err(bad("principal must be 1 to 128 printable characters".into()));
            }
            let mut digest = [0u8; 32];
            hex::decode_to_slice(entry.token_sha256.trim(), &mut digest)
                .map_err(|_| bad("token_sha256 must be 64 hex digits (the SHA-256 of the token, never the token itself)".into()))?;
            if entry.subjects.is_empty() {
                return Err(bad(format!(
                    "principal {} lists no subjects",
                    entry.principal
                )));
            }
            if let Some(s) = entry.subjects.iter().find(|s| !valid_subject(s)) {
                return Err(bad(format!(
                    "subject {s:?} must be 1 to 256 printable characters"
                )));
            }
            let caller = Caller::Principal {
                name: entry.principal,
                subjects: Arc::new(entry.subjects),
            };
            if by_digest.insert(digest, caller).is_some() {
                return Err(bad("the same token digest appears twice".into()));
            }
        }
        Ok(StaticTokens { by_digest })
    }

    /// Adds a principal with a fresh token that exists only in this process (never in
    /// the token file), and returns the token: how an in-process client of the local
    /// store (`harness-engine mcp --stdio`) authenticates like any other caller.
    pub fn add_ephemeral(
        &mut self,
        principal: &str,
        subjects: &[String],
    ) -> Result<String, TokenFileError> {
        let token = generate_token()?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(token_digest_hex(&token), &mut digest)
            .map_err(|_| TokenFileError::Random("the token digest is not 64 hex digits".into()))?;
        self.by_digest.insert(
            digest,
            Caller::Principal {
                name: principal.to_owned(),
                subjects: Arc::new(subjects.to_vec()),
            },
        );
        Ok(token)
    }

    /// Creates a token file with one principal and a fresh token; returns the raw token,
    /// which exists nowhere else afterwards. Refuses to overwrite an existing file.
    pub fn create_file(
        path: &Path,
        principal: &str,
        subjects: &[String],
    ) -> Result<String, TokenFileError> {
        let token = generate_token()?;
        let file = TokenFile {
            tokens: vec![TokenEntry {
                principal: principal.to_owned(),
                token_sha256: token_digest_hex(&token),
                subjects: subjects.to_vec(),
            }],
        };
        let yaml = serde_saphyr::to_string(&file).map_err(|e| TokenFileError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let text = format!(
            "# harness-engine serve: bearer tokens, stored as SHA-256 digests only.\n\
             # Add a principal: generate a random token, put its sha256 here, restart serve.\n{yaml}"
        );
        write_new_private_file(path, text.as_bytes()).map_err(|source| TokenFileError::Write {
            path: path.to_owned(),
            source,
        })?;
        Ok(token)
    }
}

/// A fresh token: the prefix and 32 random bytes, base64url.
pub fn generate_token() -> Result<String, TokenFileError> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| TokenFileError::Random(e.to_string()))?;
    Ok(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// Hex SHA-256 of a token, as the token file stores it.
pub fn token_digest_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Writes a new file readable by its owner only; fails if it exists.
pub fn write_new_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[async_trait]
impl Authenticator for StaticTokens {
    async fn authenticate(&self, token: &str) -> Result<Caller, AuthError> {
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::Unauthenticated(
                "the bearer token is empty or too long".into(),
            ));
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // A hash-map lookup keyed by the digest: timing reveals at most something about a
        // digest, never about a token.
        self.by_digest
            .get(&digest)
            .cloned()
            .ok_or_else(|| AuthError::Unauthenticated("the bearer token is not known".into()))
    }

    async fn may_use_bindings(
        &self,
        _caller: &Caller,
        _verb: BindingVerb,
    ) -> Result<bool, AuthError> {
        // Every configured principal may use bindings; which ones is decided by subject.
        Ok(true)
    }

    async fn may_act_for(&self, caller: &Caller, subject: &str) -> Result<bool, AuthError> {
        Ok(match caller {
            Caller::Principal { subjects, .. } => subjects.iter().any(|s| s == subject),
            _ => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<StaticTokens, TokenFileError> {
        StaticTokens::parse(Path::new("tokens.yaml"), text)
    }

    fn rt() -> tokio::runtime::Runtime {
        match tokio::runtime::Builder::new_current_thread().build() {
            Ok(rt) => rt,
            Err(e) => panic!("runtime: {e}"),
        }
    }

    #[test]
    fn a_listed_token_authenticates_as_its_principal() {
        let token = "hep_test-token";
        let text = format!(
            "tokens:\n  - principal: backend\n    token_sha256: {}\n    subjects: [\"user:alice\", \"user:bob\"]\n",
            token_digest_hex(token)
        );
        let tokens = match parse(&text) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let rt = rt();
        let caller = rt.block_on(tokens.authenticate(token));
        assert!(
            matches!(&caller, Ok(Caller::Principal { name, .. }) if name == "backend"),
            "{caller:?}"
        );
        let Ok(caller) = caller else { return };
        assert_eq!(
            rt.block_on(tokens.may_act_for(&caller, "user:bob")),
            Ok(true)
        );
        assert_eq!(
            rt.block_on(tokens.may_act_for(&caller, "user:mallory")),
            Ok(false)
        );
        for wrong in [
            "",
            "hep_test-tokeN",
            "hep_test-token ",
            &"x".repeat(MAX_TOKEN_BYTES + 1),
        ] {
            assert!(
                matches!(
                    rt.block_on(tokens.authenticate(wrong)),
                    Err(AuthError::Unauthenticated(_))
                ),
                "{wrong:?}"
            );
        }
    }

    #[test]
    fn json_token_files_are_accepted() {
        let text = format!(
            r#"{{"tokens": [{{"principal": "p", "token_sha256": "{}", "subjects": ["user:x"]}}]}}"#,
            token_digest_hex("t")
        );
        assert!(parse(&text).is_ok());
    }

    #[test]
    fn malformed_files_are_refused_with_a_reason() {
        let digest = token_digest_hex("t");
        let cases = [
            ("tokens: []\n".to_owned(), "no tokens"),
            (
                format!(
                    "tokens:\n  - principal: p\n    token_sha256: {digest}\n    subjects: []\n"
                ),
                "no subjects",
            ),
            (
                "tokens:\n  - principal: p\n    token_sha256: abc\n    subjects: [u]\n".to_owned(),
                "64 hex",
            ),
            (
                format!(
                    "tokens:\n  - principal: p\n    token: t\n    token_sha256: {digest}\n    subjects: [u]\n"
                ),
                "not valid",
            ),
            (
                format!(
                    "tokens:\n  - principal: a\n    token_sha256: {digest}\n    subjects: [u]\n  - principal: b\n    token_sha256: {digest}\n    subjects: [u]\n"
                ),
                "twice",
            ),
        ];
        for (text, want) in cases {
            match parse(&text) {
                Ok(_) => panic!("accepted: {text}"),
                Err(e) => assert!(e.to_string().contains(want), "{e} should mention {want:?}"),
            }
        }
    }

    #[test]
    fn created_files_hold_only_the_digest_and_are_private() {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        let path = dir.path().join("tokens.yaml");
        let token = match StaticTokens::create_file(&path, "local", &["user:local".to_owned()]) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        assert!(
            token.starts_with(TOKEN_PREFIX) && token.len() == TOKEN_PREFIX.len() + 43,
            "{token}"
        );
        let text = fs::read_to_string(&path).unwrap_or_default();
        assert!(!text.contains(&token), "the raw token is never written");
        assert!(text.contains(&token_digest_hex(&token)));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0);
            assert_eq!(mode, 0o600);
        }
        assert!(
            StaticTokens::create_file(&path, "local", &["user:local".to_owned()]).is_err(),
            "never overwrites"
        );
        let loaded = match StaticTokens::load(&path) {
            Ok(l) => l,
            Err(e) => panic!("{e}"),
        };
        assert!(rt().block_on(loaded.authenticate(&token)).is_ok());
    }
}
