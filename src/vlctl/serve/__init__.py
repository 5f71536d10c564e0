"""`vlctl serve`: a local web page over embeddings stores (search, steer, cluster, explain, latents, reports).

    from vlctl.serve.app import create_app
    from vlctl.serve.config import ServeConfig
    from vlctl.serve.state import state_for_store
    app = create_app(state_for_store("store/", controlembed="ce/"), ServeConfig())

`state` loads the stores and models once (`ServeState`, shared by every request), `app` is the
FastAPI application (JSON API under /api, listed at /docs, the page at /), `schemas` its pydantic
request and response models, `work` what each endpoint computes, `latents` the served SAE's latents
(the Latents tab), `demo` finds what `make demo` left under runs/demo.
"""
