#!/usr/bin/env python3
"""API requests per operation from the API server's own `apiserver_request_total` (issue "Be light on
the API server"), standard library only.

  kubectl get --raw /metrics | requests.py snap > FILE
      the counter summed by (verb, resource[/subresource]) over codes, scopes and components, as JSON,
      and again as `404 <verb> <resource>` for the requests answered 404 (GETs of objects gone: most
      often the bed's garbage collector still deleting an earlier run's namespace; when a new run
      reuses the names, its GETs find the new objects and are answered 200)
  requests.py table RUN0 RUN1 BG0 BG1 BG_SECONDS RUN_SECONDS OPERATIONS [SCRIPT]
      the run's requests (RUN1 - RUN0) less the bed's background (BG1 - BG0, counted over BG_SECONDS
      before the run, scaled to RUN_SECONDS) and less the load script's own requests SCRIPT
      (`VERB resource=count;…`: its `kubectl apply` and Ready polls), per operation, by verb and
      resource; WATCH and CONNECT (long-running) left out; column `404`: of the run's count, how
      many per operation were answered 404 (not background-subtracted). Prints the table and a
      `requests_per_operation=` line.
  requests.py timeline MARK SNAP...
      requests per second by verb and resource between consecutive snapshots named
      `req-t<SECONDS>-r<READY>.json` (taken every 10 s of a run: seconds since the apply began, Stacks
      Ready then), the busiest kinds as columns, with Stacks Ready per second; the window holding MARK
      seconds (a SIGKILL) is starred. WATCH and CONNECT left out. What the API server was asked to do
      around a failover, window by window.

The counter has no client label: everything that talked to the API server during the run is in it
(the operators, the load script's own `kubectl apply` and Ready polls, the bed's controllers), and the
background window takes out only what runs at rest. `tests/request_budget.rs` counts the operator's
own client instead.
"""
import json
import re
import sys

LINE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def snap(text):
    counts = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        labels = dict(LABEL.findall(m.group("labels")))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = f'{labels.get("verb", "?")} {resource or "-"}'
        counts[key] = counts.get(key, 0.0) + float(m.group("value"))
        if labels.get("code") == "404":
            counts[NOT_FOUND + key] = counts.get(NOT_FOUND + key, 0.0) + float(m.group("value"))
    return counts


# prefix of the keys that count only the requests answered 404
NOT_FOUND = "404 "


def counted(key):
    """Whether `key` is a request kind of the table (not long-running, not a 404 sub-count)."""
    return not key.startswith(NOT_FOUND) and key.split(" ", 1)[0] not in ("WATCH", "CONNECT")


def load(path):
    with open(path) as f:
        return json.load(f)


def delta(a, b):
    return {k: b.get(k, 0.0) - a.get(k, 0.0) for k in set(a) | set(b)}


def table(run0, run1, bg0, bg1, bg_s, run_s, ops, script=""):
    run, bg = delta(load(run0), load(run1)), delta(load(bg0), load(bg1))
    for item in filter(None, script.split(";")):
        key, n = item.rsplit("=", 1)
        run[key] = run.get(key, 0.0) - float(n)
    scale = float(run_s) / float(bg_s) if float(bg_s) > 0 else 0.0
    ops = float(ops)
    rows = []
    for key, n in run.items():
        if not counted(key):
            continue
        net = n - bg.get(key, 0.0) * scale
        if net / ops >= 0.005:
            rows.append((net / ops, key, n / ops, bg.get(key, 0.0) * scale / ops, run.get(NOT_FOUND + key, 0.0) / ops))
    rows.sort(reverse=True)
    print(f"API requests per operation ({ops:.0f} operations, {float(run_s):.0f} s; the load script's own and a background of {float(bg_s):.0f} s scaled ×{scale:.1f} subtracted; WATCH left out):")
    print(f"  {'verb resource':<40} {'net':>8} {'counted':>8} {'background':>10} {'404':>6}")
    for net, key, n, back, gone in rows:
        print(f"  {key:<40} {net:>8.2f} {n:>8.2f} {back:>10.2f} {gone:>6.2f}")
    total = sum(r[0] for r in rows)
    print(f"  {'total':<40} {total:>8.2f}")
    print(f"requests_per_operation={total:.2f}")


def timeline(mark, paths, columns=8):
    name = re.compile(r'req-t(\d+)-r(\d+)\.json$')
    snaps = sorted((int(m.group(1)), int(m.group(2)), p) for p in paths if (m := name.search(p)))
    if len(snaps) < 2:
        sys.exit("timeline: fewer than two snapshots")
    windows = []
    for (t0, r0, p0), (t1, r1, p1) in zip(snaps, snaps[1:]):
        d = {k: v for k, v in delta(load(p0), load(p1)).items() if counted(k)}
        windows.append((t0, t1, (r1 - r0) / max(t1 - t0, 1), {k: v / max(t1 - t0, 1) for k, v in d.items()}))
    totals = {}
    for _, _, _, d in windows:
        for k, v in d.items():
            totals[k] = totals.get(k, 0.0) + v
    top = [k for k, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:columns]]
    mark = float(mark)
    print("API requests per second by window (WATCH left out; * the window of the SIGKILL):")
    print(f"  {'window_s':<12} {'ready/s':>8} {'all/s':>7} " + " ".join(f"{k:>{max(len(k), 7)}}" for k in top))
    for t0, t1, ready, d in windows:
        star = "*" if t0 <= mark < t1 else " "
        cells = " ".join(f"{d.get(k, 0.0):>{max(len(k), 7)}.1f}" for k in top)
        print(f" {star}{f'{t0}-{t1}':<12} {ready:>8.1f} {sum(d.values()):>7.1f} {cells}")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "snap":
        json.dump(snap(sys.stdin.read()), sys.stdout, sort_keys=True)
    elif len(sys.argv) in (9, 10) and sys.argv[1] == "table":
        table(*sys.argv[2:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "timeline":
        timeline(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
