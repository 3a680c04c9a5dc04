//! `[upstreams.NAME.hedge]`: hedged requests.

use serde_json::json;

use crate::config::model::HedgeConfig;

keys! {
    section "upstreams.NAME.hedge" of HedgeConfig = Some(HedgeConfig::default);
    after: "percentile or duration", model, Applied, "when the hedge is sent",
        |c| json!(c.after.to_string());
    max_extra: "number", model, Applied, "hedges may add at most this share to the requests of the window",
        |c| json!(c.max_extra);
}
