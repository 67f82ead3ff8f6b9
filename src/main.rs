//! `harness-engine`: the operator binary.

use std::{fs, io::Write, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use harness_engine::{
    api::crds,
    domain::limits::Limits,
    server::{self, AppState, ServerConfig, local},
    store::{Store, sqlite::SqliteStore},
};

#[derive(Parser)]
#[command(
    name = "harness-engine",
    version,
    about = "Keeps AI-agent harness state outside disposable sandbox pods"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the data-plane HTTP API alone, on the embedded SQLite store, without
    /// Kubernetes. With no flags it creates its data directory, identity key and token
    /// file, and prints where they are.
    Serve(Box<ServeArgs>),
    /// Print the OpenAPI document of the data-plane API (JSON), or write it to a file.
    Openapi {
        /// Write the document here instead of printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print the CustomResourceDefinitions as YAML, or write one file per CRD.
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Print the version.
    Version,
}

#[derive(Args)]
struct ServeArgs {
    /// Address of the API (`/v1`, `/openapi.json`). Port 0 picks a free port; the
    /// address actually bound is printed.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Address of `/live`, `/ready` and `/metrics`.
    #[arg(long, default_value = "127.0.0.1:8081")]
    admin_listen: SocketAddr,
    /// Where the database, and the generated key and token file, live
    /// (default: `$XDG_DATA_HOME/harness-engine` or `~/.local/share/harness-engine`).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Token file (YAML or JSON: principal, token_sha256, subjects). Default: generated
    /// in the data directory on first start, with one token printed once.
    #[arg(long, value_name = "FILE")]
    tokens_file: Option<PathBuf>,
    /// HMAC identity key (at least 32 bytes). Default: 32 random bytes generated into the
    /// data directory (mode 0600) on first start.
    #[arg(long, value_name = "FILE")]
    identity_key_file: Option<PathBuf>,
    /// Environment id: part of every binding id, so environments sharing a database never collide.
    #[arg(long, default_value = "local")]
    environment: String,
    /// Deadline of one request in milliseconds (504 `timeout` when passed).
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    request_timeout_ms: u64,
    /// Sustained writes per second per binding (default: the built-in limit).
    #[arg(long)]
    writes_per_second: Option<u32>,
    /// Write burst per binding above the sustained rate (default: the built-in limit).
    #[arg(long)]
    write_burst: Option<u32>,
    /// Deployment memory configuration (YAML): organization, approvers, application
    /// writers, the strictest write policy, retention policies. See docs/memory.md.
    #[arg(long, value_name = "FILE")]
    memory_config: Option<PathBuf>,
    /// `MemoryPolicy` objects (YAML, several documents per file allowed). Repeatable.
    #[arg(long = "memory-policy", value_name = "FILE")]
    memory_policies: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => serve(*args)?,
        Command::Openapi { out } => {
            let json = server::openapi::to_json(&server::openapi::document());
            match out {
                Some(path) => {
                    fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?
                }
                None => print!("{json}"),
            }
        }
        Command::Crds { out_dir } => {
            for crd in crds::all() {
                let yaml = crds::to_yaml(&crd)?;
                match &out_dir {
                    Some(dir) => {
                        fs::create_dir_all(dir)
                            .with_context(|| format!("creating {}", dir.display()))?;
                        let path = dir.join(crds::file_name(&crd));
                        fs::write(&path, yaml)
                            .with_context(|| format!("writing {}", path.display()))?;
                    }
                    None => print!("---\n{yaml}"),
                }
            }
        }
        Command::Version => println!("harness-engine {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let setup = local::prepare(
        args.data_dir,
        args.tokens_file,
        args.identity_key_file,
        &args.environment,
    )
    .context("preparing the data directory")?;
    let mut limits = Limits::default();
    if let Some(rate) = args.writes_per_second {
        limits.writes_per_second = rate;
    }
    if let Some(burst) = args.write_burst {
        limits.write_burst = burst;
    }
    let memory = server::memory_config::load(args.memory_config.as_deref(), &args.memory_policies)
        .context("loading memory policy")?;
    let mut config = ServerConfig::new(limits.clone());
    config.request_timeout = Duration::from_millis(args.request_timeout_ms.max(1));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let store = SqliteStore::open(&setup.database, limits).await.with_context(|| format!("opening {}", setup.database.display()))?;
        let store: Arc<dyn Store> = Arc::new(store);
        let api = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        let admin = tokio::net::TcpListener::bind(args.admin_listen).await.with_context(|| format!("binding {}", args.admin_listen))?;
        let api_addr = api.local_addr()?;
        let admin_addr = admin.local_addr()?;

        let created = |yes: bool| if yes { " (created)" } else { "" };
        let mut out = std::io::stdout().lock();
        writeln!(out, "harness-engine serve {}: environment {}", env!("CARGO_PKG_VERSION"), setup.keyring.environment())?;
        writeln!(out, "data directory: {}", setup.data_dir.display())?;
        writeln!(out, "database: {}", setup.database.display())?;
        writeln!(out, "identity key: {}{}", setup.identity_key_file.display(), created(setup.created_key))?;
        writeln!(out, "token file: {}{}", setup.tokens_file.display(), created(setup.created_token.is_some()))?;
        if let Some(token) = &setup.created_token {
            writeln!(out, "new token for principal {:?} acting for subject {:?} (shown once; only its SHA-256 is stored):", local::LOCAL_PRINCIPAL, local::LOCAL_SUBJECT)?;
            writeln!(out, "token: {token}")?;
        }
        writeln!(out, "api: http://{api_addr} (OpenAPI document at /openapi.json)")?;
        writeln!(out, "admin: http://{admin_addr} (/live /ready /metrics)")?;
        out.flush()?;
        drop(out);

        let state = AppState::new(store, setup.keyring, Arc::new(setup.tokens), config);
        state.memory_policies().replace(memory);
        server::serve(state, api, admin, shutdown_signal()).await.context("serving")?;
        eprintln!("harness-engine serve: stopped");
        Ok(())
    })
}

/// Resolves on Ctrl-C or SIGTERM (what Kubernetes and most supervisors send).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
