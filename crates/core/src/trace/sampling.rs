//! Whether a request is traced: parent-based, as OpenTelemetry's default sampler.
//!
//! A request whose `traceparent` says sampled is always traced, one that says not
//! sampled never is: the decision was made where the trace began, and a trace with
//! holes in it (or a trace recorded where the app's own spans were not) helps nobody.
//! `sample` is the share of the requests that arrive without a usable `traceparent`
//! which tollgate starts a trace for. The draw is the new trace id's low half, so a
//! trace that is started costs no second draw.

use http::HeaderMap;

use super::context::{SAMPLED, SpanId, TraceId, TraceParent};

/// `[tracing] sample`, ready to decide.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    /// A draw below this starts a trace; `u64::MAX` with `always`.
    threshold: u64,
    always: bool,
}

/// What a request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Traced, as a child of the caller's span.
    Continue(TraceParent),
    /// Traced, as the root of a new trace.
    Start(TraceId),
    /// Not traced: `traceparent` (if any) passes as it came.
    Skip,
}

impl Sampler {
    /// `share` of the requests without `traceparent`, from 0.0 to 1.0 (out of range is
    /// clamped: the config has already refused it).
    pub fn new(share: f64) -> Self {
        let share = if share.is_nan() {
            0.0
        } else {
            share.clamp(0.0, 1.0)
        };
        Sampler {
            // 2^64 as f64 times the share; the cast saturates.
            threshold: (share * 18_446_744_073_709_551_616.0) as u64,
            always: share >= 1.0,
        }
    }

    pub fn decide(&self, headers: &HeaderMap) -> Decision {
        match TraceParent::from_headers(headers) {
            Some(parent) if parent.sampled() => Decision::Continue(parent),
            Some(_) => Decision::Skip,
            None => self.root(),
        }
    }

    /// A request without a usable `traceparent`.
    fn root(&self) -> Decision {
        if self.threshold == 0 {
            return Decision::Skip;
        }
        let draw = fastrand::u64(..);
        if self.always || draw < self.threshold {
            Decision::Start(TraceId::random_with(draw))
        } else {
            Decision::Skip
        }
    }
}

impl Decision {
    /// The trace and the flags a traced request's spans carry, and the remote parent.
    pub(super) fn context(self) -> Option<(TraceId, Option<SpanId>, u8)> {
        match self {
            Decision::Continue(p) => Some((p.trace_id, Some(p.parent_id), p.flags)),
            Decision::Start(id) => Some((id, None, SAMPLED)),
            Decision::Skip => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::context::TRACEPARENT;
    use http::HeaderValue;

    fn with(tp: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static(tp));
        h
    }

    const SAMPLED_TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const UNSAMPLED_TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

    #[test]
    fn the_parents_decision_is_followed_whatever_sample_says() {
        for share in [0.0, 0.5, 1.0] {
            let s = Sampler::new(share);
            let Decision::Continue(p) = s.decide(&with(SAMPLED_TP)) else {
                panic!("a sampled parent is followed at {share}");
            };
            assert_eq!(p.parent_id.to_string(), "00f067aa0ba902b7");
            assert_eq!(s.decide(&with(UNSAMPLED_TP)), Decision::Skip, "{share}");
        }
    }

    #[test]
    fn sample_applies_only_to_requests_without_a_usable_traceparent() {
        let none = HeaderMap::new();
        assert_eq!(Sampler::new(0.0).decide(&none), Decision::Skip);
        assert!(matches!(
            Sampler::new(1.0).decide(&none),
            Decision::Start(_)
        ));
        // An invalid traceparent is none at all: sampled at `sample`, a new trace.
        let invalid = with("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01");
        assert!(matches!(
            Sampler::new(1.0).decide(&invalid),
            Decision::Start(_)
        ));
        assert_eq!(Sampler::new(0.0).decide(&invalid), Decision::Skip);
    }

    #[test]
    fn the_share_started_is_close_to_sample() {
        fastrand::seed(7);
        let s = Sampler::new(0.25);
        let none = HeaderMap::new();
        let started = (0..20_000)
            .filter(|_| matches!(s.decide(&none), Decision::Start(_)))
            .count();
        assert!((4_500..5_500).contains(&started), "{started} of 20000");
    }

    #[test]
    fn new_traces_are_sampled_and_have_no_parent() {
        let Some((_, parent, flags)) = Sampler::new(1.0).decide(&HeaderMap::new()).context() else {
            panic!("started");
        };
        assert_eq!(parent, None);
        assert_eq!(flags, SAMPLED);
    }
}
