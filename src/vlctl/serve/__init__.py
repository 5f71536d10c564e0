"""`vlctl serve`: a local web page over embeddings stores (search, steer, cluster, explain, reports).

    from vlctl.serve import ServeConfig, create_app, state_for_store
    app = create_app(state_for_store("store/", controlembed="ce/"), ServeConfig())

`state` loads the stores and models once (`ServeState`, shared by every request), `app` is the
FastAPI application (JSON API under /api, OpenAPI at /docs, the page at /), `schemas` its pydantic
request and response models, `demo` finds what `make demo` left under runs/demo.
"""

from __future__ import annotations

from vlctl.serve.app import ServeConfig, create_app
from vlctl.serve.state import Collection, ExplainSet, Report, ServeState, state_for_store

__all__ = ["Collection", "ExplainSet", "Report", "ServeConfig", "ServeState", "create_app", "state_for_store"]
