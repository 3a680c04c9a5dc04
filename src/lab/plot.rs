//! An SVG time series of a lab run: per second, the load offered to the backend (with
//! its capacity) and the user requests that succeeded, for every chain, so the storm
//! and its absence can be read at a glance.

use std::fmt::Write;

use super::report::ChainResult;
use super::scenario::{Chain, Scenario};

const W: f64 = 900.0;
const PANEL_H: f64 = 210.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 75.0;
const GAP: f64 = 70.0;
/// A line per chain, in the order of `Chain::ALL`: naive, owned, adaptive, throttled.
const COLORS: [&str; 4] = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd"];
/// The legend of each chain, in the same order.
const LABELS: [&str; 4] = [
    "naive: blind retries at every hop",
    "owned: tollgate",
    "adaptive: + max_ratio",
    "throttled: + throttle",
];

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

struct Panel<'a> {
    top: f64,
    title: &'a str,
    y_max: f64,
    seconds: usize,
}

impl Panel<'_> {
    fn x(&self, s: f64) -> f64 {
        LEFT + s / self.seconds.max(1) as f64 * (W - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        self.top + PANEL_H - (v / self.y_max).min(1.05) * PANEL_H
    }

    fn frame(&self, out: &mut String) {
        let _ = writeln!(
            out,
            r##"<text x="{LEFT}" y="{}" font-size="14" font-weight="bold">{}</text>"##,
            self.top - 10.0,
            self.title
        );
        for i in 0..=4 {
            let v = self.y_max * f64::from(i) / 4.0;
            let y = self.y(v);
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{v:.0}</text>"##,
                W - RIGHT,
                LEFT - 6.0,
                y + 4.0
            );
        }
        let step = if self.seconds > 40 { 10 } else { 5 };
        for s in (0..=self.seconds).step_by(step) {
            let x = self.x(s as f64);
            let _ = writeln!(
                out,
                r##"<text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{s}s</text>"##,
                self.top + PANEL_H + 16.0
            );
        }
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{}" width="{}" height="{PANEL_H}" fill="none" stroke="#999"/>"##,
            self.top,
            W - LEFT - RIGHT
        );
    }

    fn line(&self, out: &mut String, values: &[f64], color: &str, dash: &str) {
        let pts: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(s, v)| format!("{:.1},{:.1}", self.x(s as f64 + 0.5), self.y(*v)))
            .collect();
        let _ = writeln!(
            out,
            r##"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"##,
            pts.join(" ")
        );
    }

    fn shade(&self, out: &mut String, from: f64, to: f64) {
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{}" width="{:.1}" height="{PANEL_H}" fill="#f5d5a0" opacity="0.45"/>"##,
            self.x(from),
            self.top,
            self.x(to) - self.x(from)
        );
    }
}

/// The SVG document for a run: `chains` in the order of `Chain::ALL`.
pub fn svg(s: &Scenario, chains: &[&ChainResult]) -> String {
    let color = |c: &ChainResult| {
        Chain::ALL
            .iter()
            .position(|a| a.as_str() == c.chain)
            .map_or("#000", |i| COLORS[i])
    };
    let seconds = chains
        .iter()
        .map(|c| c.backend_rps.len())
        .max()
        .unwrap_or(0);
    let capacity: Vec<f64> = (0..seconds)
        .map(|i| {
            let c = s
                .backend
                .at(std::time::Duration::from_secs_f64(i as f64 + 0.5));
            if c.down { 0.0 } else { s.backend.capacity(&c) }
        })
        .collect();
    let most = |f: &dyn Fn(&ChainResult) -> &Vec<f64>| {
        chains
            .iter()
            .flat_map(|c| f(c).iter())
            .copied()
            .fold(0.0, f64::max)
    };
    let load_max =
        nice_max(most(&|c| &c.backend_rps).max(capacity.iter().copied().fold(0.0, f64::max)));
    let ok_max = nice_max(s.load.rps.max(most(&|c| &c.success_rps)));
    let load = Panel {
        top: TOP,
        title: "calls offered to the backend per second",
        y_max: load_max,
        seconds,
    };
    let ok = Panel {
        top: TOP + PANEL_H + GAP,
        title: "user requests that succeeded per second",
        y_max: ok_max,
        seconds,
    };
    let h = TOP + 2.0 * PANEL_H + GAP + 80.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">"##
    );
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let summary: Vec<String> = chains
        .iter()
        .map(|c| {
            format!(
                "{} {:.2}x, {:.1}% ok",
                c.chain,
                c.amplification(),
                c.success_rate() * 100.0
            )
        })
        .collect();
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="24" font-size="14" font-weight="bold">tollgate lab: {}</text><text x="{LEFT}" y="44" font-size="12">{}</text>"##,
        s.name,
        summary.join("; ")
    );
    for p in [&load, &ok] {
        for (from, to, _) in &s.backend.episodes {
            p.shade(&mut out, from.as_secs_f64(), to.as_secs_f64());
        }
        p.frame(&mut out);
    }
    load.line(&mut out, &capacity, "#555", "6 4");
    let offered: Vec<f64> =
        vec![s.load.rps; (s.load.duration.as_secs_f64().ceil() as usize).min(seconds)];
    ok.line(&mut out, &offered, "#555", "6 4");
    for c in chains {
        load.line(&mut out, &c.backend_rps, color(c), "");
        ok.line(&mut out, &c.success_rps, color(c), "");
    }
    let legend = COLORS
        .iter()
        .zip(LABELS)
        .zip(Chain::ALL)
        .filter(|(_, chain)| chains.iter().any(|c| c.chain == chain.as_str()))
        .map(|((c, l), _)| (*c, "", l))
        .chain([("#555", "6 4", "backend capacity / user requests offered")]);
    let (mut x, mut ly) = (LEFT, h - 42.0);
    for (color, dash, label) in legend {
        let width = 60.0 + label.len() as f64 * 6.5;
        if x + width > W {
            (x, ly) = (LEFT, ly + 20.0);
        }
        let _ = writeln!(
            out,
            r##"<line x1="{x}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}" font-size="12">{label}</text>"##,
            x + 24.0,
            x + 30.0,
            ly + 4.0
        );
        x += width;
    }
    out.push_str("</svg>\n");
    out
}
