//! What one row runs on: the upstream process, its broken replica if any, and each
//! column's path to it, with the real tollgate proxies (the same code as `run`, on
//! ephemeral loopback ports) configured from TOML.

use std::net::SocketAddr;
use std::path::Path as FsPath;

use tokio::time::Instant;

use super::app::{self, App};
use super::client::{Caller, Target};
use super::rows::{Broken, Column, FIXED_LIMIT, Feature, Path, Replicas, Row};
use crate::LabError;
use crate::backend::Silent;
use tollgate_core::run::Running;

/// The upstream of a row, and what its columns run.
pub struct Rig {
    pub app: App,
    silent: Option<Silent>,
    pub targets: Vec<Target>,
    proxies: Vec<Running>,
}

const LOOPBACK: &str = "[listener]\naddr = \"127.0.0.1:0\"\n[admin]\naddr = \"127.0.0.1:0\"\n";

fn quoted(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The caller's tollgate: one upstream, `app`, with retries on (`[retry]`, which they
/// are not without, and the `[budget]` that `check` asks for beside it), every key at
/// its default, plus `feature`. In the unknown-host row it lists another service only.
pub fn outbound_config(endpoints: &[SocketAddr], feature: Feature, unknown_host: bool) -> String {
    let name = if unknown_host { "other" } else { "app" };
    let (upstream, budget, section) = match feature {
        Feature::RefuseAppRetries => ("app_retries = \"refuse\"\n".to_string(), "", String::new()),
        Feature::FixedLimit => (format!("max_inflight = {FIXED_LIMIT}\n"), "", String::new()),
        Feature::MaxRatio => (String::new(), "max_ratio = 0.5\n", String::new()),
        Feature::Outlier => (String::new(), "", format!("[upstreams.{name}.outlier]\n")),
        Feature::Throttle => (String::new(), "", format!("[upstreams.{name}.throttle]\n")),
        Feature::None | Feature::AdaptiveLimit | Feature::Dedupe => {
            (String::new(), "", String::new())
        }
    };
    format!(
        "{LOOPBACK}[upstreams.{name}]\nauthorities = [\"{name}\"]\nendpoints = [{}]\n{upstream}\
         [upstreams.{name}.retry]\n[upstreams.{name}.budget]\n{budget}{section}",
        quoted(endpoints)
    )
}

/// An inbound tollgate in front of `app`, at its defaults plus `feature`.
pub fn inbound_config(app: SocketAddr, feature: Feature) -> String {
    let extra = match feature {
        Feature::AdaptiveLimit => "max_inflight = \"adaptive\"\n",
        Feature::Dedupe => "[inbound.dedupe]\n",
        _ => "",
    };
    format!("{LOOPBACK}[inbound]\naddr = \"127.0.0.1:0\"\napp = \"{app}\"\n{extra}")
}

async fn start(text: &str) -> Result<Running, LabError> {
    let config = tollgate_core::config::parse("harm.toml", text, FsPath::new("."))
        .map_err(|e| LabError::Setup(format!("{e}\n{text}")))?;
    Running::start(config, None)
        .await
        .map_err(|e| LabError::Setup(e.to_string()))
}

fn inbound_addr(r: &Running) -> Result<SocketAddr, LabError> {
    r.server
        .inbound_addr()
        .ok_or_else(|| LabError::Setup("the inbound side did not start".into()))
}

impl Rig {
    /// The upstream and every column's path; the upstream's clock starts at `start`.
    pub async fn build(row: &Row, seed: u64, start: Instant) -> Result<Rig, LabError> {
        let setup = |e: std::io::Error| LabError::Setup(e.to_string());
        let answering = match row.replicas {
            Replicas::One | Replicas::DualStack => 1,
            Replicas::Two | Replicas::ThreeOneBroken(_) => 2,
        };
        let app = App::start(row.behaviour, seed, start, answering)
            .await
            .map_err(setup)?;
        let mut replicas = app.addrs.clone();
        let mut silent = None;
        if let Replicas::ThreeOneBroken(broken) = row.replicas {
            let addr = match broken {
                Broken::Dead => app::dead().await.map_err(setup)?,
                Broken::Hung => {
                    let s = Silent::start().await.map_err(setup)?;
                    let addr = s.addr;
                    silent = Some(s);
                    addr
                }
            };
            // The broken one first: the rotation of every client starts there.
            replicas.insert(0, addr);
        }
        if row.replicas == Replicas::DualStack {
            // The same port on IPv6 loopback, where nothing listens, named first.
            let port = replicas.first().map_or(0, SocketAddr::port);
            replicas.insert(0, SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)));
        }
        let mut rig = Rig {
            app,
            silent,
            targets: Vec::new(),
            proxies: Vec::new(),
        };
        for column in &row.columns {
            let target = rig.path(row, column, &replicas).await?;
            rig.targets.push(target);
        }
        Ok(rig)
    }

    async fn path(
        &mut self,
        row: &Row,
        column: &Column,
        replicas: &[SocketAddr],
    ) -> Result<Target, LabError> {
        let app_authority = if row.unknown_host {
            // The host as the app names it: an address no upstream lists.
            replicas[0].to_string()
        } else {
            "app".to_string()
        };
        let target = |addrs: Vec<SocketAddr>, absolute| Target {
            addrs,
            host: app_authority.clone(),
            absolute,
        };
        match column.path {
            Path::Direct => Ok(target(replicas.to_vec(), false)),
            Path::Outbound => {
                let endpoints = if row.unknown_host {
                    vec![
                        app::dead()
                            .await
                            .map_err(|e| LabError::Setup(e.to_string()))?,
                    ]
                } else {
                    replicas.to_vec()
                };
                let proxy = start(&outbound_config(
                    &endpoints,
                    column.feature,
                    row.unknown_host,
                ))
                .await?;
                let addr = proxy.server.local_addr();
                self.proxies.push(proxy);
                // A real client program reaches tollgate as its `http_proxy`.
                let proxied = matches!(row.caller, Caller::Program(_));
                Ok(target(vec![addr], row.unknown_host || proxied))
            }
            Path::Sidecars => {
                let mut sidecars = Vec::new();
                for &replica in replicas {
                    // The callee's own feature (its dedupe) is its sidecars'.
                    let feature = match column.feature {
                        Feature::Dedupe => Feature::Dedupe,
                        _ => Feature::None,
                    };
                    let s = start(&inbound_config(replica, feature)).await?;
                    sidecars.push(inbound_addr(&s)?);
                    self.proxies.push(s);
                }
                let caller = start(&outbound_config(&sidecars, column.feature, false)).await?;
                let addr = caller.server.local_addr();
                self.proxies.push(caller);
                Ok(target(vec![addr], false))
            }
            Path::Inbound => {
                let inbound = start(&inbound_config(replicas[0], column.feature)).await?;
                let addr = inbound_addr(&inbound)?;
                self.proxies.push(inbound);
                Ok(target(vec![addr], false))
            }
        }
    }

    /// Stops every proxy, then the upstream.
    pub async fn stop(self) {
        for p in self.proxies {
            p.shutdown(std::time::Duration::ZERO).await;
        }
        if let Some(s) = self.silent {
            s.stop();
        }
        self.app.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_config_a_row_runs_is_valid() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap_or_else(|_| unreachable!());
        let features = [
            Feature::None,
            Feature::Outlier,
            Feature::MaxRatio,
            Feature::Throttle,
            Feature::RefuseAppRetries,
            Feature::AdaptiveLimit,
            Feature::FixedLimit,
            Feature::Dedupe,
        ];
        for f in features {
            for text in [
                outbound_config(&[a, a], f, false),
                outbound_config(&[a], f, true),
                inbound_config(a, f),
            ] {
                tollgate_core::config::parse("harm.toml", &text, FsPath::new("."))
                    .unwrap_or_else(|e| panic!("{f:?}: {e}\n{text}"));
            }
        }
    }
}
