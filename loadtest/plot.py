#!/usr/bin/env python3
"""Plots of a load-test run from the Prometheus that scraped it (loadtest/lib.sh `prom_start`).

    plot.py PROM_URL START END OUT_DIR TITLE [EVENT_T:LABEL ...]

PROM_URL: the Prometheus base URL; START/END: Unix seconds of the run; OUT_DIR: where the PNGs and
`report.md` go; TITLE: the report's title (say HOLLOW AGENTS there when they were used); EVENT_T:LABEL:
a vertical marker at Unix second EVENT_T (e.g. the SIGKILL of a replica).

Each plot is one PromQL query_range over the run at a 2 s step, one line per series. A query that
returns nothing is reported as such in report.md (not silently dropped).
"""
import json
import os
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PLOTS = [
    ("convergence", "Operations completed (cumulative, all replicas)", "operations",
     [("sum(pko_update_operations_total)", "completed")]),
    ("queue_wait", "Queue wait (enqueue → dispatched), seconds", "s",
     [("histogram_quantile(0.5, sum by (le) (rate(pko_dispatch_wait_seconds_bucket[30s])))", "p50"),
      ("histogram_quantile(0.99, sum by (le) (rate(pko_dispatch_wait_seconds_bucket[30s])))", "p99")]),
    ("dispatch_latency", "Dispatch latency (first push → operation started on its agent), seconds", "s",
     [("histogram_quantile(0.5, sum by (le) (rate(pko_dispatch_latency_seconds_bucket[30s])))", "p50"),
      ("histogram_quantile(0.99, sum by (le) (rate(pko_dispatch_latency_seconds_bucket[30s])))", "p99")]),
    ("queue_depth", "Queued and in-flight operations per replica", "operations",
     [("sum by (instance) (pko_update_operations_queued)", "queued {instance}"),
      ("sum by (instance) (pko_update_operations_in_flight)", "in flight {instance}")]),
    ("cpu", "Operator CPU per replica (cores)", "cores",
     [("sum by (instance) (rate(process_cpu_seconds_total[20s]))", "{instance}")]),
    ("memory", "Operator resident memory per replica (MiB)", "MiB",
     [("sum by (instance) (process_resident_memory_bytes) / 1048576", "{instance}")]),
    ("shards", "Shards held per replica (a failover shows as a step)", "shards",
     [("sum by (instance) (pko_fleet_shards_held)", "{instance}")]),
    ("lease_writes", "Lease writes per second per replica", "writes/s",
     [("sum by (instance) (rate(pko_fleet_lease_writes_total[20s]))", "{instance}")]),
]


def query_range(base, expr, start, end):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "2"})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    base, start, end, out, title = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
    events = [(float(e.split(":", 1)[0]), e.split(":", 1)[1]) for e in sys.argv[6:]]
    os.makedirs(out, exist_ok=True)
    lines = [f"# {title}", "", f"Run from {start:.0f} to {end:.0f} (Unix s), {end - start:.0f} s; "
             f"x axes in seconds from the start.", ""]
    for name, heading, unit, queries in PLOTS:
        fig, ax = plt.subplots(figsize=(9, 3.6))
        drawn = 0
        for expr, label in queries:
            for series in query_range(base, expr, start, end):
                pts = [(float(t) - start, float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if not pts:
                    continue
                inst = series["metric"].get("instance", "")
                xs, ys = [], []
                for i, (x, y) in enumerate(pts):
                    if i and x - pts[i - 1][0] > 5:  # no scrape (a killed replica): break the line
                        xs.append(float("nan"))
                        ys.append(float("nan"))
                    xs.append(x)
                    ys.append(y)
                ax.plot(xs, ys, label=label.format(instance=inst))
                drawn += 1
        for t, label in events:
            ax.axvline(t - start, color="red", linestyle="--", linewidth=1)
            ax.annotate(label, (t - start, ax.get_ylim()[1]), color="red", fontsize=8, va="top")
        ax.set_title(heading)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"{name}.png"), dpi=90)
        plt.close(fig)
        lines.append(f"## {heading}")
        lines.append("")
        lines.append(f"![{name}]({name}.png)" if drawn else f"_no series_ for `{queries[0][0]}`")
        lines.append("")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    print(f"report: {os.path.join(out, 'report.md')} ({len(PLOTS)} plots)")


if __name__ == "__main__":
    main()
