//! A real `harness-engine serve` process for the API tests: the built binary, ports
//! picked by the server itself (port 0, the bound address read from its output), a temp
//! data directory, killed when the handle drops.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_harness-engine");

/// What `serve` printed on start.
#[derive(Debug, Default, Clone)]
pub struct Banner {
    pub api: String,
    pub admin: String,
    pub token: Option<String>,
    pub lines: Vec<String>,
}

pub struct Serve {
    child: Child,
    pub api: String,
    pub admin: String,
    pub token: String,
    pub banner: Banner,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

impl Serve {
    /// The server's process id (for its memory use).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `serve` with `args` and `envs`; waits for its banner and for `/ready`.
pub fn spawn_with(args: &[&str], envs: &[(&str, &Path)]) -> (Child, Banner) {
    let envs: Vec<(&str, String)> = envs
        .iter()
        .map(|(k, v)| (*k, v.to_string_lossy().into_owned()))
        .collect();
    spawn_with_env(args, &envs)
}

/// [`spawn_with`] with string environment values (e.g. `OTEL_*` settings).
pub fn spawn_with_env(args: &[&str], envs: &[(&str, String)]) -> (Child, Banner) {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(args);
    // Hermetic: no OpenTelemetry setting leaks in from the test's own environment.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {BIN}: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut banner = Banner::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while banner.admin.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "serve printed no admin address within 30s; got {:?}",
                    banner.lines
                );
            }
        };
        let url = |rest: &str| {
            rest.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        };
        if let Some(rest) = line.strip_prefix("api: ") {
            banner.api = url(rest);
        } else if let Some(rest) = line.strip_prefix("admin: ") {
            banner.admin = url(rest);
        } else if let Some(rest) = line.strip_prefix("token: ") {
            banner.token = Some(rest.trim().to_owned());
        }
        banner.lines.push(line);
    }
    wait_ready(&banner.admin);
    (child, banner)
}

fn wait_ready(admin: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if http_ok(&format!("{admin}/ready")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{admin}/ready never answered 200"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A blocking `GET` that reports whether the answer was 200: the probe runs from
/// synchronous code, before any async runtime exists.
pub fn http_ok(url: &str) -> bool {
    use std::io::{Read, Write};
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let Ok(mut stream) = std::net::TcpStream::connect(host) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}

/// A fresh `serve` in its own temp data directory (a first start: it generates the key
/// and a token for principal `local`, subject `user:local`).
pub fn serve(extra_args: &[&str]) -> Serve {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let data_dir = tmp.path().join("data");
    let data = data_dir.to_string_lossy().into_owned();
    let mut args = vec!["--data-dir", data.as_str()];
    args.extend_from_slice(extra_args);
    let (child, banner) = spawn_with(&args, &[]);
    let token = banner.token.clone().unwrap_or_default();
    Serve {
        child,
        api: banner.api.clone(),
        admin: banner.admin.clone(),
        token,
        banner,
        data_dir,
        _tmp: Some(tmp),
    }
}

/// A `serve` with a token file of several principals: `(principal, token, subjects)`.
pub fn serve_with_principals(principals: &[(&str, &str, &[&str])], extra_args: &[&str]) -> Serve {
    serve_with_principals_env(principals, extra_args, &[])
}

/// [`serve_with_principals`] with extra environment variables for the process.
pub fn serve_with_principals_env(
    principals: &[(&str, &str, &[&str])],
    extra_args: &[&str],
    envs: &[(&str, String)],
) -> Serve {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let data_dir = tmp.path().join("data");
    let tokens_file = tmp.path().join("tokens.json");
    let entries: Vec<Value> = principals
        .iter()
        .map(|(p, t, subjects)| serde_json::json!({"principal": p, "token_sha256": sha256_hex(t), "subjects": subjects}))
        .collect();
    std::fs::write(
        &tokens_file,
        serde_json::json!({"tokens": entries}).to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let data = data_dir.to_string_lossy().into_owned();
    let tokens = tokens_file.to_string_lossy().into_owned();
    let mut args = vec![
        "--data-dir",
        data.as_str(),
        "--tokens-file",
        tokens.as_str(),
    ];
    args.extend_from_slice(extra_args);
    let (child, banner) = spawn_with_env(&args, envs);
    let token = principals
        .first()
        .map(|(_, t, _)| (*t).to_owned())
        .unwrap_or_default();
    Serve {
        child,
        api: banner.api.clone(),
        admin: banner.admin.clone(),
        token,
        banner,
        data_dir,
        _tmp: Some(tmp),
    }
}

pub fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"))
}

/// A response reduced to what a test looks at.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {} body is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    /// The error code of an error response, checking the shape on the way.
    pub fn code(&self) -> String {
        let v = self.json();
        assert!(
            v.get("message").and_then(Value::as_str).is_some(),
            "error without message: {v}"
        );
        assert!(
            v.get("details").is_some_and(Value::is_object),
            "error without details object: {v}"
        );
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|h| h.to_str().ok()),
            Some("application/json"),
            "{v}"
        );
        v.get("code")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

pub async fn send(req: reqwest::RequestBuilder) -> Reply {
    let response = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"));
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .bytes()
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default();
    Reply {
        status,
        headers,
        body,
    }
}

/// A small API client for one server and one token.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Self {
        Api {
            base: base.to_owned(),
            token: token.to_owned(),
            http: client(),
        }
    }

    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
    }

    pub async fn bind(&self, agent: &str, conversation: &str, subject: Option<&str>) -> Reply {
        let mut req = self
            .req(reqwest::Method::POST, "/v1/bindings")
            .header("Idempotency-Key", format!("bind-{conversation}"))
            .json(&serde_json::json!({"agent_id": agent, "conversation_id": conversation, "harness": "strands"}));
        if let Some(s) = subject {
            req = req.header("Harness-Subject", s);
        }
        send(req).await
    }

    /// Binds and returns the binding id, epoch and lease generation.
    pub async fn bound(&self, agent: &str, conversation: &str) -> (String, u64, u64) {
        let r = self.bind(agent, conversation, None).await;
        assert!(
            r.status == 201 || r.status == 200,
            "bind: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        (
            v["binding_id"].as_str().unwrap_or_default().to_owned(),
            v["epoch"].as_u64().unwrap_or(99),
            v["lease_generation"].as_u64().unwrap_or(99),
        )
    }

    pub fn worker(
        &self,
        method: reqwest::Method,
        path: &str,
        epoch: u64,
        generation: u64,
    ) -> reqwest::RequestBuilder {
        self.req(method, path)
            .header("Harness-Epoch", epoch)
            .header("Harness-Lease-Generation", generation)
    }

    pub async fn write_pending(
        &self,
        binding: &str,
        fence: (u64, u64),
        key: &str,
        body: &[u8],
    ) -> Reply {
        send(
            self.worker(
                reqwest::Method::POST,
                &format!("/v1/bindings/{binding}/state/pending"),
                fence.0,
                fence.1,
            )
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/octet-stream")
            .body(body.to_vec()),
        )
        .await
    }

    pub async fn commit(
        &self,
        binding: &str,
        fence: (u64, u64),
        state_id: &str,
        expected: u64,
        run: &str,
    ) -> Reply {
        send(
            self.worker(reqwest::Method::POST, &format!("/v1/bindings/{binding}/state/commit"), fence.0, fence.1)
                .header("Idempotency-Key", format!("commit-{run}"))
                .json(&serde_json::json!({"state_id": state_id, "expected_revision": expected, "run_id": run, "terminal": {"outcome": "completed", "metadata": {}}})),
        )
        .await
    }

    pub async fn head(&self, binding: &str, fence: (u64, u64)) -> Reply {
        send(self.worker(
            reqwest::Method::GET,
            &format!("/v1/bindings/{binding}/state/head"),
            fence.0,
            fence.1,
        ))
        .await
    }

    /// The head's revision (0 when there is none), asserting the read succeeded.
    pub async fn revision(&self, binding: &str, fence: (u64, u64)) -> u64 {
        let r = self.head(binding, fence).await;
        assert_eq!(r.status, 200, "head: {}", String::from_utf8_lossy(&r.body));
        r.json()["head"]["revision"].as_u64().unwrap_or(0)
    }

    /// One full turn; returns the new revision.
    pub async fn turn(
        &self,
        binding: &str,
        fence: (u64, u64),
        body: &[u8],
        expected: u64,
        run: &str,
    ) -> u64 {
        let p = self
            .write_pending(binding, fence, &format!("write-{run}"), body)
            .await;
        assert_eq!(
            p.status,
            201,
            "pending: {}",
            String::from_utf8_lossy(&p.body)
        );
        let state_id = p.json()["state_id"].as_str().unwrap_or_default().to_owned();
        let c = self.commit(binding, fence, &state_id, expected, run).await;
        assert_eq!(
            c.status,
            200,
            "commit: {}",
            String::from_utf8_lossy(&c.body)
        );
        c.json()["revision"].as_u64().unwrap_or(0)
    }
}
