//! `[upstreams.NAME]`: one dependency: how it is reached, its timeouts, and its
//! sections.

use serde_json::{Value, json};

use crate::config::model::{ServicePort, UpstreamConfig};
use crate::config::units::format_duration;

keys! {
    section "upstreams.NAME" of UpstreamConfig = Some(UpstreamConfig::default);
    authorities: "list of host names", "none (then `listen` is needed)", Applied, "the `Host`/`:authority` values the app calls it by",
        |c| json!(c.authorities);
    listen: "address", model, Applied, "a port of its own, for apps that cannot set `Host`",
        |c| json!(c.listen.map(|a| a.to_string()));
    endpoints: "list of host:port", "**required** (none with `discovery = \"kubernetes\"`)", Applied, "where it is; names are re-resolved",
        |c| json!(c.endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>());
    discovery: "`\"dns\"` or `\"kubernetes\"`", model, Applied, "where its endpoints come from: `endpoints` re-resolved, or a Service's ready pods watched",
        |c| json!(c.discovery.as_str());
    service: "`\"NAME\"` or `\"NAME.NAMESPACE\"`", "none (**required** with `discovery = \"kubernetes\"`)", Applied, "the Service watched; its namespace defaults to the pod's own",
        |c| json!(c.discovery.service().map(|s| s.written()));
    port: "port name or number", "none (**required** with `discovery = \"kubernetes\"`)", Applied, "the Service port: its name, or its number",
        |c| match c.discovery.service().map(|s| &s.port) {
            Some(ServicePort::Number(n)) => json!(n),
            Some(ServicePort::Name(n)) => json!(n),
            None => Value::Null,
        };
    host: "host name", "the request's own", Applied, "the `Host`/`:authority` sent to it",
        |c| json!(c.host.as_ref().and_then(|h| h.to_str().ok()));
    protocol: "`\"http1\"`, `\"h2c\"` or `\"auto\"`", model, Applied, "the HTTP it is spoken to in",
        |c| json!(c.protocol.as_str());
    connect_timeout: "duration", model, Applied, "how long a connect may take before another starts beside it (to another endpoint, or the same when it is the only one)",
        |c| json!(format_duration(c.connect_timeout));
    request_timeout: "duration", model, Applied, "the deadline when the caller sends none, and a cap on a longer one",
        |c| json!(c.request_timeout.map(format_duration));
    attempt_timeout: "duration", model, Applied, "when an attempt without a response head gets a retry started beside it",
        |c| json!(c.attempt_timeout.map(format_duration));
    max_inflight: "integer", model, Applied, "requests waiting for their response head at once; more are shed",
        |c| json!(c.max_inflight);
    retry: "section", "absent: one attempt, nothing retried", Applied, "what may be retried, and how",
        |c| super::retry::SECTION.json(&c.retry);
    tls: "section", "absent: plain HTTP", Applied, "TLS to the endpoints",
        |c| super::tls::SECTION.json_of(c.tls.as_ref()),
        same: |a, b| a.tls == b.tls;
    budget: "section", "absent: no retry budget", Applied, "the share of retries it may take",
        |c| super::budget::SECTION.json_of(c.budget.as_ref());
    max_connection_age: "duration", model, Applied, "a pooled connection older than this is closed after its response",
        |c| json!(c.max_connection_age.map(format_duration));
    outlier: "section", "absent: no ejection", Applied, "endpoints that fail clearly more than the others are taken out",
        |c| super::outlier::SECTION.json_of(c.outlier.as_ref());
    hedge: "section", "absent: no hedging", Applied, "a second attempt beside a slow one",
        |c| super::hedge::SECTION.json_of(c.hedge.as_ref());
    throttle: "section", "absent: no throttling", Applied, "first attempts rejected locally while it rejects most",
        |c| super::throttle::SECTION.json_of(c.throttle.as_ref());
    app_retries: "`\"count\"`, `\"refuse\"` or `\"ignore\"`", model, Applied, "what the app's own retry gets",
        |c| json!(c.app_retries.as_str());
}
