//! Thread per core, as nginx, HAProxy and Envoy do it: one single-threaded runtime per
//! worker thread, each with its own listening socket on the same address
//! (`SO_REUSEPORT`: the kernel spreads the connections) and its own upstream connection
//! pools, so a request never crosses threads. The config snapshot, budgets and metrics
//! are shared. Every layer that keeps something per worker asks [`current`].

use std::cell::Cell;

use tokio::runtime::Handle;

use crate::config::Config;

/// Where connections are served: the current runtime, or one single-threaded runtime
/// per worker thread.
#[derive(Clone, Debug, Default)]
pub struct Workers(Vec<Handle>);

impl Workers {
    /// Everything on the runtime the server is started from.
    pub fn current() -> Self {
        Workers(Vec::new())
    }

    /// One worker per handle; each handle's thread must call [`set_current`] first.
    pub fn new(handles: Vec<Handle>) -> Self {
        Workers(handles)
    }

    pub fn count(&self) -> usize {
        self.0.len().max(1)
    }

    /// The workers' runtimes; empty when serving on the current runtime.
    pub fn handles(&self) -> &[Handle] {
        &self.0
    }
}

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as worker `index` (for per-worker connection pools).
pub fn set_current(index: usize) {
    WORKER.with(|w| w.set(index));
}

/// The worker the calling thread serves; 0 outside worker threads.
pub fn current() -> usize {
    WORKER.with(|w| w.get())
}

/// How many tasks a worker runs before it asks the kernel for new events while its queue
/// is not empty (tokio's default is 61). At 2,000 busy connections the queue never
/// empties, and asking every 61 tasks cost 4-9 % more CPU per request than every 1,024
/// in three paired runs (docs/benchmarks.md). When the queue empties, as it does under
/// tens of connections, the worker waits on the kernel at once either way; a timer or a
/// new connection is seen at worst some 1,024 requests' work later under saturation.
const EVENT_INTERVAL: u32 = 1024;

/// A worker's runtime: single-threaded, with the I/O and time drivers.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .event_interval(EVENT_INTERVAL)
        .build()
}

/// The worker threads `run` serves on: `worker_threads` from the config, else the CPUs
/// this process may use (cgroup quotas included). Each is a single-threaded runtime on
/// its own thread; with one worker, it is the calling thread.
pub struct WorkerPool {
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    handles: Vec<tokio::runtime::Handle>,
}

impl WorkerPool {
    pub fn start(config: &Config) -> std::io::Result<Self> {
        let n = config
            .runtime
            .worker_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let mut pool = WorkerPool {
            threads: Vec::new(),
            stop: None,
            handles: Vec::new(),
        };
        if n <= 1 {
            return Ok(pool);
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        for i in 0..n {
            let rt = runtime()?;
            pool.handles.push(rt.handle().clone());
            let mut stopped = stopped.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tollgate-{i}"))
                .spawn(move || {
                    set_current(i);
                    rt.block_on(async move {
                        let _ = stopped.changed().await;
                    });
                })?;
            pool.threads.push(thread);
        }
        pool.stop = Some(stop);
        Ok(pool)
    }

    pub fn workers(&self) -> Workers {
        Workers::new(self.handles.clone())
    }

    /// Stops every worker; their remaining tasks are dropped.
    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
