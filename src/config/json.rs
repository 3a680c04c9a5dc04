//! The effective config as JSON, for `GET /config`: every default filled in, durations
//! and sizes written the way the file takes them, and no secret material (certificate
//! and key *paths* are shown, never their contents).

use serde_json::{Value, json};

use super::model::*;
use super::units::{format_duration, format_size};

impl Config {
    pub fn to_json(&self) -> Value {
        json!({
            "file": self.file,
            "runtime": {
                "worker_threads": self.runtime.worker_threads,
            },
            "listener": {
                "addr": self.listener.addr.to_string(),
                "drain_timeout": format_duration(self.listener.drain_timeout),
                "header_read_timeout": format_duration(self.listener.header_read_timeout),
                "max_header_bytes": format_size(self.listener.max_header_bytes as u64),
                "max_headers": self.listener.max_headers,
                "idle_timeout": format_duration(self.listener.idle_timeout),
                "max_connections": self.listener.max_connections,
                "unknown_authorities": self.listener.unknown_authorities.as_str(),
                "passthrough_connect_timeout": format_duration(self.listener.passthrough_connect_timeout),
            },
            "admin": { "addr": self.admin.addr.to_string(), "probe_ports": self.admin.probe_ports },
            "deadline": {
                "header": self.deadline.header.as_str(),
                "accept": self.deadline.accept.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
            },
            "access_log": {
                "enabled": self.access_log.enabled,
                "format": self.access_log.format.as_str(),
                "query": self.access_log.query,
            },
            "upstreams": self.upstreams.iter().map(|u| (u.name.clone(), u.to_json())).collect::<serde_json::Map<_, _>>(),
            "inbound": self.inbound.as_ref().map(InboundConfig::to_json),
            "tracing": self.tracing.as_ref().map(|t| json!({
                "otlp": t.otlp.as_str(),
                "sample": t.sample,
                "batch": t.batch,
                "queue": t.queue,
                "timeout": format_duration(t.timeout),
            })),
        })
    }
}

impl InboundConfig {
    fn to_json(&self) -> Value {
        json!({
            "addr": self.addr.to_string(),
            "app": self.app.to_string(),
            "max_inflight": match self.max_inflight {
                InflightLimit::Fixed(n) => json!(n),
                InflightLimit::Adaptive => json!("adaptive"),
            },
            "request_timeout": self.request_timeout.map(format_duration),
            "probe_paths": self.probe_paths,
            "owned_failures": self.owned_failures.as_str(),
            "retries": self.retries.as_ref().map(|b| json!({
                "ratio": b.ratio,
                "min_per_sec": b.min_per_sec,
                "window": format_duration(b.window),
                "per_caller": self.per_caller.as_str(),
            })),
            "dedupe": self.dedupe.as_ref().map(DedupeConfig::to_json),
        })
    }
}

impl DedupeConfig {
    /// The Redis address is shown without its password.
    fn to_json(&self) -> Value {
        json!({
            "methods": self.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            "ttl": format_duration(self.ttl),
            "max_response": format_size(self.max_response as u64),
            "store": self.store.describe(),
            "max_entries": self.max_entries,
            "store_timeout": format_duration(self.store_timeout),
            "on_store_error": self.on_store_error.as_str(),
        })
    }
}

impl UpstreamConfig {
    fn to_json(&self) -> Value {
        let r = &self.retry;
        json!({
            "authorities": self.authorities,
            "listen": self.listen.map(|a| a.to_string()),
            "endpoints": self.endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            "host": self.host.as_ref().and_then(|h| h.to_str().ok()),
            "protocol": self.protocol.as_str(),
            "connect_timeout": format_duration(self.connect_timeout),
            "request_timeout": self.request_timeout.map(format_duration),
            "attempt_timeout": self.attempt_timeout.map(format_duration),
            "max_inflight": self.max_inflight,
            "retry": {
                "max_attempts": r.max_attempts,
                "on": r.on.names(),
                "methods": r.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                "idempotency_header": r.idempotency_header.as_ref().map(|h| h.as_str()),
                "mint_idempotency_key": r.mint_idempotency_key.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                "backoff_base": format_duration(r.backoff.base()),
                "backoff_max": format_duration(r.backoff.max()),
                "backoff_jitter": r.backoff.jitter().as_str(),
                "retry_after": match r.retry_after { RetryAfterMode::Honor => "honor", RetryAfterMode::Ignore => "ignore" },
                "max_retry_after": format_duration(r.max_retry_after),
                "max_body": format_size(r.max_body as u64),
                "ownership": match r.ownership { Ownership::Honor => "honor", Ownership::Ignore => "ignore" },
            },
            "budget": self.budget.as_ref().map(|b| json!({
                "ratio": b.ratio,
                "min_per_sec": b.min_per_sec,
                "window": format_duration(b.window),
                "max_ratio": b.max_ratio,
            })),
            "throttle": self.throttle.as_ref().map(|t| json!({
                "k": t.k,
                "window": format_duration(t.window),
            })),
            "app_retries": self.app_retries.as_str(),
            "tls": self.tls.as_ref().map(|t| json!({
                "server_name": t.server_name,
                "ca_file": t.ca_file.as_ref().map(|f| f.path.display().to_string()),
                "client_cert": t.client_cert.as_ref().map(|f| f.path.display().to_string()),
                "client_key": t.client_key.as_ref().map(|f| f.path.display().to_string()),
            })),
            "max_connection_age": self.max_connection_age.map(format_duration),
            "outlier": self.outlier.as_ref().map(|o| json!({
                "consecutive_failures": o.consecutive_failures,
                "base_ejection": format_duration(o.base_ejection),
                "max_ejected": format!("{}%", (o.max_ejected * 1000.0).round() / 10.0),
            })),
            "hedge": self.hedge.as_ref().map(|h| json!({
                "after": h.after.to_string(),
                "max_extra": h.max_extra,
            })),
        })
    }
}
