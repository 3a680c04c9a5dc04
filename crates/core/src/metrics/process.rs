//! The standard `process_*` metrics, read from `/proc/self` at scrape time.
//!
//! Every Prometheus client library exports the same family of process metrics
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...), and dashboards
//! and alerts are written against those names. The prometheus crate's own collector
//! pulls in a whole procfs library and a C call for two constants; this file reads
//! the three small files it needs itself:
//!
//! - `/proc/self/stat`: CPU time, threads, start time (in clock ticks after boot), and
//!   virtual and resident memory;
//! - `/proc/self/fd` (counted) and `/proc/self/limits` (the soft `Max open files`);
//! - `/proc/stat` for the boot time, and `/proc/self/auxv` for the clock tick rate and
//!   the page size the kernel handed this process (`AT_CLKTCK`, `AT_PAGESZ`), so no
//!   `sysconf` call (and no `unsafe`) is needed.
//!
//! Nothing is kept between scrapes: each one reads the files afresh and builds new
//! metric values, so concurrent scrapes cannot race. A file that cannot be read
//! (another OS, a locked-down `/proc`) leaves out the metrics it would have given;
//! it never fails the scrape.

use std::path::Path;

use prometheus::core::{Collector, Desc, Describer};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, Opts};

/// `AT_PAGESZ` and `AT_CLKTCK` in the ELF auxiliary vector.
const AT_PAGESZ: u64 = 6;
const AT_CLKTCK: u64 = 17;
/// What Linux reports on every mainstream architecture, if auxv cannot be read.
const DEFAULT_CLK_TCK: u64 = 100;
const DEFAULT_PAGE_SIZE: u64 = 4096;

/// The fields of `/proc/PID/stat` this collector uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    /// User plus system CPU time, in clock ticks.
    pub cpu_ticks: u64,
    pub threads: u64,
    /// Clock ticks after boot at which the process started.
    pub start_ticks: u64,
    pub virtual_bytes: u64,
    pub resident_pages: u64,
}

/// Parses one `/proc/PID/stat` line. The command name (field 2) is in parentheses and
/// may itself hold spaces and parentheses, so the fields are counted from the last `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is field 3 (state) of proc(5).
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        threads: field(20)?,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
        resident_pages: field(24)?,
    })
}

/// The soft limit of `Max open files` in `/proc/PID/limits`; `None` when unlimited.
pub fn parse_max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `btime` of `/proc/stat`: the boot time in Unix seconds.
pub fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The value of `key` in an auxiliary vector of native-endian word pairs.
pub fn auxv_value(auxv: &[u8], key: u64) -> Option<u64> {
    const WORD: usize = std::mem::size_of::<usize>();
    auxv.chunks_exact(2 * WORD).find_map(|pair| {
        let (k, v) = pair.split_at(WORD);
        let word = |b: &[u8]| -> Option<u64> {
            let bytes: [u8; WORD] = b.try_into().ok()?;
            u64::try_from(usize::from_ne_bytes(bytes)).ok()
        };
        (word(k)? == key).then(|| word(v)).flatten()
    })
}

/// One reading of the process's state; each field `None` when it could not be read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub virtual_bytes: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub threads: Option<f64>,
}

/// Reads the process whose `/proc` directory is `proc_dir` (`/proc/self`), with the
/// system-wide files under `proc_root` (`/proc`).
pub fn read(proc_root: &Path, proc_dir: &Path) -> Reading {
    let auxv = std::fs::read(proc_dir.join("auxv")).unwrap_or_default();
    let clk_tck = auxv_value(&auxv, AT_CLKTCK)
        .filter(|&t| t > 0)
        .unwrap_or(DEFAULT_CLK_TCK) as f64;
    let page_size = auxv_value(&auxv, AT_PAGESZ)
        .filter(|&p| p > 0)
        .unwrap_or(DEFAULT_PAGE_SIZE) as f64;
    let stat = std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|s| parse_stat(&s));
    let boot = std::fs::read_to_string(proc_root.join("stat"))
        .ok()
        .and_then(|s| parse_boot_time(&s));
    let open_fds = std::fs::read_dir(proc_dir.join("fd"))
        .ok()
        .map(|dir| dir.filter(|e| e.is_ok()).count() as f64);
    let max_fds = std::fs::read_to_string(proc_dir.join("limits"))
        .ok()
        .and_then(|s| parse_max_open_files(&s))
        .map(|n| n as f64);
    Reading {
        cpu_seconds: stat.map(|s| s.cpu_ticks as f64 / clk_tck),
        resident_bytes: stat.map(|s| s.resident_pages as f64 * page_size),
        virtual_bytes: stat.map(|s| s.virtual_bytes as f64),
        open_fds,
        max_fds,
        start_time_seconds: stat
            .zip(boot)
            .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / clk_tck),
        threads: stat.map(|s| s.threads as f64),
    }
}

/// The names, in the order of [`Reading`]'s fields; the CPU time is the one counter.
const FAMILIES: [(&str, &str); 7] = [
    (
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
    ),
    (
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
    ),
    (
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
    ),
    ("process_open_fds", "Number of open file descriptors."),
    (
        "process_max_fds",
        "Maximum number of open file descriptors.",
    ),
    (
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
    ),
    ("process_threads", "Number of OS threads in the process."),
];

/// A [`Collector`] of this process's `process_*` metrics, read at every gather.
pub struct ProcessCollector {
    descs: Vec<Desc>,
}

impl ProcessCollector {
    pub fn new() -> Self {
        let descs = FAMILIES
            .iter()
            .filter_map(|(name, help)| Opts::new(*name, *help).describe().ok())
            .collect();
        ProcessCollector { descs }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let r = read(Path::new("/proc"), Path::new("/proc/self"));
        let values = [
            r.cpu_seconds,
            r.resident_bytes,
            r.virtual_bytes,
            r.open_fds,
            r.max_fds,
            r.start_time_seconds,
            r.threads,
        ];
        let mut out = Vec::with_capacity(FAMILIES.len());
        for (i, ((name, help), value)) in FAMILIES.iter().zip(values).enumerate() {
            let Some(value) = value else { continue };
            let opts = Opts::new(*name, *help);
            if i == 0 {
                if let Ok(c) = Counter::with_opts(opts) {
                    c.inc_by(value.max(0.0));
                    out.extend(c.collect());
                }
            } else if let Ok(g) = Gauge::with_opts(opts) {
                g.set(value);
                out.extend(g.collect());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line of /proc/PID/stat, with a command name that holds ") (" and spaces.
    const STAT: &str = "4242 (to) (ll gate) S 1 4242 4242 0 -1 4194560 2010 0 0 0 \
        150 75 0 0 20 0 5 0 123456 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 \
        4096 17475 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        assert_eq!(
            parse_stat(STAT),
            Some(Stat {
                cpu_ticks: 225,
                threads: 5,
                start_ticks: 123456,
                virtual_bytes: 987654321,
                resident_pages: 2048,
            })
        );
        assert_eq!(parse_stat("4242 (tollgate) S 1 2"), None, "truncated");
        assert_eq!(parse_stat("no parenthesis at all"), None);
    }

    #[test]
    fn max_open_files_is_the_soft_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_open_files(unlimited), None);
    }

    #[test]
    fn boot_time_is_btime() {
        let stat = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1700000000\nprocesses 7\n";
        assert_eq!(parse_boot_time(stat), Some(1_700_000_000));
        assert_eq!(parse_boot_time("cpu 1 2\n"), None);
    }

    #[test]
    fn auxv_pairs_are_read_in_native_words() {
        let mut auxv = Vec::new();
        for (k, v) in [(AT_PAGESZ, 16384u64), (AT_CLKTCK, 250), (0, 0)] {
            auxv.extend_from_slice(&(k as usize).to_ne_bytes());
            auxv.extend_from_slice(&(v as usize).to_ne_bytes());
        }
        assert_eq!(auxv_value(&auxv, AT_PAGESZ), Some(16384));
        assert_eq!(auxv_value(&auxv, AT_CLKTCK), Some(250));
        assert_eq!(auxv_value(&auxv, 99), None);
        assert_eq!(auxv_value(&auxv[..5], AT_PAGESZ), None, "a torn pair");
    }

    #[test]
    fn a_missing_proc_gives_no_values_and_no_failure() {
        let nowhere = Path::new("/nonexistent/proc");
        assert_eq!(read(nowhere, &nowhere.join("self")), Reading::default());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_sanely() {
        let r = read(Path::new("/proc"), Path::new("/proc/self"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = r.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
        assert!(r.open_fds.unwrap() >= 3.0);
        assert!(r.max_fds.unwrap() >= r.open_fds.unwrap());
        assert!(r.resident_bytes.unwrap() > 1_000_000.0);
        assert!(r.virtual_bytes.unwrap() >= r.resident_bytes.unwrap());
        assert!(r.threads.unwrap() >= 1.0);
        assert!(r.cpu_seconds.unwrap() >= 0.0);
    }
}
