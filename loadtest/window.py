#!/usr/bin/env python3
"""What the machine and the API server did window by window around a failover (issue "Be light on the
API server", item 4: the slowdown after each shard movement), standard library only.

  window.py cpu NAME=PID... > FILE
      CPU seconds used so far by each PID's process tree (the process, its live descendants, and the
      children they have reaped: utime + stime + cutime + cstime over the tree), and by the whole
      machine (`machine`: /proc/stat user + nice + system + irq + softirq + steal; `iowait` apart), as
      JSON counters. A PID that is gone counts 0 (its window reads negative and is shown as `-`).
  kubectl get --raw /metrics | window.py apiserver > FILE
      the API server's own view as JSON: answers by code class and 429s, request latency, etcd request
      latency and rate, how long consistent reads waited for the watch cache, events dispatched to
      watchers, watchers terminated for being slow, lists served from the watch cache and from etcd
      (objects fetched), requests in flight, garbage collection and its CPU.
  window.py timeline MARK PREFIX SNAP...
      one row per quantity, one column per window between consecutive snapshots named
      `<PREFIX>-t<SECONDS>-r<READY>.json` (taken every 10 s of a run: seconds since the apply began,
      Stacks Ready then); counters as rates per second (CPU: cores), `sum`/`count` pairs as the mean of
      the window (ms), gauges as read at the window's end. The window holding MARK seconds (a SIGKILL)
      is starred; only windows from MARK - 30 s to MARK + 120 s are shown.

Snapshot keys: `c:<name>` counters, `s:<name>` + `n:<name>` a histogram's sum and count (seconds),
`g:<name>` gauges.
"""
import json
import os
import re
import sys

LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
LONG_RUNNING = ("WATCH", "CONNECT")


def _stat(pid):
    """(ppid, utime + stime + cutime + cstime in clock ticks) of pid, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), sum(int(x) for x in fields[11:15])


def cpu(pairs):
    hz = os.sysconf("SC_CLK_TCK")
    procs = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p)) is not None}
    children = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out = {}
    for pair in pairs:
        name, pid = pair.split("=", 1)
        ticks, todo = 0, [int(pid)] if pid.isdigit() and int(pid) in procs else []
        while todo:
            p = todo.pop()
            ticks += procs[p][1]
            todo.extend(children.get(p, []))
        out[f"c:cpu {name}"] = ticks / hz
    with open("/proc/stat") as f:
        user, nice, system, _idle, iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    out["c:cpu machine"] = (user + nice + system + irq + softirq + steal) / hz
    out["c:cpu machine iowait"] = iowait / hz
    return out


def _add(out, key, value):
    out[key] = out.get(key, 0.0) + value


def apiserver(text):
    """The quantities named in the module documentation, summed over the labels not named here."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, value = m.group("name"), float(m.group("value"))
        labels = dict(LABEL.findall(m.group("labels") or ""))
        verb = labels.get("verb", "")
        if name == "apiserver_request_total" and verb not in LONG_RUNNING:
            code = labels.get("code", "")
            _add(out, f"c:answers {code[:1]}xx" if code != "429" else "c:answers 429", value)
        elif name in ("apiserver_request_duration_seconds_sum", "apiserver_request_duration_seconds_count") and verb not in LONG_RUNNING:
            kind = "mutating" if verb in ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION") else "read"
            _add(out, f"{'s' if name.endswith('_sum') else 'n'}:request latency {kind}", value)
        elif name.startswith(("etcd_request_duration_seconds_", "apiserver_watch_cache_read_wait_seconds_")) and name.endswith(("_sum", "_count")):
            base = "etcd request latency" if name.startswith("etcd") else "watch cache read wait"
            _add(out, f"{'s' if name.endswith('_sum') else 'n'}:{base}", value)
        elif name in COUNTERS:
            _add(out, f"c:{COUNTERS[name]}", value)
        elif name in GAUGES:
            suffix = f" {labels['request_kind']}" if "request_kind" in labels else ""
            _add(out, f"g:{GAUGES[name]}{suffix}", value)
    return out


COUNTERS = {
    "etcd_requests_total": "etcd requests",
    "apiserver_watch_cache_events_received_total": "watch cache events received",
    "apiserver_watch_cache_events_dispatched_total": "watch cache events dispatched",
    "apiserver_watch_events_total": "watch events sent",
    "apiserver_watch_events_sizes_sum": "watch event bytes sent",
    "apiserver_terminated_watchers_total": "watchers terminated (slow)",
    "apiserver_watch_cache_initializations_total": "watch cache initializations",
    "apiserver_init_events_total": "watch init events",
    "apiserver_cache_list_total": "lists from the watch cache",
    "apiserver_cache_list_fetched_objects_total": "objects fetched by lists from the watch cache",
    "apiserver_storage_list_total": "lists from etcd",
    "apiserver_storage_list_fetched_objects_total": "objects fetched by lists from etcd",
    "process_cpu_seconds_total": "API server CPU",
    "go_gc_duration_seconds_sum": "API server GC pause",
}
GAUGES = {
    "apiserver_current_inflight_requests": "in flight",
    "apiserver_longrunning_requests": "long-running requests",
    "apiserver_registered_watchers": "registered watchers",
}


def _load(path):
    with open(path) as f:
        return json.load(f)


def _cell(key, a, b, seconds):
    kind, name = key.split(":", 1)
    if kind == "c":
        rate = (b.get(key, 0.0) - a.get(key, 0.0)) / seconds
        return None if rate < 0 else rate
    if kind == "g":
        return b.get(key)
    count = b.get(f"n:{name}", 0.0) - a.get(f"n:{name}", 0.0)
    return None if count <= 0 else (b.get(key, 0.0) - a.get(key, 0.0)) / count * 1000


def timeline(mark, prefix, paths):
    name = re.compile(rf'{re.escape(prefix)}-t(\d+)-r(\d+)\.json$')
    mark = float(mark)
    snaps = sorted((int(m.group(1)), int(m.group(2)), p) for p in paths if (m := name.search(p)))
    pairs = [(s0, s1) for s0, s1 in zip(snaps, snaps[1:]) if mark - 30 <= s0[0] <= mark + 120]
    if not pairs:
        sys.exit(f"timeline: no two {prefix} snapshots around {mark:.0f} s")
    loaded = {p: _load(p) for s0, s1 in pairs for p in (s0[2], s1[2])}
    keys = sorted({k for d in loaded.values() for k in d if not k.startswith("n:")})
    heads = [("*" if t0 <= mark < t1 else "") + f"{t0}-{t1}" for (t0, _, _), (t1, _, _) in pairs]
    width = max(len(h) for h in heads) + 1
    label = max(max(len(k) for k in keys) + 8, 42)
    print(f"{prefix} by window (s since the apply; * the window of the SIGKILL; rates per second, CPU in cores, latencies in ms):")
    print(f"  {'':<{label}}" + "".join(f"{h:>{width}}" for h in heads))
    ready = [(r1 - r0) / max(t1 - t0, 1) for (t0, r0, _), (t1, r1, _) in pairs]
    print(f"  {'Stacks Ready/s':<{label}}" + "".join(f"{r:>{width}.1f}" for r in ready))
    if "c:cpu machine" in keys:
        named = [k for k in keys if k.startswith("c:cpu ") and k not in ("c:cpu machine", "c:cpu machine iowait")]
        other = []
        for a, b in pairs:
            cells = [_cell(k, loaded[a[2]], loaded[b[2]], max(b[0] - a[0], 1)) for k in ["c:cpu machine", *named]]
            other.append(None if None in cells else cells[0] - sum(cells[1:]))
        print(f"  {'cpu other (machine less the named) cores':<{label}}" + "".join(f"{'-' if c is None else f'{c:.2f}':>{width}}" for c in other))
    for key in keys:
        kind, text = key.split(":", 1)
        unit = " cores" if kind == "c" and ("cpu" in text or "CPU" in text) else {"c": "/s", "g": "", "s": " ms"}[kind]
        cells = [_cell(key, loaded[a[2]], loaded[b[2]], max(b[0] - a[0], 1)) for a, b in pairs]
        print(f"  {text + unit:<{label}}" + "".join(f"{'-' if c is None else f'{c:.2f}':>{width}}" for c in cells))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "cpu":
        json.dump(cpu(sys.argv[2:]), sys.stdout, sort_keys=True)
    elif len(sys.argv) == 2 and sys.argv[1] == "apiserver":
        json.dump(apiserver(sys.stdin.read()), sys.stdout, sort_keys=True)
    elif len(sys.argv) >= 5 and sys.argv[1] == "timeline":
        timeline(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
