"""Load test of `vlctl serve --demo`: 20 concurrent clients, 2,000 mixed requests, against 127.0.0.1 only.

    python benchmarks/serve_load.py --demo-dir runs/demo --json benchmarks/serve_load.json

The server is `vlctl serve --demo` in its own process (bound to 127.0.0.1, a free port; --threads
torch threads), started and stopped here; the clients are threads with one httpx client each.
The mix (weights in MIX): text search, search by a stored image, ControlEmbed steering by one
attribute and by a blend, TEVI rerank (when the demo has MAD's TEVI), a clustering job (submit,
then poll until done; the latency is submit-to-result), explain (HilaCAM / Anchor / DiRe of the
scene's caption and a negative, base and tree-tuned models) and thumbnails. Queries are drawn
with a fixed seed from the demo's own vocabulary, so every request is one the page can send.

Reported per endpoint: count, p50 / p99 / max latency in ms (wall-clock from request to complete
response, queueing in the server included), errors (status >= 400 or no response) and 5xx.
Also measured alone (one client, one request at a time: the service time without queueing):
search and steer (100 of each kind), explain of one scene with 2 texts and two models (median of 5),
and clustering the shapes *train* store (10,000 images) by one attribute (median of 3, after
one warm-up run).

On a shared machine the numbers include the other processes' load: say so beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MIX = {"search_text": 30, "search_image": 15, "steer_attribute": 20, "steer_blend": 10, "steer_tevi": 8,
       "cluster": 4, "explain": 3, "image": 10}
WORDS = {"color": ["red", "green", "blue", "yellow", "purple", "cyan", "gray", "brown", "pink"],
         "shape": ["circle", "cube", "sphere", "cylinder", "star", "teapot", "cone", "torus"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics (numpy's default)."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def start_server(demo_dir: str, port: int, threads: int, heavy_threads: int, log,
                 extra: tuple[str, ...] = ()) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(max(threads, heavy_threads))}
    cmd = [sys.executable, "-m", "vlctl", "serve", "--demo", "--demo-dir", demo_dir, "--host", "127.0.0.1",
           "--port", str(port), "--threads", str(threads), "--heavy-threads", str(heavy_threads), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)


def wait_ready(base: str, proc: subprocess.Popen, log, timeout: float = 600) -> dict:
    import httpx

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"serve_load: the server exited: {log.read()[-2000:]}")
        try:
            return httpx.get(base + "/api/info", timeout=2).json()
        except httpx.HTTPError:
            time.sleep(0.5)
    raise SystemExit("serve_load: the server did not start")


def mad_captions(base: str, info: dict, n: int = 8) -> list[str]:
    """Captions of MAD rows (the labels of a search's hits): TEVI's text queries."""
    import httpx

    if not any(c["name"] == "mad" for c in info["collections"]):
        return []
    r = httpx.post(base + "/api/search", json={"collection": "mad", "image_id": 0, "k": n}, timeout=60).json()
    return [h["label"] for h in r["hits"] if h.get("label")]


def make_requests(info: dict, n: int, seed: int, captions: list[str]) -> list[tuple[str, str, str, dict | None]]:
    """(endpoint label, method, path, json body) x n, drawn with `seed`; `captions`: TEVI's queries."""
    rng = random.Random(seed)
    cols = {c["name"]: c for c in info["collections"]}
    shapes, mad = cols.get("shapes"), cols.get("mad")
    explain = info.get("explain")
    mix = {k: w for k, w in MIX.items() if w > 0
           if not (k.startswith(("steer_attribute", "steer_blend", "cluster")) and shapes is None)
           and not (k == "steer_tevi" and (mad is None or not mad["tevi"] or not captions)) and not (k == "explain" and explain is None)}
    kinds = rng.choices(list(mix), weights=list(mix.values()), k=n)
    out = []
    for kind in kinds:
        if kind == "search_text":
            c = shapes or next(iter(cols.values()))
            text = f"a {rng.choice(WORDS['color'])} {rng.choice(WORDS['shape'])}"
            out.append((kind, "POST", "/api/search", {"collection": c["name"], "text": text, "k": 24}))
        elif kind == "search_image":
            c = rng.choice(list(cols.values()))
            out.append((kind, "POST", "/api/search", {"collection": c["name"], "image_id": rng.randrange(c["size"]),
                                                      "k": 24}))
        elif kind == "steer_attribute":
            out.append((kind, "POST", "/api/steer", {"collection": "shapes", "image_id": rng.randrange(shapes["size"]),
                                                     "attribute": rng.choice(shapes["attributes"]), "k": 24}))
        elif kind == "steer_blend":
            a, b = rng.sample(shapes["attributes"], 2)
            out.append((kind, "POST", "/api/steer", {"collection": "shapes", "image_id": rng.randrange(shapes["size"]),
                                                     "attribute": a, "attribute_b": b, "alpha": rng.choice([0.25, 0.5,
                                                                                                            0.75]),
                                                     "k": 24}))
        elif kind == "steer_tevi":
            text = rng.choice(captions)
            out.append((kind, "POST", "/api/steer", {"collection": "mad", "text": text, "tevi": True, "k": 24}))
        elif kind == "cluster":
            out.append((kind, "POST", "/api/cluster", {"collection": "shapes",
                                                       "attribute": rng.choice(shapes["attributes"]),
                                                       "seed": rng.randrange(3)}))
        elif kind == "explain":
            ex = rng.choice(explain["examples"])
            out.append((kind, "POST", "/api/explain", {"image_id": ex["id"], "positive": ex["caption"],
                                                       "negative": _negative(ex["caption"], rng)}))
        else:
            c = rng.choice(list(cols.values()))
            out.append((kind, "GET", f"/api/images/{c['name']}/{rng.randrange(c['size'])}?size=128", None))
    return out


def _negative(caption: str, rng: random.Random) -> str:
    """The caption with one colour word swapped (a one-word hard negative in the scenes' vocabulary)."""
    colours = ["red", "green", "blue", "yellow", "purple"]
    words = caption.split()
    at = [i for i, w in enumerate(words) if w in colours]
    if not at:
        return caption.replace("a ", "a small ", 1)
    i = rng.choice(at)
    words[i] = rng.choice([c for c in colours if c != words[i]])
    return " ".join(words)


class Http:
    """One keep-alive HTTP/1.1 connection (`http.client`): a closed-loop client. Far cheaper per
    request than httpx, so the load generator's own CPU takes little from the server's two cores."""

    def __init__(self, base: str, timeout: float = 120):
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(base)
        self._new = lambda: http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        self.conn = self._new()

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        import http.client

        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (0, 1):  # a kept-alive connection the server closed while idle: reconnect once
            try:
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()
                self.conn = self._new()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` and its live children (Linux /proc; None elsewhere)."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        pids = [pid]
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == pid:
                    pids.append(int(d))
        total = 0.0
        for p in pids:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        return total
    except (OSError, ValueError, IndexError):
        return None


def run_load(base: str, requests: list, clients: int, server_pid: int | None = None) -> dict:
    results: list[tuple[str, float, int, float]] = []  # kind, latency (s), status, start (s after t0)
    lock = threading.Lock()
    queue = list(reversed(requests))

    def client():
        http = Http(base)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    kind, method, path, body = queue.pop()
                t0 = time.perf_counter()
                try:
                    status, data = http.request(method, path, body)
                    if kind == "cluster" and status == 202:
                        job = json.loads(data)
                        while job["status"] in ("queued", "running"):
                            time.sleep(0.02)
                            job = json.loads(http.request("GET", f"/api/jobs/{job['id']}")[1])
                        status = 200 if job["status"] == "done" else 400
                except (OSError, ValueError):
                    status = -1
                with lock:
                    results.append((kind, time.perf_counter() - t0, status, t0 - start))
        finally:
            http.close()

    cpu0, server0 = time.process_time(), _cpu_seconds(server_pid) if server_pid else None
    t0 = start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    server1 = _cpu_seconds(server_pid) if server_pid else None
    per: dict[str, dict] = {}
    for kind in sorted({r[0] for r in results}):
        lat = [r[1] * 1000 for r in results if r[0] == kind]
        st = [r[2] for r in results if r[0] == kind]
        per[kind] = {"count": len(lat), "p50_ms": round(percentile(lat, 50), 1), "p99_ms": round(percentile(lat, 99), 1),
                     "max_ms": round(max(lat), 1), "errors": sum(c >= 400 or c < 0 for c in st),
                     "5xx": sum(c >= 500 for c in st)}
    cpu = {"load_generator_ms_per_request": round(client_cpu / len(results) * 1000, 2)}
    if server0 is not None and server1 is not None:
        cpu["server_ms_per_request"] = round((server1 - server0) / len(results) * 1000, 2)
    return {"requests": len(results), "clients": clients, "wall_s": round(wall, 2),
            "requests_per_s": round(len(results) / wall, 1), "errors": sum(v["errors"] for v in per.values()),
            "5xx": sum(v["5xx"] for v in per.values()), "cpu": cpu, "endpoints": per,
            "_requests": sorted(results, key=lambda r: r[3])}


def write_requests(path: Path, requests: list) -> None:
    """Every request of the load run, in start order: what each percentile is recomputed from."""
    lines = ["kind,start_s,latency_ms,status"] + [f"{k},{t:.4f},{s * 1000:.2f},{c}" for k, s, c, t in requests]
    path.write_text("\n".join(lines) + "\n")


def one_client(base: str, requests: list, kinds: tuple[str, ...] = ("search_text", "search_image", "steer_attribute",
                                                                     "steer_blend", "steer_tevi"), n: int = 100) -> dict:
    """The same kinds of request sent one at a time (no queueing): the service time per request."""
    out = {}
    http = Http(base)
    try:
        for kind in kinds:
            todo = [r for r in requests if r[0] == kind][:n]
            lat = []
            for _, method, path, body in todo:
                t0 = time.perf_counter()
                status, data = http.request(method, path, body)
                lat.append((time.perf_counter() - t0) * 1000)
                if status != 200:
                    raise SystemExit(f"serve_load: {path} answered {status}: {data[:300]!r}")
            if lat:
                out[kind] = {"count": len(lat), "p50_ms": round(percentile(lat, 50), 1),
                             "p99_ms": round(percentile(lat, 99), 1)}
    finally:
        http.close()
    return out


def solo_explain(base: str, info: dict, n: int = 5) -> dict:
    import httpx

    ex = info["explain"]["examples"][0]
    body = {"image_id": ex["id"], "positive": ex["caption"], "negative": _negative(ex["caption"], random.Random(0)),
            "tree": False}
    wall, server = [], []
    with httpx.Client(base_url=base, timeout=120) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            r = http.post("/api/explain", json=body)
            wall.append(time.perf_counter() - t0)
            server.append(r.json()["seconds"])
    return {"texts": 2, "models": info["explain"]["models"], "median_s": round(statistics.median(wall), 3),
            "server_median_s": round(statistics.median(server), 3), "runs": n}


def cluster_10k(demo_dir: str, threads: int) -> dict:
    """`work.cluster` on the shapes train store (10,000 images) by each attribute, timed in-process."""
    import torch

    from vlctl.data.mad import mad_dataset_id
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.recipes.controlembed import shapes as recipe
    from vlctl.serve import work
    from vlctl.serve.demo import _store_of, find_stage
    from vlctl.serve.state import Collection

    torch.set_num_threads(threads)
    stages = Path(demo_dir) / "stages"
    keys = recipe.stage_keys(recipe.load_preset(True))
    data = find_stage(stages, "data", keys["data"], exact=True) / "train"
    store = _store_of(find_stage(stages, "embed", keys["train"]), mad_dataset_id(data))
    model = ControlEmbed.load(find_stage(stages, "fit", keys["train"]) / "ours", encoder_id=store.encoder_id)
    coll = Collection("shapes-train", store, controlembed=model)
    coll.embeddings()
    work.cluster(coll, model.categories_[0], None, 0, 12)  # warm-up: imports, the affine maps, page cache
    out = {}
    for a in model.categories_:
        times = []
        for seed in range(3):
            t0 = time.perf_counter()
            work.cluster(coll, a, None, seed, 12)
            times.append(time.perf_counter() - t0)
        out[a] = round(statistics.median(times), 3)
    return {"n_images": len(store), "median_s_by_attribute": out, "max_s": max(out.values())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo-dir", default="runs/demo")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server process (search, steer: "
                   "tiny forward passes, which more threads only slow down)")
    p.add_argument("--heavy-threads", type=int, default=1, help="torch threads of its explain / clustering process")
    p.add_argument("--server-arg", action="append", default=[], help="more `vlctl serve` flags (repeatable), "
                   "e.g. --server-arg=--no-heavy-process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="benchmarks/serve_load.json")
    p.add_argument("--passes", type=int, default=1, help="run the load this many times against the same server "
                   "(seeds seed, seed+1, ...): later passes find its caches warm; the first is the reported one")
    p.add_argument("--mix", default="", help="override weights, e.g. explain=0,search_text=40")
    args = p.parse_args()
    for item in filter(None, args.mix.split(",")):
        name, _, weight = item.partition("=")
        if name not in MIX:
            raise SystemExit(f"--mix: unknown request kind {name!r}; known: {sorted(MIX)}")
        MIX[name] = float(weight)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:  # the server's stderr (a pipe could fill and block it)
        proc = start_server(args.demo_dir, port, args.threads, args.heavy_threads, log, tuple(args.server_arg))
        try:
            t0 = time.perf_counter()
            info = wait_ready(base, proc, log)
            startup = time.perf_counter() - t0
            captions = mad_captions(base, info)
            requests = make_requests(info, args.requests, args.seed, captions)
            load = run_load(base, requests, args.clients, proc.pid)
            later = []  # the same load again on the now warm server, other requests drawn
            for i in range(1, args.passes):
                again = run_load(base, make_requests(info, args.requests, args.seed + i, captions), args.clients,
                                 proc.pid)
                again.pop("_requests")
                later.append(again)
            alone = one_client(base, requests)
            explain = solo_explain(base, info) if info.get("explain") else None
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    result = {"demo_dir": args.demo_dir, "cpus": os.cpu_count(), "server_threads": args.threads,
              "heavy_threads": args.heavy_threads, "server_args": args.server_arg, "mix": MIX,
              "startup_s": round(startup, 1), "load": load, **({"later_passes": later} if later else {}),
              "one_client": alone, "explain_alone": explain,
              "cluster_10k": cluster_10k(args.demo_dir, args.heavy_threads),
              "note": "2 CPU cores shared with other processes while measured: latencies include their load"}
    requests_csv = Path(args.json).with_suffix(".requests.csv")
    write_requests(requests_csv, load.pop("_requests"))
    result["requests_csv"] = str(requests_csv)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 1 if load["5xx"] else 0


if __name__ == "__main__":
    sys.exit(main())
