"""`vlctl serve` fuzzed from its own OpenAPI schema: schemathesis turns every operation of
/openapi.json into hypothesis strategies of valid (positive) and invalid (negative) requests --
bodies, paths, query strings, multipart uploads -- sent to the app through its ASGI transport.
Never a 5xx, and every error one clear JSON message. Over the tiny world of test_serve_api
(without caption trees: they load spaCy).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from test_serve_api import shared_world, world_state

EXAMPLES = 12  # per operation and mode: 13 operations x 2 modes


@pytest.fixture  # one app per test: an app's lifespan ends with its test (its worker pools shut down)
def api_schema(tmp_path_factory):
    from vlctl.serve.app import create_app
    from vlctl.serve.config import ServeConfig

    app = create_app(world_state(shared_world(tmp_path_factory)), ServeConfig(max_upload_bytes=64 * 1024,
                                                                               max_pixels=4096))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _check(case) -> int:
    response = case.call()
    assert response.status_code < 500, (case.as_curl_command(), response.text[:300])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"} and body["error"] and "\n" not in body["error"], body
    return response.status_code


def _fuzz(strategy, seen: set[int], examples: int = EXAMPLES) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        seen.add(_check(case))

    run()


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda m: m.value)
def test_every_operation_without_server_errors(api_schema, mode):
    _every_operation(api_schema, mode, EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda m: m.value)
def test_every_operation_long(api_schema, mode):
    _every_operation(api_schema, mode, 200)


def _every_operation(api_schema, mode, examples: int) -> None:
    operations = [r.ok() for r in api_schema.get_all_operations()]
    assert len(operations) == 13
    statuses: dict[str, set[int]] = {}
    for op in operations:
        seen = statuses.setdefault(op.label, set())
        try:
            _fuzz(op.as_strategy(generation_mode=mode), seen, examples)
        except Unsatisfiable:
            assert mode is schemathesis.GenerationMode.NEGATIVE and op.label == "GET /api/info"  # nothing to break
            seen.add(0)
    assert all(statuses.values()), statuses
    if mode is schemathesis.GenerationMode.POSITIVE:  # valid requests do get through to the work
        assert 200 in statuses["POST /api/search"] | statuses["GET /api/info"]
