//! `harness-engine`: the operator binary.

use std::{fs, io::Write, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use harness_engine::{
    api::crds,
    domain::limits::Limits,
    server::{self, AppState, ServerConfig, local},
    store::{Store, sqlite::SqliteStore},
    telemetry::{self, IngressPolicy},
    webhook,
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
    /// Run the operator: the HarnessBinding, SandboxProfile and MemoryPolicy controllers
    /// (leader only), the admission webhook and the data plane (every replica), against
    /// the cluster of the current kubeconfig or in-cluster config.
    Operator(Box<OperatorArgs>),
    /// Serve the MCP tools (docs/mcp.md) to one local agent over stdin and stdout, on
    /// the same data directory and store as `serve` (Streamable HTTP is at `/mcp` of
    /// `serve` and of the operator). Logs go to stderr; stdout is the protocol.
    Mcp(Box<McpArgs>),
    /// Print the OpenAPI document of the data-plane API (JSON), or write it to a file.
    Openapi {
        /// Write the document here instead of printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print the MCP tool list (the 17 tools, their schemas and the schema digest) as
    /// JSON, or write it to a file (`docs/mcp-tools.json`).
    McpTools {
        /// Write the list here instead of printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print the CustomResourceDefinitions as YAML, or write one file per CRD.
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Write a development CA and webhook serving certificate (`ca.crt`, `tls.crt`,
    /// `tls.key`) for local runs and tests; clusters use cert-manager.
    WebhookCert {
        /// Directory to write the three files into (created; existing files are replaced).
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
        /// DNS name or IP address the certificate is valid for (repeatable). Default:
        /// the in-cluster Service name, `localhost` and `127.0.0.1`.
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
    },
    /// Print the keyed subject reference (`hmac-sha256:...`) of an end-user subject, for
    /// `HarnessBinding.spec.subjectRef` in YAML. Needs the operator's identity key and
    /// environment.
    SubjectRef(SubjectRefArgs),
    /// Print the version.
    Version,
}

#[derive(Args)]
struct McpArgs {
    /// Speak MCP on stdin and stdout (required: the one transport of this command).
    #[arg(long)]
    stdio: bool,
    /// Agent id of the conversations a workspace name binds (a workspace key that is
    /// not a binding id names a conversation of the local principal).
    #[arg(long, default_value = "mcp")]
    agent: String,
    /// Harness of those conversations.
    #[arg(long, default_value = "claude_agent_sdk")]
    harness: String,
    /// The store, data directory, identity and policies: as `serve` (its listen
    /// addresses are not used here).
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Args)]
struct SubjectRefArgs {
    /// The end-user subject, exactly as a control-plane service names it in
    /// `Harness-Subject` (for example `user:alice`).
    subject: String,
    /// The operator's HMAC identity key (the chart mounts it at
    /// `/etc/harness-engine/identity/key`). Default: `identity.key` in `--data-dir`.
    #[arg(long, value_name = "FILE")]
    identity_key_file: Option<PathBuf>,
    /// The operator's data directory, holding `identity.key` when no file is named.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/harness-engine")]
    data_dir: PathBuf,
    /// The operator's environment id (its `--environment`): part of every reference.
    #[arg(long, default_value = "default")]
    environment: String,
}

/// The subject reference `harness-engine subject-ref` prints. Never creates a key: a
/// reference made with any other key than the operator's would name nobody.
fn subject_ref(args: &SubjectRefArgs) -> anyhow::Result<String> {
    use harness_engine::{domain::ids::Keyring, server::auth::valid_subject};
    if !valid_subject(&args.subject) {
        anyhow::bail!("the subject must be 1 to 256 bytes without control characters");
    }
    let path = args
        .identity_key_file
        .clone()
        .unwrap_or_else(|| args.data_dir.join("identity.key"));
    let key = fs::read(&path).with_context(|| {
        format!(
            "reading the identity key {}: pass the operator's key with --identity-key-file \
             (in a cluster: kubectl get secret <release>-identity -o jsonpath='{{.data.key}}' | base64 -d > key)",
            path.display()
        )
    })?;
    let keyring = Keyring::new(key, &args.environment)
        .with_context(|| format!("identity key {}", path.display()))?;
    Ok(keyring.subject_ref(&args.subject).as_str().to_owned())
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
    /// Host names `/mcp` answers (repeatable; `*`: any). Default: the loopback names
    /// when `--listen` is a loopback address (DNS-rebinding protection), else any.
    #[arg(long = "mcp-allowed-host", value_name = "HOST")]
    mcp_allowed_hosts: Vec<String>,
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
    /// What to do with a well-formed incoming W3C `traceparent`: `continue` the caller's
    /// trace, or `restart` (a new trace linked to the caller's). A malformed one is always
    /// replaced. Traces are exported when OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/telemetry.md).
    #[arg(long, default_value = "continue", value_name = "POLICY")]
    trace_ingress: IngressPolicy,
    /// Deployment memory configuration (YAML): organization, approvers, application
    /// writers, the strictest write policy, retention policies. See docs/memory.md.
    #[arg(long, value_name = "FILE")]
    memory_config: Option<PathBuf>,
    /// `MemoryPolicy` objects (YAML, several documents per file allowed). Repeatable.
    #[arg(long = "memory-policy", value_name = "FILE")]
    memory_policies: Vec<PathBuf>,
    /// MongoDB connection string: keep state in MongoDB instead of the embedded store
    /// (the data directory still holds the key and the token file).
    #[arg(long, env = "HARNESS_ENGINE_MONGODB_URI", value_name = "URI")]
    mongodb_uri: Option<String>,
    /// MongoDB database name.
    #[arg(long, default_value = "harness_engine")]
    mongodb_database: String,
    #[command(flatten)]
    budgets: BudgetArgs,
}

/// The run ledger's circuit breakers (docs/ledger.md "Budgets"). Each flag replaces one
/// default; 0 means no limit.
#[derive(Args)]
struct BudgetArgs {
    /// Events one turn may append (default 1000).
    #[arg(long, value_name = "N")]
    budget_turn_steps: Option<u64>,
    /// Tokens one turn may report in `usage.tokens` (default: no limit).
    #[arg(long, value_name = "N")]
    budget_turn_tokens: Option<u64>,
    /// Cost units one turn may report in `usage.cost_units` (default: no limit).
    #[arg(long, value_name = "N")]
    budget_turn_cost_units: Option<u64>,
    /// Irreversible effect attempts in one turn (default 16).
    #[arg(long, value_name = "N")]
    budget_turn_irreversible: Option<u64>,
    /// Events one run may append (default 100000).
    #[arg(long, value_name = "N")]
    budget_run_steps: Option<u64>,
    /// Tokens one run may report (default: no limit).
    #[arg(long, value_name = "N")]
    budget_run_tokens: Option<u64>,
    /// Cost units one run may report (default: no limit).
    #[arg(long, value_name = "N")]
    budget_run_cost_units: Option<u64>,
    /// Irreversible effect attempts in one run (default 256).
    #[arg(long, value_name = "N")]
    budget_run_irreversible: Option<u64>,
}

impl BudgetArgs {
    fn apply(&self, budgets: &mut harness_engine::domain::ledger::Budgets) {
        let set = |slot: &mut Option<u64>, flag: Option<u64>| {
            if let Some(n) = flag {
                *slot = (n > 0).then_some(n);
            }
        };
        set(&mut budgets.per_turn.steps, self.budget_turn_steps);
        set(&mut budgets.per_turn.tokens, self.budget_turn_tokens);
        set(
            &mut budgets.per_turn.cost_units,
            self.budget_turn_cost_units,
        );
        set(
            &mut budgets.per_turn.irreversible,
            self.budget_turn_irreversible,
        );
        set(&mut budgets.per_run.steps, self.budget_run_steps);
        set(&mut budgets.per_run.tokens, self.budget_run_tokens);
        set(&mut budgets.per_run.cost_units, self.budget_run_cost_units);
        set(
            &mut budgets.per_run.irreversible,
            self.budget_run_irreversible,
        );
    }
}

#[derive(Args)]
struct OperatorArgs {
    /// Address of the data-plane API.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Address of `/live`, `/ready` and `/metrics`.
    #[arg(long, default_value = "0.0.0.0:8081")]
    admin_listen: SocketAddr,
    /// Host names `/mcp` answers (repeatable). Default: any (every request carries a
    /// bearer token; a Service answers under whatever names the platform gives it).
    #[arg(long = "mcp-allowed-host", value_name = "HOST")]
    mcp_allowed_hosts: Vec<String>,
    /// Directory of the embedded store and (unless `--identity-key-file`) the identity key.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/harness-engine")]
    data_dir: PathBuf,
    /// MongoDB connection string: use MongoDB instead of the embedded store.
    #[arg(long, env = "HARNESS_ENGINE_MONGODB_URI", value_name = "URI")]
    mongodb_uri: Option<String>,
    /// MongoDB database name.
    #[arg(long, default_value = "harness_engine")]
    mongodb_database: String,
    /// HMAC identity key (at least 32 bytes), shared by every replica.
    #[arg(long, value_name = "FILE")]
    identity_key_file: Option<PathBuf>,
    /// Environment id: part of every binding id.
    #[arg(long, default_value = "default")]
    environment: String,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Run the controllers without leader election (one replica only).
    #[arg(long)]
    no_leader_election: bool,
    /// Namespace of the leader-election Lease (default: `--namespace`, else `harness-engine-system`).
    #[arg(long, env = "POD_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "harness-engine-operator")]
    leader_election_id: String,
    /// Leader lease duration in seconds. The leader renews every fifth of it and stops
    /// acting when it could not renew for two thirds of it (the renew deadline).
    #[arg(long, default_value_t = 15)]
    leader_lease_seconds: u64,
    /// Reconciles running at once per controller. A reconcile mostly waits on one API
    /// write (reads come from watch caches), so this bounds writes in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: u16,
    /// Address of the admission webhook (HTTPS). Unset: no webhook in this process.
    #[arg(long)]
    webhook_listen: Option<SocketAddr>,
    /// Directory holding the webhook's `tls.crt` and `tls.key` (re-read when they change).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/etc/harness-engine/webhook-tls"
    )]
    webhook_cert_dir: PathBuf,
    /// Manage the webhook's certificates in this Secret (namespace `POD_NAMESPACE`, else
    /// the leader election namespace): the leader issues and rotates a CA and serving
    /// certificate and keeps the `caBundle` of `--webhook-configuration` current; every
    /// replica writes the serving pair into `--webhook-cert-dir` (which must be writable).
    /// Unset: the certificate files are provided (cert-manager, Helm, a mounted Secret).
    #[arg(long, value_name = "NAME", requires = "webhook_configuration")]
    webhook_certs_secret: Option<String>,
    /// The ValidatingWebhookConfiguration whose webhooks trust the managed CA.
    #[arg(long, value_name = "NAME")]
    webhook_configuration: Option<String>,
    /// Names the managed serving certificate is valid for (comma-separated DNS names or
    /// IP addresses; the webhook Service's names).
    #[arg(long, value_name = "HOSTS", value_delimiter = ',')]
    webhook_cert_hosts: Vec<String>,
    /// Lifetime of a managed serving certificate, in seconds (re-issued with a third
    /// left). Default 90 days.
    #[arg(long, default_value_t = 90 * 86_400)]
    webhook_cert_lifetime_seconds: u64,
    /// Lifetime of a managed CA, in seconds (rotated with a third left). Default 10 years.
    #[arg(long, default_value_t = 3650 * 86_400)]
    webhook_ca_lifetime_seconds: u64,
    /// Seconds between the leader's retention sweeps of thread state and memory
    /// (each writes an audit record); 0 turns sweeping off.
    #[arg(long, default_value_t = 3600)]
    sweep_interval_seconds: u64,
    /// A pending write never committed is deleted after this many seconds.
    #[arg(long, default_value_t = 86_400)]
    pending_ttl_seconds: u64,
    /// A conversation with no write for this many seconds has its thread state deleted
    /// (binding, heads, native state, objects, streams; never memory, which follows its
    /// own retention policy). Unset: thread state is kept until its binding is cleared.
    #[arg(long)]
    conversation_ttl_seconds: Option<u64>,
    /// Users allowed to change `HarnessBinding.status.lease` (repeatable). Default: this
    /// operator's ServiceAccount, `system:serviceaccount:<POD_NAMESPACE>:harness-engine`.
    #[arg(long = "operator-identity", value_name = "USER")]
    operator_identities: Vec<String>,
    /// Deployment memory configuration (YAML; the chart mounts its ConfigMap here):
    /// organization, approvers, application writers, the loosest write policy, shared
    /// learning, kinds, retention policies. Re-read every 10 s; a change applies to the
    /// data plane and the webhook, an invalid change is logged and ignored. Unset: the
    /// defaults (docs/memory.md).
    #[arg(long, value_name = "FILE")]
    memory_config: Option<PathBuf>,
    /// How often a Ready binding's `status.state` is refreshed from the store, in seconds
    /// (the projection is rate-limited to this per binding).
    #[arg(long, default_value_t = 30)]
    state_projection_seconds: u64,
    /// How long start-up waits for our CRDs to be established, in seconds.
    #[arg(long, default_value_t = 60)]
    crd_wait_seconds: u64,
    /// Log format on stderr (levels and targets from `RUST_LOG`).
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "HARNESS_ENGINE_LOG_FORMAT"
    )]
    log_format: harness_engine::operator::logging::LogFormat,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => serve(*args)?,
        Command::Operator(args) => operator(*args)?,
        Command::Mcp(args) => mcp_stdio(*args)?,
        Command::Openapi { out } => {
            let json = server::openapi::to_json(&server::openapi::document());
            match out {
                Some(path) => {
                    fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?
                }
                None => print!("{json}"),
            }
        }
        Command::McpTools { out } => {
            let json = harness_engine::mcp::catalog::to_json();
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
        Command::WebhookCert { out_dir, hosts } => {
            let hosts = if hosts.is_empty() {
                webhook::certs::default_hosts()
            } else {
                hosts
            };
            let written = webhook::certs::self_signed(&out_dir, &hosts)?;
            println!(
                "wrote {}, {} and {} for {}",
                written.ca_file.display(),
                written.cert_file.display(),
                written.key_file.display(),
                hosts.join(", ")
            );
        }
        Command::SubjectRef(args) => println!("{}", subject_ref(&args)?),
        Command::Version => println!("harness-engine {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Warnings and errors (a store failure, an unreadable key) go to stderr through the
    // same log layer as the operator's, filtered by RUST_LOG.
    let log_format = match std::env::var("HARNESS_ENGINE_LOG_FORMAT").as_deref() {
        Ok("json") => harness_engine::operator::logging::LogFormat::Json,
        _ => harness_engine::operator::logging::LogFormat::Text,
    };
    let telemetry =
        telemetry::init_with_logs(Some(harness_engine::operator::logging::layer(log_format)))
            .context("starting telemetry (OTEL_* settings)")?;
    let (limits, memory, config) = local_settings(&args)?;
    let setup = local::prepare(
        args.data_dir.clone(),
        args.tokens_file.clone(),
        args.identity_key_file.clone(),
        &args.environment,
    )
    .context("preparing the data directory")?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let telemetry_ref = &telemetry;
    let served = runtime.block_on(async move {
        let telemetry = telemetry_ref;
        let store = open_local_store(&args, &setup.database, limits).await?;
        let api = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        let admin = tokio::net::TcpListener::bind(args.admin_listen).await.with_context(|| format!("binding {}", args.admin_listen))?;
        let api_addr = api.local_addr()?;
        let admin_addr = admin.local_addr()?;

        let created = |yes: bool| if yes { " (created)" } else { "" };
        let mut out = std::io::stdout().lock();
        writeln!(out, "harness-engine serve {}: environment {}", env!("CARGO_PKG_VERSION"), setup.keyring.environment())?;
        writeln!(out, "data directory: {}", setup.data_dir.display())?;
        match &args.mongodb_uri {
            Some(_) => writeln!(out, "database: MongoDB database {}", args.mongodb_database)?,
            None => writeln!(out, "database: {}", setup.database.display())?,
        }
        writeln!(out, "identity key: {}{}", setup.identity_key_file.display(), created(setup.created_key))?;
        writeln!(out, "token file: {}{}", setup.tokens_file.display(), created(setup.created_token.is_some()))?;
        if let Some(token) = &setup.created_token {
            writeln!(out, "new token for principal {:?} acting for subject {:?} (shown once; only its SHA-256 is stored):", local::LOCAL_PRINCIPAL, local::LOCAL_SUBJECT)?;
            writeln!(out, "token: {token}")?;
        }
        writeln!(out, "telemetry: {} (trace ingress: {})", telemetry.describe(), args.trace_ingress)?;
        writeln!(out, "api: http://{api_addr} (OpenAPI document at /openapi.json, MCP at /mcp)")?;
        writeln!(out, "admin: http://{admin_addr} (/live /ready /metrics)")?;
        out.flush()?;
        drop(out);

        let state = AppState::new(store, setup.keyring, Arc::new(setup.tokens), config);
        state.memory_policies().replace(memory);
        if let Some(path) = &args.memory_config {
            tokio::spawn(server::memory_config::watch_deployment(
                path.clone(),
                state.memory_policies().clone(),
                Duration::from_secs(10),
            ));
        }
        let hosts = harness_engine::mcp::HostPolicy::for_listener(api_addr, &args.mcp_allowed_hosts);
        let router = harness_engine::mcp::with_mcp(state.clone(), server::app(state.clone()), hosts);
        server::serve_app(state, router, api, admin, shutdown_signal()).await.context("serving")?;
        eprintln!("harness-engine serve: stopped");
        Ok(())
    });
    // Flush queued spans outside the async runtime (shutdown blocks on the last export).
    telemetry.shutdown();
    served
}

/// What `serve` and `mcp --stdio` derive from their flags: store limits, the memory
/// policies and the server settings.
fn local_settings(
    args: &ServeArgs,
) -> anyhow::Result<(
    Limits,
    harness_engine::domain::memory::policy::MemoryPolicySet,
    ServerConfig,
)> {
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
    config.trace_ingress = args.trace_ingress;
    args.budgets.apply(&mut config.ledger_budgets);
    Ok((limits, memory, config))
}

/// The store of `serve` and `mcp --stdio`: MongoDB when a URI is given, else the
/// embedded SQLite file of the data directory.
async fn open_local_store(
    args: &ServeArgs,
    database: &std::path::Path,
    limits: Limits,
) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match &args.mongodb_uri {
        Some(uri) => Arc::new(
            harness_engine::store::mongo::MongoStore::connect(uri, &args.mongodb_database, limits)
                .await
                .context("connecting to MongoDB")?,
        ),
        None => Arc::new(
            SqliteStore::open(database, limits)
                .await
                .with_context(|| format!("opening {}", database.display()))?,
        ),
    })
}

fn mcp_stdio(args: McpArgs) -> anyhow::Result<()> {
    if !args.stdio {
        anyhow::bail!(
            "harness-engine mcp serves stdio only: pass --stdio (Streamable HTTP is at /mcp of `serve` and of the operator)"
        );
    }
    let serve_args = args.serve;
    let telemetry = telemetry::init_with_logs(Some(harness_engine::operator::logging::layer(
        harness_engine::operator::logging::LogFormat::Text,
    )))
    .context("starting telemetry (OTEL_* settings)")?;
    let (limits, memory, config) = local_settings(&serve_args)?;
    let mut setup = local::prepare(
        serve_args.data_dir.clone(),
        serve_args.tokens_file.clone(),
        serve_args.identity_key_file.clone(),
        &serve_args.environment,
    )
    .context("preparing the data directory")?;
    // The local agent is the local principal, with a token that exists only in this
    // process: it authenticates like any caller, and owns the same bindings as `serve`'s.
    let token = setup
        .tokens
        .add_ephemeral(local::LOCAL_PRINCIPAL, &[local::LOCAL_SUBJECT.to_owned()])
        .context("minting the local agent's token")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let named = harness_engine::mcp::NamedWorkspaces {
        agent_id: args.agent,
        harness: args.harness,
    };
    let served = runtime.block_on(async move {
        let store = open_local_store(&serve_args, &setup.database, limits).await?;
        let state = AppState::new(store, setup.keyring, Arc::new(setup.tokens), config);
        state.memory_policies().replace(memory);
        eprintln!(
            "harness-engine mcp {}: stdio, data directory {}",
            env!("CARGO_PKG_VERSION"),
            setup.data_dir.display()
        );
        if let Some(created) = &setup.created_token {
            // This start created the token file: its token is shown once, here, for
            // `serve` on the same directory later (stdout is the protocol).
            eprintln!(
                "token file {} created; token for principal {:?} (shown once): {created}",
                setup.tokens_file.display(),
                local::LOCAL_PRINCIPAL
            );
        }
        harness_engine::mcp::serve_stdio(server::app(state), &token, named).await
    });
    telemetry.shutdown();
    served
}

fn operator(args: OperatorArgs) -> anyhow::Result<()> {
    use harness_engine::{
        operator::{self, Context as OperatorContext, OperatorConfig, OperatorMetrics, leader},
        server::{admin, auth::kubernetes},
        store::mongo::MongoStore,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let telemetry = telemetry::init_with_logs(Some(operator::logging::layer(args.log_format)))
        .context("starting telemetry (OTEL_* settings)")?;
    println!("telemetry: {}", telemetry.describe());
    let result = runtime.block_on(async move {
        let metrics = OperatorMetrics::default();
        let client = operator::counting_client(metrics.api_requests.clone())
            .await
            .context("connecting to Kubernetes (kubeconfig or in-cluster config)")?;
        operator::check_crds(&client, Duration::from_secs(args.crd_wait_seconds)).await?;

        std::fs::create_dir_all(&args.data_dir)
            .with_context(|| format!("creating {}", args.data_dir.display()))?;
        let (keyring, key_file, created) = local::identity_key(
            &args.data_dir,
            args.identity_key_file.clone(),
            &args.environment,
        )
        .context("loading the identity key")?;
        let limits = Limits::default();
        let store: Arc<dyn Store> = match &args.mongodb_uri {
            Some(uri) => Arc::new(
                MongoStore::connect(uri, &args.mongodb_database, limits.clone())
                    .await
                    .context("connecting to MongoDB")?,
            ),
            None => {
                let path = args.data_dir.join("state.db");
                Arc::new(
                    SqliteStore::open(&path, limits.clone())
                        .await
                        .with_context(|| format!("opening {}", path.display()))?,
                )
            }
        };
        let retention = operator::retention::RetentionSchedule::from_flags(
            args.sweep_interval_seconds,
            args.pending_ttl_seconds,
            args.conversation_ttl_seconds,
        )
        .map_err(anyhow::Error::msg)?;
        let auth = kubernetes::KubernetesAuthenticator::new(
            client.clone(),
            kubernetes::KubernetesAuthConfig::default(),
        );
        let server_metrics = admin::Metrics::with_extra(|r| metrics.register(r));
        let state = server::AppState::with_metrics(
            store.clone(),
            keyring.clone(),
            Arc::new(auth),
            ServerConfig::new(limits),
            server_metrics,
        );
        // One deployment memory configuration for the data plane and the webhook.
        let memory = state.memory_policies().clone();
        if let Some(path) = &args.memory_config {
            memory.set_deployment(server::memory_config::load_deployment(path)?);
            tokio::spawn(server::memory_config::watch_deployment(
                path.clone(),
                memory.clone(),
                Duration::from_secs(10),
            ));
        }
        // Binds from control-plane services create the conversation's HarnessBinding
        // with this process's own ServiceAccount (docs/operator.md).
        state.use_binding_objects(Arc::new(server::binding_objects::KubeBindingObjects::new(
            client.clone(),
            args.namespace.clone(),
        )));
        let api = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let admin_listener = tokio::net::TcpListener::bind(args.admin_listen)
            .await
            .with_context(|| format!("binding {}", args.admin_listen))?;
        let hostname = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "harness-engine".into());
        let identity = format!("{hostname}_{:08x}", rand::random::<u32>());
        {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "harness-engine operator {}: environment {}, identity {identity}",
                env!("CARGO_PKG_VERSION"),
                keyring.environment()
            )?;
            writeln!(
                out,
                "identity key: {}{}",
                key_file.display(),
                if created { " (created)" } else { "" }
            )?;
            writeln!(out, "api: http://{}", api.local_addr()?)?;
            writeln!(
                out,
                "admin: http://{} (/live /ready /metrics)",
                admin_listener.local_addr()?
            )?;
            writeln!(
                out,
                "watching: {}",
                args.namespace.as_deref().unwrap_or("all namespaces")
            )?;
            out.flush()?;
        }

        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = {
            let rx = stop_rx.clone();
            move || {
                let mut rx = rx.clone();
                async move {
                    let _ = rx.wait_for(|s| *s).await;
                }
            }
        };
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop_tx.send(true);
        });
        tokio::spawn(operator::memory_policy::feed(
            client.clone(),
            args.namespace.clone(),
            state.memory_policies().clone(),
        ));
        let scopes = harness_engine::domain::memory::policy::BindingScopes::default();
        state.use_binding_scopes(scopes.clone());
        tokio::spawn(operator::memory_policy::feed_bindings(
            client.clone(),
            args.namespace.clone(),
            scopes,
            state.ledger_budgets().clone(),
        ));
        tokio::spawn(operator::profile::feed_ledger_rules(
            client.clone(),
            args.namespace.clone(),
            state.ledger_budgets().clone(),
        ));
        let hosts = harness_engine::mcp::HostPolicy {
            allowed_hosts: args.mcp_allowed_hosts.clone(),
        };
        let router =
            harness_engine::mcp::with_mcp(state.clone(), server::app(state.clone()), hosts);
        let data_plane = tokio::spawn(server::serve_app(
            state,
            router,
            api,
            admin_listener,
            stopped(),
        ));
        let managed_certs = match &args.webhook_certs_secret {
            Some(secret) => Some(Arc::new(operator::webhook_certs::CertConfig {
                namespace: std::env::var("POD_NAMESPACE")
                    .ok()
                    .or_else(|| args.leader_election_namespace.clone())
                    .or_else(|| args.namespace.clone())
                    .unwrap_or_else(|| "harness-engine-system".into()),
                secret: secret.clone(),
                webhook_configuration: args.webhook_configuration.clone().unwrap_or_default(),
                hosts: if args.webhook_cert_hosts.is_empty() {
                    webhook::certs::default_hosts()
                } else {
                    args.webhook_cert_hosts.clone()
                },
                cert_lifetime: Duration::from_secs(args.webhook_cert_lifetime_seconds.max(3)),
                ca_lifetime: Duration::from_secs(args.webhook_ca_lifetime_seconds.max(3)),
                cert_dir: args.webhook_cert_dir.clone(),
            })),
            None => None,
        };
        // The leader's own work besides the controllers: the managed certificates.
        let leader_extras = {
            let (client, metrics, certs) = (client.clone(), metrics.clone(), managed_certs.clone());
            let (stopped, store, retention) = (stopped.clone(), store.clone(), retention.clone());
            move || {
                let (client, metrics, certs, stopped) = (
                    client.clone(),
                    metrics.clone(),
                    certs.clone(),
                    stopped.clone(),
                );
                let (store, retention) = (store.clone(), retention.clone());
                async move {
                    let certs = async {
                        if let Some(certs) = certs {
                            operator::webhook_certs::run(
                                client,
                                certs,
                                metrics.webhook_certs.clone(),
                                stopped(),
                            )
                            .await;
                        }
                    };
                    let sweeps = async {
                        if let Some(schedule) = retention {
                            operator::retention::run(
                                store,
                                schedule,
                                metrics.retention.clone(),
                                stopped(),
                            )
                            .await;
                        }
                    };
                    futures::future::join(certs, sweeps).await;
                }
            }
        };
        let webhook_task = match args.webhook_listen {
            Some(addr) => {
                let identities = if args.operator_identities.is_empty() {
                    let ns = std::env::var("POD_NAMESPACE")
                        .unwrap_or_else(|_| "harness-engine-system".into());
                    vec![format!("system:serviceaccount:{ns}:harness-engine")]
                } else {
                    args.operator_identities.clone()
                };
                let hook = Arc::new(webhook::Webhook::new(
                    webhook::WebhookConfig {
                        operator_identities: identities,
                        memory: memory.clone(),
                    },
                    Arc::new(webhook::KubeLookup::new(client.clone())),
                ));
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {addr}"))?;
                println!("webhook: https://{}", listener.local_addr()?);
                let cert = args.webhook_cert_dir.join("tls.crt");
                let key = args.webhook_cert_dir.join("tls.key");
                if let Some(certs) = &managed_certs {
                    tokio::spawn(operator::webhook_certs::sync_files(
                        client.clone(),
                        certs.clone(),
                        Duration::from_secs(5),
                        stopped(),
                    ));
                } else {
                    // Provided files must be there and usable now: fail the start early.
                    webhook::tls::ReloadingAcceptor::new(cert.clone(), key.clone()).with_context(
                        || format!("loading the webhook certificate {}", cert.display()),
                    )?;
                }
                let managed = managed_certs.is_some();
                let stopped = stopped.clone();
                Some(tokio::spawn(async move {
                    if managed {
                        // The first pair comes from the Secret the leader creates.
                        wait_for_files(&[&cert, &key], stopped()).await;
                        if !cert.exists() {
                            return; // stopped before the first pair arrived
                        }
                    }
                    match webhook::tls::ReloadingAcceptor::new(cert.clone(), key) {
                        Ok(acceptor) => {
                            webhook::tls::serve_with(
                                listener,
                                Arc::new(acceptor),
                                webhook::router(hook),
                                stopped(),
                            )
                            .await
                        }
                        Err(error) => tracing::error!(
                            file = %cert.display(),
                            %error,
                            "webhook: cannot load the certificate; the webhook is not served"
                        ),
                    }
                }))
            }
            None => None,
        };

        let lease_duration = Duration::from_secs(args.leader_lease_seconds.max(2));
        let (renew_deadline, renew_every, retry_every, call_timeout) =
            leader::LeaderConfig::timings(lease_duration);
        let config = OperatorConfig {
            namespace: args.namespace.clone(),
            leader: leader::LeaderConfig {
                enabled: !args.no_leader_election,
                namespace: args
                    .leader_election_namespace
                    .clone()
                    .or_else(|| args.namespace.clone())
                    .unwrap_or_else(|| "harness-engine-system".into()),
                name: args.leader_election_id.clone(),
                identity: identity.clone(),
                lease_duration,
                renew_deadline,
                renew_every,
                retry_every,
                call_timeout,
            },
            concurrency: args.concurrency.max(1),
            crd_wait: Duration::from_secs(args.crd_wait_seconds),
        };
        let elector = leader::Elector::new(client.clone(), config.leader.clone());
        let ctx = Arc::new(
            OperatorContext::new(
                client.clone(),
                store,
                keyring,
                metrics.clone(),
                &identity,
                Duration::from_secs(args.state_projection_seconds.max(1)),
            )
            .with_memory(memory.clone())
            .with_leadership(elector.leadership()),
        );
        let lost = if config.leader.enabled {
            tokio::select! {
                () = elector.acquire() => {}
                () = stopped() => {
                    let _ = data_plane.await;
                    return Ok(());
                }
            }
            println!(
                "leading: lease {}/{}",
                config.leader.namespace, config.leader.name
            );
            metrics.leader.set(1);
            tokio::select! {
                _ = futures::future::join(
                    operator::run_controllers(ctx, &config, stopped()),
                    leader_extras(),
                ) => false,
                () = elector.hold() => true,
            }
        } else {
            metrics.leader.set(1);
            futures::future::join(
                operator::run_controllers(ctx, &config, stopped()),
                leader_extras(),
            )
            .await;
            false
        };
        metrics.leader.set(0);
        if lost {
            anyhow::bail!(
                "lost the leader lease: exiting so a supervisor restarts this replica as a follower"
            );
        }
        if config.leader.enabled {
            elector.release().await;
        }
        data_plane
            .await
            .context("data plane task")?
            .context("serving")?;
        if let Some(task) = webhook_task {
            task.await.context("webhook task")?;
        }
        eprintln!("harness-engine operator: stopped");
        Ok(())
    });
    drop(runtime);
    telemetry.shutdown();
    result
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

/// Waits until every file exists (the managed webhook certificate's first pair), or
/// `stop` resolves.
async fn wait_for_files(files: &[&std::path::Path], stop: impl std::future::Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut said = false;
    while !files.iter().all(|f| f.exists()) {
        if !said {
            tracing::info!(
                file = %files.first().map(|f| f.display().to_string()).unwrap_or_default(),
                "webhook: waiting for the managed certificate"
            );
            said = true;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
            () = &mut stop => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(subject: &str, key_file: Option<PathBuf>, environment: &str) -> SubjectRefArgs {
        SubjectRefArgs {
            subject: subject.into(),
            identity_key_file: key_file,
            data_dir: PathBuf::from("/nonexistent/harness-engine"),
            environment: environment.into(),
        }
    }

    #[test]
    fn subject_ref_is_the_operators_reference_and_needs_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = b"subject-ref-test-key-0123456789abcdef".to_vec();
        let file = dir.path().join("key");
        fs::write(&file, &key).expect("key");
        let printed = subject_ref(&args("user:alice", Some(file.clone()), "e2e")).expect("ref");
        let keyring = harness_engine::domain::ids::Keyring::new(key, "e2e").expect("keyring");
        assert_eq!(printed, keyring.subject_ref("user:alice").as_str());
        assert!(printed.starts_with("hmac-sha256:") && printed.len() == 12 + 64);
        // The environment is part of the reference.
        let other = subject_ref(&args("user:alice", Some(file.clone()), "default")).expect("ref");
        assert_ne!(printed, other);

        let missing = subject_ref(&args("user:alice", None, "e2e")).expect_err("no key");
        let text = format!("{missing:#}");
        assert!(
            text.contains("/nonexistent/harness-engine/identity.key")
                && text.contains("--identity-key-file"),
            "{text}"
        );
        fs::write(&file, b"short").expect("short key");
        let short = subject_ref(&args("user:alice", Some(file), "e2e")).expect_err("short key");
        assert!(format!("{short:#}").contains("at least"), "{short:#}");
        let bad = subject_ref(&args("", None, "e2e")).expect_err("empty subject");
        assert!(bad.to_string().contains("subject"), "{bad}");
    }
}
