# The report of scripts/bench.sh --fixed-rate: one table with each proxy's CPU time per
# request at a fixed rate, cell by cell, tollgate's ratios to its peers, and req/s at
# saturation beside them; then each cell's detail. Input, three files:
#   rate-cells.tsv:  cell title offered rate rounds rate_duration sat_duration targets conns seconds
#   rate-rounds.tsv: cell target round offered achieved p50_ms p99_ms requests non2xx errors
#                    cpu_us_per_req cpu_percent csw_per_req backend_us_per_req noisy
#                    sys_us_per_req
#   rounds.tsv:      the matrix's runs at saturation (see matrix.sh); empty with --no-saturation
# (-1: no proxy, for direct). Variables (-v): the run's settings.

function median(key,    n, i, j, v, a) {
  n = cnt[key]
  for (i = 1; i <= n; i++) a[i] = val[key, i]
  for (i = 2; i <= n; i++) {
    v = a[i]
    for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]
    a[j + 1] = v
  }
  if (n == 0) return -1
  if (n % 2) return a[(n + 1) / 2]
  return (a[n / 2] + a[n / 2 + 1]) / 2
}

function add(key, x) { cnt[key]++; val[key, cnt[key]] = x }

function fmt(x, f) { return (x < 0 || x == "") ? "-" : sprintf(f, x) }

# A's CPU per request over B's in the same round of a cell, the median over the rounds
# where both ran: runs next to each other share the host's state.
function paired(c, a, b,    r, n, key) {
  key = "pair" SUBSEP c SUBSEP a SUBSEP b
  cnt[key] = 0
  for (r = 1; r <= maxround[c]; r++)
    if (((c, a, r) in cpu) && ((c, b, r) in cpu) && cpu[c, a, r] > 0 && cpu[c, b, r] > 0)
      add(key, cpu[c, a, r] / cpu[c, b, r])
  return median(key)
}

function note_target(t) { if (!(t in tseen)) { tseen[t] = 1; tlist[++ntl] = t } }

FILENAME ~ /rate-cells\.tsv$/ {
  cells[++ncells] = $1
  title[$1] = $2; offered[$1] = $3; rate[$1] = $4; rounds[$1] = $5; rdur[$1] = $6; sdur[$1] = $7
  ntg[$1] = split($8, tg, " ")
  for (i = 1; i <= ntg[$1]; i++) { ctg[$1, i] = tg[i]; note_target(tg[i]) }
  secs[$1] = $10
  next
}

FILENAME ~ /rate-rounds\.tsv$/ {
  c = $1; t = $2; r = $3 + 0
  add(c SUBSEP t SUBSEP "ach", $5 + 0); add(c SUBSEP t SUBSEP "p50", $6 + 0); add(c SUBSEP t SUBSEP "p99", $7 + 0)
  add(c SUBSEP t SUBSEP "cpu", $11 + 0); add(c SUBSEP t SUBSEP "util", $12 + 0)
  add(c SUBSEP t SUBSEP "csw", $13 + 0); add(c SUBSEP t SUBSEP "back", $14 + 0)
  if ($16 != "") add(c SUBSEP t SUBSEP "sys", $16 + 0)
  cpu[c, t, r] = $11 + 0
  non2xx[c, t] += $9; errs[c, t] += $10; reqs[c, t] += $8
  if ($15 == 1) noisy++
  if (r > maxround[c]) maxround[c] = r
  runs++
  next
}

FILENAME ~ /\/rounds\.tsv$/ {
  c = $1; t = $2
  add(c SUBSEP t SUBSEP "sat", $4 + 0); add(c SUBSEP t SUBSEP "satutil", $9 + 0); add(c SUBSEP t SUBSEP "satcpu", $8 + 0)
  satruns++
  next
}

END {
  for (ci = 1; ci <= ncells; ci++) {
    c = cells[ci]
    for (i = 1; i <= ntg[c]; i++) {
      t = ctg[c, i]
      split("ach p50 p99 cpu sys util csw back sat satutil satcpu", mm, " ")
      for (m in mm) med[c, t, mm[m]] = median(c SUBSEP t SUBSEP mm[m])
    }
  }
  # Columns: the proxies (every target but direct), the ratios of tollgate to each peer
  # that ran, and req/s at saturation of every target.
  np = 0
  for (i = 1; i <= ntl; i++) if (tlist[i] != "direct") prox[++np] = tlist[i]
  nr = 0
  if ("tollgate" in tseen)
    for (i = 1; i <= np; i++) if (prox[i] != "tollgate") rpeer[++nr] = prox[i]

  printf "== tollgate fixed-rate comparison\n"
  printf "command:  %s\n", cmd
  printf "machine:  %d CPUs, %s, %s; load average %s before, %s after\n", nproc, cpu_model, kernel, load_before, load_after
  printf "software: tollgate %s, built %s; nginx %s, haproxy %s, h2load %s, wrk %s, pingora %s\n", tg_rev, tg_built, nginx_ver, haproxy_ver, h2load_ver, wrk_ver, pingora_ver
  printf "pinning:  the proxy on CPU %s alone; h2load, the backend and this script on CPU %s\n", proxy_cpu, load_cpu
  printf "method:   each target offered the same open-loop rate (h2load --rps, per-client timers);\n"
  printf "          proxy CPU = utime+stime of all its processes and threads (/proc/PID/stat)\n"
  printf "          (sys us/req in each cell: the stime part, the kernel's work for the proxy)\n"
  printf "          over the run, divided by the requests completed; medians over the rounds,\n"
  printf "          ratios paired by round%s\n", (sat == 1 ? "; req/s at saturation: the matrix's closed-loop run, same rounds" : "")
  printf "\nproxy CPU per request at a fixed rate, us (median)\n"
  line = sprintf("%-9s %8s %8s ", "cell", "offered", "achieved")
  for (i = 1; i <= np; i++) line = line sprintf(" %9s", substr(prox[i], 1, 9))
  line = line " |"
  for (i = 1; i <= nr; i++) line = line sprintf(" %11s", "tg/" substr(rpeer[i], 1, 8))
  if (sat == 1) {
    line = line " | req/s at saturation:"
    for (i = 1; i <= ntl; i++) line = line sprintf(" %8s", substr(tlist[i], 1, 8))
  }
  print line
  for (ci = 1; ci <= ncells; ci++) {
    c = cells[ci]
    low = -1
    for (i = 1; i <= ntg[c]; i++) {
      a = med[c, ctg[c, i], "ach"]
      if (a >= 0 && (low < 0 || a < low)) low = a
    }
    line = sprintf("%-9s %8d %8s ", c, rate[c], fmt(low, "%.0f"))
    for (i = 1; i <= np; i++) line = line sprintf(" %9s", ((c, prox[i], "cpu") in med) ? fmt(med[c, prox[i], "cpu"], "%.2f") : "")
    line = line " |"
    for (i = 1; i <= nr; i++) {
      x = (((c, "tollgate", "cpu") in med) && ((c, rpeer[i], "cpu") in med)) ? paired(c, "tollgate", rpeer[i]) : -1
      line = line sprintf(" %11s", fmt(x, "%.2f"))
    }
    if (sat == 1) {
      line = line " |                    "
      for (i = 1; i <= ntl; i++) line = line sprintf(" %8s", ((c, tlist[i], "sat") in med) ? fmt(med[c, tlist[i], "sat"], "%.0f") : "")
    }
    print line
  }
  printf "(offered: the cell's rate, req/s; achieved: the lowest median over its targets; tg/X: tollgate's\n"
  printf " CPU per request over X's, paired by round: below 1, tollgate spends less)\n"

  for (ci = 1; ci <= ncells; ci++) {
    c = cells[ci]
    printf "\n%s: %s\n", c, title[c]
    printf "offered %d req/s%s, %d round(s) of %d s%s; %d s\n", rate[c],
      (rate[c] != offered[c] ? sprintf(" (lowered from %d: a target fell short in its warm-up)", offered[c]) : ""),
      rounds[c], rdur[c], (sat == 1 ? sprintf(", then %d s at saturation", sdur[c]) : ""), secs[c]
    printf "%-17s %9s %6s %8s %8s %8s %7s %10s %10s %6s %8s %10s", "target", "achieved", "% off", "p50 ms", "p99 ms", "non-2xx", "errors", "CPU us/req", "sys us/req", "CPU %", "csw/req", "backend us"
    if (sat == 1) printf " | %9s %6s %10s", "sat req/s", "CPU %", "CPU us/req"
    printf "\n"
    for (i = 1; i <= ntg[c]; i++) {
      t = ctg[c, i]
      printf "%-17s %9s %6s %8s %8s %8d %7d %10s %10s %6s %8s %10s", t, fmt(med[c, t, "ach"], "%.0f"),
        (med[c, t, "ach"] >= 0 ? sprintf("%.1f", med[c, t, "ach"] / rate[c] * 100) : "-"),
        fmt(med[c, t, "p50"], "%.3f"), fmt(med[c, t, "p99"], "%.3f"), non2xx[c, t], errs[c, t],
        fmt(med[c, t, "cpu"], "%.2f"), fmt(med[c, t, "sys"], "%.2f"), fmt(med[c, t, "util"], "%.1f"), fmt(med[c, t, "csw"], "%.3f"), fmt(med[c, t, "back"], "%.2f")
      if (sat == 1) printf " | %9s %6s %10s", fmt(med[c, t, "sat"], "%.0f"), fmt(med[c, t, "satutil"], "%.1f"), fmt(med[c, t, "satcpu"], "%.2f")
      printf "\n"
    }
  }
  printf "\n(achieved: req/s the load completed, %% of the offered rate; non-2xx and errors: totals\n"
  printf " over the runs (h2load's errored and timed-out requests); sys us/req: the part of CPU\n"
  printf " us/req the kernel spent for the proxy (stime); csw/req: voluntary and\n"
  printf " involuntary context switches of the proxy's threads per request; backend us: the\n"
  printf " backend's CPU per request, the same for every target when all is well)\n"
  if (noisy > 0) printf "NOTE: a compiler was running during %d of %d fixed-rate runs: those figures are noisy\n", noisy, runs
  if (restarts != "") printf "NOTE: restarted or left out: %s\n", restarts
  if (skips != "") printf "NOTE: %s\n", skips
  printf "took %d s\n", total_secs
}
