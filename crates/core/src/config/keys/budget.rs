//! `[upstreams.NAME.budget]`: the share of retries an upstream may take.

use serde_json::json;

use crate::config::model::BudgetConfig;
use crate::config::units::format_duration;

keys! {
    section "upstreams.NAME.budget" of BudgetConfig = Some(BudgetConfig::default);
    ratio: "number", model, Applied, "retries may add at most this share to the requests of the window",
        |c| json!(c.ratio);
    min_per_sec: "number", model, Applied, "retries per second allowed whatever the traffic",
        |c| json!(c.min_per_sec);
    window: "duration", model, Applied, "the sliding window the share is counted over",
        |c| json!(format_duration(c.window));
    max_ratio: "number", model, Applied, "the most the share adapts to (absent: it stays at `ratio`)",
        |c| json!(c.max_ratio);
}
