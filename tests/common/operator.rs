//! A real `harness-engine operator` process against the local control plane, scoped to
//! one namespace, on free ports, with its own data directory; killed when dropped.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use super::{control_plane, kubectl, repo_path};

pub struct Operator {
    child: Option<Child>,
    pub api: String,
    pub admin: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
}

/// Options for one operator process.
pub struct OperatorOptions<'a> {
    pub namespace: &'a str,
    pub data_dir: &'a Path,
    /// Leader election with this lease duration (seconds), or none.
    pub leader_lease_seconds: Option<u64>,
    pub extra: Vec<String>,
}

impl Operator {
    pub fn binary() -> PathBuf {
        PathBuf::from(env!("CARGO_BIN_EXE_harness-engine"))
    }

    pub fn start(opts: OperatorOptions<'_>) -> Operator {
        Self::start_with_kubeconfig(opts, &control_plane().kubeconfig)
    }

    /// [`Operator::start`] with another identity: `kubeconfig` (for example a
    /// ServiceAccount token bound to the operator's ClusterRole from `config/rbac`).
    pub fn start_with_kubeconfig(opts: OperatorOptions<'_>, kubeconfig: &Path) -> Operator {
        std::fs::create_dir_all(opts.data_dir).expect("data dir");
        let log = opts.data_dir.join(format!(
            "operator-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        ));
        let mut cmd = Command::new(Self::binary());
        cmd.env("KUBECONFIG", kubeconfig)
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .args([
                "operator",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--namespace",
                opts.namespace,
                "--environment",
                "e2e",
                "--crd-wait-seconds",
                "30",
            ])
            .arg("--data-dir")
            .arg(opts.data_dir);
        match opts.leader_lease_seconds {
            Some(s) => {
                cmd.args([
                    "--leader-election-namespace",
                    opts.namespace,
                    "--leader-lease-seconds",
                    &s.to_string(),
                ]);
            }
            None => {
                cmd.arg("--no-leader-election");
            }
        }
        cmd.args(&opts.extra);
        // Both streams append to one file: stdout through the copy below, stderr straight
        // from the process (without O_APPEND its writes would overwrite the copied lines).
        std::fs::File::create(&log).expect("log file");
        let stderr = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .expect("log file");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("operator starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        let log_copy = log.clone();
        std::thread::spawn(move || {
            let mut sink = std::fs::OpenOptions::new()
                .append(true)
                .open(&log_copy)
                .ok();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(f) = sink.as_mut() {
                    use std::io::Write;
                    let _ = writeln!(f, "{line}");
                }
                let _ = tx.send(line);
            }
        });
        let mut api = None;
        let mut admin = None;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while api.is_none() || admin.is_none() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("api: ") {
                        api = Some(rest.split_whitespace().next().unwrap_or("").to_owned());
                    }
                    if let Some(rest) = line.strip_prefix("admin: ") {
                        admin = Some(rest.split_whitespace().next().unwrap_or("").to_owned());
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "operator did not start; its log:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
            }
        }
        Operator {
            child: Some(child),
            api: api.unwrap_or_default(),
            admin: admin.unwrap_or_default(),
            data_dir: opts.data_dir.to_owned(),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the process, if it still runs.
    pub fn signal(&self, signal: &str) {
        if let Some(child) = self.child.as_ref() {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; whether it did.
    pub fn exits_within(&mut self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let None | Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL: no cleanup, no lease release, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait (a clean stop).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = std::time::Instant::now() + Duration::from_secs(15);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `kubectl apply -k config/samples -n NS`: the samples exactly as users apply them.
pub fn apply_samples(ns: &str) {
    let dir = repo_path("config/samples");
    let (ok, out, err) = kubectl(&["apply", "-k", dir.to_str().unwrap_or(""), "-n", ns]);
    assert!(ok, "applying config/samples: {out}{err}");
}

/// Removes finalizers from every HarnessBinding left in `ns` (after the operator is
/// gone), so the namespace can be deleted.
pub fn drop_finalizers(ns: &str) {
    let (_, names, _) = kubectl(&["get", "harnessbindings", "-n", ns, "-o", "name"]);
    for name in names.lines().filter(|l| !l.is_empty()) {
        let _ = kubectl(&[
            "patch",
            name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
    }
}

/// One of the replicas of the controller chaos tests (`tests/operator_chaos.rs`,
/// `tests/control_plane_chaos.rs`): leader election with `lease_seconds`, the state
/// projected every second, and a MongoDB store of this namespace on the control plane's
/// FerretDB, as replicas must share (the embedded SQLite store is for one replica, and
/// a paused replica would hold its write lock).
pub fn chaos_replica(ns: &str, data: &Path, lease_seconds: u64) -> Operator {
    Operator::start(OperatorOptions {
        namespace: ns,
        data_dir: data,
        leader_lease_seconds: Some(lease_seconds),
        extra: vec![
            "--state-projection-seconds".into(),
            "1".into(),
            "--mongodb-uri".into(),
            control_plane().mongodb_uri.clone(),
            "--mongodb-database".into(),
            format!("chaos_{}", ns.replace('-', "_")),
        ],
    })
}

/// How many claims of the binding with `uid` are live (not being deleted) right now.
pub async fn live_claims(
    claims: &kube::Api<harness_engine::api::sandbox::SandboxClaim>,
    uid: &str,
) -> usize {
    let selector = format!(
        "{}={uid}",
        harness_engine::operator::binding::BINDING_UID_LABEL
    );
    claims
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .expect("claims")
        .items
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .count()
}
