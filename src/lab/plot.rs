//! An SVG time series of a lab run: per second, the load offered to the backend (with
//! its capacity) and the user requests that succeeded, for both chains, so the storm
//! and its absence can be read at a glance.

use std::fmt::Write;

use super::report::ChainResult;
use super::scenario::Scenario;

const W: f64 = 900.0;
const PANEL_H: f64 = 210.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 75.0;
const GAP: f64 = 70.0;
const NAIVE: &str = "#d62728";
const OWNED: &str = "#2ca02c";

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

/// The SVG document for a run.
pub fn svg(s: &Scenario, naive: &ChainResult, owned: &ChainResult) -> String {
    let seconds = naive.backend_rps.len().max(owned.backend_rps.len());
    let capacity: Vec<f64> = (0..seconds)
        .map(|i| {
            let c = s
                .backend
                .at(std::time::Duration::from_secs_f64(i as f64 + 0.5));
            if c.down { 0.0 } else { s.backend.capacity(&c) }
        })
        .collect();
    let load_max = nice_max(
        naive
            .backend_rps
            .iter()
            .chain(&owned.backend_rps)
            .chain(&capacity)
            .copied()
            .fold(0.0, f64::max),
    );
    let ok_max = nice_max(
        s.load.rps.max(
            naive
                .success_rps
                .iter()
                .chain(&owned.success_rps)
                .copied()
                .fold(0.0, f64::max),
        ),
    );
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
    let h = TOP + 2.0 * PANEL_H + GAP + 60.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">"##
    );
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">tollgate lab: {} — naive {:.2}x, {:.1}% ok; owned {:.2}x, {:.1}% ok</text>"##,
        s.name,
        naive.amplification(),
        naive.success_rate() * 100.0,
        owned.amplification(),
        owned.success_rate() * 100.0
    );
    for p in [&load, &ok] {
        for (from, to, _) in &s.backend.episodes {
            p.shade(&mut out, from.as_secs_f64(), to.as_secs_f64());
        }
        p.frame(&mut out);
    }
    load.line(&mut out, &capacity, "#555", "6 4");
    load.line(&mut out, &naive.backend_rps, NAIVE, "");
    load.line(&mut out, &owned.backend_rps, OWNED, "");
    let offered: Vec<f64> =
        vec![s.load.rps; (s.load.duration.as_secs_f64().ceil() as usize).min(seconds)];
    ok.line(&mut out, &offered, "#555", "6 4");
    ok.line(&mut out, &naive.success_rps, NAIVE, "");
    ok.line(&mut out, &owned.success_rps, OWNED, "");
    let ly = h - 22.0;
    let legend = [
        (NAIVE, "", "naive: blind retries at every hop"),
        (OWNED, "", "owned: tollgate"),
        ("#555", "6 4", "backend capacity / user requests offered"),
    ];
    let mut x = LEFT;
    for (color, dash, label) in legend {
        let _ = writeln!(
            out,
            r##"<line x1="{x}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}" font-size="12">{label}</text>"##,
            x + 24.0,
            x + 30.0,
            ly + 4.0
        );
        x += 60.0 + label.len() as f64 * 6.5;
    }
    out.push_str("</svg>\n");
    out
}
