//! `[upstreams.NAME.retry]`: which failures are retried, how often, and the sleep
//! between attempts.

use serde_json::json;

use crate::config::model::{Ownership, RetryAfterMode, RetryConfig};
use crate::config::units::{format_duration, format_size};

keys! {
    section "upstreams.NAME.retry" of RetryConfig = Some(RetryConfig::default);
    max_attempts: "integer", model, Applied, "attempts per request, the first included; 1 turns retries off",
        |c| json!(c.max_attempts);
    on: "list of conditions and statuses", model, Applied, "the failures that may be retried",
        |c| json!(c.on.names());
    methods: "list of methods", model, Applied, "the methods that may be sent again",
        |c| json!(c.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>());
    idempotency_header: "header name (`\"\"`: none)", model, Applied, "a request that carries it may be sent again whatever its method",
        |c| json!(c.idempotency_header.as_ref().map(|h| h.as_str()));
    mint_idempotency_key: "list of methods", model, Applied, "requests of these methods without a key get one minted",
        |c| json!(c.mint_idempotency_key.iter().map(|m| m.as_str()).collect::<Vec<_>>());
    backoff_base: "duration", model, Applied, "the first sleep's cap, doubled per retry",
        |c| json!(format_duration(c.backoff.base()));
    backoff_max: "duration", model, Applied, "the most a sleep's cap grows to",
        |c| json!(format_duration(c.backoff.max()));
    backoff_jitter: "`\"full\"` or `\"none\"`", model, Applied, "the sleep drawn from 0 to its cap, or exactly the cap (to demonstrate)",
        |c| json!(c.backoff.jitter().as_str());
    retry_after: "`\"honor\"` or `\"ignore\"`", model, Applied, "`Retry-After` and `grpc-retry-pushback-ms`",
        |c| json!(match c.retry_after {
            RetryAfterMode::Honor => "honor",
            RetryAfterMode::Ignore => "ignore",
        });
    max_retry_after: "duration", model, Applied, "a longer wait asked for is not waited for",
        |c| json!(format_duration(c.max_retry_after));
    max_body: "size", model, Applied, "a request body kept for replay up to this size",
        |c| json!(format_size(c.max_body as u64));
    ownership: "`\"honor\"` or `\"ignore\"`", model, Applied, "an answer another tollgate gave up on goes straight back",
        |c| json!(match c.ownership {
            Ownership::Honor => "honor",
            Ownership::Ignore => "ignore",
        });
}
