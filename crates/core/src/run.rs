//! `tollgate run`: load the config, bind everything, serve until SIGTERM or SIGINT,
//! then drain. Exit codes: 0 after a clean drain, 2 when the config or a bind fails.
//!
//! Two binaries serve it: `tollgate`, every command, and `tollgate-proxy`, this command
//! alone, without the tools (the lab, the simulation, inject and its webhook, the
//! calculator), so a sidecar maps only the pages of what it runs. `tollgate run` hands
//! over to `tollgate-proxy` when it is installed beside it ([`PROXY_BINARY`]). Both read
//! their command line with the same [`RunArgs`] and [`LogArgs`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::admin::Admin;
use crate::config::{self, Config};
use crate::metrics::Metrics;
use crate::sides::Server;
use crate::worker::{self, WorkerPool, Workers};

/// The binary that serves `run` alone, installed beside `tollgate` (`cargo build
/// --release` and the image put it there).
pub const PROXY_BINARY: &str = "tollgate-proxy";

/// `run`'s arguments, the same in both binaries.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Config file [default: $TOLLGATE_CONFIG, then config/tollgate.toml].
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The log on stderr, a flag of every command; its level from `RUST_LOG`.
#[derive(clap::Args)]
pub struct LogArgs {
    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, value_enum, global = true, default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogArgs {
    /// Logs to stderr from here on, as asked (the access log too, in JSON).
    pub fn init(&self) {
        use std::io::IsTerminal;
        use tracing_subscriber::filter::Targets;
        use tracing_subscriber::prelude::*;
        let filter: Targets = std::env::var("RUST_LOG")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal());
        match self.log_format {
            LogFormat::Json => {
                tracing_subscriber::registry()
                    .with(fmt.json().with_filter(filter))
                    .init();
                crate::access_log::logs_are_json();
            }
            LogFormat::Text => tracing_subscriber::registry()
                .with(fmt.with_filter(filter))
                .init(),
        }
    }
}

/// This build: a hash of the source it was built from (build.rs). `tollgate run` hands
/// over only to a `tollgate-proxy` of the same build: `cargo run` rebuilds only the
/// binary it runs, and the one beside it may be older.
pub const BUILD: &str = env!("TOLLGATE_BUILD");

/// The environment variable of the hand-over: `BUILD PATH` from `tollgate` (its build and
/// where it is), `stale` back from a `tollgate-proxy` of another build.
const HANDOVER: &str = "TOLLGATE_HANDOVER";

/// Why `tollgate run` serves from its own binary when a `tollgate-proxy` is beside it.
pub enum Kept {
    /// The one beside it is of another build: it handed the process back.
    Stale(PathBuf),
    /// It could not be started.
    Failed(PathBuf, std::io::Error),
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kept::Stale(proxy) => write!(
                f,
                "{} is from another build than this binary (build both: cargo build); \
                 serving from this one",
                proxy.display()
            ),
            Kept::Failed(proxy, e) => write!(
                f,
                "could not start {}: {e}; serving from this binary",
                proxy.display()
            ),
        }
    }
}

/// In `tollgate run`: hands this process over to [`PROXY_BINARY`] beside the running
/// binary, with the same command line (its first word too, so `ps` shows what was
/// started): same process, same descriptors, only `run`'s pages. Returns only when it
/// did not: `None` when there is no such binary there, else why.
pub fn hand_over() -> Option<Kept> {
    let exe = std::env::current_exe().ok()?;
    let proxy = exe.with_file_name(PROXY_BINARY);
    if std::env::var_os(HANDOVER).is_some_and(|v| v == "stale") {
        return Some(Kept::Stale(proxy));
    }
    if !proxy.is_file() {
        return None;
    }
    let mut handover = std::ffi::OsString::from(format!("{BUILD} "));
    handover.push(&exe);
    let error = exec_same_args(&proxy, &handover);
    Some(Kept::Failed(proxy, error))
}

/// In `tollgate-proxy`: when a `tollgate` of another build handed over, hands the process
/// back to it, which then serves. Returns when this build is the one expected (or it was
/// started directly), or with why it could not hand back.
pub fn taken_over() -> Option<std::io::Error> {
    let handover = std::env::var_os(HANDOVER)?;
    let (build, from) = handover.to_str()?.split_once(' ')?;
    if build == BUILD {
        return None;
    }
    Some(exec_same_args(Path::new(from), "stale".as_ref()))
}

/// Replaces this process's program with `program` and this command line, [`HANDOVER`]
/// set to `handover`. Returns only when it failed.
fn exec_same_args(program: &Path, handover: &std::ffi::OsStr) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(program);
    if let Some(first) = args.next() {
        command.arg0(first);
    }
    command.args(args).env(HANDOVER, handover).exec()
}

/// Why `run` could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(#[from] config::ConfigErrors),
    #[error(transparent)]
    Bind(#[from] crate::listen::BindError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error(
        "tollgate's own connections are captured by this network namespace's NAT rules: \
         they must spare the UID tollgate runs as, {uid}, or every connection it opens \
         comes back to it (install them with `tollgate iptables --uid {uid}`)"
    )]
    SelfCaptured { uid: String },
}

/// A running tollgate: proxy, admin endpoint and the config watcher.
pub struct Running {
    pub server: Arc<Server>,
    pub admin: Admin,
    watcher: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Binds and serves `config` on the current runtime; `path` is watched for changes
    /// when given.
    pub async fn start(config: Config, path: Option<PathBuf>) -> Result<Self, StartError> {
        Self::start_on(config, path, Workers::current()).await
    }

    /// Binds and serves `config` on `workers`; admin and reload run on the current
    /// runtime.
    pub async fn start_on(
        config: Config,
        path: Option<PathBuf>,
        workers: Workers,
    ) -> Result<Self, StartError> {
        let metrics = Metrics::new();
        let admin_addr = config.admin.addr;
        let server = Arc::new(Server::start(config, metrics, workers).await?);
        let admin = Admin::start(admin_addr, server.shared().clone()).await?;
        let _ = server.shared().outbound.admin_bound.set(admin.local_addr());
        let watcher = path.map(|p| crate::reload::spawn(p, server.clone()));
        Ok(Running {
            server,
            admin,
            watcher,
        })
    }

    /// Stops accepting, drains, and stops the admin endpoint last (so `/readyz` says
    /// 503 while draining). Returns the connections cut off by the drain timeout.
    pub async fn shutdown(self, drain_timeout: Duration) -> usize {
        if let Some(w) = self.watcher {
            w.abort();
        }
        let left = self.server.shutdown(drain_timeout).await;
        self.admin.stop().await;
        left
    }
}

/// Waits for SIGTERM or SIGINT.
pub async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {},
                _ = i.recv() => {},
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Why `run` could not start, in the log's own format (so a JSON log stays JSON), or
/// on plain stderr when the log filter would drop errors: a failed start is never silent.
fn startup_error(what: impl std::fmt::Display) {
    if tracing::enabled!(tracing::Level::ERROR) {
        tracing::error!("{what}");
    } else {
        eprintln!("tollgate: {what}");
    }
}

/// `tollgate run`: returns the process exit code.
pub fn run(path: PathBuf) -> i32 {
    let config = match config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            for d in &e.0 {
                startup_error(d);
            }
            startup_error(format_args!(
                "the config has {} problem(s); not starting",
                e.0.len()
            ));
            return 2;
        }
    };
    for d in config::lint(&config) {
        tracing::warn!(lint = %d, "config warning");
    }
    let drain = config.listener.drain_timeout;
    // The workers serve traffic; this thread runs signals, reload and the admin
    // endpoint (and, with a single worker, the traffic too).
    let (pool, rt) =
        match WorkerPool::start(&config).and_then(|pool| Ok((pool, worker::runtime()?))) {
            Ok(v) => v,
            Err(e) => {
                startup_error(StartError::Runtime(e));
                return 2;
            }
        };
    let workers = pool.workers();
    let code = rt.block_on(async move {
        let running = match Running::start_on(config, Some(path), workers).await {
            Ok(r) => r,
            Err(e) => {
                startup_error(e);
                return 2;
            }
        };
        let listener = running.server.local_addr();
        if crate::loops::self_capture(listener, Duration::from_millis(300)).await {
            let uid = crate::loops::uid().map_or_else(|| "unknown".to_string(), |u| u.to_string());
            startup_error(StartError::SelfCaptured { uid });
            running.shutdown(Duration::ZERO).await;
            return 2;
        }
        tracing::info!(
            listener = %running.server.local_addr(),
            inbound = ?running.server.inbound_addr(),
            admin = %running.admin.local_addr(),
            "tollgate is serving"
        );
        terminated().await;
        tracing::info!(drain_timeout = ?drain, "draining");
        let cut = running.shutdown(drain).await;
        if cut > 0 {
            tracing::warn!(connections = cut, "drain timeout reached; closing the rest");
        }
        crate::access_log::drain(Duration::from_millis(500));
        tracing::info!("stopped");
        0
    });
    pool.stop();
    code
}
