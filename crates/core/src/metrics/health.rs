//! The metrics of endpoint health and hedging: endpoints ejected now, ejections
//! counted, and hedges by what became of them. Their own file so the families of one
//! feature sit together; registered by [`super::Metrics`] like every other family.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::family::{counters, int_gauges};

/// What became of a hedge: the `result` label of `tollgate_hedges_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeResult {
    /// Its answer went back to the app.
    Won,
    /// It was sent, and the answer came from another attempt (or it failed).
    Lost,
    /// Due, but the `max_extra` budget had no room: not sent.
    Denied,
}

impl HedgeResult {
    const ALL: [HedgeResult; 3] = [HedgeResult::Won, HedgeResult::Lost, HedgeResult::Denied];

    pub fn as_str(self) -> &'static str {
        match self {
            HedgeResult::Won => "won",
            HedgeResult::Lost => "lost",
            HedgeResult::Denied => "denied",
        }
    }
}

/// The families.
pub(super) struct Families {
    ejected: IntGaugeVec,
    ejections: IntCounterVec,
    hedges: IntCounterVec,
}

impl Families {
    pub(super) fn new(r: &Registry) -> Self {
        Families {
            ejected: int_gauges(
                r,
                "tollgate_endpoints_ejected",
                "Endpoints out of the rotation now for failing ([outlier]).",
                &["upstream"],
            ),
            ejections: counters(
                r,
                "tollgate_ejections_total",
                "Endpoints ejected for failing in a row ([outlier]).",
                &["upstream"],
            ),
            hedges: counters(
                r,
                "tollgate_hedges_total",
                "Hedged attempts: won (their answer went back), lost (another attempt's did, \
                 or they failed), denied (the max_extra budget had no room).",
                &["upstream", "result"],
            ),
        }
    }

    /// The handles of one upstream, every result of a hedge among them.
    pub(super) fn upstream(&self, name: &str) -> Handles {
        Handles {
            ejected: self.ejected.with_label_values(&[name]),
            ejections: self.ejections.with_label_values(&[name]),
            hedges: HedgeResult::ALL.map(|r| self.hedges.with_label_values(&[name, r.as_str()])),
        }
    }

    /// Removes the series of an upstream a reload removed.
    pub(super) fn remove(&self, name: &str) {
        let _ = self.ejected.remove_label_values(&[name]);
        let _ = self.ejections.remove_label_values(&[name]);
        for r in HedgeResult::ALL {
            let _ = self.hedges.remove_label_values(&[name, r.as_str()]);
        }
    }
}

/// One upstream's handles.
#[derive(Clone)]
pub struct Handles {
    /// `tollgate_endpoints_ejected{upstream}`, set before a scrape.
    pub(super) ejected: IntGauge,
    /// `tollgate_ejections_total{upstream}`.
    pub ejections: IntCounter,
    hedges: [IntCounter; 3],
}

impl Handles {
    pub fn hedge(&self, r: HedgeResult) {
        self.hedges[r as usize].inc();
    }
}
