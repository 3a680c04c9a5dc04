//! `[access_log]`: one line per request.

use serde_json::json;

use crate::config::model::AccessLogConfig;

keys! {
    section "access_log" of AccessLogConfig = Some(AccessLogConfig::default);
    enabled: "boolean", model, Applied, "one line per request on stderr",
        |c| json!(c.enabled);
    format: "`\"text\"` or `\"json\"`", model, Applied, "`key=value` pairs or one JSON object per line",
        |c| json!(c.format.as_str());
    query: "boolean", model, Applied, "log the path's query too (it often carries what must not be logged)",
        |c| json!(c.query);
}
