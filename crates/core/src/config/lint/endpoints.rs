//! The lints of an upstream's endpoint health and hedging: an outlier section that can
//! eject nothing or all but one endpoint, and a hedge section that never hedges or
//! hedges beside unbudgeted retries.

use super::Lint;
use crate::config::units::format_duration;
use crate::config::{Diagnostic, Discovery, HedgeAfter};

impl Lint<'_> {
    /// An outlier section that can eject nothing, or that can eject all but one.
    pub(super) fn outlier(&self) -> Option<Diagnostic> {
        let o = self.up.outlier.as_ref()?;
        let n = self.up.endpoints.len();
        // A watched Service's pods are counted only at run time.
        let counted = self.up.discovery == Discovery::Dns;
        let share = format!("{}%", (o.max_ejected * 1000.0).round() / 10.0);
        // A name may lead to many pods (a headless Service): each address is an
        // endpoint of its own. Only IP literals are counted offline.
        let literal = counted && self.up.endpoints.iter().all(|e| e.ip().is_some());
        if literal && n == 1 {
            return Some(
                self.warn(
                    "outlier",
                    "with one endpoint nothing is ever ejected: there is nowhere else to send \
                 its traffic"
                        .to_string(),
                    "list the upstream's endpoints one by one, or remove the outlier section"
                        .to_string(),
                ),
            );
        }
        if o.max_ejected >= 1.0 {
            return Some(
                self.warn(
                    "outlier.max_ejected",
                    format!(
                        "max_ejected = {share} lets every endpoint but one be ejected: when the \
                     whole upstream fails (a bad deploy, a dependency of its own down), the \
                     endpoints are ejected one after another and the last one takes all the \
                     traffic"
                    ),
                    "keep it at \"50%\" (the default) or lower, so most of the upstream stays in \
                 rotation when all of it is failing"
                        .to_string(),
                ),
            );
        }
        if literal && o.max_out(n) == 0 {
            let least = (100.0 / n as f64).ceil();
            return Some(self.warn(
                "outlier.max_ejected",
                format!(
                    "max_ejected = {share} of {n} endpoints rounds down to none: no endpoint \
                     is ever ejected"
                ),
                format!("raise it to at least \"{least}%\", or remove the outlier section"),
            ));
        }
        None
    }

    /// A retrying upstream whose one endpoint is one address that is not this host's: a
    /// Service's virtual IP, most likely. kube-proxy picks a pod per connection, so a
    /// retry lands on a random pod and nothing can be ejected. (A name that resolves to
    /// one address is told at run time; offline only a literal can be seen.)
    pub(super) fn one_address(&self) -> Option<Diagnostic> {
        let [only] = self.up.endpoints.as_slice() else {
            return None;
        };
        let ip = only.ip()?;
        if ip.ip().is_loopback() {
            return None;
        }
        Some(
            self.warn(
                "endpoints",
                format!(
                    "one address ({ip}): a Service VIP? retries land on a random pod and nothing \
                 can be ejected"
                ),
                "use a headless Service's name (every pod's address is an endpoint of its own) or \
             discovery = \"kubernetes\""
                    .to_string(),
            ),
        )
    }

    /// A hedge section that never sends a hedge, or sends them beside unbudgeted
    /// retries.
    pub(super) fn hedge(&self) -> Option<Diagnostic> {
        let h = self.up.hedge.as_ref()?;
        let up = self.up;
        if up.retry.max_attempts <= 1 {
            return Some(
                self.warn(
                    "hedge",
                    "a hedge is an attempt and counts toward max_attempts: with max_attempts = 1 \
                 no hedge is ever sent"
                        .to_string(),
                    format!(
                        "set max_attempts = 2 or more in [upstreams.{}.retry], or remove the hedge \
                     section",
                        up.name
                    ),
                ),
            );
        }
        if let (HedgeAfter::Fixed(after), Some(attempt_timeout)) = (h.after, up.attempt_timeout)
            && after >= attempt_timeout
        {
            return Some(self.warn(
                "hedge.after",
                format!(
                    "after = {} is not shorter than attempt_timeout {}: a retry starts beside \
                     a slow attempt before its hedge would be sent, so no hedge is ever sent",
                    format_duration(after),
                    format_duration(attempt_timeout)
                ),
                "hedge well within the attempt's time, e.g. after = \"p95\"".to_string(),
            ));
        }
        if h.max_extra == 0.0 {
            return Some(
                self.warn(
                    "hedge.max_extra",
                    "max_extra = 0 leaves hedges no room: none is ever sent".to_string(),
                    "set max_extra = 0.05 (hedges add at most 5% to the requests), or remove the \
                 hedge section"
                        .to_string(),
                ),
            );
        }
        if up.budget.is_none() {
            return Some(self.warn(
                "hedge",
                format!(
                    "hedging without a retry budget: hedges are capped by max_extra, but the \
                     retries after them are not, so when the upstream fails every request \
                     still makes all {} attempts",
                    up.retry.max_attempts
                ),
                format!(
                    "add [upstreams.{}.budget] with ratio = 0.1 and min_per_sec = 10",
                    up.name
                ),
            ));
        }
        None
    }
}
