//! `tollgate run`: load the config, bind everything, serve until SIGTERM or SIGINT,
//! then drain. Exit codes: 0 after a clean drain, 2 when the config or a bind fails.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::Admin;
use crate::config::{self, Config};
use crate::metrics::Metrics;
use crate::sides::Server;
use crate::worker::{self, WorkerPool, Workers};

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
