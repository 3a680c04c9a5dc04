//! What an upstream's `[retry]`, `[budget]` and `[throttle]` sections say: which
//! failures may be retried, how often, how long to sleep between attempts, how many
//! retries the upstream may take in a window (and how far that share may adapt), and
//! when first attempts are rejected locally. Plain data: the retry layer builds its
//! running `Backoff`, `RetryBudget` and `Throttle` from these.

use std::fmt;
use std::time::Duration;

use http::{HeaderName, Method};

use crate::config::units::format_duration;

#[derive(Clone, Debug, PartialEq)]
pub struct RetryConfig {
    /// First try included; 1 turns retries off.
    pub max_attempts: u32,
    pub on: RetryOn,
    pub methods: Vec<Method>,
    pub idempotency_header: Option<HeaderName>,
    /// Requests of these methods without the idempotency header get one minted (a
    /// random UUID), the same on every attempt.
    pub mint_idempotency_key: Vec<Method>,
    pub backoff: BackoffConfig,
    pub retry_after: RetryAfterMode,
    pub max_retry_after: Duration,
    pub max_body: usize,
    /// Whether a response another tollgate already gave up on is passed straight back.
    pub ownership: Ownership,
}

impl RetryConfig {
    /// What an upstream without a `[retry]` section does: one attempt, nothing retried.
    pub fn off() -> Self {
        RetryConfig {
            max_attempts: 1,
            ..RetryConfig::default()
        }
    }

    pub fn method_allowed(&self, method: &Method) -> bool {
        self.methods.iter().any(|m| m == method)
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            on: RetryOn::default(),
            methods: ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]
                .iter()
                .filter_map(|m| Method::from_bytes(m.as_bytes()).ok())
                .collect(),
            idempotency_header: Some(HeaderName::from_static("idempotency-key")),
            mint_idempotency_key: Vec::new(),
            backoff: BackoffConfig::default(),
            retry_after: RetryAfterMode::Honor,
            max_retry_after: Duration::from_secs(5),
            max_body: 64 * 1024,
            ownership: Ownership::Honor,
        }
    }
}

/// How the sleep before a retry is drawn from its cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jitter {
    /// Uniform over `[0, cap]`.
    Full,
    /// Exactly `cap`: synchronised retries, for comparison only.
    None,
}

impl Jitter {
    pub fn as_str(self) -> &'static str {
        match self {
            Jitter::Full => "full",
            Jitter::None => "none",
        }
    }
}

/// The backoff schedule: the sleep before retry `n + 1` is drawn from
/// `[0, min(max, base * 2^n)]`. One that exists is valid: `0 < base <= max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffConfig {
    base: Duration,
    max: Duration,
    jitter: Jitter,
}

/// Why a backoff schedule cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBackoff {
    ZeroBase,
    BaseAboveMax { base: Duration, max: Duration },
}

impl fmt::Display for InvalidBackoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidBackoff::ZeroBase => write!(f, "backoff_base must be longer than 0"),
            InvalidBackoff::BaseAboveMax { base, max } => write!(
                f,
                "backoff_base {} is longer than backoff_max {}",
                format_duration(*base),
                format_duration(*max)
            ),
        }
    }
}

impl BackoffConfig {
    pub fn try_new(base: Duration, max: Duration) -> Result<Self, InvalidBackoff> {
        if base.is_zero() {
            return Err(InvalidBackoff::ZeroBase);
        }
        if base > max {
            return Err(InvalidBackoff::BaseAboveMax { base, max });
        }
        Ok(BackoffConfig {
            base,
            max,
            jitter: Jitter::Full,
        })
    }

    pub fn with_jitter(self, jitter: Jitter) -> Self {
        BackoffConfig { jitter, ..self }
    }

    pub fn base(&self) -> Duration {
        self.base
    }

    pub fn max(&self) -> Duration {
        self.max
    }

    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The longest sleep before retry number `retries_so_far + 1`: `min(max, base * 2^n)`.
    pub fn cap(&self, retries_so_far: u32) -> Duration {
        let factor = 1u32.checked_shl(retries_so_far.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            base: Duration::from_millis(25),
            max: Duration::from_secs(1),
            jitter: Jitter::Full,
        }
    }
}

/// What to do with a response that already carries `x-tollgate-outcome`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Pass it straight back: the tollgate nearest the failure owned it.
    Honor,
    /// Retry it like any other failure. Only for demonstrating retry storms.
    Ignore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfterMode {
    Honor,
    Ignore,
}

/// The failure conditions a retry may fire on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryOn {
    pub connect_failure: bool,
    pub reset: bool,
    pub timeout: bool,
    /// gRPC status 14 in a trailers-only response.
    pub unavailable: bool,
    /// Bit `code - 100` set for each listed status code.
    statuses: [u64; 8],
}

impl RetryOn {
    pub fn none() -> Self {
        RetryOn {
            connect_failure: false,
            reset: false,
            timeout: false,
            unavailable: false,
            statuses: [0; 8],
        }
    }

    pub fn add_status(&mut self, code: u16) {
        if (100..600).contains(&code) {
            let bit = usize::from(code - 100);
            self.statuses[bit / 64] |= 1 << (bit % 64);
        }
    }

    pub fn status(&self, code: u16) -> bool {
        if !(100..600).contains(&code) {
            return false;
        }
        let bit = usize::from(code - 100);
        self.statuses[bit / 64] & (1 << (bit % 64)) != 0
    }

    pub fn statuses(&self) -> impl Iterator<Item = u16> + '_ {
        (100u16..600).filter(|c| self.status(*c))
    }

    /// The words as written in the config, in a stable order.
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.connect_failure {
            out.push("connect-failure".to_string());
        }
        if self.reset {
            out.push("reset".to_string());
        }
        if self.timeout {
            out.push("timeout".to_string());
        }
        out.extend(self.statuses().map(|c| c.to_string()));
        if self.unavailable {
            out.push("unavailable".to_string());
        }
        out
    }
}

impl Default for RetryOn {
    fn default() -> Self {
        let mut on = RetryOn {
            connect_failure: true,
            reset: true,
            timeout: true,
            unavailable: true,
            statuses: [0; 8],
        };
        for code in [502, 503, 504] {
            on.add_status(code);
        }
        on
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct BudgetConfig {
    /// Retries may add at most this share of the window's requests.
    pub ratio: f64,
    /// Retries per second allowed whatever the traffic, so quiet upstreams can retry.
    pub min_per_sec: f64,
    pub window: Duration,
    /// Present and above `ratio`: the share adapts between `ratio` and this.
    pub max_ratio: Option<f64>,
}

impl BudgetConfig {
    /// The most the share can be: `max_ratio` when it adapts, else `ratio`.
    pub fn top_ratio(&self) -> f64 {
        self.adaptive_max().unwrap_or(self.ratio)
    }

    /// `max_ratio`, when the share adapts (it is above `ratio`).
    pub fn adaptive_max(&self) -> Option<f64> {
        self.max_ratio.filter(|m| *m > self.ratio)
    }
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            ratio: 0.1,
            min_per_sec: 10.0,
            window: Duration::from_secs(10),
            max_ratio: None,
        }
    }
}

/// `[upstreams.NAME.throttle]`: client-side adaptive throttling of first attempts (the
/// SRE book's "Handling Overload"): reject locally with probability
/// `max(0, (requests - k * accepts) / (requests + 1))` over the window.
#[derive(Clone, Debug, PartialEq)]
pub struct ThrottleConfig {
    /// How many requests per accepted one the upstream may be asked before throttling.
    pub k: f64,
    pub window: Duration,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            k: 2.0,
            window: Duration::from_secs(5),
        }
    }
}

/// `app_retries`: what happens to a request that is, on evidence, the app's own retry
/// (a retry count its client set, or the per-call identity of a failure tollgate owned
/// in the last 2 s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AppRetries {
    /// Counted, and forwarded as a retry: within the budget, never retried again.
    #[default]
    Count,
    /// Answered at once with the failure's status and outcome `app-retry` (one whose
    /// failure tollgate does not remember goes as with `Count`).
    Refuse,
    /// Not looked for: the app's retries go as new requests, with tollgate's own
    /// retries. Only for demonstrating retry storms (the lab's naive chain).
    Ignore,
}

impl AppRetries {
    pub fn as_str(self) -> &'static str {
        match self {
            AppRetries::Count => "count",
            AppRetries::Refuse => "refuse",
            AppRetries::Ignore => "ignore",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_zero_base_or_a_base_above_max_is_refused() {
        assert_eq!(
            BackoffConfig::try_new(Duration::ZERO, ms(1000)),
            Err(InvalidBackoff::ZeroBase)
        );
        let e = BackoffConfig::try_new(ms(2000), ms(1000)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "backoff_base 2s is longer than backoff_max 1s"
        );
    }
}
