"""`vlctl serve`: the web page over a store, or over the stores `make demo` left behind.

    vlctl serve store/ --controlembed ce/ --tevi tevi/
    vlctl serve --demo [--demo-dir runs/demo]
    vlctl serve --demo --host 0.0.0.0 --token "$(openssl rand -hex 16)"
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from vlctl.config import add_config_args, config_from_args
from vlctl.fsops import VlctlError

DEMO_DIR = "runs/demo"  # where `make demo` writes
STATE_ARGS = ("store", "backend", "demo", "demo_dir", "controlembed", "tevi", "sae", "encoder", "data", "tuned", "reports")


def serve_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import in_path, text_arg
    from vlctl.serve.config import ServeConfig

    p.add_argument("store", nargs="?", default=None, type=in_path("store directory", "dir"),
                   help="store directory (vlctl embed / vlctl index); or --backend, or --demo")
    p.add_argument("--backend", default=None, type=text_arg("backend"), help="serve a Milvus collection instead of "
                   "a store directory: milvus:PATH.db, milvus:http(s)://HOST:PORT or milvus:HOST:PORT, then "
                   "#COLLECTION (filled by `vlctl index STORE --backend`; docs/deployment.md)")
    p.add_argument("--demo", action="store_true", help="serve what `make demo` left in --demo-dir: the shapes store "
                   "with ControlEmbed, MAD with TEVI, the scenes with the base and tree-tuned models, the reports")
    p.add_argument("--demo-dir", default=None, type=in_path("demo directory", "dir"),
                   help=f"the demo's output directory (default: {DEMO_DIR}; read only)")
    p.add_argument("--controlembed", default=None, type=in_path("ControlEmbed model directory", "dir"),
                   help="a ControlEmbed model fitted on the store's encoder: the Steer and Clusters tabs")
    p.add_argument("--tevi", default=None, type=in_path("TEVI directory", "dir"),
                   help="a TEVI model fitted on the store's encoder: the TEVI rerank in the Steer tab")
    p.add_argument("--sae", default=None, type=in_path("SAE directory", "dir"),
                   help="an SAE fitted on the store's encoder (vlctl fit sae), without TEVI: the Latents tab")
    p.add_argument("--encoder", default=None, type=text_arg("spec"),
                   help="encoder spec for text and image queries (default: the one the store records)")
    p.add_argument("--data", default=None, type=in_path("dataset directory", "dir"),
                   help="for a store of a generated set that moved: the set's directory (its images)")
    p.add_argument("--tuned", default=None, type=in_path("TinyCLIP model directory", "dir"),
                   help="a second TinyCLIP (e.g. tree-tuned) shown beside the store's encoder in Explain")
    p.add_argument("--reports", default=None, type=in_path("reports directory", "dir"),
                   help="a `vlctl reproduce` output directory (or a parent of several) for the Reports tab")
    add_config_args(p, ServeConfig)


def build_state(args: argparse.Namespace):
    """The ServeState the flags name (loads every model once)."""
    from vlctl.serve.demo import demo_state
    from vlctl.serve.state import state_for_store

    if [args.demo, args.store is not None, args.backend is not None].count(True) != 1:
        raise VlctlError("serve: give a STORE directory, --backend or --demo (one of them)")
    if args.demo_dir is not None and not args.demo:
        raise VlctlError("serve: --demo-dir goes with --demo")
    if args.demo:
        if any(getattr(args, f) is not None for f in ("controlembed", "tevi", "sae", "encoder", "data", "tuned", "reports")):
            raise VlctlError("serve --demo: the demo brings its own models; --controlembed, --tevi, --sae, --encoder, "
                             "--data, --tuned and --reports go with a STORE")
        demo_dir = args.demo_dir
        if demo_dir is None:  # the default is checked here, not by the parser: it only matters with --demo
            demo_dir = Path(DEMO_DIR)
            if not demo_dir.is_dir():
                raise VlctlError(f"--demo-dir: {DEMO_DIR}: demo directory not found (run `make demo` first, "
                                 "or name the directory it wrote)")
        return demo_state(demo_dir)
    return state_for_store(args.store, controlembed=args.controlembed, tevi=args.tevi, encoder=args.encoder,
                           data=args.data, tuned=args.tuned, reports=args.reports, sae=args.sae,
                           backend=args.backend)


def state_from_fields(fields: dict):
    """`build_state` from the state's flags alone (picklable: the heavy-work process calls it);
    quiet, since the server process has already said what it left out."""
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        return build_state(argparse.Namespace(**fields))


SWITCH_INTERVAL_S = 0.0005  # the server process's sys.setswitchinterval (Python's default: 0.005)


def _plain(args: argparse.Namespace) -> dict:
    """The state's flags as plain values (the parser's path strings do not pickle)."""
    return {f: str(v) if isinstance(v, str) else v for f, v in ((f, getattr(args, f)) for f in STATE_ARGS)}


def bind(host: str, port: int):
    """The listening socket of `host:port`, bound before any model is loaded: a port in use is one
    line and exit 2 at once, not a minute of loading and then uvicorn's error (its URL the other
    server's). Port 0 picks a free port; the socket then names it."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # uvicorn's own setting: a just-closed port rebinds
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        import errno

        if e.errno == errno.EADDRINUSE:
            raise VlctlError(f"--port {port}: {host}:{port} is already in use by another process; stop it, or pick "
                             "another --port (0 for any free one)") from None
        raise VlctlError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(args: argparse.Namespace) -> dict:
    import uvicorn

    from vlctl.serve.app import create_app
    from vlctl.serve.config import ServeConfig, check_bind

    config = config_from_args(ServeConfig, args)
    if not config.token and os.environ.get("VLCTL_SERVE_TOKEN"):
        config = dataclasses.replace(config, token=os.environ["VLCTL_SERVE_TOKEN"])
    check_bind(config)
    sock = bind(config.host, config.port)
    config = dataclasses.replace(config, port=sock.getsockname()[1])
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    state = build_state(args)
    print("[vlctl] serve: loading the models\u2026", file=sys.stderr)
    state.warm()
    heavy = None
    if config.heavy_process:
        import functools

        from vlctl.serve.heavy import HeavyWorker

        print("[vlctl] serve: starting the process for explain and clustering\u2026", file=sys.stderr)
        fields = _plain(args)
        if args.backend is not None:  # Milvus Lite's data is this process's: the workers reach it through its server
            fields["backend"] = next(iter(state.collections.values())).store.shared()
        heavy = HeavyWorker(functools.partial(state_from_fields, fields),
                            threads=config.heavy_threads, nice=config.heavy_nice)
        heavy.wait_ready()
    app = create_app(state, config, heavy)
    # A torch forward in this process (a text query's, without the heavy-work processes or when one
    # is lost) gives the interpreter lock back at every op and waits for it after each one while the
    # request threads run Python: at the default 5 ms switch interval a MiniLM forward took ~50 ms
    # under the load test, at 0.5 ms ~36 ms (text p99 135-175 -> 117-121 ms, benchmarks/serve_load.py).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{host}:{config.port}/" + ("?token=TOKEN" if config.token else "")
    print(f"[vlctl] serve: {url} (Ctrl-C stops)", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=5, limit_concurrency=256,
                                           h11_max_incomplete_event_size=64 * 1024))
    try:
        server.run(sockets=[sock])  # Ctrl-C and SIGTERM end it gracefully: the app's lifespan stops the workers
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it handled: the server has stopped, as asked
    finally:
        if heavy is not None:
            heavy.shutdown()
        sock.close()
    print("[vlctl] serve: stopped", file=sys.stderr)
    return {}
