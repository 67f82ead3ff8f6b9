//! A FerretDB of the bench's own (the MongoDB protocol this machine can run): the binary
//! `e2e/scripts/build.sh` builds (cached), on free ports and a scratch directory,
//! stopped when dropped.

#![allow(dead_code)]

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

fn fail(msg: &str) -> ! {
    eprintln!("bench: {msg}");
    std::process::exit(1)
}

/// A FerretDB of our own, on a free port and a scratch directory, stopped on drop.
pub struct FerretDb {
    child: Child,
    port: u16,
}

impl FerretDb {
    pub fn start(scratch: &Path) -> Self {
        let bin = ferretdb_binary();
        let port = free_port();
        let debug_port = free_port();
        let data = scratch.join("ferretdb");
        let _ = std::fs::create_dir_all(&data);
        let child = Command::new(&bin)
            .arg("--handler=sqlite")
            .arg(format!("--sqlite-url=file:{}/", data.display()))
            .arg(format!("--listen-addr=127.0.0.1:{port}"))
            .arg("--telemetry=disable")
            .arg(format!("--state-dir={}", data.display()))
            .arg(format!("--debug-addr=127.0.0.1:{debug_port}"))
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| fail(&format!("starting {}: {e}", bin.display())));
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > until {
                fail("FerretDB did not listen within 20 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        FerretDb { child, port }
    }
    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/", self.port)
    }
}

impl Drop for FerretDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| fail(&format!("free port: {e}")))
}

/// The FerretDB built by `e2e/scripts/build.sh` (cached; builds on first use).
fn ferretdb_binary() -> PathBuf {
    if let Ok(bin) = std::env::var("HARNESS_E2E_BIN") {
        return PathBuf::from(bin).join("ferretdb");
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/scripts/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| fail(&format!("{}: {e}", script.display())));
    if !out.status.success() {
        fail("e2e/scripts/build.sh failed");
    }
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("ferretdb")
}
