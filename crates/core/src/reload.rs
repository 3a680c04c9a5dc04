//! Hot reload: the config file (and the certificate files it names) is watched, and
//! re-read on change and on SIGHUP. A new config is validated in full before it is
//! swapped in; an invalid one is logged with every error, counted, and the old one
//! keeps serving. That includes a config that serves nothing
//! ([`Config::serves_anything`]): a shell redirect (`>`) truncates the file before it
//! writes, and a reload that reads it in between must not drop every upstream.
//!
//! The watch polls `stat` of each path, following symlinks, and compares device,
//! inode, size and modification time. That sees every way a file is replaced:
//! a Kubernetes ConfigMap update (an atomic swap of the `..data` symlink in the mounted
//! directory, so the path resolves to a new inode), an editor's write-and-rename, and a
//! write in place. Polling never misses an event the way an inotify watch on a replaced
//! inode or directory can, and needs no watch descriptors. A burst of changes is
//! debounced: a reload happens once the files have stopped changing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{self, Config};
use crate::metrics::ReloadResult;
use crate::sides::Server;

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_millis(250);
/// How long the files must stay unchanged before they are read.
const SETTLE: Duration = Duration::from_millis(100);

/// Device, inode, size and modification time (seconds, nanoseconds) of one file.
type FileStamp = (u64, u64, u64, i64, i64);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp(Vec<Option<FileStamp>>);

fn stamp(paths: &[PathBuf]) -> Stamp {
    Stamp(
        paths
            .iter()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .map(|m| (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
            })
            .collect(),
    )
}

/// The files a config depends on: itself and its certificates.
fn watched(path: &Path, config: &Config) -> Vec<PathBuf> {
    let mut out = vec![path.to_path_buf()];
    for u in &config.upstreams {
        if let Some(t) = &u.tls {
            out.extend(t.files().map(|(_, f)| f.path.clone()));
        }
    }
    out
}

/// What a reload did, for the watcher.
#[derive(Debug)]
pub struct Reloaded {
    pub result: ReloadResult,
    /// The certificate files a refused config names: they are watched too, so fixing
    /// only a certificate (a Secret that lands after its ConfigMap) is seen.
    pub refused_files: Vec<PathBuf>,
}

/// Reads, validates and applies the config at `path`, and says what it changed: one
/// line per upstream added, removed or changed, every setting that waits for a
/// restart, and the lints of the new config (in Kubernetes nearly every change
/// arrives by reload, so they are not left to `run`'s start).
pub async fn reload(path: &Path, server: &Server) -> Reloaded {
    let metrics = server.shared().metrics().clone();
    let config = match config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            metrics.reload(ReloadResult::Error);
            for d in &errors.0 {
                tracing::error!(problem = %d, "config reload rejected");
            }
            if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
                tracing::warn!(file = %path.display(), "the config file is empty: still being written? It is read again when it changes");
            }
            tracing::error!(
                file = %path.display(),
                problems = errors.0.len(),
                "config reload rejected; the previous config keeps serving"
            );
            return Reloaded {
                result: ReloadResult::Error,
                refused_files: files_named(path),
            };
        }
    };
    let running = server.shared().snapshot().config.clone();
    let reconciled = config::diff::reconcile(&running, config);
    for change in &reconciled.changes {
        tracing::info!("{change}");
    }
    for what in &reconciled.restart_needed {
        tracing::warn!(setting = %what, "changed in the config, but takes effect only after a restart");
    }
    for d in config::lint(&reconciled.in_effect) {
        tracing::warn!(lint = %d, "config warning");
    }
    let applied = server
        .apply(reconciled.in_effect, reconciled.restart_needed)
        .await;
    for (upstream, error) in &applied.unbound {
        tracing::warn!(%upstream, %error, "its listen port could not be bound; the rest of the config is in force, and the port is tried again at the next reload");
    }
    let result = if applied.unbound.is_empty() {
        tracing::info!(file = %path.display(), "config reloaded");
        ReloadResult::Ok
    } else {
        tracing::warn!(file = %path.display(), "config reloaded in part");
        ReloadResult::Partial
    };
    metrics.reload(result);
    Reloaded {
        result,
        refused_files: Vec::new(),
    }
}

/// The certificate files a config file names, read from its text alone (a config
/// refused for a missing certificate still parses).
fn files_named(path: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let base = path.parent().unwrap_or(Path::new("."));
    match config::parse(&path.display().to_string(), &text, base) {
        Ok(c) => watched(path, &c).split_off(1),
        Err(_) => Vec::new(),
    }
}

/// Watches `path` and listens for SIGHUP, reloading into `server`.
pub fn spawn(path: PathBuf, server: Arc<Server>) -> tokio::task::JoinHandle<()> {
    // Registered before returning, so a SIGHUP right after start is not lost.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    tokio::spawn(watch(path, server, hup))
}

async fn watch(path: PathBuf, server: Arc<Server>, mut hup: Option<tokio::signal::unix::Signal>) {
    let mut files = watched(&path, &server.shared().snapshot().config);
    // Unknown at first: the file may have changed between being loaded and now, so the
    // first look compares its content with the config in force.
    let mut last: Option<Stamp> = None;
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
        };
        let mut now = stamp(&files);
        if !forced && last.as_ref() == Some(&now) {
            continue;
        }
        if !forced {
            // Let a burst of writes finish before reading.
            for _ in 0..50 {
                tokio::time::sleep(SETTLE).await;
                let again = stamp(&files);
                if again == now {
                    break;
                }
                now = again;
            }
            if now.0.first().is_some_and(|s| s.is_none()) {
                // The file is gone for now (mid-rename): look again on the next tick.
                last = Some(now);
                continue;
            }
            let certificates_changed = match &last {
                Some(l) => l.0.get(1..) != now.0.get(1..),
                // The first look: the files may have changed since they were loaded.
                None => !config::files_unchanged(&server.shared().snapshot().config),
            };
            let serving = server.shared().snapshot().config.source_hash;
            let same_text =
                std::fs::read_to_string(&path).is_ok_and(|t| config::source_hash(&t) == serving);
            if same_text && !certificates_changed {
                // Nothing to reload; but if a bad edit was refused, it is gone now.
                if server.shared().metrics().in_effect_again() {
                    tracing::info!(file = %path.display(), "the file on disk is the config in force again; the refused edit is gone");
                }
                last = Some(now);
                continue;
            }
        }
        tracing::info!(signal = forced, "config change seen; reloading");
        let reloaded = reload(&path, &server).await;
        files = watched(&path, &server.shared().snapshot().config);
        for f in reloaded.refused_files {
            if !files.contains(&f) {
                files.push(f);
            }
        }
        last = Some(if files.len() == now.0.len() {
            now
        } else {
            stamp(&files)
        });
    }
}
