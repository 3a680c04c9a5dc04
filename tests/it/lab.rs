//! A shortened lab run: the same chain code as `tollgate lab`, a few seconds long. The
//! owned chain must beat the naive one where it matters: less load on the struggling
//! backend and more users served.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tollgate_lab::scenario::{Chain, Overrides, scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_retries_beat_naive_retries_in_a_short_storm() {
    let s = scenario(
        "storm",
        &Overrides {
            duration: Some(Duration::from_secs(5)),
            ..Overrides::default()
        },
    )
    .unwrap();
    let run = tollgate_lab::run(s, false).await.unwrap();
    let (naive, owned) = (run.chain("naive").unwrap(), run.chain("owned").unwrap());
    println!(
        "naive: {:.2}x {:.1}% ok; owned: {:.2}x {:.1}% ok",
        naive.amplification(),
        naive.success_rate() * 100.0,
        owned.amplification(),
        owned.success_rate() * 100.0
    );
    assert_eq!(naive.requests, 300);
    assert_eq!(owned.requests, 300);
    assert!(
        owned.amplification() < naive.amplification(),
        "owned amplification {:.2} is not below naive {:.2}",
        owned.amplification(),
        naive.amplification()
    );
    assert!(
        owned.success_rate() > naive.success_rate(),
        "owned success {:.3} is not above naive {:.3}",
        owned.success_rate(),
        naive.success_rate()
    );
    // Measured at the backend: every call the chains made is there.
    assert!(naive.backend_calls >= naive.requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_dead_dependency_the_adaptive_share_falls_and_the_throttle_sheds() {
    let s = scenario(
        "dead",
        &Overrides {
            duration: Some(Duration::from_secs(8)),
            ..Overrides::default()
        },
    )
    .unwrap();
    let chains = [Chain::Owned, Chain::Adaptive, Chain::Throttled];
    let run = tollgate_lab::run_chains(s, &chains, false).await.unwrap();
    let episode = |c: &str| run.chain(c).unwrap().episode.unwrap();
    let (owned, adaptive, throttled) =
        (episode("owned"), episode("adaptive"), episode("throttled"));
    println!("in the outage: owned {owned:?}, adaptive {adaptive:?}, throttled {throttled:?}");
    // The fixed budget keeps retrying a fifth of the requests; the adaptive share
    // stops once retries keep failing.
    assert!(owned.amplification > 1.15, "owned {}", owned.amplification);
    assert!(
        adaptive.amplification < owned.amplification - 0.1,
        "adaptive {} owned {}",
        adaptive.amplification,
        owned.amplification
    );
    assert!(throttled.amplification < adaptive.amplification);
    let api = run.chain("adaptive").unwrap();
    assert!(
        api.share.iter().any(|s| *s < 0.2),
        "the share never fell below ratio: {:?}",
        api.share
    );
}

#[test]
fn the_lab_command_runs_and_prints_json() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["lab", "--scenario", "down", "--duration", "3", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["scenario"], "down");
    for chain in ["naive", "owned", "adaptive", "throttled"] {
        assert!(v[chain]["amplification"].as_f64().is_some(), "{chain}");
        assert!(v[chain]["series"]["backend_rps"].as_array().unwrap().len() >= 3);
    }
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["lab", "--scenario", "hurricane"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn sim_shows_the_published_shape() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["sim", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let policies = v["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 7);
    for name in ["+ adaptive budget, 10-30%", "+ throttle (k = 2, 5 s)"] {
        assert!(policies.iter().any(|p| p["policy"] == name), "{name}");
    }
    let budget = policies
        .iter()
        .find(|p| p["policy"] == "full jitter + 10% budget")
        .unwrap();
    assert!(budget["peak_load"].as_u64().unwrap() <= 120);
}

#[test]
fn the_lab_table_names_its_scenario_once() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["lab", "--scenario", "down", "--duration", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stdout.starts_with("tollgate lab: down\n"), "{stdout}");
    let both = format!("{stdout}{stderr}");
    assert_eq!(both.matches("tollgate lab: down").count(), 1, "{both}");
}

/// The endpoint scenarios, shortened: what they report holds whatever the machine's
/// speed (the budget's bound on hedges, ejection of the silent endpoint); their
/// latency figures are for `tollgate lab` itself, never asserted here.
#[test]
fn the_endpoint_scenarios_run_and_report_their_figures() {
    let run = |name: &str| -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["lab", "--scenario", name, "--duration", "4", "--json"])
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let hedge = run("hedge");
    assert_eq!(hedge["chains"], serde_json::json!(["plain", "hedged"]));
    let hedged = &hedge["hedged"];
    let sent =
        hedged["hedges"]["won"].as_u64().unwrap() + hedged["hedges"]["lost"].as_u64().unwrap();
    let requests = hedged["requests"].as_u64().unwrap();
    assert!(
        sent as f64 <= 0.05 * requests as f64,
        "{sent} hedges for {requests} requests"
    );
    assert!(hedged["extra_load"].as_f64().unwrap() <= 0.05 + 1e-9);
    assert_eq!(hedge["plain"]["hedges"]["won"], 0);
    if sent > 0 {
        assert!(hedged["abandoned_at_backend"].as_u64().unwrap() > 0);
    }

    let blackhole = run("blackhole");
    assert_eq!(
        blackhole["chains"],
        serde_json::json!(["healthy", "silent", "ejecting"])
    );
    assert_eq!(blackhole["healthy"]["silent_connections"], 0);
    assert!(blackhole["ejecting"]["ejections"].as_u64().unwrap() >= 1);
    assert_eq!(blackhole["silent"]["ejections"], 0);
    let to_silent = |chain: &str| blackhole[chain]["silent_connections"].as_u64().unwrap();
    assert!(
        to_silent("ejecting") < to_silent("silent"),
        "ejection did not spare the silent endpoint its traffic"
    );
}

/// The fleet scenario, shortened: a hundred callers at a request a second each, each
/// within its own budget, multiply the failing app's load by their floors alone; the
/// inbound side's budget holds it near 1.1x, every first attempt reaches the app, and a
/// lone quiet caller still gets its retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbound_budget_caps_what_a_fleet_of_callers_retries() {
    use tollgate_lab::fleet::{FleetSpec, run};
    let spec = FleetSpec {
        callers: vec![100],
        measure: Duration::from_secs(2),
        ..FleetSpec::default()
    };
    let r = run(spec, false).await.unwrap();
    let fleet = &r.rows[0];
    println!(
        "100 callers: {:.2}x without, {:.2}x with; quiet: {:.2}x without, {:.2}x with",
        fleet.without.amplification(),
        fleet.with.amplification(),
        r.quiet.without.amplification(),
        r.quiet.with.amplification()
    );
    assert!(fleet.without.requests >= 150, "{:?}", fleet.without);
    assert!(
        fleet.without.amplification() > 1.3,
        "a hundred floors: {:?}",
        fleet.without
    );
    // The bound is 1.1x; a debug build of 200 tollgates on a busy machine lags, and
    // what it caught up on lands in the measured seconds, so only the gap is held
    // tight here (the release figures are in docs/lab.md).
    assert!(
        fleet.with.amplification() <= 1.35
            && fleet.without.amplification() - fleet.with.amplification() >= 0.3,
        "the fleet budget did not hold: {:?} with, {:?} without",
        fleet.with,
        fleet.without
    );
    assert!(fleet.with.rejected > 0);
    assert_eq!(fleet.with.first_refused + fleet.without.first_refused, 0);
    assert!(
        r.quiet.with.amplification() >= 1.3
            && r.quiet.with.amplification() >= r.quiet.without.amplification() - 0.2,
        "a quiet caller lost its retries: {:?} vs {:?}",
        r.quiet.with,
        r.quiet.without
    );
    assert_eq!(r.quiet.with.rejected, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_retries_book_twice_without_dedupe_and_once_with_it() {
    if std::process::Command::new("redis-server")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
        .is_err()
    {
        eprintln!(
            "\n*** SKIPPED payments lab test: redis-server is not installed \
             (apt-get install redis-server); the scenario was NOT run ***\n"
        );
        return;
    }
    let spec = tollgate_lab::payments::PaymentsSpec {
        orders: 300,
        ..Default::default()
    };
    let r = tollgate_lab::payments::run(spec, false).await.unwrap();
    println!("{}", tollgate_lab::payments::table(&r));
    let [plain, blind, keyed] = &r.runs[..] else {
        panic!("three runs");
    };
    assert!(plain.lost > 0 && blind.lost > 0 && keyed.lost > 0);
    assert_eq!(plain.duplicates, 0);
    assert!(plain.answered < 300, "lost answers are failed orders");
    assert!(blind.duplicates > 0, "blind POST retries book twice");
    assert_eq!(keyed.duplicates, 0, "keys and dedupe book once");
    assert!(keyed.answered >= 297, "{} of 300 answered", keyed.answered);
    assert!(keyed.replayed > 0);
}

/// `--scenario apps`: with the app between two tollgates, marking its failure
/// `downstream-owned` keeps db at one layer's attempts; without, the layers multiply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_between_two_tollgates_costs_db_one_layer_when_its_failure_is_marked() {
    use tollgate_lab::apps::{AppsSpec, run, table};
    let r = run(AppsSpec { requests: 5 }, false).await.unwrap();
    println!("{}", table(&r));
    assert_eq!((r.off.app_calls, r.off.db_calls, r.off.owned), (15, 45, 0));
    assert_eq!(
        (r.mark.app_calls, r.mark.db_calls, r.mark.owned),
        (5, 15, 5)
    );
}
