//! `[listener]`: where the app sends its outbound HTTP, and the limits of a client
//! connection. Every key waits for a restart: the listener is bound once.

use serde_json::json;

use crate::config::model::ListenerConfig;
use crate::config::units::{format_duration, format_size};

keys! {
    section "listener" of ListenerConfig = Some(ListenerConfig::default);
    addr: "address", model, Restart, "where the app sends its outbound HTTP (HTTP/1.1 and h2c)",
        |c| json!(c.addr.to_string());
    drain_timeout: "duration", model, Restart, "on SIGTERM, how long requests in flight may finish",
        |c| json!(format_duration(c.drain_timeout));
    header_read_timeout: "duration", model, Restart, "a request head must arrive whole within this of its first byte",
        |c| json!(format_duration(c.header_read_timeout));
    max_header_bytes: "size", model, Restart, "a larger request head gets `431`",
        |c| json!(format_size(c.max_header_bytes as u64));
    max_headers: "integer", model, Restart, "more header fields than this: `431`",
        |c| json!(c.max_headers);
    idle_timeout: "duration", model, Restart, "a keep-alive client connection with nothing in flight is closed after this",
        |c| json!(format_duration(c.idle_timeout));
    max_connections: "integer", model, Restart, "client connections beyond this are closed at once",
        |c| json!(c.max_connections);
    unknown_authorities: "`\"pass\"` or `\"refuse\"`", model, Restart, "a request for an authority no upstream lists: passed through as it is, or `404 no-route`",
        |c| json!(c.unknown_authorities.as_str());
    passthrough_connect_timeout: "duration", model, Restart, "how long connecting may take for what is passed through",
        |c| json!(format_duration(c.passthrough_connect_timeout));
}
