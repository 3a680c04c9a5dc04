//! `/config` as it was written by hand before the keys were declared once: the JSON
//! the declarations must keep showing.

use serde_json::{Value, json};
use tollgate_core::config::units::{format_duration, format_size};
use tollgate_core::config::*;

pub fn config(c: &Config) -> Value {
    {
        json!({
            "file": c.file,
            "runtime": {
                "worker_threads": c.runtime.worker_threads,
            },
            "listener": {
                "addr": c.listener.addr.to_string(),
                "drain_timeout": format_duration(c.listener.drain_timeout),
                "header_read_timeout": format_duration(c.listener.header_read_timeout),
                "max_header_bytes": format_size(c.listener.max_header_bytes as u64),
                "max_headers": c.listener.max_headers,
                "idle_timeout": format_duration(c.listener.idle_timeout),
                "max_connections": c.listener.max_connections,
                "unknown_authorities": c.listener.unknown_authorities.as_str(),
                "passthrough_connect_timeout": format_duration(c.listener.passthrough_connect_timeout),
            },
            "admin": {
                "addr": c.admin.addr.to_string(),
                "probes": c.admin.probes.iter().map(|p| serde_json::json!({
                    "port": p.port,
                    "path": p.path,
                    "headers": p.headers.iter().map(|(n, v)| (n.as_str().to_string(), serde_json::json!(String::from_utf8_lossy(v.as_bytes())))).collect::<serde_json::Map<_, _>>(),
                })).collect::<Vec<_>>(),
            },
            "deadline": {
                "header": c.deadline.header.as_str(),
                "accept": c.deadline.accept.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
            },
            "access_log": {
                "enabled": c.access_log.enabled,
                "format": c.access_log.format.as_str(),
                "query": c.access_log.query,
            },
            "upstreams": c.upstreams.iter().map(|u| (u.name.clone(), upstream(u))).collect::<serde_json::Map<_, _>>(),
            "inbound": c.inbound.as_ref().map(inbound),
            "tracing": c.tracing.as_ref().map(|t| json!({
                "otlp": t.otlp.as_str(),
                "sample": t.sample,
                "batch": t.batch,
                "queue": t.queue,
                "timeout": format_duration(t.timeout),
            })),
            "kubernetes": {
                "kubeconfig": c.kubernetes.kubeconfig.as_ref().map(|p| p.display().to_string()),
            },
        })
    }
}

fn inbound(i: &InboundConfig) -> Value {
    {
        json!({
            "addr": i.addr.to_string(),
            "app": i.app.to_string(),
            "max_inflight": match i.max_inflight {
                InflightLimit::Fixed(n) => json!(n),
                InflightLimit::Adaptive => json!("adaptive"),
            },
            "request_timeout": i.request_timeout.map(format_duration),
            "probe_paths": i.probe_paths,
            "owned_failures": i.owned_failures.as_str(),
            "retries": i.retries.as_ref().map(|b| json!({
                "ratio": b.ratio,
                "min_per_sec": b.min_per_sec,
                "window": format_duration(b.window),
                "per_caller": i.per_caller.as_str(),
            })),
            "dedupe": i.dedupe.as_ref().map(dedupe),
        })
    }
}

fn dedupe(d: &DedupeConfig) -> Value {
    {
        json!({
            "methods": d.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            "ttl": format_duration(d.ttl),
            "max_response": format_size(d.max_response as u64),
            "store": d.store.describe(),
            "max_entries": d.max_entries,
            "store_timeout": format_duration(d.store_timeout),
            "on_store_error": d.on_store_error.as_str(),
            "header": d.header.as_str(),
            "identity_headers": d.identity_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
        })
    }
}

fn upstream(u: &UpstreamConfig) -> Value {
    {
        let r = &u.retry;
        json!({
            "authorities": u.authorities,
            "listen": u.listen.map(|a| a.to_string()),
            "endpoints": u.endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            "discovery": u.discovery.as_str(),
            "service": u.discovery.service().map(|s| s.written()),
            "port": match u.discovery.service().map(|s| &s.port) {
                Some(ServicePort::Number(n)) => json!(n),
                Some(ServicePort::Name(n)) => json!(n),
                None => Value::Null,
            },
            "host": u.host.as_ref().and_then(|h| h.to_str().ok()),
            "protocol": u.protocol.as_str(),
            "connect_timeout": format_duration(u.connect_timeout),
            "request_timeout": u.request_timeout.map(format_duration),
            "attempt_timeout": u.attempt_timeout.map(format_duration),
            "max_inflight": u.max_inflight,
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
            "budget": u.budget.as_ref().map(|b| json!({
                "ratio": b.ratio,
                "min_per_sec": b.min_per_sec,
                "window": format_duration(b.window),
                "max_ratio": b.max_ratio,
            })),
            "throttle": u.throttle.as_ref().map(|t| json!({
                "k": t.k,
                "window": format_duration(t.window),
            })),
            "app_retries": u.app_retries.as_str(),
            "tls": u.tls.as_ref().map(|t| json!({
                "server_name": t.server_name,
                "ca_file": t.ca_file.as_ref().map(|f| f.path.display().to_string()),
                "client_cert": t.client_cert.as_ref().map(|f| f.path.display().to_string()),
                "client_key": t.client_key.as_ref().map(|f| f.path.display().to_string()),
            })),
            "max_connection_age": u.max_connection_age.map(format_duration),
            "outlier": u.outlier.as_ref().map(|o| json!({
                "consecutive_failures": o.consecutive_failures,
                "base_ejection": format_duration(o.base_ejection),
                "max_ejected": format!("{}%", (o.max_ejected * 1000.0).round() / 10.0),
            })),
            "hedge": u.hedge.as_ref().map(|h| json!({
                "after": h.after.to_string(),
                "max_extra": h.max_extra,
            })),
        })
    }
}
