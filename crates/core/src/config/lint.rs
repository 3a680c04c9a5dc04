//! The lints of one valid config: settings that work as written but will hurt someone
//! during an outage. Each is a warning in the shape of a config error, at the key it is
//! about, saying what the setting costs and what to write instead.

use std::net::SocketAddr;
use std::time::Duration;

use http::Method;

use super::figures::{attempts_that_fit, total_backoff};
use super::units::format_duration;
use super::{
    AppRetries, Config, Diagnostic, Jitter, Ownership, Severity, UnknownAuthorities, UpstreamConfig,
};

mod endpoints;

/// A retry budget above this share of requests barely caps a storm.
pub const LOOSE_BUDGET_RATIO: f64 = 0.5;
/// A throttle with a smaller `k` rejects what a healthy upstream would serve.
pub const MIN_THROTTLE_K: f64 = 1.5;

pub fn warning(config: &Config, key: &str, message: String, fix: String) -> Diagnostic {
    let (line, column) = config.position(key);
    Diagnostic {
        severity: Severity::Warning,
        file: config.file.clone(),
        line,
        column,
        key: key.to_string(),
        message,
        fix,
    }
}

/// The warnings of one valid config, in file order.
pub fn lint(config: &Config) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if !config.listener.addr.ip().is_loopback() {
        let mut exposed = exposed_listener(config, "listener.addr", config.listener.addr);
        if config.listener.unknown_authorities == UnknownAuthorities::Pass {
            // Worse: a forward proxy into whatever the pod can reach.
            exposed.message.push_str(
                ", and reach any other host through it: requests for authorities no \
                 upstream lists are passed through (unknown_authorities = \"pass\")",
            );
            exposed
                .fix
                .push_str(", or write unknown_authorities = \"refuse\" in [listener]");
        }
        out.push(exposed);
    }
    for up in &config.upstreams {
        lint_upstream(config, up, &mut out);
    }
    out.extend(unbudgeted_inbound(config));
    out.sort_by_key(|d| (d.line, d.column));
    out
}

fn exposed_listener(config: &Config, key: &str, addr: SocketAddr) -> Diagnostic {
    warning(
        config,
        key,
        format!(
            "{addr} accepts requests from other hosts, who can then send traffic through this \
             sidecar, spending its retry budgets and using its client certificates"
        ),
        format!(
            "bind it to 127.0.0.1:{}: the app reaches its sidecar on localhost",
            addr.port()
        ),
    )
}

/// An `[inbound]` without `[inbound.retries]`: the app takes every retry of every
/// caller, and each caller's own budget has a floor of its own, so a failing app gets
/// the floors of the whole fleet added up.
fn unbudgeted_inbound(config: &Config) -> Option<Diagnostic> {
    let inbound = config.inbound.as_ref().filter(|i| i.retries.is_none())?;
    Some(warning(
        config,
        "inbound",
        format!(
            "no fleet retry budget: {} receives every retry of every caller, and each \
             caller's budget allows retries of its own (its min_per_sec), so when the app \
             fails, N callers can multiply its load by up to their max_attempts",
            inbound.app
        ),
        "add [inbound.retries] with ratio = 0.1 and min_per_sec = 10: retries beyond it are \
         answered 503 retry-rejected and never reach the app; the floor is per replica, \
         replicas × min_per_sec a second for the whole fleet"
            .to_string(),
    ))
}

/// The lints of one upstream. Those about retries fire only when it retries.
fn lint_upstream(config: &Config, up: &UpstreamConfig, out: &mut Vec<Diagnostic>) {
    let lint = Lint { config, up };
    if let Some(listen) = up.listen.filter(|a| !a.ip().is_loopback()) {
        out.push(exposed_listener(config, &lint.key("listen"), listen));
    }
    out.extend(lint.timeouts());
    out.extend(lint.outlier());
    out.extend(lint.hedge());
    out.extend(lint.throttle());
    out.extend(lint.app_retries());
    if up.retry.max_attempts <= 1 {
        return;
    }
    out.extend(lint.methods());
    out.extend(lint.budget());
    out.extend(lint.max_ratio());
    out.extend(lint.jitter());
    out.extend(lint.ownership());
    out.extend(lint.one_address());
}

/// One upstream being linted.
struct Lint<'c> {
    config: &'c Config,
    up: &'c UpstreamConfig,
}

impl Lint<'_> {
    fn key(&self, k: &str) -> String {
        format!("upstreams.{}.{k}", self.up.name)
    }

    fn warn(&self, key: &str, message: String, fix: String) -> Diagnostic {
        warning(self.config, &self.key(key), message, fix)
    }

    /// An attempt timeout past the deadline, or attempts that do not all fit in it.
    /// Without both timeouts there is nothing to compare.
    fn timeouts(&self) -> Option<Diagnostic> {
        let up = self.up;
        let (attempt_timeout, request_timeout) = (up.attempt_timeout?, up.request_timeout?);
        let attempts = up.retry.max_attempts;
        let d = format_duration;
        if attempt_timeout > request_timeout {
            let never_retried = if attempts > 1 {
                " and a slow attempt never gets a retry beside it"
            } else {
                ""
            };
            let fix = if attempts > 1 {
                format!(
                    "set attempt_timeout to at most {}, request_timeout / max_attempts, so that every attempt fits",
                    d(whole_ms(request_timeout / attempts))
                )
            } else {
                format!(
                    "set attempt_timeout below request_timeout, or raise request_timeout to {}",
                    d(attempt_timeout)
                )
            };
            return Some(self.warn(
                "attempt_timeout",
                format!(
                    "attempt_timeout {} is longer than request_timeout {}: the deadline always \
                     comes first, so attempt_timeout never applies{never_retried}",
                    d(attempt_timeout),
                    d(request_timeout),
                ),
                fix,
            ));
        }
        // When attempt_timeout alone is over the deadline the warning above says it all.
        let patience = up.total_patience()?;
        if patience <= request_timeout {
            return None;
        }
        let backoff = total_backoff(up);
        let fit = attempts_that_fit(up, request_timeout);
        let mut fixes = Vec::new();
        if let Some(room) = request_timeout.checked_sub(backoff) {
            let most = whole_ms(room / attempts);
            if !most.is_zero() {
                fixes.push(format!("lower attempt_timeout to {} or less", d(most)));
            }
        }
        fixes.push(format!("lower max_attempts to {fit}"));
        fixes.push(format!("raise request_timeout to {}", d(patience)));
        Some(self.warn(
            "retry.max_attempts",
            format!(
                "total patience {} ({attempts} × attempt_timeout {} + {} backoff) is longer than \
                 request_timeout {}: the deadline cuts off the later attempts, only {fit} of \
                 {attempts} {}",
                d(patience),
                d(attempt_timeout),
                d(backoff),
                d(request_timeout),
                if fit == 1 { "fits" } else { "fit" }
            ),
            join_or(&fixes),
        ))
    }

    /// Methods that are not idempotent, retried.
    fn methods(&self) -> Option<Diagnostic> {
        let retry = &self.up.retry;
        let unsafe_methods: Vec<&str> = retry
            .methods
            .iter()
            .filter(|m| !is_idempotent(m))
            .map(Method::as_str)
            .collect();
        if unsafe_methods.is_empty() {
            return None;
        }
        let list = join_and(&unsafe_methods);
        let first = unsafe_methods[0];
        let header = match &retry.idempotency_header {
            Some(h) => format!("a request carrying the {h} header is retried whatever its method"),
            None => "set idempotency_header = \"idempotency-key\": a request carrying it is \
                     retried whatever its method"
                .to_string(),
        };
        let verb = if unsafe_methods.len() == 1 {
            "is"
        } else {
            "are"
        };
        Some(self.warn(
            "retry.methods",
            format!(
                "{list} {verb} not idempotent: a request that timed out may already have been \
                 applied, and the retry applies it again (a second charge, a duplicate order)"
            ),
            format!(
                "remove {list} from methods; {header}, so the app can mark what is safe to repeat, \
                 or set mint_idempotency_key = [\"{first}\"] with a callee that runs [inbound.dedupe]"
            ),
        ))
    }

    /// No budget, a budget that allows no retry at all, one that can never bind, or one
    /// too loose to cap a storm.
    fn budget(&self) -> Option<Diagnostic> {
        let attempts = self.up.retry.max_attempts;
        let most_retries = f64::from(attempts - 1);
        let Some(b) = &self.up.budget else {
            return Some(self.warn(
                "budget",
                format!(
                    "no retry budget: when the upstream fails, every request makes all \
                     {attempts} attempts, {attempts}× the load on a dependency that is already \
                     failing"
                ),
                format!(
                    "add [upstreams.{}.budget] with ratio = 0.1 and min_per_sec = 10: retries \
                     then add at most 10% to the requests",
                    self.up.name
                ),
            ));
        };
        const TIGHTEN: &str =
            "lower it to 0.1 or 0.2; min_per_sec keeps quiet upstreams able to retry";
        if b.ratio == 0.0 && b.min_per_sec == 0.0 {
            Some(self.warn(
                "budget.ratio",
                format!(
                    "ratio = 0 and min_per_sec = 0 leave the budget no room at all: with \
                     max_attempts = {attempts} retries are configured but can never happen"
                ),
                "set ratio = 0.1 and min_per_sec = 10 to allow some retries, or max_attempts = 1 \
                 to turn them off where it can be seen"
                    .to_string(),
            ))
        } else if b.ratio >= most_retries {
            Some(self.warn(
                "budget.ratio",
                format!(
                    "ratio {} can never bind: with max_attempts = {attempts} a request makes at \
                     most {} {}, so retries add at most {:.0}% whatever the ratio, and the \
                     effective cap is {attempts}× (max_attempts), as without a budget",
                    b.ratio,
                    attempts - 1,
                    if attempts == 2 { "retry" } else { "retries" },
                    most_retries * 100.0
                ),
                TIGHTEN.to_string(),
            ))
        } else if b.ratio > LOOSE_BUDGET_RATIO {
            Some(self.warn(
                "budget.ratio",
                format!(
                    "ratio {} lets retries add {:.0}% to the load of an upstream that is \
                     failing: a budget that loose hardly caps a retry storm",
                    b.ratio,
                    b.ratio * 100.0
                ),
                TIGHTEN.to_string(),
            ))
        } else {
            None
        }
    }

    /// A `max_ratio` that changes nothing, or whose top can never bind.
    fn max_ratio(&self) -> Option<Diagnostic> {
        let b = self.up.budget.as_ref()?;
        let max = b.max_ratio?;
        let attempts = self.up.retry.max_attempts;
        if max == b.ratio {
            return Some(self.warn(
                "budget.max_ratio",
                format!(
                    "max_ratio {max} equals ratio: the share cannot move, and the budget is \
                     the fixed one"
                ),
                format!(
                    "raise max_ratio (e.g. to {}) to let the share grow while retries \
                     succeed, or remove it",
                    short_ratio(b.ratio * 3.0)
                ),
            ));
        }
        let most_retries = f64::from(attempts - 1);
        (max >= most_retries && b.ratio < most_retries).then(|| {
            self.warn(
                "budget.max_ratio",
                format!(
                    "max_ratio {max} can never bind: with max_attempts = {attempts} retries \
                     add at most {:.0}% whatever the share, so at its top the budget caps \
                     nothing",
                    most_retries * 100.0
                ),
                format!(
                    "lower max_ratio below {most_retries}, e.g. to {}",
                    short_ratio((b.ratio * 3.0).min(most_retries / 2.0))
                ),
            )
        })
    }

    /// A throttle so eager it rejects traffic a healthy upstream would take.
    fn throttle(&self) -> Option<Diagnostic> {
        let t = self.up.throttle.as_ref()?;
        (t.k < MIN_THROTTLE_K).then(|| {
            self.warn(
                "throttle.k",
                format!(
                    "k = {} starts rejecting requests as soon as fewer than {:.0}% of them \
                     are accepted: an ordinary dip throttles traffic the upstream would have \
                     served",
                    t.k,
                    100.0 / t.k
                ),
                "use k = 2 (the default, as in the SRE book), or at least 1.5".to_string(),
            )
        })
    }

    fn app_retries(&self) -> Option<Diagnostic> {
        (self.up.app_retries == AppRetries::Ignore).then(|| {
            self.warn(
                "app_retries",
                "app_retries = \"ignore\": the app's own retries (marked by its client, or \
                 repeating the identity of a call tollgate failed) go as new requests and are \
                 retried again, so the app's attempts multiply with tollgate's"
                    .to_string(),
                "remove it or set \"count\", the default, or \"refuse\"; \"ignore\" exists \
                 to demonstrate retry storms"
                    .to_string(),
            )
        })
    }

    fn jitter(&self) -> Option<Diagnostic> {
        (self.up.retry.backoff.jitter() == Jitter::None).then(|| {
            self.warn(
                "retry.backoff_jitter",
                "backoff_jitter = \"none\": callers that failed together sleep exactly as long \
                 and retry together, in synchronised waves"
                    .to_string(),
                "remove it or set \"full\", the default: sleeps drawn between 0 and the cap \
                 spread the retries out"
                    .to_string(),
            )
        })
    }

    fn ownership(&self) -> Option<Diagnostic> {
        (self.up.retry.ownership == Ownership::Ignore).then(|| {
            self.warn(
                "retry.ownership",
                "ownership = \"ignore\": failures another tollgate has already retried are \
                 retried again here, so the layers' attempts multiply"
                    .to_string(),
                "remove it or set \"honor\", the default; \"ignore\" exists to demonstrate retry \
                 storms"
                    .to_string(),
            )
        })
    }
}

/// Idempotent by RFC 9110 §9.2.2. Any other method, extension methods included, may
/// change something each time it is applied.
fn is_idempotent(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ]
    .contains(method)
}

/// A share as a config value: two decimals at most.
fn short_ratio(x: f64) -> String {
    format!("{}", (x * 100.0).round() / 100.0)
}

/// Rounded down to whole milliseconds, so a suggested value reads like a config value.
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn join_and(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

fn join_or(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{}, or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::config::testing::{BASE, parse};
    use std::path::Path;

    fn keys(config: &Config) -> Vec<String> {
        lint(config).into_iter().map(|d| d.key).collect()
    }

    #[test]
    fn a_sound_config_draws_no_warning() {
        assert_eq!(keys(&parse(BASE)), Vec::<String>::new());
    }

    #[test]
    fn the_shipped_example_draws_no_warning() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(config::DEFAULT_CONFIG_PATH);
        let config = config::load(&path).unwrap();
        assert_eq!(keys(&config), Vec::<String>::new());
    }

    #[test]
    fn each_lint_names_its_key_and_line() {
        let cases = [
            (
                r#"attempt_timeout = "600ms""#,
                r#"attempt_timeout = "1s""#,
                "upstreams.api.retry.max_attempts",
            ),
            (
                r#"attempt_timeout = "600ms""#,
                r#"attempt_timeout = "3s""#,
                "upstreams.api.attempt_timeout",
            ),
            (
                "max_attempts = 3",
                "max_attempts = 3\nmethods = [\"GET\", \"POST\"]",
                "upstreams.api.retry.methods",
            ),
            ("ratio = 0.1", "ratio = 0.8", "upstreams.api.budget.ratio"),
            (
                "[upstreams.api.budget]\nratio = 0.1",
                "",
                "upstreams.api.budget",
            ),
            (
                "max_attempts = 3",
                "max_attempts = 3\nbackoff_jitter = \"none\"",
                "upstreams.api.retry.backoff_jitter",
            ),
            (
                "max_attempts = 3",
                "max_attempts = 3\nownership = \"ignore\"",
                "upstreams.api.retry.ownership",
            ),
            (
                "ratio = 0.1",
                "ratio = 0.1\nmax_ratio = 0.1",
                "upstreams.api.budget.max_ratio",
            ),
            (
                "ratio = 0.1",
                "ratio = 0.1\nmax_ratio = 2.5",
                "upstreams.api.budget.max_ratio",
            ),
            (
                "ratio = 0.1",
                "ratio = 0.1\n[upstreams.api.throttle]\nk = 1.2",
                "upstreams.api.throttle.k",
            ),
            (
                r#"addr = "127.0.0.1:15001""#,
                r#"addr = "0.0.0.0:15001""#,
                "listener.addr",
            ),
        ];
        for (from, to, key) in cases {
            let text = BASE.replacen(from, to, 1);
            let config = parse(&text);
            let found = lint(&config);
            assert_eq!(
                found.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(),
                vec![key],
                "after replacing {from:?} with {to:?}"
            );
            let d = &found[0];
            assert_eq!(d.severity, Severity::Warning);
            assert!(!d.fix.is_empty());
            let (line, column) = config.position(key);
            assert_eq!((d.line, d.column), (line, column));
            assert!(d.line > 1, "{key} was not placed: {d}");
        }
    }

    #[test]
    fn an_inbound_side_without_a_fleet_budget_is_linted_at_its_section() {
        let with = |retries: &str| {
            parse(&format!(
                "{BASE}\n[inbound]\naddr = \"0.0.0.0:15006\"\napp = \"127.0.0.1:8080\"\n{retries}"
            ))
        };
        let config = with("");
        let found = lint(&config);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "inbound");
        assert_eq!((found[0].line, found[0].column), config.position("inbound"));
        assert!(
            found[0].message.contains("no fleet retry budget"),
            "{}",
            found[0]
        );
        assert!(found[0].fix.contains("[inbound.retries]"), "{}", found[0]);
        // Listening on every address is the inbound side's job, not a lint.
        assert_eq!(
            keys(&with("[inbound.retries]\nratio = 0.1\n")),
            Vec::<String>::new()
        );
    }

    #[test]
    fn retry_lints_stay_quiet_when_retries_are_off() {
        let text = BASE
            .replacen("max_attempts = 3", "max_attempts = 1\nmethods = [\"POST\"]\nbackoff_jitter = \"none\"\nownership = \"ignore\"", 1)
            .replacen("[upstreams.api.budget]\nratio = 0.1", "", 1);
        assert_eq!(keys(&parse(&text)), Vec::<String>::new());
    }

    #[test]
    fn one_address_for_a_retrying_upstream_is_a_service_vip_most_likely() {
        let one = r#"endpoints = ["127.0.0.1:8080"]"#;
        let vip = BASE.replacen(one, r#"endpoints = ["10.96.12.7:80"]"#, 1);
        let found = lint(&parse(&vip));
        assert_eq!(
            found.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(),
            ["upstreams.api.endpoints"]
        );
        assert!(found[0].message.contains("a Service VIP?"), "{}", found[0]);
        assert!(found[0].fix.contains("headless"), "{}", found[0]);
        // A name may be a headless Service: every pod's address an endpoint.
        let named = BASE.replacen(one, r#"endpoints = ["payments:8080"]"#, 1);
        assert_eq!(keys(&parse(&named)), Vec::<String>::new());
        let named_outlier = named + "[upstreams.api.outlier]\n";
        assert_eq!(keys(&parse(&named_outlier)), Vec::<String>::new());
        // Retries off: nothing to land on a random pod.
        let off = vip.replacen("max_attempts = 3", "max_attempts = 1", 1);
        assert!(!keys(&parse(&off)).contains(&"upstreams.api.endpoints".to_string()));
    }

    #[test]
    fn endpoint_health_and_hedging_lints_name_their_key() {
        let three = r#"endpoints = ["127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:8082"]"#;
        let two = r#"endpoints = ["127.0.0.1:8080", "127.0.0.1:8081"]"#;
        let one = r#"endpoints = ["127.0.0.1:8080"]"#;
        let outlier = |endpoints: &str, extra: &str| {
            BASE.replacen(one, endpoints, 1) + "[upstreams.api.outlier]\n" + extra
        };
        let hedge = |extra: &str| BASE.to_string() + "[upstreams.api.hedge]\n" + extra;
        let sound = outlier(three, "") + "[upstreams.api.hedge]\n";
        assert_eq!(keys(&parse(&sound)), Vec::<String>::new());
        let cases = [
            (outlier(one, ""), "upstreams.api.outlier"),
            (
                outlier(two, "max_ejected = \"100%\"\n"),
                "upstreams.api.outlier.max_ejected",
            ),
            (
                outlier(three, "max_ejected = \"20%\"\n"),
                "upstreams.api.outlier.max_ejected",
            ),
            (hedge("after = \"600ms\"\n"), "upstreams.api.hedge.after"),
            (hedge("max_extra = 0\n"), "upstreams.api.hedge.max_extra"),
            (
                hedge("").replacen("max_attempts = 3", "max_attempts = 1", 1),
                "upstreams.api.hedge",
            ),
        ];
        for (text, key) in cases {
            let config = parse(&text);
            let found = lint(&config);
            assert_eq!(
                found.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(),
                vec![key],
                "{text}"
            );
            assert!(found[0].line > 1, "{key} was not placed");
        }
        let unbudgeted = hedge("").replacen("[upstreams.api.budget]\nratio = 0.1", "", 1);
        let found = lint(&parse(&unbudgeted));
        let hedge_lint = found
            .iter()
            .find(|d| d.key == "upstreams.api.hedge")
            .unwrap();
        assert!(
            hedge_lint
                .message
                .contains("hedging without a retry budget"),
            "{hedge_lint}"
        );
    }

    #[test]
    fn the_patience_warning_offers_values_that_fit() {
        let text = BASE.replacen(
            r#"attempt_timeout = "600ms""#,
            r#"attempt_timeout = "1s""#,
            1,
        );
        let d = lint(&parse(&text)).remove(0);
        // 3 × 1s + 25ms + 50ms of backoff against 2s.
        assert!(d.message.contains("3075ms"), "{}", d.message);
        assert!(d.message.contains("only 1 of 3 fits"), "{}", d.message);
        assert!(
            d.fix.contains("lower attempt_timeout to 641ms"),
            "{}",
            d.fix
        );
        assert!(d.fix.contains("lower max_attempts to 1"), "{}", d.fix);
        assert!(
            d.fix.contains("raise request_timeout to 3075ms"),
            "{}",
            d.fix
        );
    }
}
