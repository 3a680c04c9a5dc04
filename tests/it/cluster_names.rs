//! Authorities in a cluster: an authority without a dot (`payments`, as `tollgate
//! inject` writes it from the app's own `http://payments:8080`) also matches
//! `payments.NS`, `payments.NS.svc` and `payments.NS.svc.<cluster domain>` for the
//! pod's own namespace (`POD_NAMESPACE`, set by inject from the downward API), so the
//! same config serves in whichever namespace the pod runs, and nothing is pinned to
//! `default`. Another namespace's name is not matched; an expanded name that another
//! upstream lists explicitly is a config error naming both.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Command;

use common::tempdir::TempDir;
use common::{Process, Upstream, get, respond};

#[tokio::test]
async fn a_dotless_authority_answers_to_its_names_in_the_pods_namespace() {
    let payments = Upstream::start(|_req| async { respond(200, "payments") }).await;
    let upstreams = format!(
        "[upstreams.payments]\nauthorities = [\"payments\"]\nendpoints = [\"{}\"]\n\
         [upstreams.payments.budget]\nratio = 0.1\nmin_per_sec = 1\nwindow = \"10s\"\n",
        payments.addr
    );
    let tg = Process::start_with_env(&upstreams, &[("POD_NAMESPACE", "shop")]).await;
    for host in [
        "payments",
        "payments:8080",
        "payments.shop",
        "payments.shop.svc:8080",
    ] {
        let got = get(tg.addr, "/", host).await;
        assert_eq!(got.status, 200, "{host}: {:?}", got.body);
        assert_eq!(got.body, "payments", "{host}");
    }
    assert_eq!(payments.hits(), 4);
    // Another namespace's payments is not this one: passed through as it is (to a
    // name that does not resolve here), never to this upstream.
    let other = get(tg.addr, "/", "payments.billing.svc").await;
    assert_ne!(other.status, 200);
    assert_eq!(
        payments.hits(),
        4,
        "another namespace's name went to payments"
    );
}

#[test]
fn an_expanded_name_another_upstream_lists_is_a_config_error() {
    let dir = TempDir::new("cluster-names");
    let path = dir.path().join("tollgate.toml");
    std::fs::write(
        &path,
        "[upstreams.payments]\nauthorities = [\"payments\"]\nendpoints = [\"127.0.0.1:1\"]\n\
         [upstreams.legacy]\nauthorities = [\"payments.shop.svc\"]\nendpoints = [\"127.0.0.1:2\"]\n",
    )
    .unwrap();
    let check = |ns: Option<&str>| {
        let mut cmd = Command::new(common::binary());
        cmd.args(["check", "--config"]).arg(&path);
        cmd.env_remove("POD_NAMESPACE");
        if let Some(ns) = ns {
            cmd.env("POD_NAMESPACE", ns);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, text) = check(Some("shop"));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(
            "upstreams.payments.authorities: `payments` also stands for `payments.shop.svc` in \
             namespace shop (POD_NAMESPACE), which upstream `legacy` at 5:16 lists"
        ),
        "{text}"
    );
    // In another namespace the two names are two Services.
    let (code, text) = check(Some("billing"));
    assert_ne!(code, Some(1), "{text}");
}
