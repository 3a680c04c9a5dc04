//! A real OTLP/HTTP receiver for the trace tests: a server on loopback that takes
//! `POST /v1/traces` and decodes each body with the official OTLP messages (the
//! `opentelemetry-proto` crate, generated from OpenTelemetry's own `.proto` files), and
//! what the tests read of the spans it got.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use http::{HeaderValue, Method, Response};
use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

use crate::common::{Upstream, full};

/// A sampled `traceparent`, as an app's own tracing sends it.
pub const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// What the receiver got: each export's spans, as decoded.
#[derive(Clone, Default)]
pub struct Received(pub Arc<Mutex<Vec<Vec<Span>>>>);

impl Received {
    pub fn spans(&self) -> Vec<Span> {
        self.0.lock().unwrap().iter().flatten().cloned().collect()
    }

    pub fn exports(&self) -> Vec<usize> {
        self.0.lock().unwrap().iter().map(Vec::len).collect()
    }
}

/// An OTLP/HTTP receiver: only `POST /v1/traces` with a protobuf body is taken.
pub async fn receiver() -> (Upstream, Received) {
    let received = Received::default();
    let into = received.clone();
    let server = Upstream::start(move |req| {
        let into = into.clone();
        async move {
            let typed = req.headers().get("content-type").map(HeaderValue::as_bytes)
                == Some(b"application/x-protobuf");
            if req.method() != Method::POST || req.uri().path() != "/v1/traces" || !typed {
                return Response::builder().status(404).body(full("")).unwrap();
            }
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let Ok(export) = ExportTraceServiceRequest::decode(body) else {
                return Response::builder().status(400).body(full("")).unwrap();
            };
            let spans = export
                .resource_spans
                .into_iter()
                .flat_map(|r| r.scope_spans)
                .flat_map(|s| s.spans)
                .collect();
            into.0.lock().unwrap().push(spans);
            Response::builder()
                .header("content-type", "application/x-protobuf")
                .body(full(""))
                .unwrap()
        }
    })
    .await;
    (server, received)
}

pub fn attr<'s>(span: &'s Span, key: &str) -> Option<&'s Value> {
    let kv = span.attributes.iter().find(|kv| kv.key == key)?;
    kv.value.as_ref()?.value.as_ref()
}

/// The trace as a tree, as a trace viewer lays it out: for the messages of failed
/// assertions (and docs/tracing.md's example).
pub fn render(spans: &[Span]) -> String {
    fn value(v: Option<&Value>) -> String {
        match v {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::DoubleValue(d)) => format!("{d:.1}"),
            Some(Value::BoolValue(b)) => b.to_string(),
            other => format!("{other:?}"),
        }
    }
    fn walk(spans: &[Span], parent: &[u8], t0: u64, depth: usize, out: &mut String) {
        let mut children: Vec<&Span> = spans
            .iter()
            .filter(|s| s.parent_span_id == parent)
            .collect();
        children.sort_by_key(|s| s.start_time_unix_nano);
        for s in children {
            let pad = "   ".repeat(depth);
            let ms = |t: u64| t.saturating_sub(t0) as f64 / 1e6;
            out.push_str(&format!(
                "{pad}{} {:?} at {:.1} ms, took {:.1} ms\n",
                s.name,
                kind(s),
                ms(s.start_time_unix_nano),
                ms(s.end_time_unix_nano) - ms(s.start_time_unix_nano),
            ));
            for kv in &s.attributes {
                let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                out.push_str(&format!("{pad}   {}={}\n", kv.key, value(v)));
            }
            for e in &s.events {
                out.push_str(&format!(
                    "{pad}   event {} at {:.1} ms",
                    e.name,
                    ms(e.time_unix_nano)
                ));
                for kv in &e.attributes {
                    let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                    out.push_str(&format!(" {}={}", kv.key, value(v)));
                }
                out.push('\n');
            }
            walk(spans, &s.span_id, t0, depth + 1, out);
        }
    }
    let ids: Vec<&[u8]> = spans.iter().map(|s| s.span_id.as_slice()).collect();
    let t0 = spans
        .iter()
        .map(|s| s.start_time_unix_nano)
        .min()
        .unwrap_or(0);
    let mut out = String::new();
    for root in spans
        .iter()
        .filter(|s| !ids.contains(&s.parent_span_id.as_slice()))
    {
        let parent = &root.parent_span_id;
        if !out.contains(&format!("{parent:?}")) {
            out.push_str(&format!("under {parent:?}\n"));
            walk(spans, parent, t0, 1, &mut out);
        }
    }
    out
}

pub fn kind(span: &Span) -> SpanKind {
    SpanKind::try_from(span.kind).unwrap()
}

pub fn string_attr(span: &Span, key: &str) -> Option<String> {
    match attr(span, key) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

pub fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

pub fn double_attr(span: &Span, key: &str) -> Option<f64> {
    match attr(span, key) {
        Some(Value::DoubleValue(d)) => Some(*d),
        _ => None,
    }
}
