#!/usr/bin/env python3
"""Remove the finalizers of every Stack and Update in a namespace, straight through the API.

Usage: unfinalize.py NAMESPACE [THREADS]

Load-test cleanup only: with no operator running, the finalizers it would have removed keep the
namespace from being deleted. One `kubectl patch` per object costs a process start each (~4 objects/s
on 2 cores); this keeps one TLS connection per thread and sends JSON merge patches
(`{"metadata":{"finalizers":null}}`) over it. The cluster, CA and client certificate come from the
current kubeconfig context (`kubectl config view --minify`). Prints progress every 5 s and the total.
Standard library only.
"""
import http.client
import json
import queue
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

# (plural, group/version) of the kinds whose finalizers only the operator removes
KINDS = [("stacks", "pulumi.com/v1"), ("updates", "auto.pulumi.com/v1alpha1")]


def kube_config():
    out = subprocess.run(["kubectl", "config", "view", "--minify", "--raw", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    cfg = json.loads(out)
    cluster = cfg["clusters"][0]["cluster"]
    user = cfg["users"][0]["user"]
    for key in ("certificate-authority", "client-certificate", "client-key"):
        if key not in (cluster if key.startswith("certificate") else user):
            sys.exit(f"unfinalize: the kubeconfig's current context has no `{key}` file")
    url = urllib.parse.urlsplit(cluster["server"])
    ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
    ctx.load_cert_chain(user["client-certificate"], user["client-key"])
    return url.hostname, url.port or 443, ctx


def connect(host, port, ctx):
    return http.client.HTTPSConnection(host, port, context=ctx, timeout=60)


def names(conn, ns, plural, gv):
    """The names of the objects of one kind in ns that still have finalizers (paged, 500 a page)."""
    found, cont = [], ""
    while True:
        path = f"/apis/{gv}/namespaces/{ns}/{plural}?limit=500"
        if cont:
            path += "&continue=" + urllib.parse.quote(cont)
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status == 404:
            return found
        if resp.status != 200:
            sys.exit(f"unfinalize: listing {plural}: HTTP {resp.status}: {body[:200]!r}")
        doc = json.loads(body)
        found += [o["metadata"]["name"] for o in doc.get("items", []) if o["metadata"].get("finalizers")]
        cont = doc.get("metadata", {}).get("continue", "")
        if not cont:
            return found


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: unfinalize.py NAMESPACE [THREADS]")
    ns = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    host, port, ctx = kube_config()
    conn = connect(host, port, ctx)
    work = queue.Queue()
    for plural, gv in KINDS:
        for name in names(conn, ns, plural, gv):
            work.put(f"/apis/{gv}/namespaces/{ns}/{plural}/{name}")
    total = work.qsize()
    if total == 0:
        return
    print(f"removing the finalizers of {total} objects in {ns} ({threads} connections)…", flush=True)
    done, failed = [0], []
    lock = threading.Lock()
    patch = json.dumps({"metadata": {"finalizers": None}})

    def worker():
        c = connect(host, port, ctx)
        while True:
            try:
                path = work.get_nowait()
            except queue.Empty:
                return
            for attempt in range(3):
                try:
                    c.request("PATCH", path, body=patch,
                              headers={"Content-Type": "application/merge-patch+json"})
                    resp = c.getresponse()
                    resp.read()
                    ok = resp.status in (200, 404)
                    break
                except (OSError, http.client.HTTPException):
                    c.close()
                    c = connect(host, port, ctx)
                    ok = False
            with lock:
                done[0] += 1
                if not ok:
                    failed.append(path)

    t0 = last = time.monotonic()
    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    while any(t.is_alive() for t in pool):
        pool[0].join(timeout=0.2)
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            print(f"  {done[0]}/{total} in {last - t0:.0f} s", flush=True)
    print(f"finalizers removed from {total - len(failed)} objects in {time.monotonic() - t0:.1f} s", flush=True)
    if failed:
        sys.exit(f"unfinalize: {len(failed)} patches failed, first: {failed[0]}")


if __name__ == "__main__":
    main()
