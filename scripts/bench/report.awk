# The report of scripts/bench.sh: per cell, the medians over rounds, the ratios paired
# by round, then the matrix in one table, and tollgate's memory.
# Input, two files:
#   cells.tsv: cell title note rounds duration proxy_cpus load_cpus ratios targets warnings seconds
#   rounds.tsv: cell target round rps p50_ms p99_ms requests cpu_us_per_req cpu_percent
#               core_us_per_req non2xx socket_errors noisy other_proxy_pct other_load_pct rss_kib
# (cpu_us_per_req, cpu_percent and rss_kib are -1 where there is no proxy: direct).
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

function jstr(s,    out, i, ch) {
  out = ""
  for (i = 1; i <= length(s); i++) {
    ch = substr(s, i, 1)
    if (ch == "\\") out = out "\\\\"
    else if (ch == "\"") out = out "\\\""
    else if (ch == "\t") out = out "\\t"
    else out = out ch
  }
  return "\"" out "\""
}

function jnum(x, fmt) { return (x < 0) ? "null" : sprintf(fmt, x) }

function fmt(x, f) { return (x < 0) ? "-" : sprintf(f, x) }

# A's figure over B's in the same round of a cell, median over the rounds where both
# ran: runs next to each other share the machine's state, so pairing them cancels slow
# drifts of the host that a ratio of overall medians would keep.
function paired(c, a, b, m,    r, n, key) {
  key = "pair" SUBSEP c SUBSEP a SUBSEP b SUBSEP m
  cnt[key] = 0
  for (r = 1; r <= maxround[c]; r++)
    if (((c, a, r, m) in rv) && ((c, b, r, m) in rv) && rv[c, a, r, m] > 0 && rv[c, b, r, m] > 0) {
      n = ++cnt[key]
      val[key, n] = rv[c, a, r, m] / rv[c, b, r, m]
    }
  return median(key)
}

function mib(kb) { return (kb == "" ? "?" : sprintf("%.1f MiB", kb / 1024)) }

function base(t) { sub(/-[12]w$/, "", t); return t }

# The cell's ratio pairs whose both sides ran, in pr[c, 1..npr[c]] as "A/B".
function pairs_of(c,    n, i, k, p, ab) {
  npr[c] = 0
  n = split(ratios[c], p, " ")
  for (i = 1; i <= n; i++) {
    split(p[i], ab, "/")
    if (((c, ab[1]) in seen) && ((c, ab[2]) in seen)) pr[c, ++npr[c]] = p[i]
  }
}

BEGIN {
  metrics = "rps p50 p99 cpu util core rss"
  nm = split(metrics, mname, " ")
}

FNR == NR {
  cells[++ncells] = $1
  title[$1] = $2; note[$1] = $3; crounds[$1] = $4; cdur[$1] = $5; pcpus[$1] = $6; lcpus[$1] = $7
  ratios[$1] = $8; warnings[$1] = $10; secs[$1] = $11
  next
}

{
  c = $1; t = $2; r = $3 + 0
  if (!((c, t) in seen)) { seen[c, t] = 1; order[c, ++nt[c]] = t }
  v[1] = $4; v[2] = $5; v[3] = $6; v[4] = $8; v[5] = $9; v[6] = $10; v[7] = $16
  for (m = 1; m <= nm; m++) {
    rv[c, t, r, mname[m]] = v[m] + 0
    k = c SUBSEP t SUBSEP mname[m]; cnt[k]++; val[k, cnt[k]] = v[m] + 0
  }
  reqs[c, t] += $7; non2xx[c, t] += $11; serr[c, t] += $12
  if ($13 == 1) { noisy[c]++; noisy_all++ }
  o = ($14 > $15 && t != "direct") ? $14 + 0 : $15 + 0   # direct uses only the load CPUs
  if (!((c, t) in noise) || o > noise[c, t]) noise[c, t] = o
  raw[c, t, r] = sprintf("{\"round\": %d, \"rps\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"requests\": %d, \"cpu_us_per_req\": %s, \"cpu_percent\": %s, \"core_us_per_req\": %.2f, \"rss_kib\": %s, \"non_2xx\": %d, \"socket_errors\": %d, \"other_load_proxy_cpu_pct\": %.1f, \"other_load_load_cpu_pct\": %.1f, \"noisy\": %s}",
    r, $4, $5, $6, $7, jnum($8 + 0, "%.2f"), jnum($9 + 0, "%.1f"), $10, jnum($16 + 0, "%d"), $11, $12, $14, $15, ($13 == 1 ? "true" : "false"))
  if (r > maxround[c]) maxround[c] = r
  rows[c]++; total_rows++
}

END {
  for (ci = 1; ci <= ncells; ci++) {
    c = cells[ci]
    for (i = 1; i <= nt[c]; i++) {
      t = order[c, i]
      for (m = 1; m <= nm; m++) med[c, t, mname[m]] = median(c SUBSEP t SUBSEP mname[m])
    }
    pairs_of(c)
  }

  if (mode == "json") {
    printf "{\n"
    printf "  \"command\": %s,\n", jstr(cmd)
    printf "  \"machine\": {\"nproc\": %d, \"cpu_model\": %s, \"kernel\": %s, \"loadavg_before\": %s, \"loadavg_after\": %s},\n",
      nproc, jstr(cpu_model), jstr(kernel), jstr(load_before), jstr(load_after)
    printf "  \"software\": {\"tollgate\": %s, \"tollgate_binary_built\": %s, \"nginx\": %s, \"haproxy\": %s, \"wrk\": %s, \"h2load\": %s, \"pingora\": %s},\n",
      jstr(tg_rev), jstr(tg_built), jstr(nginx_ver), jstr(haproxy_ver), jstr(wrk_ver), jstr(h2load_ver), jstr(pingora_ver)
    printf "  \"settings\": {\"proxy_cpu\": %d, \"load_cpu\": %d, \"targets\": %s, \"statistic\": \"median\"},\n",
      proxy_cpu, load_cpu, jstr(targets)
    printf "  \"cells\": {"
    for (ci = 1; ci <= ncells; ci++) {
      c = cells[ci]
      printf "%s\n    %s: {\"title\": %s, \"note\": %s, \"rounds\": %d, \"duration_s\": %d, \"proxy_cpus\": %s, \"load_cpus\": %s, \"seconds\": %d, \"tollgate_warnings_logged\": %d,\n",
        (ci > 1 ? "," : ""), jstr(c), jstr(title[c]), jstr(note[c]), crounds[c], cdur[c], jstr(pcpus[c]), jstr(lcpus[c]), secs[c], warnings[c]
      printf "      \"results\": {"
      for (i = 1; i <= nt[c]; i++) {
        t = order[c, i]
        printf "%s\n        %s: {\"rps\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"cpu_us_per_req\": %s, \"cpu_percent\": %s, \"core_us_per_req\": %.2f, \"rss_kib\": %s, \"requests\": %d, \"non_2xx\": %d, \"socket_errors\": %d, \"max_other_load_pct\": %.1f,\n",
          (i > 1 ? "," : ""), jstr(t), med[c, t, "rps"], med[c, t, "p50"], med[c, t, "p99"], jnum(med[c, t, "cpu"], "%.2f"),
          jnum(med[c, t, "util"], "%.1f"), med[c, t, "core"], jnum(med[c, t, "rss"], "%d"), reqs[c, t], non2xx[c, t], serr[c, t], noise[c, t]
        printf "          \"rounds\": ["
        sep = ""
        for (r = 1; r <= maxround[c]; r++) if ((c, t, r) in raw) { printf "%s\n            %s", sep, raw[c, t, r]; sep = "," }
        printf "\n          ]}"
      }
      printf "\n      },\n      \"ratios\": {"
      for (i = 1; i <= npr[c]; i++) {
        split(pr[c, i], ab, "/")
        printf "%s\n        %s: {\"rps\": %s, \"p50\": %s, \"p99\": %s, \"cpu_us_per_req\": %s, \"rss\": %s}", (i > 1 ? "," : ""), jstr(ab[1] "/" ab[2]),
          jnum(paired(c, ab[1], ab[2], "rps"), "%.3f"), jnum(paired(c, ab[1], ab[2], "p50"), "%.3f"),
          jnum(paired(c, ab[1], ab[2], "p99"), "%.3f"), jnum(paired(c, ab[1], ab[2], "cpu"), "%.3f"), jnum(paired(c, ab[1], ab[2], "rss"), "%.3f")
      }
      printf "%s}}", (npr[c] ? "\n      " : "")
    }
    printf "\n  },\n"
    if (rss_idle != "")
      printf "  \"memory\": {\"idle_rss_kib\": %d, \"connections\": %d, \"idle_connections_open\": %d, \"idle_connections_answered\": %d, \"rss_idle_connections_kib\": %d, \"rss_busy_connections_kib\": %d, \"peak_rss_kib\": %d, \"rss_after_close_kib\": %d, \"busy_load\": {\"rps\": %.1f, \"p99_ms\": %.3f, \"requests\": %d, \"non_2xx\": %d, \"socket_errors\": %d}},\n",
        rss_idle, rss_conns, held_open, held_ok, rss_held, rss_busy, rss_peak, rss_after, rss_rps, rss_p99, rss_reqs, rss_non2xx, rss_serr
    else
      printf "  \"memory\": null,\n"
    printf "  \"noisy_runs\": %d,\n", noisy_all
    printf "  \"skipped\": %s,\n", jstr(skips)
    printf "  \"restarts\": %s,\n", jstr(restarts)
    printf "  \"seconds\": %d\n", total_secs
    printf "}\n"
    exit
  }

  printf "tollgate load matrix: each cell's targets in alternating rounds, median of each metric\n"
  printf "command:  %s\n", cmd
  printf "machine:  %d CPUs, %s, %s; load average %s before, %s after\n", nproc, cpu_model, kernel, load_before, load_after
  printf "software: tollgate %s, built %s; nginx %s, haproxy %s, pingora %s, wrk %s, h2load %s\n", tg_rev, tg_built, nginx_ver, haproxy_ver, pingora_ver, wrk_ver, h2load_ver
  printf "pinning:  proxy under test alone on CPU %d (two-core cell: two CPUs); load generator and the nginx backend on CPU %d\n", proxy_cpu, load_cpu
  printf "run time: %d s\n", total_secs

  for (ci = 1; ci <= ncells; ci++) {
    c = cells[ci]
    printf "\n== %s: %s\n", c, title[c]
    printf "   %d round(s) of %d s; proxy on CPU %s, load on CPU %s; cell took %d s\n", crounds[c], cdur[c], pcpus[c], lcpus[c], secs[c]
    if (note[c] != "") printf "   NOTE: %s\n", note[c]
    printf "%-17s %9s %8s %8s %11s %6s %12s %8s %8s %7s %8s\n", "target", "req/s", "p50 ms", "p99 ms", "CPU us/req", "CPU %", "core us/req", "RSS MiB", "non-2xx", "errors", "other %"
    for (i = 1; i <= nt[c]; i++) {
      t = order[c, i]
      printf "%-17s %9.0f %8.3f %8.3f %11s %6s %12.1f %8s %8d %7d %8.1f\n", t, med[c, t, "rps"], med[c, t, "p50"], med[c, t, "p99"],
        fmt(med[c, t, "cpu"], "%.1f"), fmt(med[c, t, "util"], "%.0f"), med[c, t, "core"], (med[c, t, "rss"] < 0 ? "-" : sprintf("%.1f", med[c, t, "rss"] / 1024)),
        non2xx[c, t], serr[c, t], noise[c, t]
    }
    if (npr[c]) {
      printf "ratios (per round, median)             req/s     p50     p99  CPU us/req     RSS\n"
      for (i = 1; i <= npr[c]; i++) {
        split(pr[c, i], ab, "/")
        printf "  %-34s %7.2f %7.2f %7.2f %11s %7s\n", ab[1] " / " ab[2],
          paired(c, ab[1], ab[2], "rps"), paired(c, ab[1], ab[2], "p50"), paired(c, ab[1], ab[2], "p99"),
          fmt(paired(c, ab[1], ab[2], "cpu"), "%.2f"), fmt(paired(c, ab[1], ab[2], "rss"), "%.2f")
      }
    }
    if (noisy[c]) printf "   NOTE: %d of %d runs of this cell were noisy (a compiler running, or other tasks using more than %s%% of a core)\n", noisy[c], rows[c], noise_pct
    if (warnings[c]) printf "   NOTE: tollgate logged %d warning/error line(s) in this cell; see its log (--out DIR keeps it)\n", warnings[c]
  }

  # The whole matrix in one table: the cell's subject (the first side of its first
  # ratio), its medians, and its paired ratios to each peer: req/s x CPU us/req.
  printf "\nmatrix: tollgate's medians, and its ratios to each peer paired by round as req/s | CPU us/req\n"
  printf "(req/s above 1: tollgate serves more; CPU above 1: tollgate spends more per request)\n"
  printf "%-9s %-15s %8s %7s %7s %7s %6s  %-13s %-13s %-13s %-13s\n", "cell", "subject", "req/s", "p50", "p99", "CPU/req", "RSS", "vs nginx", "vs haproxy", "vs pingora", "vs baseline"
  for (ci = 1; ci <= ncells; ci++) {
    c = cells[ci]
    if (!npr[c]) continue
    split(pr[c, 1], ab, "/"); s = ab[1]
    col["nginx"] = col["haproxy"] = col["pingora"] = col["base"] = "-"
    for (i = 1; i <= npr[c]; i++) {
      split(pr[c, i], ab, "/")
      if (ab[1] != s) continue
      b = base(ab[2])
      cr = paired(c, s, ab[2], "cpu")
      cell_txt = (cr < 0) ? sprintf("%.2f", paired(c, s, ab[2], "rps")) : sprintf("%.2f | %.2f", paired(c, s, ab[2], "rps"), cr)
      if (b == "nginx" || b == "haproxy" || b == "pingora") col[b] = cell_txt
      else if (col["base"] == "-") { col["base"] = cell_txt " " (ab[2] == "direct" ? "direct" : ab[2]) }
    }
    printf "%-9s %-15s %8.0f %7.3f %7.3f %7s %6s  %-13s %-13s %-13s %s\n", c, s, med[c, s, "rps"], med[c, s, "p50"], med[c, s, "p99"],
      fmt(med[c, s, "cpu"], "%.1f"), (med[c, s, "rss"] < 0 ? "-" : sprintf("%.1fM", med[c, s, "rss"] / 1024)),
      col["nginx"], col["haproxy"], col["pingora"], col["base"]
  }

  if (rss_idle != "") {
    printf "\ntollgate memory (retries + budget, worker_threads = 1)\n"
    printf "  %-46s %s\n", "idle, after start", mib(rss_idle)
    printf "  %-46s %s  (%d open, %d answered 200)\n", rss_conns " idle keep-alive connections", mib(rss_held), held_open, held_ok
    printf "  %-46s %s\n", rss_conns " busy connections (wrk -c" rss_conns "), mid-run", mib(rss_busy)
    printf "  %-46s %s\n", "peak (VmHWM)", mib(rss_peak)
    printf "  %-46s %s\n", "after the connections closed", mib(rss_after)
    printf "  under wrk -c%d: %.0f req/s, p99 %.3f ms, non-2xx %d, socket errors %d\n", rss_conns, rss_rps, rss_p99, rss_non2xx, rss_serr
  }
  if (skips != "") printf "\nSKIPPED: %s\n", skips
  if (noisy_all) printf "\nNOTE: %d of %d runs were noisy (a compiler running, or other tasks using more than %s%% of a core): treat these figures with care.\n", noisy_all, total_rows, noise_pct
  if (restarts != "") printf "\nNOTE: processes that went away during the run (restarted): %s\n", restarts
}
