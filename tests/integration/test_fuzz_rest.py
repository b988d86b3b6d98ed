"""SEE's REST API fuzzed against its own OpenAPI document with schemathesis: every route, inputs
drawn from the schema (valid ones must be accepted, invalid ones refused with 4xx), no 5xx,
responses as documented and within SEE's byte budget (set small here), within 1 s.
Deterministic: hypothesis derandomized."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from service_loop import LoopThread, delete_keys

from mutualrl.bench.testing.see import make_config, rollout, stats_record

SECRET = "rest-fuzz-secret"
BUDGET = 256 * 1024


@pytest.fixture(scope="module")
def see_rest(redis_url: str) -> Iterator[dict[str, Any]]:
    """A SEE with auth on, one run with records of two policies, in a background loop."""
    import uuid

    from mutualrl.client.see import SeeClient
    from mutualrl.see.server import start_see

    prefix = f"rfuzz{uuid.uuid4().hex[:10]}"
    loop = LoopThread("rest-fuzz")
    see = loop.run(start_see(make_config(
        redis_url, key_prefix=prefix, auth_token=SECRET,
        limits={"max_response_bytes": BUDGET, "max_record_bytes": 64 * 1024})), 30)
    run_id = f"{prefix}run"
    with SeeClient(see.address, token=SECRET) as client:
        client.create_run(run_id, ["a", "b"], 0.5)
        client.publish(run_id, [rollout(p, r, f"q{i}", 0) for p in "ab" for r in range(2)
                                for i in range(3)])
        client.publish(run_id, [stats_record(p, 0, "q0", [0.0, 1.0]) for p in "ab"])
    try:
        yield {"url": see.rest_url, "run_id": run_id}
    finally:
        loop.run(see.stop(0.2), 30)
        loop.close()
        delete_keys(redis_url, f"*{prefix}*")


# Routes fuzzed in each mode: POSITIVE inputs (the schema allows them: accepted, 2xx or 404 for
# ids that do not exist) and NEGATIVE ones (the schema forbids them: refused with 4xx).
MODES = ("positive", "negative")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES)
def test_rest_routes_behave_as_their_schema_says(see_rest: dict[str, Any], mode: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """schemathesis's checks on every operation of /openapi.json: no 5xx, status codes, content
    types and bodies as documented, valid input accepted and invalid input refused; each
    answer within 1 s and nothing logged at ERROR."""
    from schemathesis import GenerationMode

    caplog.set_level(logging.ERROR)
    schema = schemathesis.openapi.from_url(f"{see_rest['url']}/openapi.json")
    # The token is sent by the test itself; generated (or negated) security parameters would
    # be overwritten by it, and a "negative" case would then be a valid request.
    # Query parameters a route does not declare are ignored, as HTTP APIs do (OpenAPI has no
    # way to forbid them): not counted as a violation the route should refuse.
    schema.config.generation.update(with_security_parameters=False,
                                    allow_extra_parameters=False)
    generation = GenerationMode.POSITIVE if mode == "positive" else GenerationMode.NEGATIVE
    failures: dict[str, str] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    for operation in operations:

        @settings(max_examples=20, derandomize=True, database=None, deadline=None,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=generation))
        def check(case: Any) -> None:
            # As drawn (unknown runs: 404 before most checks), then on the run that exists, so
            # the query parameters reach the code that reads them.
            for run_id in (None, see_rest["run_id"]):
                if run_id is not None:
                    if "run_id" not in (case.path_parameters or {}):
                        return
                    case.path_parameters["run_id"] = run_id
                auth = {"Authorization": f"Bearer {SECRET}"}
                response = case.call_and_validate(base_url=see_rest["url"], headers=auth,
                                                  timeout=5)
                if response.elapsed >= 1.0:  # once more: the machine may be loaded
                    response = case.call(base_url=see_rest["url"], headers=auth, timeout=5)
                assert response.elapsed < 1.0, "no answer within 1 s"
                assert len(response.content) <= BUDGET, len(response.content)

        try:
            check()
        except Unsatisfiable:
            assert mode == "negative"  # a route without parameters has no invalid input
        except (Exception, BaseExceptionGroup) as err:  # collected per route, reported together
            failures[operation.label] = f"{type(err).__name__}: {str(err)[:1500]}"
    assert failures == {}, "\n\n".join(f"{k}: {v}" for k, v in failures.items())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
