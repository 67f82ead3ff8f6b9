//! The system under test and its faults: the processes (`harness-engine serve`, or the
//! MongoDB node and its own FerretDB), the small filesystem their data lives on, and the
//! control path that raises fences and clears epochs (the operator's part).

use std::{
    fs::{File, OpenOptions},
    io::Write,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use harness_engine::{
    domain::ids::BindingId,
    store::{BindingStore, StoreError, sqlite::SqliteStore},
};
use serde::{Deserialize, Serialize};

use super::history::Output;

/// A free TCP port on 127.0.0.1 (released at once; the process binds it again, with
/// `SO_REUSEADDR`, on every restart).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("picking a free port: {e}"))
}

fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// A child process the fault injector may kill, pause and restart. Output goes to a log
/// file that survives the run.
pub struct Proc {
    pub name: &'static str,
    command: Box<dyn Fn() -> Command + Send + Sync>,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
    pub starts: u32,
}

impl Proc {
    pub fn new(
        name: &'static str,
        log: PathBuf,
        command: impl Fn() -> Command + Send + Sync + 'static,
    ) -> Self {
        Proc {
            name,
            command: Box::new(command),
            log,
            child: None,
            paused: false,
            starts: 0,
        }
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log.display()));
        let mut note = log.try_clone().expect("log handle");
        let _ = writeln!(note, "---- start {} #{}", self.name, self.starts + 1);
        let err = log.try_clone().expect("log handle");
        let child = (self.command)()
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.name));
        self.child = Some(child);
        self.paused = false;
        self.starts += 1;
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL and reap: when this returns, the process is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    pub fn pause(&mut self) -> bool {
        match self.pid() {
            Some(pid) if !self.paused => {
                self.paused = signal(pid, "STOP");
                self.paused
            }
            _ => false,
        }
    }

    pub fn resume(&mut self) {
        if let Some(pid) = self.pid()
            && self.paused
        {
            signal(pid, "CONT");
            self.paused = false;
        }
    }

    /// SIGTERM, then SIGKILL if it does not stop within `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        self.resume();
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "TERM");
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process exited by itself (a crash the run should report).
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                Some(status.to_string())
            }
            _ => None,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// The data directory's own small filesystem (tmpfs with `size=`), so the run can fill
/// it. Unmounted when dropped. `None` from [`Disk::mount`] when mounting is impossible
/// (not root, no tmpfs): the run goes on without the full-disk fault and says so.
pub struct Disk {
    pub root: PathBuf,
    mounted: bool,
    ballast: PathBuf,
}

impl Disk {
    pub fn mount(root: &Path, size_mib: u64) -> Result<Disk, String> {
        std::fs::create_dir_all(root).map_err(|e| format!("creating {}: {e}", root.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m,mode=0700")])
            .arg("chaos-tmpfs")
            .arg(root)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Disk {
            root: root.to_owned(),
            mounted: true,
            ballast: root.join("ballast"),
        })
    }

    /// Fills the filesystem to the last byte; returns how much was written.
    pub fn fill(&self) -> u64 {
        let Ok(mut f) = File::create(&self.ballast) else {
            return 0;
        };
        let chunk = vec![0x5a_u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => written += n as u64,
            }
        }
        // Also the last partial blocks.
        for size in [4096usize, 512, 1] {
            while f.write(&chunk[..size]).is_ok_and(|n| n > 0) {
                written += size as u64;
            }
        }
        let _ = f.sync_all();
        written
    }

    pub fn free(&self) {
        let _ = std::fs::remove_file(&self.ballast);
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.free();
        if self.mounted {
            let ok = Command::new("umount")
                .arg(&self.root)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                // Something still holds a file open: detach it now, it goes when closed.
                let _ = Command::new("umount").arg("-l").arg(&self.root).status();
            }
        }
    }
}

/// Writes a token file with one principal and returns the bearer token.
pub fn write_tokens(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    let token = format!(
        "hep_chaos_{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    std::fs::write(
        path,
        format!(
            "tokens:\n  - principal: chaos\n    token_sha256: {digest}\n    subjects: [\"user:chaos\"]\n"
        ),
    )
    .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    token
}

/// What a control call (fence raise, clear) returned, in the history's terms.
pub fn control_output(result: Result<(u64, u64), StoreError>) -> (Output, Option<u64>) {
    use harness_engine::domain::state::Rejection;
    match result {
        Ok((epoch, generation)) => (
            Output {
                epoch,
                r#gen: generation,
                ..Output::ok()
            },
            None,
        ),
        Err(StoreError::Rejected(r)) => {
            let current = match &r {
                Rejection::StaleEpoch { current, .. } => Some(*current),
                _ => None,
            };
            (Output::fail(r.code()), current)
        }
        Err(e) => (Output::unknown(e.to_string()), None),
    }
}

/// The operator's side: raising fences and clearing epochs. With `serve` (SQLite) it is
/// the store API in this process on the same database file (SQLite serializes the two
/// processes' writers; every fence check runs inside the writer's transaction). With the
/// MongoDB node it is the node's control port, because FerretDB needs every conditional
/// write of a database to come from one process.
#[derive(Clone)]
pub enum Control {
    Store(Arc<SqliteStore>),
    Http { base: String, http: reqwest::Client },
}

/// A control request to the node.
#[derive(Debug, Serialize, Deserialize)]
pub struct ControlRequest {
    pub binding_id: String,
    pub epoch: u64,
    pub generation: u64,
}

/// The node's answer: the fence on success, the refusal's code (and the current epoch
/// for `stale_epoch`) otherwise; `unavailable` for a backend failure.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ControlResponse {
    pub epoch: u64,
    pub generation: u64,
    pub code: Option<String>,
    pub current_epoch: Option<u64>,
    pub error: Option<String>,
}

impl Control {
    /// Raises the fence (`clear == false`) or clears into `epoch` (`clear == true`).
    /// Returns the output and, for `stale_epoch`, the binding's current epoch. The bool
    /// says whether the outcome is bounded by the return time (a store call here) or by
    /// the next barrier (a request to another process).
    pub async fn call(
        &self,
        binding: &BindingId,
        clear: bool,
        epoch: u64,
        generation: u64,
    ) -> (Output, Option<u64>, bool) {
        match self {
            Control::Store(store) => {
                let result = if clear {
                    store
                        .clear(binding, epoch)
                        .await
                        .map(|r| (r.epoch, generation))
                } else {
                    store
                        .raise_fence(binding, epoch, generation)
                        .await
                        .map(|f| (f.epoch, f.lease_generation))
                };
                let (out, current) = control_output(result);
                (out, current, true)
            }
            Control::Http { base, http } => {
                let path = if clear { "clear" } else { "fence" };
                let sent = http
                    .post(format!("{base}/chaos/{path}"))
                    .json(&ControlRequest {
                        binding_id: binding.as_str().to_owned(),
                        epoch,
                        generation,
                    })
                    .send()
                    .await;
                let response = match sent {
                    Err(e) if e.is_connect() => return (Output::fail("unreachable"), None, true),
                    Err(e) => return (Output::unknown(e.to_string()), None, false),
                    Ok(r) => r,
                };
                match response.json::<ControlResponse>().await {
                    Err(e) => (Output::unknown(e.to_string()), None, false),
                    Ok(r) => match (r.code, r.error) {
                        (Some(code), _) => (Output::fail(code), r.current_epoch, true),
                        (None, Some(error)) => (Output::unknown(error), None, false),
                        (None, None) => (
                            Output {
                                epoch: r.epoch,
                                r#gen: r.generation,
                                ..Output::ok()
                            },
                            None,
                            true,
                        ),
                    },
                }
            }
        }
    }
}

/// Waits until `url` answers 200 (the admin port's `/ready`), up to `limit`.
pub async fn wait_ready(http: &reqwest::Client, url: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(r) = http.get(url).timeout(Duration::from_secs(1)).send().await
            && r.status().is_success()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Waits until a TCP connection to `port` succeeds.
pub async fn wait_port(port: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
