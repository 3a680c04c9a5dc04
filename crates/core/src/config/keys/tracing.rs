//! `[tracing]`: spans exported over OTLP.

use serde_json::json;

use crate::config::model::TracingConfig;
use crate::config::units::format_duration;

keys! {
    section "tracing" of TracingConfig = Some(TracingConfig::default);
    otlp: "URL", model, Applied, "the collector's OTLP/HTTP base address",
        |c| json!(c.otlp.as_str());
    sample: "number", model, Applied, "the share of requests without `traceparent` that start a trace",
        |c| json!(c.sample);
    batch: "integer", model, Applied, "spans per export",
        |c| json!(c.batch);
    queue: "integer", model, Applied, "spans waiting at most; more are dropped and counted",
        |c| json!(c.queue);
    timeout: "duration", model, Applied, "one export's time",
        |c| json!(format_duration(c.timeout));
}
