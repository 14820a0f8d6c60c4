#!/usr/bin/env python3
"""The fleet's shard table (the Lease `<fleet>-shards-<S>`, annotation `pulumi.com/shard-table`) for
shell scripts (the demo, the load tests). The table records ranges of shards per holder:
{"r-0": [[first, last, epoch], ...], "": [...free...]}.

  shard_table.py holders NAMESPACE [FLEET]   one line per shard: `<shard> <holder>` (holder `-`: none)
  shard_table.py stamp                       reads table annotations line by line (a `kubectl get -w
                                             -o jsonpath` of the annotation) and prints, for every shard
                                             whose holder changed, `<unix time> <fleet>-shard-<k> <holder>`
                                             as the line arrives (the format of loadtest/lib.sh's watch)
"""
import json
import subprocess
import sys
import time


def entries(table):
    """shard -> (holder, epoch) of one decoded table."""
    out = {}
    for holder, ranges in table.items():
        for first, last, epoch in ranges:
            for k in range(first, last + 1):
                out[k] = (holder, epoch)
    return out


def holders(namespace, fleet="pko"):
    raw = subprocess.run(["kubectl", "-n", namespace, "get", "leases", "-l", f"pulumi.com/fleet={fleet},pulumi.com/lease=table", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    shards = {}
    for lease in json.loads(raw)["items"]:
        value = (lease["metadata"].get("annotations") or {}).get("pulumi.com/shard-table", "{}")
        shards.update(entries(json.loads(value)))
    for k in sorted(shards):
        print(k, shards[k][0] or "-")


def stamp(fleet="pko"):
    last = {}
    for line in sys.stdin:
        now = time.time()
        try:
            table = entries(json.loads(line))
        except ValueError:
            continue
        for k, (holder, _) in sorted(table.items()):
            if last.get(k) != holder:
                last[k] = holder
                print("%.3f %s-shard-%d %s" % (now, fleet, k, holder), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "holders":
        holders(*sys.argv[2:4])
    elif len(sys.argv) >= 2 and sys.argv[1] == "stamp":
        stamp(*sys.argv[2:3])
    else:
        sys.exit(__doc__)
