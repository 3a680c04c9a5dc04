//! What `[inbound.dedupe]` says: a request carrying the idempotency header runs once,
//! and its duplicates get the first one's answer. Plain data; the running parts (the
//! store, its fallback, the waiting duplicates) are built by `inbound::dedupe`.
//!
//! The Redis address may carry a password. It is kept apart from everything that is
//! shown: `Display` and `Debug` write `***` in its place, so neither a log line, a
//! reload message nor `/config` ever prints it.

use std::fmt;
use std::time::Duration;

use http::{HeaderName, Method};

/// `[inbound.dedupe]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DedupeConfig {
    /// Keys on other methods pass through untouched.
    pub methods: Vec<Method>,
    /// How long a completed key replays its response.
    pub ttl: Duration,
    /// A response larger than this (head and body as kept) is not kept.
    pub max_response: usize,
    pub store: DedupeStore,
    /// The memory store's bound: the oldest completed keys go first, never one in flight.
    pub max_entries: usize,
    /// One store operation longer than this counts as the store failing.
    pub store_timeout: Duration,
    pub on_store_error: OnStoreError,
    /// The header a key is read from, and which every answer names
    /// (`x-tollgate-dedupe: on; header=NAME`).
    pub header: HeaderName,
    /// Credentials besides `Authorization` and `Cookie` that tell callers apart: each
    /// is part of a key's scope.
    pub identity_headers: Vec<HeaderName>,
}

impl Default for DedupeConfig {
    fn default() -> Self {
        DedupeConfig {
            methods: vec![Method::POST, Method::PATCH],
            ttl: Duration::from_secs(24 * 3600),
            max_response: 1 << 20,
            store: DedupeStore::Memory,
            max_entries: 100_000,
            store_timeout: Duration::from_millis(50),
            on_store_error: OnStoreError::Closed,
            header: HeaderName::from_static("idempotency-key"),
            identity_headers: vec![HeaderName::from_static("x-api-key")],
        }
    }
}

/// Where the keys are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DedupeStore {
    /// This replica only.
    Memory,
    /// One store for every replica of the service.
    Redis(RedisAddr),
}

impl DedupeStore {
    /// As `/config` shows it: the Redis address without its password.
    pub fn describe(&self) -> String {
        match self {
            DedupeStore::Memory => "memory".to_string(),
            DedupeStore::Redis(r) => r.to_string(),
        }
    }
}

/// What a keyed request gets while the shared store fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnStoreError {
    /// `503 dedupe-unavailable` with `Retry-After`: it cannot be made safe now.
    #[default]
    Closed,
    /// This replica's memory store stands in (duplicates across replicas possible).
    Open,
}

impl OnStoreError {
    pub fn as_str(self) -> &'static str {
        match self {
            OnStoreError::Closed => "closed",
            OnStoreError::Open => "open",
        }
    }
}

/// `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]`, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisAddr {
    /// A name or an IP address (an IPv6 one without its brackets).
    pub host: String,
    pub port: u16,
    pub db: i64,
    pub username: Option<String>,
    /// Never shown: see the module doc.
    pub password: Option<String>,
}

impl RedisAddr {
    pub const DEFAULT_PORT: u16 = 6379;
}

impl fmt::Display for RedisAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("redis://")?;
        match (&self.username, &self.password) {
            (Some(u), Some(_)) => write!(f, "{u}:***@")?,
            (None, Some(_)) => f.write_str(":***@")?,
            (Some(u), None) => write!(f, "{u}@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        write!(f, ":{}/{}", self.port, self.db)
    }
}

impl fmt::Debug for RedisAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisAddr({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_never_shown() {
        let r = RedisAddr {
            host: "::1".into(),
            port: 6380,
            db: 2,
            username: Some("app".into()),
            password: Some("hunter2".into()),
        };
        assert_eq!(r.to_string(), "redis://app:***@[::1]:6380/2");
        let store = DedupeStore::Redis(r);
        assert!(!format!("{store:?}").contains("hunter2"));
        assert!(!store.describe().contains("hunter2"));
    }
}
