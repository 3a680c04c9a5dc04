//! `[upstreams.NAME.throttle]`: first attempts rejected locally.

use serde_json::json;

use crate::config::model::ThrottleConfig;
use crate::config::units::format_duration;

keys! {
    section "upstreams.NAME.throttle" of ThrottleConfig = Some(ThrottleConfig::default);
    k: "number", model, Applied, "requests per accepted one the upstream may be asked before throttling",
        |c| json!(c.k);
    window: "duration", model, Applied, "the window requests and accepts are counted over",
        |c| json!(format_duration(c.window));
}
