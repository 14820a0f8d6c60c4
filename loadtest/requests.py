#!/usr/bin/env python3
"""API requests per operation from the API server's own `apiserver_request_total` (issue "Be light on
the API server"), standard library only.

  kubectl get --raw /metrics | requests.py snap > FILE
      the counter summed by (verb, resource[/subresource]) over codes, scopes and components, as JSON
  requests.py table RUN0 RUN1 BG0 BG1 BG_SECONDS RUN_SECONDS OPERATIONS [SCRIPT]
      the run's requests (RUN1 - RUN0) less the bed's background (BG1 - BG0, counted over BG_SECONDS
      before the run, scaled to RUN_SECONDS) and less the load script's own requests SCRIPT
      (`VERB resource=count;…`: its `kubectl apply` and Ready polls), per operation, by verb and
      resource; WATCH and CONNECT (long-running) left out. Prints the table and a
      `requests_per_operation=` line.

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
    return counts


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
        verb = key.split(" ", 1)[0]
        if verb in ("WATCH", "CONNECT"):
            continue
        net = n - bg.get(key, 0.0) * scale
        if net / ops >= 0.005:
            rows.append((net / ops, key, n / ops, bg.get(key, 0.0) * scale / ops))
    rows.sort(reverse=True)
    print(f"API requests per operation ({ops:.0f} operations, {float(run_s):.0f} s; the load script's own and a background of {float(bg_s):.0f} s scaled ×{scale:.1f} subtracted; WATCH left out):")
    print(f"  {'verb resource':<40} {'net':>8} {'counted':>8} {'background':>10}")
    for net, key, counted, back in rows:
        print(f"  {key:<40} {net:>8.2f} {counted:>8.2f} {back:>10.2f}")
    total = sum(r[0] for r in rows)
    print(f"  {'total':<40} {total:>8.2f}")
    print(f"requests_per_operation={total:.2f}")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "snap":
        json.dump(snap(sys.stdin.read()), sys.stdout, sort_keys=True)
    elif len(sys.argv) in (9, 10) and sys.argv[1] == "table":
        table(*sys.argv[2:])
    else:
        sys.exit(__doc__)
