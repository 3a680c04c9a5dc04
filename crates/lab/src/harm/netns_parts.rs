//! The parts of a harm row about Services that run inside its network namespaces, each
//! a process of its own started by the lab ([`super::netns_row`]) as `tollgate lab --scenario
//! harm` with `TOLLGATE_HARM_NETNS_PART` set: the pods' apps (the lab's [`App`], which
//! counts what each column sent each pod, printed when the lab closes its stdin) and the
//! client pod's app (the lab's [`Client`] for both columns, which writes the Service in
//! the API when the row has discovery, and prints what each call got).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::app::App;
use super::client::{self, Caller, Client, Target};
use super::kube::Api;
use super::netns::{
    ADMIN, APP_PORT, CALLER, DIR, DUAL, HEADLESS, PART, PODS, READY_WAIT, ROW, SEED, SVC_PORT,
    TOKEN, VIP, VIP_PORT, discovered,
};
use super::netns_row::{LEAD, LEAVE_AT, SCALE_AT, format_record};
use super::rows::{Row, Shape};

/// In a process started as a part of a row (`TOLLGATE_HARM_NETNS_PART`): runs that part,
/// and its exit code. `None` in the lab itself.
pub fn part_main() -> Option<i32> {
    let part = std::env::var(PART).ok()?;
    let row = std::env::var(ROW)
        .ok()
        .and_then(|k| super::rows::all().into_iter().find(|r| r.key == k));
    let seed = std::env::var(SEED).ok().and_then(|s| s.parse().ok());
    let (Some(row), Some(seed), Some(shape)) = (row.clone(), seed, row.and_then(|r| r.service))
    else {
        eprintln!("tollgate lab: {PART} without a row of network namespaces and a seed");
        return Some(2);
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate lab: {e}");
            return Some(1);
        }
    };
    let done = match part.as_str() {
        "apps" => rt.block_on(apps(&row, seed)),
        "client" => rt.block_on(client(row, shape, seed)),
        other => Err(format!("no part {other}")),
    };
    Some(match done {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tollgate lab: {part}: {e}");
            1
        }
    })
}

fn say(line: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())
}

/// The pods' apps, every pod's but the first's, until the lab closes stdin (or has been
/// gone long past the row): then what each column sent them.
async fn apps(row: &Row, seed: u64) -> Result<(), String> {
    let at: Vec<SocketAddr> = PODS[1..]
        .iter()
        .filter_map(|p| p.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, APP_PORT))
        .collect();
    let started = SystemTime::now();
    let app = App::start_on(row.behaviour, seed, Instant::now(), &at)
        .await
        .map_err(|e| e.to_string())?;
    say("READY")?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = tx.send(());
    });
    let lifetime = row.traffic.duration() + row.traffic.patience + Duration::from_secs(120);
    let _ = tokio::time::timeout(lifetime, rx).await;
    let epoch = started.duration_since(UNIX_EPOCH).unwrap_or_default();
    say(&format!("EPOCH_US {}", epoch.as_micros()))?;
    for ((replica, column), r) in app.counters.by_replica() {
        say(&format!(
            "REACHED {replica} {column} {} {} {}",
            r.first.as_micros(),
            r.last.as_micros(),
            r.calls
        ))?;
    }
    // Last: the lab reads up to these.
    for c in 0..row.columns.len() {
        let counters = &app.counters;
        say(&format!(
            "COUNT {c} {} {} {}",
            counters.calls(c),
            counters.retries(c),
            counters.peak(c)
        ))?;
    }
    app.stop();
    Ok(())
}

/// The addresses of pods `n`, at their sidecars.
fn pods(n: &[usize]) -> Result<Vec<SocketAddr>, String> {
    n.iter()
        .map(|&i| {
            let ip: IpAddr = PODS
                .get(i)
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("no pod {i}"))?;
            Ok(SocketAddr::new(ip, SVC_PORT))
        })
        .collect()
}

/// The API ready, the Service made with its first pods' slices, and the caller's
/// tollgate watching them: the API, for the changes to come.
async fn discover(shape: Shape) -> Result<Api, String> {
    let dir = PathBuf::from(std::env::var(DIR).map_err(|_| format!("no {DIR}"))?);
    let token = std::env::var(TOKEN).map_err(|_| format!("no {TOKEN}"))?;
    let api = Api::ready(&dir, token).await?;
    api.create_service().await?;
    let first: &[usize] = match shape {
        Shape::DiscoveredScale => &[1, 2],
        _ => &[0, 1, 2],
    };
    for (&n, addr) in first.iter().zip(pods(first)?) {
        api.add_pod(n, addr.ip(), SVC_PORT).await?;
    }
    let until = Instant::now() + READY_WAIT;
    let want = format!(
        "tollgate_discovery_endpoints{{upstream=\"payments\"}} {}",
        first.len()
    );
    loop {
        if metrics()
            .await
            .is_some_and(|m| m.lines().any(|l| l.trim() == want))
        {
            return Ok(api);
        }
        if Instant::now() > until {
            return Err(format!("the caller's tollgate never showed `{want}`"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The caller's tollgate's `/metrics`.
async fn metrics() -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(ADMIN).await.ok()?;
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {ADMIN}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).await.ok()?;
        Some(text)
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

/// The client pod's app: once every sidecar and the caller's tollgate listen, the row's
/// calls down both columns at once, then what each call got.
async fn client(row: Row, shape: Shape, seed: u64) -> Result<(), String> {
    let caller: SocketAddr = CALLER.parse().map_err(|_| "the caller's address")?;
    let mut listening: Vec<SocketAddr> = PODS
        .iter()
        .filter_map(|p| p.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, SVC_PORT))
        .collect();
    listening.push(caller);
    let until = Instant::now() + READY_WAIT;
    for addr in listening {
        loop {
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
                break;
            }
            if Instant::now() > until {
                return Err(format!("nothing listens at {addr}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let api = if discovered(shape) {
        Some(Arc::new(discover(shape).await?))
    } else {
        None
    };
    let direct: Vec<SocketAddr> = match shape {
        Shape::ClusterIpDeadPod | Shape::DiscoveredDeadPod => {
            let vip: IpAddr = VIP.parse().map_err(|_| "the VIP")?;
            vec![SocketAddr::new(vip, VIP_PORT)]
        }
        Shape::DiscoveredScale => pods(&[1, 2])?,
        Shape::HeadlessDeadFirst | Shape::HeadlessScaleUp | Shape::HeadlessScaleDown => {
            tokio::net::lookup_host((HEADLESS, SVC_PORT))
                .await
                .map_err(|e| format!("{HEADLESS}: {e}"))?
                .collect()
        }
        Shape::DualStackName => {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((DUAL, APP_PORT))
                .await
                .map_err(|e| format!("{DUAL}: {e}"))?
                .collect();
            if addrs.first().is_none_or(|a| !a.is_ipv6()) || addrs.len() != 2 {
                return Err(format!("{DUAL} resolves to {addrs:?}, not ::1 then IPv4"));
            }
            addrs
        }
    };
    let target = |addrs| Target {
        addrs,
        host: "payments".to_string(),
        absolute: false,
    };
    // A pod that fails is found by a new connection: the rows about a dead pod send
    // each call on a connection of its own (kube-proxy picks a pod per connection).
    let per_call = matches!(
        shape,
        Shape::ClusterIpDeadPod
            | Shape::HeadlessDeadFirst
            | Shape::DiscoveredDeadPod
            | Shape::DualStackName
    );
    let clients: Vec<Arc<Client>> = [target(direct), target(vec![caller])]
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let c = Client::new(t, i, Caller::Lab);
            Arc::new(if per_call { c.connection_per_call() } else { c })
        })
        .collect();
    say("START")?;
    let start = Instant::now() + LEAD;
    // With discovery the Service changes in the API: a pod joins it, one leaves it.
    let scaling = api.filter(|_| shape == Shape::DiscoveredScale).map(|api| {
        tokio::spawn(async move {
            tokio::time::sleep_until(start + SCALE_AT).await;
            let [new] = pods(&[3])?[..] else {
                return Err("the new pod's address".to_string());
            };
            api.add_pod(3, new.ip(), SVC_PORT).await?;
            tokio::time::sleep_until(start + LEAVE_AT).await;
            api.remove_pod(1).await
        })
    });
    let plan = Arc::new(row.traffic.plan(seed));
    let records = client::drive(clients, plan, Arc::new(row.traffic.clone()), start).await;
    if let Some(scaling) = scaling {
        scaling.await.map_err(|e| e.to_string())??;
    }
    let mut out = String::new();
    for (c, column) in records.iter().enumerate() {
        for r in column {
            out.push_str(&format_record(c, r));
            out.push('\n');
        }
    }
    out.push_str("DONE");
    say(&out)
}
