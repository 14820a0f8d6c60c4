#!/usr/bin/env python3
"""The run's timeline from the objects themselves, per STEP seconds: Stacks created (the apply),
Stacks labelled with their shard (the time of the labeller's managedFields entry; a Stack made
with its label counts as labelled when created), Updates created (an operation queued), Stacks
Ready (the Ready condition's lastTransitionTime). Tells a stall of the apply from a stall of the
labeller or of the operators.

    kubectl -n NS get stacks -o json > stacks.json; kubectl -n NS get updates -o json > updates.json
    loadtest/timeline.py stacks.json updates.json T0 [STEP] > timeline.tsv

T0: the apply's start (Unix seconds). Writes a TSV (t_s, created, labelled, updates, ready) to stdout
and, to stderr, when the last Stack was created and the last made Ready (to the second, which the
load script's Ready poll is not), and the longest stretch without any Stack created, labelled,
queued or Ready while the apply was still going.
"""
import datetime
import json
import sys

LABELLER = "pulumi-kubernetes-operator/shard"


def ts(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def main():
    stacks = json.load(open(sys.argv[1]))["items"]
    updates = json.load(open(sys.argv[2]))["items"]
    t0 = float(sys.argv[3])
    step = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    series = {"created": [], "labelled": [], "updates": [], "ready": []}
    for s in stacks:
        meta = s["metadata"]
        created = ts(meta["creationTimestamp"])
        series["created"].append(created)
        labelled = [ts(m["time"]) for m in meta.get("managedFields", []) if m.get("manager") == LABELLER and m.get("time")]
        series["labelled"].append(min(labelled) if labelled else created)
        for c in (s.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                series["ready"].append(ts(c["lastTransitionTime"]))
    series["updates"] = [ts(u["metadata"]["creationTimestamp"]) for u in updates]
    end = max(max(v) for v in series.values() if v)
    bins = int((end - t0) // step) + 1
    counts = {k: [0] * bins for k in series}
    for k, times in series.items():
        for t in times:
            counts[k][max(0, int((t - t0) // step))] += 1
    print("t_s\tcreated\tlabelled\tupdates\tready")
    for i in range(bins):
        print(f"{i * step}\t" + "\t".join(str(counts[k][i]) for k in ("created", "labelled", "updates", "ready")))
    last_created = max(series["created"])
    quiet, run = (0, 0), 0
    for i in range(bins):
        if i * step > last_created - t0:
            break
        if all(counts[k][i] == 0 for k in ("created", "labelled", "updates", "ready")):
            run += 1
            if run > quiet[1]:
                quiet = (i - run + 1, run)
        else:
            run = 0
    if series["ready"]:
        # to the second, from the objects: the script's Ready poll (every 20 s at 10,000 Stacks) is coarser
        last_ready = max(series["ready"])
        print(f"timeline: last Stack created at t={last_created - t0:.0f} s, last Stack Ready at t={last_ready - t0:.0f} s "
              f"({last_ready - last_created:.0f} s after the last creation)", file=sys.stderr)
    print(f"timeline: {len(stacks)} Stacks, {len(updates)} Updates, {bins} steps of {step} s; longest stretch with nothing "
          f"created, labelled, queued or Ready during the apply: {quiet[1] * step} s from t={quiet[0] * step} s", file=sys.stderr)
    for k in ("created", "labelled", "updates", "ready"):
        longest, start, run = 0, 0, 0
        for i in range(bins):
            if i * step > last_created - t0:
                break
            run = run + 1 if counts[k][i] == 0 else 0
            if run > longest:
                longest, start = run, i - run + 1
        print(f"timeline: longest stretch without a Stack {k if k != 'updates' else 'queued (Update created)'} during the apply: "
              f"{longest * step} s from t={start * step} s", file=sys.stderr)


if __name__ == "__main__":
    main()
