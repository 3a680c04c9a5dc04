//! `[upstreams.NAME.outlier]`: passive outlier ejection.

use serde_json::json;

use crate::config::model::OutlierConfig;
use crate::config::units::format_duration;

keys! {
    section "upstreams.NAME.outlier" of OutlierConfig = Some(OutlierConfig::default);
    consecutive_failures: "integer", model, Applied, "failures of an endpoint in a row that eject it",
        |c| json!(c.consecutive_failures);
    base_ejection: "duration", model, Applied, "the first ejection's length, doubled for each in a row",
        |c| json!(format_duration(c.base_ejection));
    max_ejected: "percentage", model, Applied, "the most of the endpoints out at once",
        |c| json!(format!("{}%", (c.max_ejected * 1000.0).round() / 10.0));
}
