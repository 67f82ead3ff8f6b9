//! Checked histories under faults (issue 17, item 1): many concurrent clients against a
//! real data plane, every invocation and response recorded with timestamps, faults
//! injected on a schedule fixed by the seed, and the history checked by `e2e/checker`
//! (porcupine) against a model of each binding and memory record.
//!
//! - SQLite: `harness-engine serve` (the real binary) on a data directory that lives on a
//!   tmpfs of its own; fences are raised and epochs cleared through the store API on the
//!   same database file, as an operator sharing the store would. Faults: SIGKILL and
//!   SIGSTOP/SIGCONT of `serve`, the data filesystem filled to the last byte.
//! - MongoDB: the same data plane on the MongoDB store in a child process ([`node`]),
//!   against its own FerretDB whose data directory is on the tmpfs. Faults: SIGKILL and
//!   SIGSTOP/SIGCONT of the node and of FerretDB, the filesystem full.
//!
//! After the run the injector heals everything, kills the server once more (every
//! acknowledged write must survive it), reads every binding, object and memory record,
//! and stops. The history, the faults as they happened, the checker's summary and the
//! servers' logs stay in `target/chaos/<run>/`.

pub mod history;
pub mod node;
pub mod system;
pub mod workload;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex, atomic::AtomicBool},
    time::{Duration, Instant},
};

use harness_engine::{
    domain::{ids::BindingId, limits::Limits},
    store::sqlite::SqliteStore,
};
use rand::{Rng, seq::SliceRandom};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::RwLock;

use history::Recorder;
use system::{Control, Disk, Proc, free_port, wait_port, wait_ready};
use workload::{Api, BindingState, Eras, Fence, MemoryKey};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sqlite,
    Mongo,
}

impl Backend {
    pub fn parse(s: &str) -> Option<Backend> {
        match s {
            "sqlite" => Some(Backend::Sqlite),
            "mongo" | "mongodb" | "ferretdb" => Some(Backend::Mongo),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Mongo => "mongo",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub seed: u64,
    pub backend: Backend,
    pub duration_s: u64,
    pub bindings: usize,
    pub workers_per_binding: usize,
    pub object_keys: usize,
    pub memory_keys: usize,
    pub memory_clients_per_key: usize,
    /// The clients move to fresh bindings and memory records every `era_s` seconds.
    pub era_s: u64,
    /// Size of the data filesystem.
    pub disk_mib: u64,
    /// The test function that re-runs as the MongoDB node.
    #[serde(skip)]
    pub node_test: &'static str,
}

impl Config {
    pub fn new(backend: Backend, seed: u64, duration_s: u64, node_test: &'static str) -> Self {
        Config {
            seed,
            backend,
            duration_s,
            bindings: 3,
            workers_per_binding: 3,
            object_keys: 2,
            memory_keys: 2,
            memory_clients_per_key: 2,
            era_s: 300,
            disk_mib: if duration_s > 600 { 512 } else { 96 },
            node_test,
        }
    }

    /// `CHAOS_SEED` (default: from the clock, printed), `CHAOS_DURATION` (`90s`, `15m`,
    /// `1h`), `CHAOS_ERA` (how long the clients stay on one set of bindings; 5 minutes).
    pub fn from_env(backend: Backend, default_duration_s: u64, node_test: &'static str) -> Self {
        let seed = std::env::var("CHAOS_SEED")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse()
                    .unwrap_or_else(|_| panic!("CHAOS_SEED={s} is not a number"))
            })
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_secs() % 1_000_000)
            });
        let duration = std::env::var("CHAOS_DURATION")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| parse_duration(&s))
            .unwrap_or(default_duration_s);
        let mut config = Config::new(backend, seed, duration, node_test);
        if let Some(era) = std::env::var("CHAOS_ERA").ok().filter(|s| !s.is_empty()) {
            config.era_s = parse_duration(&era).max(1);
        }
        config
    }
}

/// `90`, `90s`, `15m`, `1h`.
pub fn parse_duration(s: &str) -> u64 {
    let s = s.trim();
    let (n, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: u64 = n
        .parse()
        .unwrap_or_else(|_| panic!("duration {s:?}: expected e.g. 90s, 15m, 1h"));
    match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => panic!("duration {s:?}: unit must be s, m or h"),
    }
}

#[derive(Debug, Serialize)]
pub struct RunReport {
    pub config: Config,
    pub out_dir: PathBuf,
    pub wall_seconds: f64,
    pub operations: usize,
    pub by_op: BTreeMap<String, BTreeMap<String, usize>>,
    pub faults: BTreeMap<String, u32>,
    pub disk_fault: String,
    /// Server processes that exited by themselves (not killed by the injector).
    pub unexpected_exits: Vec<String>,
    pub verdict: String,
    pub checker: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    KillServer,
    PauseServer,
    DiskFull,
    KillFerretdb,
    PauseFerretdb,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::KillServer => "kill-server",
            Fault::PauseServer => "pause-server",
            Fault::DiskFull => "disk-full",
            Fault::KillFerretdb => "kill-ferretdb",
            Fault::PauseFerretdb => "pause-ferretdb",
        }
    }
}

/// The processes and the filesystem, owned by the fault injector during the run.
struct System {
    backend: Backend,
    engine: Proc,
    ferret: Option<Proc>,
    ferret_port: u16,
    disk: Option<Disk>,
    ready_url: String,
    http: reqwest::Client,
    unexpected_exits: Vec<String>,
}

impl System {
    /// Kills the server and starts it again: a barrier at its death (SQLite) or after
    /// the gap (the node, whose last commands FerretDB may still be running).
    async fn restart_engine(&mut self, rec: &Recorder, gate: &RwLock<()>, gap: Duration) {
        self.engine.kill();
        if self.backend == Backend::Sqlite {
            rec.barrier();
        }
        // Every request invoked before the death has finished once this is granted.
        drop(gate.write().await);
        tokio::time::sleep(gap).await;
        if self.backend == Backend::Mongo {
            rec.barrier();
        }
        self.start_engine().await;
    }

    async fn start_engine(&mut self) {
        for attempt in 1..=3 {
            self.engine.start();
            if wait_ready(&self.http, &self.ready_url, Duration::from_secs(30)).await {
                return;
            }
            eprintln!(
                "chaos: {} not ready after start #{attempt}",
                self.engine.name
            );
            self.engine.kill();
        }
        panic!(
            "{} did not become ready three times in a row; see its log",
            self.engine.name
        );
    }

    async fn start_ferret(&mut self) {
        let port = self.ferret_port;
        if let Some(ferret) = &mut self.ferret {
            ferret.start();
            assert!(
                wait_port(port, Duration::from_secs(30)).await,
                "FerretDB did not listen on {port} within 30s; see its log"
            );
        }
    }

    fn check_exits(&mut self, rec: &Recorder) {
        if let Some(status) = self.engine.exited() {
            rec.fault("unexpected-exit", format!("{} {status}", self.engine.name));
            self.unexpected_exits
                .push(format!("{} exited by itself: {status}", self.engine.name));
        }
        if let Some(ferret) = &mut self.ferret
            && let Some(status) = ferret.exited()
        {
            rec.fault("unexpected-exit", format!("ferretdb {status}"));
            self.unexpected_exits
                .push(format!("ferretdb exited by itself: {status}"));
        }
    }

    /// Everything running, nothing paused, the disk free.
    async fn heal(&mut self, rec: &Recorder, gate: &RwLock<()>) {
        if let Some(disk) = &self.disk {
            disk.free();
        }
        if let Some(ferret) = &mut self.ferret {
            ferret.resume();
        }
        self.engine.resume();
        self.check_exits(rec);
        if self.ferret.as_ref().is_some_and(|f| !f.running()) {
            self.start_ferret().await;
        }
        if !self.engine.running() {
            rec.barrier();
            drop(gate.write().await);
            self.start_engine().await;
        }
    }

    async fn inject(&mut self, step: &Planned, rec: &Recorder, gate: &RwLock<()>) {
        let time = Duration::from_millis(step.ms);
        match step.fault {
            Fault::KillServer => {
                rec.fault(step.fault.name(), format!("restart after {} ms", step.ms));
                self.restart_engine(rec, gate, time).await;
            }
            Fault::PauseServer => {
                rec.fault(step.fault.name(), format!("SIGSTOP for {} ms", step.ms));
                self.engine.pause();
                tokio::time::sleep(time).await;
                self.engine.resume();
            }
            Fault::DiskFull => {
                if let Some(disk) = &self.disk {
                    let filled = disk.fill();
                    rec.fault(
                        step.fault.name(),
                        format!("{} MiB of ballast, held {} ms", filled >> 20, step.ms),
                    );
                    tokio::time::sleep(time).await;
                    disk.free();
                }
            }
            Fault::KillFerretdb => {
                rec.fault(step.fault.name(), format!("restart after {} ms", step.ms));
                if let Some(ferret) = &mut self.ferret {
                    ferret.kill();
                }
                tokio::time::sleep(time).await;
                self.start_ferret().await;
            }
            Fault::PauseFerretdb => {
                rec.fault(step.fault.name(), format!("SIGSTOP for {} ms", step.ms));
                if let Some(ferret) = &mut self.ferret {
                    ferret.pause();
                    tokio::time::sleep(time).await;
                    ferret.resume();
                }
            }
        }
        self.check_exits(rec);
    }
}

/// One planned fault: when it starts (ms after the clients start), what, and how long
/// it lasts (the pause, the hold, or the time until the restart).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Planned {
    pub at_ms: u64,
    pub fault: Fault,
    pub ms: u64,
}

/// The fault schedule, fixed by the seed and the duration: a server kill first (every
/// run has one), then every other kind once in a seeded order, then seeded picks; a
/// seeded quiet spell of 0.5 to 2.5 s before each; nothing that would end after the run.
pub fn plan(seed: u64, kinds: &[Fault], duration_ms: u64) -> Vec<Planned> {
    let mut rng = workload::rng_for(seed, 9999);
    let mut order = kinds[1..].to_vec();
    order.shuffle(&mut rng);
    order.insert(0, kinds[0]);
    let mut plan = Vec::new();
    let mut at = 0;
    for n in 0.. {
        let pick = rng.random_range(0..kinds.len());
        let fault = order.get(n).copied().unwrap_or(kinds[pick]);
        let wait = rng.random_range(500..2500);
        let ms = match fault {
            Fault::KillServer => rng.random_range(200..1200),
            Fault::PauseServer => rng.random_range(200..6000),
            Fault::DiskFull => rng.random_range(500..3000),
            Fault::KillFerretdb => rng.random_range(300..2000),
            Fault::PauseFerretdb => rng.random_range(200..5000),
        };
        at += wait;
        if at + ms >= duration_ms {
            break;
        }
        plan.push(Planned {
            at_ms: at,
            fault,
            ms,
        });
        at += ms;
    }
    plan
}

/// Runs the plan (a step starts on time, or at once when restarts ran late), healing
/// everything after each step.
async fn nemesis(
    mut sys: System,
    plan: Vec<Planned>,
    start: Instant,
    rec: Arc<Recorder>,
    gate: Arc<RwLock<()>>,
) -> (System, BTreeMap<String, u32>) {
    let mut counts = BTreeMap::new();
    for step in &plan {
        tokio::time::sleep_until((start + Duration::from_millis(step.at_ms)).into()).await;
        sys.inject(step, &rec, &gate).await;
        *counts.entry(step.fault.name().to_owned()).or_insert(0) += 1;
        sys.heal(&rec, &gate).await;
    }
    (sys, counts)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { repo().join(p) })
        .unwrap_or_else(|| repo().join("target"))
}

/// Runs a script that prints a path on stdout.
fn script_path(script: &Path) -> PathBuf {
    let out = Command::new(script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The control plane's binaries (for FerretDB): `HARNESS_E2E_BIN`, the env file that
/// `e2e/scripts/up.sh` writes, or the build cache (`e2e/scripts/build.sh`, a no-op when
/// built).
fn e2e_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("HARNESS_E2E_BIN")
        && !bin.is_empty()
    {
        return PathBuf::from(bin);
    }
    if let Ok(env_file) = std::env::var("HARNESS_E2E_ENV")
        && let Ok(text) = std::fs::read_to_string(&env_file)
        && let Some(bin) = text.lines().find_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("export ").unwrap_or(l);
            l.strip_prefix("HARNESS_E2E_BIN=")
                .map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_owned())
        })
    {
        return PathBuf::from(bin);
    }
    script_path(&repo().join("e2e/scripts/build.sh"))
}

/// Builds (or finds in its cache) the checker and runs it on the history.
pub fn check_history(history: &Path, viz_dir: &Path) -> (String, Value) {
    let checker = script_path(&repo().join("e2e/checker/build.sh"));
    let out = Command::new(&checker)
        .arg("-viz")
        .arg(viz_dir)
        .arg(history)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", checker.display()));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the checker printed no summary ({e}); exit {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let verdict = summary["verdict"].as_str().unwrap_or("error").to_owned();
    (verdict, summary)
}

/// One run at a time per test binary: the two backends' runs would share two cores.
static ONE_RUN: Mutex<()> = Mutex::new(());

pub fn run(config: Config) -> RunReport {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run_async(config))
}

async fn run_async(config: Config) -> RunReport {
    let started = Instant::now();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let out_dir = target_dir().join("chaos").join(format!(
        "{}-seed{}-{stamp}",
        config.backend.name(),
        config.seed
    ));
    std::fs::create_dir_all(&out_dir).expect("run directory");
    eprintln!(
        "chaos: {} seed {} for {} s; output in {}",
        config.backend.name(),
        config.seed,
        config.duration_s,
        out_dir.display()
    );
    let tmp = tempfile::tempdir().expect("temp dir");
    let disk_root = tmp.path().join("disk");
    let (disk, disk_fault) = match Disk::mount(&disk_root, config.disk_mib) {
        Ok(disk) => (Some(disk), format!("tmpfs of {} MiB", config.disk_mib)),
        Err(why) => {
            eprintln!("chaos: the full-disk fault is skipped: {why}");
            std::fs::create_dir_all(&disk_root).expect("data dir");
            (None, format!("skipped: {why}"))
        }
    };
    let tokens_file = tmp.path().join("tokens.yaml");
    let token = system::write_tokens(&tokens_file);
    let (api_port, admin_port) = (free_port(), free_port());
    let base = format!("http://127.0.0.1:{api_port}");
    let ready_url = format!("http://127.0.0.1:{admin_port}/ready");
    let http = Api::client(Duration::from_secs(5));
    let rec = Arc::new(Recorder::new());
    let gate = Arc::new(RwLock::new(()));

    let (engine, ferret, ferret_port, control_port) = match config.backend {
        Backend::Sqlite => {
            let data_dir = disk_root.join("data");
            let tokens = tokens_file.clone();
            let engine = Proc::new("serve", out_dir.join("serve.log"), move || {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_harness-engine"));
                cmd.arg("serve")
                    .args(["--listen", &format!("127.0.0.1:{api_port}")])
                    .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
                    .arg("--data-dir")
                    .arg(&data_dir)
                    .arg("--tokens-file")
                    .arg(&tokens)
                    .args(["--environment", "chaos", "--request-timeout-ms", "3000"])
                    .arg("--memory-policy")
                    .arg(concat!(
                        env!("CARGO_MANIFEST_DIR"),
                        "/tests/fixtures/memory_policy_all_agents.yaml"
                    ));
                cmd
            });
            (engine, None, 0, 0)
        }
        Backend::Mongo => {
            let bin = e2e_bin();
            let ferret_port = free_port();
            let debug_port = free_port();
            let ferret_dir = disk_root.join("ferretdb");
            std::fs::create_dir_all(&ferret_dir).expect("ferretdb dir");
            let ferret = Proc::new("ferretdb", out_dir.join("ferretdb.log"), move || {
                let mut cmd = Command::new(bin.join("ferretdb"));
                cmd.arg("--handler=sqlite")
                    .arg(format!("--sqlite-url=file:{}/", ferret_dir.display()))
                    .arg(format!("--state-dir={}", ferret_dir.display()))
                    .arg(format!("--listen-addr=127.0.0.1:{ferret_port}"))
                    .arg(format!("--debug-addr=127.0.0.1:{debug_port}"))
                    .args(["--telemetry=disable", "--log-level=warn"]);
                cmd
            });
            let control_port = free_port();
            let node_config = node::NodeConfig {
                mongo_uri: format!("mongodb://127.0.0.1:{ferret_port}/"),
                database: "chaos".into(),
                data_dir: tmp.path().join("node"),
                tokens_file: tokens_file.clone(),
                api: ([127, 0, 0, 1], api_port).into(),
                admin: ([127, 0, 0, 1], admin_port).into(),
                control: ([127, 0, 0, 1], control_port).into(),
                request_timeout_ms: 3000,
            };
            let node_json = serde_json::to_string(&node_config).expect("node config");
            let test = config.node_test;
            let engine = Proc::new("node", out_dir.join("node.log"), move || {
                let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
                cmd.args(["--exact", test, "--nocapture", "--include-ignored"])
                    .args(["--test-threads", "1"])
                    .env(node::NODE_ENV, &node_json);
                cmd
            });
            (engine, Some(ferret), ferret_port, control_port)
        }
    };
    let mut sys = System {
        backend: config.backend,
        engine,
        ferret,
        ferret_port,
        disk,
        ready_url,
        http: http.clone(),
        unexpected_exits: Vec::new(),
    };
    sys.start_ferret().await;
    sys.start_engine().await;

    let api = Arc::new(Api {
        base: base.clone(),
        token,
        http: http.clone(),
        gate: gate.clone(),
        rec: rec.clone(),
    });
    let control = match config.backend {
        Backend::Sqlite => {
            let db = disk_root.join("data/state.db");
            let store = SqliteStore::open(&db, Limits::default())
                .await
                .unwrap_or_else(|e| panic!("opening {} beside serve: {e}", db.display()));
            Control::Store(Arc::new(store))
        }
        Backend::Mongo => Control::Http {
            base: format!("http://127.0.0.1:{control_port}"),
            http: http.clone(),
        },
    };

    // Bindings and memory records of every era, created before the run; a binding
    // starts at epoch 0, generation 1 (the model's initial state).
    let eras_n = usize::try_from(config.duration_s.div_ceil(config.era_s).max(1)).unwrap_or(1);
    let mut era_bindings = Vec::new();
    let mut era_memory = Vec::new();
    for era in 0..eras_n {
        let mut list = Vec::new();
        for b in 0..config.bindings {
            let i = era * config.bindings + b;
            let response = http
                .post(format!("{base}/v1/bindings"))
                .bearer_auth(&api.token)
                .header("Idempotency-Key", format!("bind-{i}"))
                .json(&json!({"agent_id": "chaos-agent", "conversation_id": format!("conv-{i}"), "harness": "strands"}))
                .send()
                .await
                .expect("bind");
            assert!(
                response.status().is_success(),
                "bind: {}",
                response.status()
            );
            let v: Value = response.json().await.expect("binding json");
            assert_eq!(
                (v["epoch"].as_u64(), v["lease_generation"].as_u64()),
                (Some(0), Some(1)),
                "a new binding starts at epoch 0, generation 1: {v}"
            );
            let id =
                BindingId::parse(v["binding_id"].as_str().unwrap_or_default()).expect("binding id");
            list.push(Arc::new(BindingState {
                id,
                part: format!("b{i}"),
                fence: Mutex::new(Fence {
                    epoch: 0,
                    generation: 1,
                }),
                next_generation: Mutex::new(2),
            }));
        }
        era_bindings.push(list);
        era_memory.push(
            (0..config.memory_keys)
                .map(|k| {
                    let i = era * config.memory_keys + k;
                    MemoryKey {
                        part: format!("m{i}"),
                        key: format!("chaos/m{i}"),
                    }
                })
                .collect::<Vec<_>>(),
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let clients_started = Instant::now();
    let deadline = clients_started + Duration::from_secs(config.duration_s);
    let eras = Arc::new(Eras {
        start: clients_started,
        length: Duration::from_secs(config.era_s),
        bindings: era_bindings,
        memory: era_memory,
    });
    let mut workers = Vec::new();
    for b in 0..config.bindings {
        for w in 0..config.workers_per_binding {
            workers.push(tokio::spawn(workload::worker(
                api.clone(),
                eras.clone(),
                b,
                b * 10 + w,
                config.seed,
                config.object_keys,
                stop.clone(),
            )));
        }
        workers.push(tokio::spawn(workload::operator(
            api.clone(),
            control.clone(),
            eras.clone(),
            b,
            100 + b,
            config.seed,
            stop.clone(),
        )));
    }
    for k in 0..config.memory_keys {
        for j in 0..config.memory_clients_per_key {
            workers.push(tokio::spawn(workload::memory_client(
                api.clone(),
                eras.clone(),
                k,
                200 + k * 10 + j,
                config.seed,
                stop.clone(),
            )));
        }
    }
    let mut kinds = vec![Fault::KillServer, Fault::PauseServer];
    if sys.disk.is_some() {
        kinds.push(Fault::DiskFull);
    }
    if config.backend == Backend::Mongo {
        kinds.extend([Fault::KillFerretdb, Fault::PauseFerretdb]);
    }
    let schedule = plan(config.seed, &kinds, config.duration_s * 1000);
    std::fs::write(
        out_dir.join("schedule.json"),
        serde_json::to_string_pretty(&schedule).expect("schedule"),
    )
    .expect("writing the schedule");
    let injector = tokio::spawn(nemesis(
        sys,
        schedule,
        clients_started,
        rec.clone(),
        gate.clone(),
    ));
    tokio::time::sleep_until(deadline.into()).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.await.expect("client task");
    }
    let (mut sys, faults) = injector.await.expect("fault injector");
    sys.heal(&rec, &gate).await;

    // The last fault: kill the server (and FerretDB) once more, then read everything.
    rec.fault("final-kill", "every acknowledged write must survive it");
    if sys.ferret.is_some() {
        sys.engine.kill();
        if let Some(ferret) = &mut sys.ferret {
            ferret.kill();
        }
        drop(gate.write().await);
        tokio::time::sleep(Duration::from_millis(500)).await;
        rec.barrier();
        sys.start_ferret().await;
        sys.start_engine().await;
    } else {
        sys.restart_engine(&rec, &gate, Duration::from_millis(200))
            .await;
    }
    let mut final_errors = Vec::new();
    for b in eras.all_bindings() {
        if let Err(e) = workload::final_reads(&api, &control, b, 300, config.object_keys).await {
            final_errors.push(e);
        }
    }
    for memory in eras.all_memory() {
        let mut revision = 0;
        let out = workload::memory_op(
            &api,
            &eras.bindings[0][0],
            &format!("{base}/v1/memory/user/records"),
            &memory.part,
            &memory.key,
            301,
            0,
            &mut revision,
            false,
        )
        .await;
        if out.status == "unknown" {
            final_errors.push(format!("final memory read {}: {out:?}", memory.part));
        }
    }
    drop(control);
    sys.engine.terminate(Duration::from_secs(10));
    rec.barrier();
    if let Some(ferret) = &mut sys.ferret {
        ferret.terminate(Duration::from_secs(5));
    }
    let unexpected_exits = std::mem::take(&mut sys.unexpected_exits);
    drop(sys);

    let history = rec.finish();
    let history_path = out_dir.join("history.jsonl");
    history::write_jsonl(&history_path, &history).expect("writing the history");
    history::write_jsonl(&out_dir.join("faults.jsonl"), &rec.faults()).expect("writing the faults");
    let mut by_op: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for op in &history {
        let key = if op.out.status == "fail" {
            format!("fail:{}", op.out.code)
        } else {
            op.out.status.to_owned()
        };
        *by_op
            .entry(op.f.to_owned())
            .or_default()
            .entry(key)
            .or_insert(0) += 1;
    }
    let (mut verdict, checker) = check_history(&history_path, &out_dir);
    if !final_errors.is_empty() {
        verdict = "fail".into();
    }
    let report = RunReport {
        config,
        out_dir: out_dir.clone(),
        wall_seconds: started.elapsed().as_secs_f64(),
        operations: history.len(),
        by_op,
        faults,
        disk_fault,
        unexpected_exits,
        verdict,
        checker: json!({"summary": checker, "final_errors": final_errors}),
    };
    let text = serde_json::to_string_pretty(&report).expect("report");
    std::fs::write(out_dir.join("report.json"), &text).expect("writing the report");
    let line = serde_json::to_string(&json!({
        "backend": report.config.backend,
        "seed": report.config.seed,
        "duration_s": report.config.duration_s,
        "wall_s": report.wall_seconds.round(),
        "operations": report.operations,
        "faults": report.faults,
        "verdict": report.verdict,
        "out_dir": report.out_dir,
    }))
    .expect("summary line");
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(target_dir().join("chaos/runs.jsonl"))
    {
        let _ = writeln!(f, "{line}");
    }
    eprintln!("chaos: {line}");
    drop(tmp);
    report
}

/// Asserts a run passed, with enough done to mean something.
pub fn assert_pass(report: &RunReport) {
    let summary = &report.checker["summary"];
    assert_eq!(
        report.verdict,
        "pass",
        "the checked history failed: {}\nrun directory: {}",
        serde_json::to_string_pretty(&report.checker).unwrap_or_default(),
        report.out_dir.display()
    );
    assert!(
        report.unexpected_exits.is_empty(),
        "servers exited by themselves: {:?} (see {})",
        report.unexpected_exits,
        report.out_dir.display()
    );
    let ok = |f: &str| {
        report
            .by_op
            .get(f)
            .and_then(|m| m.get("ok"))
            .copied()
            .unwrap_or(0)
    };
    for f in ["head", "commit", "oput", "oget", "fence", "mput", "mget"] {
        assert!(ok(f) > 0, "no {f} succeeded: {:?}", report.by_op);
    }
    assert!(
        report.faults.get("kill-server").copied().unwrap_or(0) > 0,
        "no server kill happened: {:?}",
        report.faults
    );
    assert_eq!(summary["linearizable"], "ok");
}
