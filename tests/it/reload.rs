//! Hot reload: every way a config file gets replaced is seen, an invalid file keeps the
//! old config serving, nothing in flight is lost, and budget windows carry over.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use hyper_util::rt::TokioIo;

/// A config with listener and admin on ephemeral ports and one upstream `a`, plus `extra`.
/// Unknown authorities are refused: an upstream's absence reads `404 no-route`.
fn text(up: SocketAddr, extra: &str) -> String {
    format!(
        "[listener]\naddr = \"127.0.0.1:0\"\nunknown_authorities = \"refuse\"\n\
         [admin]\naddr = \"127.0.0.1:0\"\n\
         [upstreams.a]\nauthorities = [\"a\"]\nendpoints = [\"{up}\"]\n{extra}"
    )
}

fn with_b(up: SocketAddr) -> String {
    text(
        up,
        &format!("[upstreams.b]\nauthorities = [\"b\"]\nendpoints = [\"{up}\"]\n"),
    )
}

/// Waits (at most 10 s) until `Host: b` routes (`yes`) or not; fails the test with
/// `what` was not picked up otherwise.
async fn b_routes(tg: &Tollgate, yes: bool, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while (get(tg.addr, "/", "b").await.status == 200) != yes {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A config file written with `content` in a fresh directory, and tollgate watching it.
async fn watched(name: &str, content: &str) -> (tempdir::TempDir, std::path::PathBuf, Tollgate) {
    let dir = tempdir::TempDir::new(name);
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, content).unwrap();
    let tg = Tollgate::start_file(&path).await;
    (dir, path, tg)
}

async fn ok_upstream() -> Upstream {
    Upstream::start(|_req| async { respond(200, "ok") }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_place_is_reloaded() {
    let up = ok_upstream().await;
    let (_dir, path, tg) = watched("inplace", &text(up.addr, "")).await;
    assert_eq!(get(tg.addr, "/", "b").await.status, 404);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all(with_b(up.addr).as_bytes()).unwrap();
    }
    b_routes(&tg, true, "the in-place write").await;
    assert_eq!(tg.reloads("ok").await, 1.0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_and_rename_is_reloaded() {
    let up = ok_upstream().await;
    let (dir, path, tg) = watched("rename", &text(up.addr, "")).await;
    let tmp = dir.path().join(".tollgate.toml.swp");
    std::fs::write(&tmp, with_b(up.addr)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    b_routes(&tg, true, "the renamed file").await;
    tg.stop().await;
}

/// The layout kubelet makes of a mounted ConfigMap, and its atomic update.
struct ConfigMapDir {
    dir: tempdir::TempDir,
    generation: usize,
}

impl ConfigMapDir {
    fn new(content: &str) -> Self {
        let dir = tempdir::TempDir::new("configmap");
        let mut c = ConfigMapDir { dir, generation: 0 };
        c.publish(content);
        std::os::unix::fs::symlink("..data/tollgate.toml", c.path()).unwrap();
        c
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("tollgate.toml")
    }

    /// Writes a new timestamped directory and swaps `..data` to it atomically.
    fn publish(&mut self, content: &str) {
        self.generation += 1;
        let gen_dir = format!(
            "..2026_11_30_00_00_0{}.{}",
            self.generation,
            std::process::id()
        );
        std::fs::create_dir(self.dir.path().join(&gen_dir)).unwrap();
        std::fs::write(
            self.dir.path().join(&gen_dir).join("tollgate.toml"),
            content,
        )
        .unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&gen_dir, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_symlink_swap_is_reloaded() {
    let up = ok_upstream().await;
    let mut cm = ConfigMapDir::new(&text(up.addr, ""));
    let tg = Tollgate::start_file(&cm.path()).await;
    assert_eq!(get(tg.addr, "/", "b").await.status, 404);
    cm.publish(&with_b(up.addr));
    b_routes(&tg, true, "the ConfigMap update").await;
    cm.publish(&text(up.addr, ""));
    b_routes(&tg, false, "the second ConfigMap update").await;
    assert_eq!(tg.reloads("ok").await, 2.0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_keeps_the_old_config_and_counts_an_error() {
    let up = ok_upstream().await;
    let (_dir, path, tg) = watched("invalid", &with_b(up.addr)).await;
    // b removed, but with a typo elsewhere: the whole file is refused.
    std::fs::write(
        &path,
        text(up.addr, "[upstreams.a.retry]\nmax_atempts = 2\n"),
    )
    .unwrap();
    tg.wait_reloads("error", 1.0).await;
    assert_eq!(
        get(tg.addr, "/", "b").await.status,
        200,
        "the old config must keep serving"
    );
    assert_eq!(tg.reloads("ok").await, 0.0);
    tg.stop().await;
}

/// `tollgate_config_last_reload_successful`.
async fn in_effect(tg: &Tollgate) -> f64 {
    metric(
        &tg.metrics().await,
        "tollgate_config_last_reload_successful",
    )
    .unwrap()
}

/// Waits (at most 10 s) until the gauge says whether the file on disk is in force.
async fn wait_in_effect(tg: &Tollgate, want: f64, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while in_effect(tg).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: tollgate_config_last_reload_successful did not become {want} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_a_refused_edit_clears_the_failure() {
    let up = ok_upstream().await;
    let good = with_b(up.addr);
    let bad = text(up.addr, "[upstreams.a.retry]\nmax_atempts = 2\n");
    // A file copied back over a bad edit.
    let (_dir, path, tg) = watched("revert", &good).await;
    assert_eq!(in_effect(&tg).await, 1.0);
    std::fs::write(&path, &bad).unwrap();
    tg.wait_reloads("error", 1.0).await;
    wait_in_effect(&tg, 0.0, "the refused edit").await;
    std::fs::write(&path, &good).unwrap();
    wait_in_effect(&tg, 1.0, "the file copied back").await;
    assert_eq!(
        tg.reloads("ok").await,
        0.0,
        "nothing to reload: it is in force"
    );
    assert_eq!(get(tg.addr, "/", "b").await.status, 200);
    tg.stop().await;

    // A ConfigMap swapped to a bad version and back.
    let mut cm = ConfigMapDir::new(&good);
    let tg = Tollgate::start_file(&cm.path()).await;
    cm.publish(&bad);
    tg.wait_reloads("error", 1.0).await;
    wait_in_effect(&tg, 0.0, "the bad ConfigMap").await;
    cm.publish(&good);
    wait_in_effect(&tg, 1.0, "the ConfigMap swapped back").await;
    tg.stop().await;
}

/// A shell redirect (`cat new.toml > tollgate.toml`) truncates the file before it writes
/// the new text. A reload that reads it in between finds an empty file, which serves
/// nothing: it is refused and counted, and the old config keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_by_a_shell_redirect_keeps_the_old_config() {
    use std::io::Write;
    let up = ok_upstream().await;
    let (_dir, path, tg) = watched("redirect", &with_b(up.addr)).await;

    // Requests to `b` all along; anything but 200 (a 404 no-route) is kept.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (addr, stopped) = (tg.addr, stop.clone());
    let client = tokio::spawn(async move {
        let (mut answered, mut failed) = (0, Vec::new());
        while !stopped.load(Ordering::SeqCst) {
            let status = get(addr, "/", "b").await.status;
            if status == 200 {
                answered += 1;
            } else {
                failed.push(status);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (answered, failed)
    });

    // `>` opens with O_TRUNC: the file is 0 bytes, and stays so until the watcher has
    // read it and refused it.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    tg.wait_reloads("error", 1.0).await;
    assert_eq!(tg.reloads("ok").await, 0.0);
    // Then the shell writes the new text: it is loaded.
    let new = format!(
        "{}[upstreams.c]\nauthorities = [\"c\"]\nendpoints = [\"{}\"]\n",
        with_b(up.addr),
        up.addr
    );
    file.write_all(new.as_bytes()).unwrap();
    drop(file);
    tg.wait_reloads("ok", 1.0).await;
    assert_eq!(get(tg.addr, "/", "c").await.status, 200);

    stop.store(true, Ordering::SeqCst);
    let (answered, failed) = client.await.unwrap();
    assert!(failed.is_empty(), "answers other than 200: {failed:?}");
    assert!(answered > 0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_file() {
    let up = ok_upstream().await;
    let mut p = Process::start(&format!(
        "[upstreams.a]\nauthorities = [\"a\"]\nendpoints = [\"{}\"]\n",
        up.addr
    ))
    .await;
    let reloads = |p: &Process| {
        let admin = p.admin;
        async move {
            let m = String::from_utf8(get(admin, "/metrics", "admin").await.body.to_vec()).unwrap();
            metric(&m, "tollgate_config_reloads_total{result=\"ok\"}").unwrap()
        }
    };
    // An unchanged file is never reloaded by the watcher; a SIGHUP reloads it anyway.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(reloads(&p).await, 0.0);
    p.signal("HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while reloads(&p).await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "SIGHUP did not reload"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(10)).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_finish_on_the_config_they_started_with() {
    let up = Upstream::start(|_req| async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        respond(200, "slow")
    })
    .await;
    let slow_b = format!(
        "[upstreams.b]\nauthorities = [\"b\"]\nendpoints = [\"{}\"]\nattempt_timeout = \"5s\"\n",
        up.addr
    );
    let (_dir, path, tg) = watched("inflight", &text(up.addr, &slow_b)).await;
    let addr = tg.addr;
    let slow = tokio::spawn(async move { get(addr, "/", "b").await });
    assert!(wait_until(Duration::from_secs(5), || up.hits() == 1).await);
    std::fs::write(&path, text(up.addr, "")).unwrap();
    tg.wait_reloads("ok", 1.0).await;
    assert_eq!(
        get(tg.addr, "/", "b").await.status,
        404,
        "b is gone for new requests"
    );
    let r = slow.await.unwrap();
    assert_eq!(
        r.status, 200,
        "the request in flight finished on its own config"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_window_survives_a_reload_that_only_changed_max_attempts() {
    let up = Upstream::start(|_req| async { respond(503, "down") }).await;
    let cfg = |attempts: u32, ratio: &str| {
        text(
            up.addr,
            &format!(
                "[upstreams.a.retry]\nmax_attempts = {attempts}\nbackoff_base = \"1ms\"\nbackoff_max = \"1ms\"\n\
                 [upstreams.a.budget]\nratio = {ratio}\nmin_per_sec = 0.5\nwindow = \"60s\"\n"
            ),
        )
    };
    let (_dir, path, tg) = watched("budget", &cfg(3, "0.0")).await;
    // 0.5/s x 60 s = 30 retries in the window, then the budget is spent. Distinct
    // requests: the same one again within 2 s would be the app's own retry.
    for i in 0..20 {
        get(tg.addr, &format!("/{i}"), "a").await;
    }
    assert_eq!(
        get(tg.addr, "/20", "a").await.outcome(),
        Some("budget-exhausted")
    );

    std::fs::write(&path, cfg(4, "0.0")).unwrap();
    tg.wait_reloads("ok", 1.0).await;
    let r = get(tg.addr, "/21", "a").await;
    assert_eq!(
        r.outcome(),
        Some("budget-exhausted"),
        "the spent window carried over"
    );
    assert_eq!(r.attempts(), 1);

    // A changed budget starts a fresh window.
    std::fs::write(&path, cfg(4, "0.001")).unwrap();
    tg.wait_reloads("ok", 2.0).await;
    let r = get(tg.addr, "/22", "a").await;
    assert_eq!(r.attempts(), 4, "a new budget has its floor to spend");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_load_lose_no_request_and_no_connection() {
    logs();
    let up = Upstream::start(|_req| async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        respond(200, "ok")
    })
    .await;
    // This machine may be starved of CPU by the test's own 200 clients: give connects
    // time, the test is about reloads.
    let generous = "connect_timeout = \"5s\"\nattempt_timeout = \"5s\"\n";
    let b = format!(
        "[upstreams.b]\nauthorities = [\"b\"]\nendpoints = [\"{}\"]\n{generous}",
        up.addr
    );
    let (_dir, path, tg) = watched("load", &text(up.addr, &format!("{generous}{b}"))).await;

    const CLIENTS: usize = 200;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..CLIENTS {
        let (addr, stop, done) = (tg.addr, stop.clone(), done.clone());
        clients.spawn(async move {
            // One keep-alive connection per client: a dropped connection fails the test.
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake::<_, BoxBody>(TokioIo::new(stream))
                    .await
                    .unwrap();
            let conn = tokio::spawn(conn);
            let host = if i % 2 == 0 { "a" } else { "b" };
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                sender.ready().await.expect("connection lost during reload");
                let req = request("GET", "/", host).body(empty()).unwrap();
                let resp = sender
                    .send_request(req)
                    .await
                    .expect("request lost during reload");
                assert_eq!(resp.status(), 200, "request failed during reload");
                read(resp).await;
                n += 1;
                done.fetch_add(1, Ordering::SeqCst);
            }
            conn.abort();
            n
        });
    }
    assert!(
        wait_until(Duration::from_secs(10), || done.load(Ordering::SeqCst)
            > 1000)
        .await
    );
    for i in 0..6u32 {
        let before = tg.reloads("ok").await;
        // Alternate retry settings and an extra upstream; a and b stay.
        let extra = format!(
            "{generous}[upstreams.a.retry]\nmax_attempts = {}\n{b}{}",
            2 + i % 2,
            if i % 2 == 0 {
                format!(
                    "[upstreams.c]\nauthorities = [\"c\"]\nendpoints = [\"{}\"]\n",
                    up.addr
                )
            } else {
                String::new()
            }
        );
        std::fs::write(&path, text(up.addr, &extra)).unwrap();
        tg.wait_reloads("ok", before + 1.0).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    while let Some(n) = clients.join_next().await {
        total += n.unwrap();
    }
    assert!(total > 1000);
    assert_eq!(tg.reloads("error").await, 0.0);
    println!("{total} requests over {CLIENTS} connections through 6 reloads, none lost");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_dedicated_port_opens_and_a_removed_one_closes() {
    let up = ok_upstream().await;
    let (_dir, path, tg) = watched("listen", &text(up.addr, "")).await;
    let port = free_port();
    let dedicated: SocketAddr = ([127, 0, 0, 1], port).into();
    std::fs::write(
        &path,
        text(
            up.addr,
            &format!(
                "[upstreams.d]\nlisten = \"127.0.0.1:{port}\"\nendpoints = [\"{}\"]\n",
                up.addr
            ),
        ),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(dedicated).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new port never opened"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(get(dedicated, "/", "whatever").await.status, 200);
    std::fs::write(&path, text(up.addr, "")).unwrap();
    while tokio::net::TcpStream::connect(dedicated).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the removed port stayed open"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tg.stop().await;
}

/// Fetches `/config` from the admin endpoint.
async fn config_json(tg: &Tollgate) -> serde_json::Value {
    let r = get(tg.admin, "/config", "admin").await;
    assert_eq!(r.status, 200);
    serde_json::from_slice(&r.body).unwrap()
}

/// A setting that needs a restart is not applied by a reload: `/config` and `/readyz`
/// show what is in effect and what waits, and every later reload still reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_that_needs_a_restart_is_shown_as_it_runs_until_restarted() {
    let up = ok_upstream().await;
    let (_dir, path, tg) = watched("restart-needed", &text(up.addr, "")).await;
    let slow = text(up.addr, "").replace("[admin]", "idle_timeout = \"5s\"\n[admin]");
    std::fs::write(&path, &slow).unwrap();
    tg.wait_reloads("ok", 1.0).await;
    let waiting = "listener.idle_timeout: 1m in effect, 5s in the file";
    let c = config_json(&tg).await;
    assert_eq!(c["listener"]["idle_timeout"], "1m", "{c}");
    assert_eq!(c["pending_restart"], serde_json::json!([waiting]));
    let ready = get(tg.admin, "/readyz", "admin").await;
    assert_eq!(ready.status, 200);
    assert!(
        String::from_utf8_lossy(&ready.body).contains(waiting),
        "{:?}",
        ready.body
    );

    // A later reload of something else still reports it (it is still not in effect).
    std::fs::write(
        &path,
        format!(
            "{slow}[upstreams.b]\nauthorities = [\"b\"]\nendpoints = [\"{}\"]\n",
            up.addr
        ),
    )
    .unwrap();
    tg.wait_reloads("ok", 2.0).await;
    b_routes(&tg, true, "upstream b").await;
    let c = config_json(&tg).await;
    assert_eq!(c["listener"]["idle_timeout"], "1m");
    assert_eq!(c["pending_restart"], serde_json::json!([waiting]));
    tg.stop().await;
}

/// An upstream's own listen port that a reload cannot bind: the rest is applied, the
/// reload is counted as partial, and the listener shows down until a later reload binds
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_port_a_reload_cannot_bind_makes_it_partial() {
    let up = ok_upstream().await;
    let (_dir, path, tg) = watched("partial", &text(up.addr, "")).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let with_listen = format!(
        "{}[upstreams.b]\nauthorities = [\"b\"]\nendpoints = [\"{}\"]\nlisten = \"127.0.0.1:{port}\"\n",
        text(up.addr, ""),
        up.addr
    );
    std::fs::write(&path, &with_listen).unwrap();
    tg.wait_reloads("partial", 1.0).await;
    assert_eq!(tg.reloads("ok").await, 0.0);
    b_routes(&tg, true, "upstream b by its authority").await;
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_listener_up{upstream=\"b\"}"),
        Some(0.0),
        "{m}"
    );
    let ready = get(tg.admin, "/readyz", "admin").await;
    assert_eq!(ready.status, 200, "the rest of the config serves");
    assert!(
        String::from_utf8_lossy(&ready.body).contains("listener of upstream b not bound"),
        "{:?}",
        ready.body
    );
    assert!(config_json(&tg).await["upstreams"]["b"]["listen"].is_null());

    // The port is freed and the file touched: the next reload binds it.
    drop(taken);
    std::fs::write(&path, format!("{with_listen}# again\n")).unwrap();
    tg.wait_reloads("ok", 1.0).await;
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_listener_up{upstream=\"b\"}"),
        Some(1.0)
    );
    let direct = get(SocketAddr::from(([127, 0, 0, 1], port)), "/", "anything").await;
    assert_eq!(direct.status, 200);
    tg.stop().await;
}

/// Every reload says what it changed, one line per upstream, and logs the lints `run`
/// logs at start: in Kubernetes nearly every change arrives by reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_names_each_change_and_warns_as_a_start_does() {
    let up = ok_upstream().await;
    let a = format!(
        "[upstreams.a]\nauthorities = [\"a\"]\nendpoints = [\"{}\"]\n",
        up.addr
    );
    let p = Process::start_logged(&a).await;
    let config = p.dir.path().join("tollgate.toml");
    let base = std::fs::read_to_string(&config).unwrap();
    let changed = base.replace(
        "[upstreams.a]\n",
        "[upstreams.a]\nrequest_timeout = \"3s\"\n",
    ) + &format!(
        "[upstreams.b]\nauthorities = [\"b\"]\nendpoints = [\"{}\"]\n[upstreams.b.retry]\nmax_attempts = 3\n",
        up.addr
    );
    std::fs::write(&config, changed).unwrap();
    let logged = wait_until(Duration::from_secs(10), || {
        p.log().contains("config reloaded")
    })
    .await;
    assert!(logged, "no reload logged:\n{}", p.log());
    let log = p.log();
    for line in [
        "upstream a changed: request_timeout",
        "upstream b added",
        "upstreams.b.budget: no retry budget",
    ] {
        assert!(log.contains(line), "{line:?} not in the log:\n{log}");
    }
}
