//! `spec.harness.options` rules (`spec/001_78d7ff78f70a2a2a.txt` §1, "Agent harness
//! configuration"): at most 32 KiB encoded, and no field named or shaped like a secret,
//! token, credential, environment dictionary, module path, command or executable code.
//!
//! Names are checked at every depth, word by word (`openaiApiKey`, `OPENAI_API_KEY` and
//! `openai-api-key` all split into `openai api key`), so the check does not depend on a
//! naming style. String values are checked at every depth, including inside arrays, for
//! the shapes credentials and code actually take. Counting words keep the usual tuning
//! knobs legal: `max_tokens` or `thinking_budget_tokens` are sizes, not tokens.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use super::Violation;

/// Largest encoded size of the options (spec 001 §1: "maximum encoded size 32 KiB").
pub const MAX_OPTIONS_BYTES: usize = 32 * 1024;

const FIELD: &str = "spec.harness.options";

/// What a forbidden name or value looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    Secret,
    Environment,
    ModulePath,
    Command,
    Code,
}

impl Finding {
    fn name_message(self) -> &'static str {
        match self {
            Finding::Secret => {
                "the field name looks like a secret, token, credential, password or key; harness options never hold secrets: reference them through environment-owned configuration or the credential service (data-model spec §1)"
            }
            Finding::Environment => {
                "the field name looks like an environment dictionary; harness options cannot set environment variables (data-model spec §1)"
            }
            Finding::ModulePath => {
                "the field name looks like a module or import path; harness options cannot load arbitrary modules (data-model spec §1)"
            }
            Finding::Command => {
                "the field name looks like a command or shell; harness options cannot run commands (data-model spec §1)"
            }
            Finding::Code => {
                "the field name looks like code or a script; harness options cannot carry executable code (data-model spec §1)"
            }
        }
    }
}

/// Checks the options; every finding becomes one violation naming its path.
pub fn validate(options: &Map<String, Value>) -> Vec<Violation> {
    let mut violations = Vec::new();
    match serde_json::to_vec(options) {
        Ok(encoded) if encoded.len() > MAX_OPTIONS_BYTES => {
            violations.push(Violation::invalid(
                FIELD,
                format!(
                    "encoded as JSON the options are {} bytes; the limit is {MAX_OPTIONS_BYTES} bytes (32 KiB, data-model spec §1)",
                    encoded.len()
                ),
            ));
        }
        Ok(_) => {}
        Err(e) => violations.push(Violation::invalid(
            FIELD,
            format!("the options cannot be encoded as JSON: {e}"),
        )),
    }
    for (key, value) in options {
        walk(&field_path(FIELD, key), key, value, &mut violations);
    }
    violations
}

fn walk(path: &str, key: &str, value: &Value, out: &mut Vec<Violation>) {
    if let Some(finding) = classify_name(key) {
        out.push(Violation::invalid(path, finding.name_message()));
        // The name alone refuses the field; scanning under it would repeat the point.
        return;
    }
    walk_value(path, value, out);
}

fn walk_value(path: &str, value: &Value, out: &mut Vec<Violation>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                walk(&field_path(path, k), k, v, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk_value(&format!("{path}[{i}]"), v, out);
            }
        }
        Value::String(s) => {
            if let Some(shape) = classify_value(s) {
                out.push(Violation::invalid(
                    path,
                    format!(
                        "the value looks like {shape}; harness options never hold secrets, commands or code (data-model spec §1)"
                    ),
                ));
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `a.b` for identifier-like keys, `a["odd key"]` otherwise, so the path is unambiguous.
fn field_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        format!("{parent}.{key}")
    } else {
        format!("{parent}[{}]", Value::String(key.to_owned()))
    }
}

/// Splits a key into lowercase words at separators, camelCase humps and acronym ends:
/// `openaiAPIKey` -> `openai api key`, `OPENAI_API_KEY` -> `openai api key`.
pub fn words(key: &str) -> Vec<String> {
    let chars: Vec<char> = key.chars().collect();
    let mut words = Vec::new();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            continue;
        }
        if c.is_uppercase() && !current.is_empty() {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                words.push(std::mem::take(&mut current));
            }
        }
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

fn any_word(words: &[String], set: &[&str]) -> bool {
    words.iter().any(|w| set.contains(&w.as_str()))
}

const SECRET_WORDS: &[&str] = &[
    "secret",
    "secrets",
    "credential",
    "credentials",
    "creds",
    "password",
    "passwords",
    "passwd",
    "passphrase",
    "apikey",
    "apikeys",
    "privatekey",
    "accesskey",
    "bearer",
    "cookie",
    "cookies",
    "authorization",
    "auth",
    "jwt",
];
/// Fragments that mean a secret even inside one run-together word (`openaiapikey`).
const SECRET_FRAGMENTS: &[&str] = &[
    "secret",
    "password",
    "passwd",
    "credential",
    "apikey",
    "privatekey",
    "accesskey",
    "clientsecret",
];
const TOKEN_WORDS: &[&str] = &["token", "tokens"];
/// With one of these, `token` counts text tokens (`max_tokens`), not a credential.
const COUNT_WORDS: &[&str] = &[
    "max", "min", "num", "limit", "limits", "budget", "count", "total", "per", "output", "input",
    "context", "window", "thinking", "reserved", "target",
];
const KEY_WORDS: &[&str] = &["key", "keys"];
/// With one of these, `key` is a cryptographic or API key.
const KEY_QUALIFIERS: &[&str] = &[
    "api",
    "private",
    "access",
    "secret",
    "signing",
    "encryption",
    "ssh",
    "client",
    "auth",
    "master",
    "service",
    "account",
    "license",
];
const ENV_WORDS: &[&str] = &[
    "env",
    "envs",
    "environ",
    "environment",
    "environments",
    "dotenv",
    "envvar",
    "envvars",
];
const MODULE_WORDS: &[&str] = &[
    "module",
    "modules",
    "import",
    "imports",
    "entrypoint",
    "entrypoints",
    "plugin",
    "plugins",
    "loader",
    "pythonpath",
    "classpath",
];
const MODULE_FRAGMENTS: &[&str] = &[
    "entrypoint",
    "modulepath",
    "importpath",
    "pythonpath",
    "classpath",
    "nodepath",
    "ldpreload",
    "ldlibrarypath",
];
const COMMAND_WORDS: &[&str] = &[
    "command",
    "commands",
    "cmd",
    "cmds",
    "cmdline",
    "exec",
    "execute",
    "executable",
    "executables",
    "argv",
    "shell",
    "bash",
    "sh",
    "zsh",
    "powershell",
    "pwsh",
    "subprocess",
    "spawn",
    "popen",
];
const CODE_WORDS: &[&str] = &[
    "script",
    "scripts",
    "eval",
    "lambda",
    "snippet",
    "snippets",
    "callable",
    "callables",
    "sourcecode",
];
/// With one of these, `code` is an identifier (`language_code`), not a program.
const CODE_IDENTIFIER_QUALIFIERS: &[&str] = &[
    "status", "country", "language", "lang", "error", "exit", "region", "locale", "currency",
    "postal", "zip", "http", "response", "area", "iso",
];

/// What a field name looks like, if it is forbidden.
pub fn classify_name(key: &str) -> Option<Finding> {
    let words = words(key);
    let joined: String = words.concat();
    if any_word(&words, SECRET_WORDS)
        || SECRET_FRAGMENTS.iter().any(|f| joined.contains(f))
        || (any_word(&words, TOKEN_WORDS) && !any_word(&words, COUNT_WORDS))
        || (any_word(&words, KEY_WORDS) && any_word(&words, KEY_QUALIFIERS))
    {
        return Some(Finding::Secret);
    }
    if any_word(&words, ENV_WORDS) {
        return Some(Finding::Environment);
    }
    if any_word(&words, MODULE_WORDS) || MODULE_FRAGMENTS.iter().any(|f| joined.contains(f)) {
        return Some(Finding::ModulePath);
    }
    if any_word(&words, COMMAND_WORDS) {
        return Some(Finding::Command);
    }
    if any_word(&words, CODE_WORDS)
        || (any_word(&words, &["code"]) && !any_word(&words, CODE_IDENTIFIER_QUALIFIERS))
    {
        return Some(Finding::Code);
    }
    None
}

struct Shape {
    what: &'static str,
    pattern: Regex,
}

fn shape(what: &'static str, pattern: &str) -> Shape {
    Shape {
        what,
        // The patterns are constants of this file and covered by its tests.
        pattern: Regex::new(pattern).unwrap_or_else(|e| panic!("bad built-in pattern: {e}")),
    }
}

static VALUE_SHAPES: LazyLock<Vec<Shape>> = LazyLock::new(|| {
    vec![
        shape("a bearer token", r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
        shape(
            "a PEM key or certificate block",
            r"-----BEGIN [A-Z0-9 ]+-----",
        ),
        shape("an API key (`sk-...`)", r"\bsk-[A-Za-z0-9_-]{16,}"),
        shape(
            "an AWS access key id",
            r"\b(AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b",
        ),
        shape(
            "a GitHub or Slack token",
            r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|xox[abprs]-[A-Za-z0-9-]{10,})",
        ),
        shape(
            "a JSON Web Token",
            r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",
        ),
        shape(
            "a URL with a password",
            r"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@",
        ),
        shape("a script (shebang line)", r"^\s*#!"),
        shape(
            "code (an import statement)",
            r"(?m)^\s*(import\s+[A-Za-z_][\w.]*(\s+as\s+\w+)?\s*;?\s*$|from\s+[A-Za-z_][\w.]*\s+import\s+\S)",
        ),
        shape("code (a `require(...)` call)", r#"\brequire\s*\(\s*['"]"#),
        shape(
            "code (a dynamic import, eval or exec call)",
            r"\b(__import__|importlib\.import_module|eval|exec|os\.system|subprocess\.\w+)\s*\(",
        ),
    ]
});

/// What a string value looks like, if it is forbidden.
pub fn classify_value(value: &str) -> Option<&'static str> {
    VALUE_SHAPES
        .iter()
        .find(|s| s.pattern.is_match(value))
        .map(|s| s.what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(options: Value) -> Vec<Violation> {
        match options {
            Value::Object(map) => validate(&map),
            other => panic!("test options must be an object, got {other}"),
        }
    }

    #[test]
    fn words_split_every_naming_style() {
        for (key, expected) in [
            ("openaiApiKey", vec!["openai", "api", "key"]),
            ("OPENAI_API_KEY", vec!["openai", "api", "key"]),
            ("openai-api-key", vec!["openai", "api", "key"]),
            ("openaiAPIKey", vec!["openai", "api", "key"]),
            ("max_tokens", vec!["max", "tokens"]),
            ("s3Bucket", vec!["s3", "bucket"]),
        ] {
            assert_eq!(words(key), expected, "{key}");
        }
    }

    #[test]
    fn forbidden_names_at_any_depth() {
        let cases: &[(&str, Finding)] = &[
            ("apiKey", Finding::Secret),
            ("OPENAI_API_KEY", Finding::Secret),
            ("openaiapikey", Finding::Secret),
            ("password", Finding::Secret),
            ("db_passwd", Finding::Secret),
            ("clientSecret", Finding::Secret),
            ("access_token", Finding::Secret),
            ("token", Finding::Secret),
            ("credentials", Finding::Secret),
            ("privateKey", Finding::Secret),
            ("ssh_key", Finding::Secret),
            ("Authorization", Finding::Secret),
            ("env", Finding::Environment),
            ("environment", Finding::Environment),
            ("extraEnv", Finding::Environment),
            ("ENV_VARS", Finding::Environment),
            ("module", Finding::ModulePath),
            ("import_path", Finding::ModulePath),
            ("PYTHONPATH", Finding::ModulePath),
            ("entry_point", Finding::ModulePath),
            ("plugins", Finding::ModulePath),
            ("command", Finding::Command),
            ("cmd", Finding::Command),
            ("shell", Finding::Command),
            ("preExec", Finding::Command),
            ("argv", Finding::Command),
            ("code", Finding::Code),
            ("setup_script", Finding::Code),
            ("sourceCode", Finding::Code),
            ("lambda", Finding::Code),
        ];
        for (key, finding) in cases {
            assert_eq!(classify_name(key), Some(*finding), "{key}");
            let mut inner = Map::new();
            inner.insert((*key).to_owned(), json!("x"));
            let nested = check(json!({"outer": {"list": [inner]}}));
            assert_eq!(nested.len(), 1, "{key}: {nested:?}");
            assert_eq!(
                nested[0].field,
                format!("spec.harness.options.outer.list[0].{key}")
            );
        }
    }

    #[test]
    fn ordinary_tuning_names_are_allowed() {
        for key in [
            "model_provider_mode",
            "max_tokens",
            "maxOutputTokens",
            "thinking_budget_tokens",
            "token_limit",
            "temperature",
            "recursion_limit",
            "language_code",
            "status_code",
            "system_prompt",
            "keywords",
            "tokenizer",
            "author",
            "codec",
            "sandbox_profile",
            "checkpoint_interval",
            "primary_key_field",
        ] {
            assert_eq!(classify_name(key), None, "{key}");
        }
        let ok = check(json!({
            "model_provider_mode": "configured",
            "max_tokens": 4096,
            "tools": ["search", "calculator"],
            "retry": {"attempts": 3, "backoff": "2s"},
            "docs_url": "https://example.com/docs",
            "note": "import the data later",
        }));
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn secret_and_code_shaped_values_are_refused() {
        let cases = [
            "Bearer abcdefghijklmnop",
            "-----BEGIN PRIVATE KEY-----\nMIIE...\n-----END PRIVATE KEY-----",
            "-----BEGIN RSA PRIVATE KEY-----",
            "sk-abcdefghijklmnopqrstuv",
            "sk-ant-api03-abcdefghijklmnopqrstuv",
            "AKIAABCDEFGHIJKLMNOP",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "xoxb-1234567890-abcdef",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig",
            "postgres://app:hunter2@db.example.com:5432/app",
            "#!/bin/sh\nrm -rf /",
            "import os",
            "import os.path as p",
            "from subprocess import run",
            "const fs = require('fs')",
            "__import__('os')",
            "os.system('id')",
        ];
        for value in cases {
            assert!(classify_value(value).is_some(), "{value}");
            let found = check(json!({"settings": {"items": ["fine", value]}}));
            assert_eq!(found.len(), 1, "{value}");
            assert_eq!(found[0].field, "spec.harness.options.settings.items[1]");
            assert!(found[0].message.contains("the value looks like"));
        }
    }

    #[test]
    fn ordinary_values_are_allowed() {
        for value in [
            "configured",
            "https://example.com/path",
            "sk-short",
            "use bearer auth upstream",
            "please import the files",
            "required",
            "We require (some) care",
            "2m30s",
        ] {
            assert_eq!(classify_value(value), None, "{value}");
        }
    }

    #[test]
    fn size_limit_is_32_kib_encoded() {
        let just_fits = "a".repeat(MAX_OPTIONS_BYTES - r#"{"blob":""}"#.len());
        assert!(check(json!({ "blob": just_fits })).is_empty());
        let too_big = "a".repeat(MAX_OPTIONS_BYTES);
        let found = check(json!({ "blob": too_big }));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "spec.harness.options");
        assert!(found[0].message.contains("limit is 32768 bytes"));
    }

    #[test]
    fn odd_keys_get_an_unambiguous_path() {
        let found = check(json!({"a b": {"api.key": "x"}}));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, r#"spec.harness.options["a b"]["api.key"]"#);
    }
}
