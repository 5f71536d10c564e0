"""The FastAPI application of `vlctl serve`: `create_app(state, config)`.

    GET  /                       the page (static/index.html: six tabs, keyboard usable)
    GET  /api/info               what is served: collections, attributes, explain models, reports, limits
    POST /api/search             text or stored-image query -> thumbnails with scores
    POST /api/search/upload      an uploaded image as the query (multipart: file, collection, k)
    POST /api/steer              ControlEmbed attribute / alpha blend, or TEVI rerank with before/after
    POST /api/cluster            starts a background clustering job -> {id, status}
    GET  /api/jobs/{id}          the job, with its result when done (the page polls it)
    POST /api/explain            HilaCAM / Anchor / DiRe heatmaps and caption-tree scores, per model
    POST /api/explain/upload     the same for an uploaded image (multipart: file, positive, negative, tree)
    GET  /api/images/{source}/{row}?size=   a row's image as PNG (by id; never a path)
    GET  /api/sample/{source}?n=&seed=       rows to pick a query image from (ids, and each with its file name)
    POST /api/latents            starts describing the served SAE's latents (a background job, once)
    GET  /api/latents/{collection}?q=&offset=&limit=   its live latents, or those named like q
    GET  /api/latents/{collection}/{latent}           one latent with its top images
    GET  /reports/{id}/{name}    a report's html and the files it links (names listed at start)
    GET  /docs, /openapi.json    the API, listed from the OpenAPI schema by a page of ours (no CDN: it
                                 renders offline), and the schema
    GET  /favicon.ico            the page's icon (static/favicon.svg)

Every request body is a pydantic model (`vlctl.serve.schemas`); every error is JSON
`{"error": "one message"}` (422 bad request fields, 400 a request the data refuses, 404 unknown id,
413 too large, 415 not an image, 401 no token, 429 too many jobs, 503 the heavy-work process was
lost, 504 past the timeout).

Safe defaults (`ServeConfig`): the CLI binds 127.0.0.1; with a token every request needs it
(`Authorization: Bearer T`, or the cookie set by opening `/?token=T`); request bodies over
`max_upload_bytes` are refused while they arrive; uploads are typed by their bytes and refused over
`max_pixels`; every computation runs on a bounded worker pool and answers 504 after
`request_timeout` seconds.

Latency: search and steer take a few ms of CPU, so their answers skip FastAPI's response
validation (the dicts `work` builds are the response models' fields, checked by the tests) and
are encoded once by `JSONResponse`. Explain and clustering run in a `HeavyWorker` process when one
is given (the CLI starts one), so they never hold the GIL of the process answering the searches;
without one they run on a thread of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from vlctl.fsops import VlctlError
from vlctl.serve import imaging, latents, schemas, work
from vlctl.serve.config import ServeConfig
from vlctl.serve.heavy import HeavyWorker, WorkerLost
from vlctl.serve.jobs import Jobs, TooManyJobs
from vlctl.serve.state import NotFound, ServeState, file_fields
from vlctl.serve.texts import TextBatches

STATIC = Path(__file__).resolve().parent / "static"
COOKIE = "vlctl_token"
log = logging.getLogger("vlctl.serve")


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    errs = exc.errors()
    if not errs:
        return "invalid request"
    e = errs[0]
    loc = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body",)) or "request"
    msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{loc}: {msg}{more}"


class _Guard:
    """Pure ASGI middleware: the token, then the body size limit (Content-Length, or counted while
    the body arrives), before the app sees the request."""

    def __init__(self, app, config: ServeConfig):
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        set_cookie = False
        if self.config.token:
            ok, set_cookie = self._authorised(scope, headers)
            if not ok:
                return await _error(401, "this server needs its token: Authorization: Bearer TOKEN, or open "
                                    "/?token=TOKEN once")(scope, receive, send)
        limit = self.config.max_upload_bytes
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await _error(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")(
                scope, receive, send)
        body, more = bytearray(), True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > limit:
                return await _error(413, f"request body exceeds the limit of {limit} bytes")(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        async def send_with_cookie(message):
            if set_cookie and message["type"] == "http.response.start":
                cookie = f"{COOKIE}={self.config.token}; Path=/; HttpOnly; SameSite=Strict"
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie.encode())]}
            await send(message)

        return await self.app(scope, replay, send_with_cookie)

    def _authorised(self, scope, headers: dict) -> tuple[bool, bool]:
        token = self.config.token.encode()

        def same(value: str) -> bool:
            return hmac.compare_digest(value.encode("utf-8", "replace"), token)

        auth = headers.get("authorization", "")
        if auth.startswith("Bearer ") and same(auth[7:]):
            return True, False
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and same(value):
                return True, False
        from urllib.parse import parse_qs

        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if any(same(v) for v in query.get("token", [])):
            return True, True
        return False, False


def create_app(state: ServeState, config: ServeConfig | None = None, heavy: HeavyWorker | None = None) -> FastAPI:
    """The application over `state` (loaded once, shared by every request); `heavy`: the process
    that computes explain and clustering over its own copy of the state (None: a thread here)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("vlctl")  # not `from vlctl import`: the package is the layer above this one
    except PackageNotFoundError:
        __version__ = "unknown"
    config = config or ServeConfig()
    for coll in state.collections.values():
        coll.text_queries.size = config.text_cache
    pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="vlctl-serve")
    # Explain takes ~1 s of both cores and holds the explain lock: on its own thread, so that
    # explain requests wait for each other, not in front of the searches.
    explain_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlctl-explain")
    jobs = Jobs(workers=config.job_workers)
    texts = TextBatches(heavy)  # uncached text queries of concurrent requests: one forward for all

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        jobs.shutdown()
        texts.shutdown()
        for p in (pool, explain_pool):
            p.shutdown(wait=False, cancel_futures=True)
        if heavy is not None:
            heavy.shutdown()

    # FastAPI's /docs loads Swagger UI from a CDN (blank offline), and no package here ships it: our own page.
    app = FastAPI(title="vlctl serve", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan,
                  description="Search, steer, cluster and explain an embeddings store, and list its SAE's latents. Errors are "
                  "{\"error\": message}; images are served by row id.")
    app.state.vlctl = state
    app.state.jobs = jobs
    errors = {code: {"model": schemas.Error} for code in (400, 404, 413, 415, 422, 429, 503, 504)}

    async def run(fn, *args, executor: ThreadPoolExecutor = pool):
        loop = asyncio.get_running_loop()
        return await _timed(loop.run_in_executor(executor, functools.partial(fn, *args)))

    async def _timed(fut):
        try:
            return await asyncio.wait_for(fut, config.request_timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the request took longer than {config.request_timeout:g} s and was abandoned") from None

    async def run_explain(row, pixels, positive, negative, tree):
        if state.explain is None:
            raise NotFound("no explain set is served (it needs an encoder with a ViT image tower)")
        if heavy is not None:
            return await _timed(asyncio.wrap_future(heavy.submit("explain", row, pixels, positive, negative, tree)))
        return await run(work.explain, state.explain, row, positive, negative, tree, pixels, executor=explain_pool)

    # -- errors: one JSON message each ------------------------------------------------------
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _error(422, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(imaging.UploadError)
    async def _upload(request: Request, exc: imaging.UploadError):
        return _error(exc.status, str(exc))

    @app.exception_handler(TooManyJobs)
    async def _busy(request: Request, exc: TooManyJobs):
        return _error(429, str(exc), {"Retry-After": "1"})

    @app.exception_handler(VlctlError)
    async def _refused(request: Request, exc: VlctlError):
        return _error(400, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    @app.exception_handler(NotFound)
    async def _missing(request: Request, exc: NotFound):
        return _error(404, str(exc.args[0]) if exc.args else "not found")

    @app.exception_handler(WorkerLost)
    async def _lost(request: Request, exc: WorkerLost):
        return _error(503, str(exc), {"Retry-After": "5"})

    @app.exception_handler(TimeoutError)
    async def _slow(request: Request, exc: TimeoutError):
        return _error(504, str(exc))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        log.exception("vlctl serve: %s %s", request.method, request.url.path)
        return _error(500, f"internal error ({type(exc).__name__}); the server log has the traceback")

    # -- the page ---------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    async def index():
        return FileResponse(STATIC / "index.html", media_type="text/html",
                            headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return FileResponse(STATIC / "docs.html", media_type="text/html", headers={"X-Content-Type-Options": "nosniff"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml",
                            headers={"Cache-Control": "max-age=86400"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # -- API --------------------------------------------------------------------------------
    @app.get("/api/info", response_model=schemas.Info)
    async def info():
        cols = [schemas.CollectionInfo(
            name=c.name, size=len(c), encoder_id=c.store.encoder_id, description=c.description,
            thumbnails=c.pixels is not None, text_queries=c.encoder is not None, attributes=c.attributes,
            subclasses={a: c.subclasses(a) for a in c.attributes},
            free_text_attributes=c.free_text_attributes, tevi=c.tevi is not None,
            tevi_note=c.tevi.fusion_note() if c.tevi is not None else "", sae=c.sae is not None)
            for c in state.collections.values()]
        ex = None
        if state.explain is not None:
            es = state.explain
            examples = [{"id": i, "caption": es.caption(i), **file_fields(es.files, i)} for i in range(min(es.count, 24))]
            ex = schemas.ExplainInfo(name=es.name, size=es.count, models=list(es.models), trees=es.trees is not None,
                                     examples=examples)
        reports = [schemas.ReportInfo(id=r.id, title=r.title, url=f"/reports/{r.id}/report.html",
                                      figures=[n for n in r.files if n.lower().endswith(".png")])
                   for r in state.reports.values()]
        limits = {"max_k": schemas.MAX_K, "max_candidates": schemas.MAX_CANDIDATES, "max_text": schemas.MAX_TEXT,
                  "max_upload_bytes": config.max_upload_bytes, "max_pixels": config.max_pixels,
                  "request_timeout": config.request_timeout}
        return schemas.Info(title=state.title, collections=cols, explain=ex, reports=reports, limits=limits)

    @app.post("/api/search", response_model=schemas.SearchResponse, responses=errors)
    async def search(req: schemas.SearchRequest):
        coll = state.collection(req.collection)
        if req.text is not None:
            await _timed(texts.cache(coll, req.text))
        return JSONResponse(await run(work.search, coll, req.text, req.image_id, req.k))

    @app.post("/api/search/upload", response_model=schemas.SearchResponse, responses=errors)
    async def search_upload(file: Annotated[UploadFile, File(description="an image: PNG, JPEG, GIF, BMP, WEBP or TIFF")],
                            collection: Annotated[schemas.Name, Form()],
                            k: Annotated[int, Form(ge=1, le=schemas.MAX_K)] = 24):
        coll = state.collection(collection)
        data = await file.read()
        rgb = await run(imaging.decode_upload, data, config.max_pixels)
        return JSONResponse(await run(work.search, coll, None, None, k, rgb))

    @app.post("/api/steer", response_model=schemas.SteerResponse, responses=errors)
    async def steer(req: schemas.SteerRequest):
        coll = state.collection(req.collection)
        if req.text is not None:
            await _timed(texts.cache(coll, req.text))
        return JSONResponse(await run(work.steer, coll, req))

    @app.post("/api/cluster", response_model=schemas.Job, status_code=202, responses=errors)
    async def cluster(req: schemas.ClusterRequest):
        coll = state.collection(req.collection)
        coll.affine(req.attribute)  # a bad attribute is refused now, not as a failed job
        key = (req.collection, req.attribute, req.k, req.seed, req.per_cluster)
        cached = coll.clusters.get(key)

        def job():
            if cached:
                result = cached
            elif heavy is not None:  # this job thread waits; the process computes
                result = heavy.submit("cluster", req.collection, req.attribute, req.k, req.seed,
                                      req.per_cluster).result()
            else:
                result = work.cluster(coll, req.attribute, req.k, req.seed, req.per_cluster)
            coll.clusters.put(key, result)
            return result

        return _job_view(jobs.submit(job, key=key))

    @app.get("/api/jobs/{job_id}", response_model=schemas.Job, responses=errors)
    async def job(job_id: Annotated[str, PathParam(pattern=r"^[0-9a-f]{16}$")]):
        return _job_view(jobs.get(job_id))

    @app.post("/api/explain", response_model=schemas.ExplainResponse, responses=errors)
    async def explain(req: schemas.ExplainRequest):
        if state.explain is not None:
            state.explain.check_row(req.image_id)
        return await run_explain(req.image_id, None, req.positive, req.negative, req.tree)

    @app.post("/api/explain/upload", response_model=schemas.ExplainResponse, responses=errors)
    async def explain_upload(file: Annotated[UploadFile, File(description="an image: PNG, JPEG, GIF, BMP, WEBP or TIFF")],
                             positive: Annotated[str, Form(max_length=schemas.MAX_TEXT)],
                             negative: Annotated[str | None, Form(max_length=schemas.MAX_TEXT)] = None,
                             tree: Annotated[bool, Form()] = True):
        try:  # the form's texts by the same rules as ExplainRequest's (Form() alone skips their pattern)
            form = schemas.ExplainUploadForm(positive=positive, negative=negative, tree=tree)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None
        if state.explain is None:
            raise NotFound("no explain set is served (it needs an encoder with a ViT image tower)")
        rgb = await run(imaging.decode_upload, await file.read(), config.max_pixels)
        return await run_explain(None, rgb, form.positive, form.negative, form.tree)

    @app.get("/api/images/{source}/{row}", responses={200: {"content": {"image/png": {}}}, **errors},
             response_class=Response)
    async def image(source: Annotated[schemas.Name, PathParam()], row: Annotated[int, PathParam(ge=0, le=2**40)],
                    size: Annotated[int, Query(ge=16, le=512)] = 128):
        src = state.image_sources.get(source)
        if src is None:
            raise NotFound(f"no image source {source!r}; served: {', '.join(sorted(state.image_sources))}")
        data = await run(_thumbnail, src, row, size)
        return Response(data, media_type="image/png",
                        headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})

    @app.get("/api/sample/{source}", responses=errors)
    async def sample(source: Annotated[schemas.Name, PathParam()], n: Annotated[int, Query(ge=1, le=100)] = 12,
                     seed: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0) -> dict[str, list]:
        src = state.image_sources.get(source)
        if src is None:
            raise NotFound(f"no image source {source!r}; served: {', '.join(sorted(state.image_sources))}")
        count = src.count if hasattr(src, "count") else len(src)
        ids = sorted(random.Random(seed).sample(range(count), min(n, count)))
        label = src.label if hasattr(src, "label") else src.caption
        return {"ids": ids, "items": [{"id": i, "label": label(i), **file_fields(src.files, i)} for i in ids]}

    @app.post("/api/latents", response_model=schemas.Job, status_code=202, responses=errors)
    async def latents_job(req: schemas.LatentsRequest):
        coll = state.collection(req.collection)
        if coll.sae is None:
            latents.summary(coll)  # refused now with its message, not as a failed job
        # On a job thread of this process: the table must live here, where the listing reads it.
        return _job_view(jobs.submit(functools.partial(latents.summary, coll), key=("latents", req.collection)))

    @app.get("/api/latents/{collection}", response_model=schemas.LatentList, responses=errors)
    async def latents_list(collection: Annotated[schemas.Name, PathParam()],
                           q: Annotated[str | None, Query(max_length=schemas.MAX_TEXT)] = None,
                           offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
                           limit: Annotated[int, Query(ge=1, le=schemas.MAX_K)] = 50):
        return await run(latents.listing, state.collection(collection), q, offset, limit)

    @app.get("/api/latents/{collection}/{latent}", response_model=schemas.LatentDetail, responses=errors)
    async def latent_detail(collection: Annotated[schemas.Name, PathParam()],
                            latent: Annotated[int, PathParam(ge=0, le=2**31 - 1)]):
        return await run(latents.detail, state.collection(collection), latent)

    @app.get("/reports/{report}/{name:path}", include_in_schema=False)
    async def report_file(report: str, name: str):
        rep = state.reports.get(report)
        if rep is None:
            raise NotFound(f"no report {report!r}")
        file = rep.html if name == "report.html" else rep.files.get(name)
        if file is None:
            raise NotFound(f"report {report!r} has no file {name[:100]!r}")
        return FileResponse(file, headers={"X-Content-Type-Options": "nosniff"})

    app.add_middleware(_Guard, config=config)
    return app


def _job_view(job: dict) -> dict:
    return {k: job[k] for k in ("id", "status", "result", "error")}


def _thumbnail(src: Any, row: int, size: int) -> bytes:
    if src.pixels is None:
        raise NotFound(f"{src.name!r}: the store names no image files, so it has no thumbnails")
    src.check_row(row)
    key = (row, size)
    data = src.thumbs.get(key)
    if data is None:
        data = imaging.png(imaging.resize_to(src.pixels(row), size, src.pixelated))
        src.thumbs.put(key, data)
    return data
