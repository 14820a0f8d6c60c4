#!/usr/bin/env python3
"""SIGTERM handoffs of a chaos run, from the operators' own logs (`loadtest/handoff.py RUN_DIR`).

For each `signal received: shutting down` in a replica's log (`RUN_DIR/operator-*.log`): the time until the last
shard-table write of another replica that took shards, within 20 s, and how many shards those writes took. One line
per SIGTERM, then `median` over them. Independent of the kubectl Lease watch, whose initial list can arrive after a
fast handoff on a loaded bed."""
import datetime as dt
import glob
import re
import statistics
import sys


def stamp(line):
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{1,6})\d*Z", line)
    return dt.datetime.fromisoformat(m.group(1)) if m else None


def main(run_dir):
    logs = {p: open(p, errors="replace").read().splitlines() for p in sorted(glob.glob(run_dir + "/operator-*.log"))}
    writes = []  # (time, log, shards taken)
    for path, lines in logs.items():
        for line in lines:
            m = re.search(r"shard table written taken=(\d+)", line)
            if m and int(m.group(1)) > 0 and stamp(line):
                writes.append((stamp(line), path, int(m.group(1))))
    handoffs = []
    for victim, lines in logs.items():
        for line in lines:
            if "signal received: shutting down" not in line or not stamp(line):
                continue
            t0 = stamp(line)
            after = [(t, n) for t, p, n in writes if p != victim and t0 < t and (t - t0).total_seconds() <= 20]
            if not after:
                print(f"{victim.rsplit('/', 1)[-1]} {t0.time()} handoff=? (no shard taken within 20 s)")
                continue
            took = (max(t for t, _ in after) - t0).total_seconds()
            handoffs.append(took)
            print(f"{victim.rsplit('/', 1)[-1]} {t0.time()} handoff={took:.2f}s taken={sum(n for _, n in after)}")
    if handoffs:
        print(f"median {statistics.median(handoffs):.2f}s min {min(handoffs):.2f}s max {max(handoffs):.2f}s "
              f"n={len(handoffs)}")


if __name__ == "__main__":
    main(sys.argv[1])
