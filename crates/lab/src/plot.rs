//! An SVG time series of a lab run: per second, the load offered to the backend (with
//! its capacity) and the user requests that succeeded, for every chain, so the storm
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
/// The chains' colours, in the scenario's order: red for the naive (or the plain)
/// chain, green for the owned one, then blue and purple (adaptive, throttled).
const COLOURS: [&str; 4] = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd"];

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

/// The top of the load panel: the most offered, and the capacity only up to twice that.
/// A backend that answers everything at once (`dead`: a `503` in no time) has a capacity
/// far above any load, and a scale set by it would lay every chain's line flat.
fn load_scale(offered: f64, capacity: f64) -> f64 {
    nice_max(offered.max(capacity.min(2.0 * offered)))
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

/// The legend of the dashed lines.
const REFERENCE: &str = "backend capacity / user requests offered";

/// A chain's entry in the legend.
fn legend_label(c: &ChainResult) -> String {
    match c.key {
        "naive" => "naive: blind retries at every hop".to_string(),
        "owned" => "owned: tollgate".to_string(),
        "adaptive" => "adaptive: + max_ratio".to_string(),
        "throttled" => "throttled: + throttle".to_string(),
        _ => format!("{}: {}", c.key, c.title),
    }
}

/// The SVG document for a run.
pub fn svg(s: &Scenario, chains: &[ChainResult]) -> String {
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
    let most = |values: &mut dyn Iterator<Item = f64>| values.fold(0.0, f64::max);
    let offered = most(&mut chains.iter().flat_map(|c| c.backend_rps.iter().copied()));
    let load_max = load_scale(offered, most(&mut capacity.iter().copied()));
    let ok_max = nice_max(s.load.rps.max(most(
        &mut chains.iter().flat_map(|c| c.success_rps.iter().copied()),
    )));
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
    let width = |label: &str| 60.0 + label.len() as f64 * 6.5;
    // The legend: one entry per chain and the dashed references, in as many lines as
    // the width needs.
    let legend_lines = {
        let (mut lines, mut x) = (1.0, LEFT);
        let labels = chains
            .iter()
            .map(legend_label)
            .chain(std::iter::once(REFERENCE.into()));
        for label in labels {
            if x > LEFT && x + width(&label) > W - RIGHT {
                lines += 1.0;
                x = LEFT;
            }
            x += width(&label);
        }
        lines
    };
    let h = TOP + 2.0 * PANEL_H + GAP + 42.0 + 18.0 * legend_lines;
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
                c.key,
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
    let mut legend = Vec::new();
    for (c, colour) in chains.iter().zip(COLOURS.iter().cycle()) {
        load.line(&mut out, &c.backend_rps, colour, "");
        ok.line(&mut out, &c.success_rps, colour, "");
        legend.push((*colour, "", legend_label(c)));
    }
    legend.push(("#555", "6 4", REFERENCE.to_string()));
    let mut ly = h - 4.0 - 18.0 * legend_lines;
    let mut x = LEFT;
    for (color, dash, label) in legend {
        if x > LEFT && x + width(&label) > W - RIGHT {
            ly += 18.0;
            x = LEFT;
        }
        let _ = writeln!(
            out,
            r##"<line x1="{x}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}" font-size="12">{label}</text>"##,
            x + 24.0,
            x + 30.0,
            ly + 4.0
        );
        x += width(&label);
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_scale_follows_the_load_not_a_capacity_far_above_it() {
        assert_eq!(load_scale(420.0, 90.0), 500.0, "a storm over capacity");
        assert_eq!(
            load_scale(60.0, 90.0),
            100.0,
            "capacity near the load is shown"
        );
        assert_eq!(
            load_scale(300.0, 10_000.0),
            1_000.0,
            "a dead backend's 10,000/s is not"
        );
        assert_eq!(load_scale(0.0, 0.0), 1.0);
    }
}
