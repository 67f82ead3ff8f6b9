//! Stopping and starting the processes of the local control plane (etcd,
//! kube-apiserver, the Agent Sandbox controller, ...) in the middle of a test, the way a
//! crash and a supervisor's restart would: SIGKILL, then the same command line, working
//! directory and environment again, in its own session, its log appended and its pid
//! file rewritten so `e2e/scripts/down.sh` still stops it.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// One component of the run started by `e2e/scripts/up.sh`.
pub struct Component {
    name: String,
    run: PathBuf,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
}

fn nul_split(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

impl Component {
    /// The component `name` of the running control plane (its pid file names it).
    pub fn find(name: &str) -> Self {
        let env_file = PathBuf::from(
            std::env::var("HARNESS_E2E_ENV").expect("HARNESS_E2E_ENV (run through make test)"),
        );
        let run = env_file
            .parent()
            .expect("the env file lives in the run directory")
            .to_path_buf();
        let pid = Self::pid_in(&run, name);
        let argv = nul_split(
            &std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_else(|e| panic!("{name} (pid {pid}): {e}")),
        );
        let env = nul_split(&std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default())
            .into_iter()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|_| run.clone());
        assert!(!argv.is_empty(), "{name}: empty command line");
        Component {
            name: name.to_owned(),
            run,
            argv,
            env,
            cwd,
        }
    }

    fn pid_in(run: &std::path::Path, name: &str) -> u32 {
        let file = run.join("pids").join(format!("{name}.pid"));
        std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// SIGKILL, and wait until the process is gone.
    pub fn kill(&self) {
        let pid = Self::pid_in(&self.run, &self.name);
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "{} (pid {pid}) did not die",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts it again as it was started (same argv, environment, directory).
    pub fn start(&self) {
        let pidf = self.run.join("pids").join(format!("{}.pid", self.name));
        let _ = std::fs::remove_file(&pidf);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.run.join("logs").join(format!("{}.log", self.name)))
            .expect("the component's log");
        // `setsid --fork`: the component is not this process's child (nothing to reap
        // here; `down.sh` stops it through the pid file).
        let status = Command::new("setsid")
            .arg("--fork")
            .arg("bash")
            .arg("-c")
            .arg(r#"echo $$ >"$1"; shift; exec "$@""#)
            .arg(&self.name)
            .arg(&pidf)
            .args(&self.argv)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .status();
        let status = status.unwrap_or_else(|e| panic!("restarting {}: {e}", self.name));
        assert!(
            status.success(),
            "restarting {}: setsid {status}",
            self.name
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&pidf).map_or(true, |s| s.trim().is_empty()) {
            assert!(Instant::now() < deadline, "{} did not start", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
