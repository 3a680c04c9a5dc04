# The report of scripts/bench.sh: medians over rounds, tollgate's ratios, memory.
# Input: one tab-separated line per (target, round):
#   target round rps p50_ms p99_ms requests cpu_us_per_req cpu_percent core_us_per_req non2xx socket_errors
#   noisy other_proxy_cpu_pct other_load_cpu_pct
# (cpu_us_per_req and cpu_percent are -1 where there is no proxy process: direct).
# Variables (-v): mode = table | json, and the run's settings and memory figures.

function median(key,    n, i, j, v, a) {
  n = cnt[key]
  for (i = 1; i <= n; i++) a[i] = val[key, i]
  for (i = 2; i <= n; i++) {          # insertion sort: a handful of rounds
    v = a[i]
    for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]
    a[j + 1] = v
  }
  if (n == 0) return -1
  if (n % 2) return a[(n + 1) / 2]
  return (a[n / 2] + a[n / 2 + 1]) / 2
}

function jstr(s) {
  gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\t/, "\\t", s)
  return "\"" s "\""
}

function jnum(x, fmt) { return (x < 0) ? "null" : sprintf(fmt, x) }

function ratio(a, b) { return (a > 0 && b > 0) ? a / b : -1 }

# tollgate's figure over the peer's in the same round, median over the rounds where
# both ran: runs next to each other share the machine's state, so pairing them cancels
# slow drifts of the host that a ratio of overall medians would keep.
function paired(p, m,    r, n, key) {
  key = "pair" SUBSEP p SUBSEP m
  cnt[key] = 0
  for (r = 1; r <= maxround; r++)
    if ((("tollgate", r, m) in rv) && ((p, r, m) in rv) && rv["tollgate", r, m] > 0 && rv[p, r, m] > 0) {
      n = ++cnt[key]
      val[key, n] = rv["tollgate", r, m] / rv[p, r, m]
    }
  return median(key)
}

function mib(kb) { return (kb == "" ? "?" : sprintf("%.1f MiB", kb / 1024)) }

function known(t) { return (t in seen) }

BEGIN {
  metrics = "rps p50 p99 cpu util core"
  nm = split(metrics, mname, " ")
}

{
  t = $1
  if (!(t in seen)) { seen[t] = 1; order[++nt] = t }
  rounds_seen[t]++
  v[1] = $3; v[2] = $4; v[3] = $5; v[4] = $7; v[5] = $8; v[6] = $9
  for (m = 1; m <= nm; m++) rv[t, $2 + 0, mname[m]] = v[m] + 0
  for (m = 1; m <= nm; m++) { k = t SUBSEP mname[m]; cnt[k]++; val[k, cnt[k]] = v[m] + 0 }
  reqs[t] += $6; non2xx[t] += $10; serr[t] += $11
  if ($12 == 1) noisy++
  o = ($13 > $14 && t != "direct") ? $13 + 0 : $14 + 0   # direct uses only the load CPU
  if (!((t) in noise) || o > noise[t]) noise[t] = o
  raw[t, $2] = sprintf("{\"round\": %d, \"rps\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"requests\": %d, \"cpu_us_per_req\": %s, \"cpu_percent\": %s, \"core_us_per_req\": %.2f, \"non_2xx\": %d, \"socket_errors\": %d, \"other_load_proxy_cpu_pct\": %.1f, \"other_load_load_cpu_pct\": %.1f, \"noisy\": %s}",
    $2, $3, $4, $5, $6, jnum($7 + 0, "%.2f"), jnum($8 + 0, "%.1f"), $9, $10, $11, $13, $14, ($12 == 1 ? "true" : "false"))
  if ($2 + 0 > maxround) maxround = $2 + 0
  total_rows++
}

END {
  for (i = 1; i <= nt; i++) {
    t = order[i]
    for (m = 1; m <= nm; m++) med[t, mname[m]] = median(t SUBSEP mname[m])
  }
  # tollgate's ratios to each peer, from the medians
  np = 0
  split("direct haproxy nginx tollgate-noretry", peers, " ")
  for (i = 1; i <= 4; i++) if (known("tollgate") && known(peers[i])) pr[++np] = peers[i]

  if (mode == "json") {
    printf "{\n"
    printf "  \"command\": %s,\n", jstr(cmd)
    printf "  \"machine\": {\"nproc\": %d, \"cpu_model\": %s, \"kernel\": %s, \"loadavg_before\": %s, \"loadavg_after\": %s},\n",
      nproc, jstr(cpu_model), jstr(kernel), jstr(load_before), jstr(load_after)
    printf "  \"software\": {\"tollgate\": %s, \"tollgate_binary_built\": %s, \"nginx\": %s, \"haproxy\": %s, \"wrk\": %s},\n",
      jstr(tg_rev), jstr(tg_built), jstr(nginx_ver), jstr(haproxy_ver), jstr(wrk_ver)
    printf "  \"settings\": {\"duration_s\": %d, \"rounds\": %d, \"connections\": %d, \"wrk_threads\": 1, \"proxy_cpu\": %d, \"load_cpu\": %d, \"statistic\": \"median\"},\n",
      duration, rounds, conns, proxy_cpu, load_cpu
    printf "  \"results\": {\n"
    for (i = 1; i <= nt; i++) {
      t = order[i]
      printf "    %s: {\"rps\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"cpu_us_per_req\": %s, \"cpu_percent\": %s, \"core_us_per_req\": %.2f, \"requests\": %d, \"non_2xx\": %d, \"socket_errors\": %d, \"max_other_load_pct\": %.1f,\n",
        jstr(t), med[t, "rps"], med[t, "p50"], med[t, "p99"], jnum(med[t, "cpu"], "%.2f"), jnum(med[t, "util"], "%.1f"),
        med[t, "core"], reqs[t], non2xx[t], serr[t], noise[t]
      printf "      \"rounds\": ["
      sep = ""
      for (r = 1; r <= maxround; r++) if ((t, r) in raw) { printf "%s\n        %s", sep, raw[t, r]; sep = "," }
      printf "\n      ]}%s\n", (i < nt ? "," : "")
    }
    printf "  },\n"
    printf "  \"tollgate_ratios\": {"
    for (i = 1; i <= np; i++) {
      p = pr[i]
      printf "%s\n    %s: {\"rps\": %s, \"p50\": %s, \"p99\": %s, \"cpu_us_per_req\": %s}", (i > 1 ? "," : ""), jstr("tollgate/" p),
        jnum(paired(p, "rps"), "%.3f"), jnum(paired(p, "p50"), "%.3f"),
        jnum(paired(p, "p99"), "%.3f"), jnum(paired(p, "cpu"), "%.3f")
    }
    printf "%s},\n", (np ? "\n  " : "")
    printf "  \"memory\": {\"idle_rss_kib\": %d, \"connections\": %d, \"idle_connections_open\": %d, \"idle_connections_answered\": %d, \"rss_idle_connections_kib\": %d, \"rss_busy_connections_kib\": %d, \"peak_rss_kib\": %d, \"rss_after_close_kib\": %d,\n",
      rss_idle, rss_conns, held_open, held_ok, rss_held, rss_busy, rss_peak, rss_after
    printf "             \"busy_load\": {\"rps\": %.1f, \"p99_ms\": %.3f, \"requests\": %d, \"non_2xx\": %d, \"socket_errors\": %d}},\n",
      rss_rps, rss_p99, rss_reqs, rss_non2xx, rss_serr
    printf "  \"noisy_runs\": %d,\n", noisy
  printf "  \"restarts\": %s,\n", jstr(restarts)
    printf "  \"tollgate_warnings_logged\": %d\n", tg_warnings
    printf "}\n"
    exit
  }

  printf "tollgate load comparison: wrk -t1 -c%d -d%ds --latency, %d round(s), median of each metric\n", conns, duration, rounds
  printf "command:  %s\n", cmd
  printf "machine:  %d CPUs, %s, %s; load average %s before, %s after\n", nproc, cpu_model, kernel, load_before, load_after
  printf "software: tollgate %s, built %s; nginx %s, haproxy %s, wrk %s\n", tg_rev, tg_built, nginx_ver, haproxy_ver, wrk_ver
  printf "pinning:  proxy under test alone on CPU %d; wrk and the nginx backend share CPU %d\n\n", proxy_cpu, load_cpu

  printf "%-17s %9s %8s %8s %11s %6s %12s %8s %9s %8s\n", "target", "req/s", "p50 ms", "p99 ms", "CPU us/req", "CPU %", "core us/req", "non-2xx", "sock err", "other %"
  for (i = 1; i <= nt; i++) {
    t = order[i]
    c = (med[t, "cpu"] < 0) ? "-" : sprintf("%.1f", med[t, "cpu"])
    u = (med[t, "util"] < 0) ? "-" : sprintf("%.0f", med[t, "util"])
    printf "%-17s %9.0f %8.3f %8.3f %11s %6s %12.1f %8d %9d %8.1f\n", t, med[t, "rps"], med[t, "p50"], med[t, "p99"], c, u, med[t, "core"], non2xx[t], serr[t], noise[t]
  }
  if (np) {
    printf "\ntollgate's ratios (per round, median) req/s     p50     p99  CPU us/req\n"
    for (i = 1; i <= np; i++) {
      p = pr[i]
      cr = paired(p, "cpu")
      printf "  tollgate / %-23s %7.2f %7.2f %7.2f %11s\n", p,
        paired(p, "rps"), paired(p, "p50"), paired(p, "p99"), (cr < 0 ? "-" : sprintf("%.2f", cr))
    }
  }
  printf "\ntollgate memory (retries + budget, worker_threads = 1)\n"
  printf "  %-46s %s\n", "idle, after start", mib(rss_idle)
  printf "  %-46s %s  (%d open, %d answered 200)\n", rss_conns " idle keep-alive connections", mib(rss_held), held_open, held_ok
  printf "  %-46s %s\n", rss_conns " busy connections (wrk -c" rss_conns "), mid-run", mib(rss_busy)
  printf "  %-46s %s\n", "peak (VmHWM)", mib(rss_peak)
  printf "  %-46s %s\n", "after the connections closed", mib(rss_after)
  printf "  under wrk -c%d: %.0f req/s, p99 %.3f ms, non-2xx %d, socket errors %d\n", rss_conns, rss_rps, rss_p99, rss_non2xx, rss_serr
  if (noisy) printf "\nNOTE: %d of %d runs were noisy (a compiler running, or other tasks using more than %s%% of a core): treat these figures with care.\n", noisy, total_rows, noise_pct
  if (restarts != "") printf "\nNOTE: processes that went away during the run (restarted): %s\n", restarts
  if (tg_warnings) printf "\nNOTE: tollgate logged %d warning/error line(s); see its log (--out DIR keeps it).\n", tg_warnings
}
