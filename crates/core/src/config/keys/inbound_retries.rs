//! `[inbound.retries]`: one retry budget for every caller of the app, and how it is
//! shared. Its model is the budget with the sharing beside it.

use serde_json::json;

use crate::config::model::{BudgetConfig, PerCaller};
use crate::config::units::format_duration;

keys! {
    section "inbound.retries" of (BudgetConfig, PerCaller) = Some(<(BudgetConfig, PerCaller)>::default);
    ratio: "number", model, Applied, "callers' retries may add at most this share to their first attempts",
        |c| json!(c.0.ratio);
    min_per_sec: "number", model, Applied, "retries per second admitted whatever the traffic",
        |c| json!(c.0.min_per_sec);
    window: "duration", model, Applied, "the sliding window the share is counted over",
        |c| json!(format_duration(c.0.window));
    per_caller: "`\"fair\"` or `\"off\"`", model, Applied, "no caller gets more than an equal share while others ask",
        |c| json!(c.1.as_str());
}
