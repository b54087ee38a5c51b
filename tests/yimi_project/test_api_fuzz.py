"""The HTTP API fuzzed from its own OpenAPI schema (the one ``/api/schema/`` serves,
drf-spectacular) with schemathesis: for every operation, requests that fit the schema
(positive) and requests that do not (negative: a list or a number where an object or a
string belongs, missing fields, bad query parameters and path ids), sent through the whole
Django stack as the owner (``/api/pair/`` anonymously, as a new device sends it). Generated
strings hold NUL and other control characters too. No answer may be a 5xx, and every
refusal must be the API's error body with one of its stable codes.

Bounded and deterministic: ``EXAMPLES`` cases per operation and mode, derandomized (the
same cases on every run), no example database, no deadline (a busy machine is slow, never
wrong). schemathesis's own pytest plugin is off (pytest.ini): only its generator is used.
"""

from __future__ import annotations

import functools
import json
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client

from yimi_project.errors import HTTP_STATUS

pytestmark = pytest.mark.django_db

EXAMPLES = 10  # per operation and mode: 27 × 10 requests, about 12 s of CPU

# Every operation of the schema, and whether it has anything a negative case can break
# (parameters or a JSON body; an image upload's body is bytes, which any bytes fit).
# test_the_fuzz_covers_every_operation_of_the_schema keeps this list the schema's.
OPERATIONS = {
    "GET /api/memory/assertions/": True,
    "POST /api/memory/assertions/": True,
    "GET /api/memory/assertions/{id}/": True,
    "GET /api/memory/assertions/{id}/forget/": True,
    "POST /api/memory/assertions/{id}/forget/": True,
    "GET /api/memory/assertions/{id}/history/": True,
    "GET /api/memory/recall/": True,
    "GET /api/memory/short-context/": False,
    "GET /api/memory/speaking-preferences/": False,
    "POST /api/memory/speaking-preferences/": True,
    "PUT /api/memory/speaking-preferences/": True,
    "POST /api/memory/speaking-preferences/restore/": True,
    "POST /api/pair/": True,
    "GET /api/timeline/": True,
    "POST /api/images/": False,
}
ANONYMOUS = {"POST /api/pair/"}


@functools.cache
def schema() -> Any:
    """The schema ``/api/schema/`` serves, loaded by schemathesis (once per process)."""
    import schemathesis
    from drf_spectacular.generators import SchemaGenerator

    document = json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True), default=str))
    return schemathesis.openapi.from_dict(document)


def operations() -> dict[str, Any]:
    return {f"{op.method.upper()} {op.path}": op for op in (result.ok() for result in schema().get_all_operations())}


def negatable(operation: Any) -> bool:
    json_body = any(body.media_type == "application/json" for body in operation.body)
    return bool(json_body or len(operation.query) or len(operation.path_parameters))


def test_the_fuzz_covers_every_operation_of_the_schema() -> None:
    assert {label: negatable(op) for label, op in operations().items()} == OPERATIONS


# What a generated case may carry besides: one string of its body or query with NUL or a
# lone surrogate appended, or its body with a field nested past the guard's limit — the
# kinds that gave 500 before the JSON guard (issue 35).
NUL, SURROGATE, DEEP = "\x00", "\ud800", "deep"
POISONS = (None, NUL, SURROGATE, DEEP)


def string_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, str):
        return [path]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in string_paths(item, (*path, key))]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in string_paths(item, (*path, index))]
    return []


def poison(case: Any, kind: str | None, pick: int) -> None:
    """Put ``kind`` into ``case``: appended to its ``pick``-th string (body first, then query;
    a query string cannot carry a lone surrogate), or, for ``DEEP``, as a field of its body."""
    from schemathesis.core import NOT_SET

    body = None if case.body is NOT_SET or isinstance(case.body, bytes) else case.body
    if kind == DEEP:
        if isinstance(body, dict):
            nested: Any = 0
            for _ in range(40):
                nested = [nested]
            body["x"] = nested
        return
    if kind is None:
        return
    targets = [("body", p) for p in string_paths(body) if p] + [("query", (k,)) for k in (case.query or {}) if kind == NUL]
    if not targets:
        return
    where, path = targets[pick % len(targets)]
    holder = body if where == "body" else case.query
    for key in path[:-1]:
        holder = holder[key]
    value = holder[path[-1]]
    holder[path[-1]] = (value if isinstance(value, str) else str(value)) + kind


def send(client: Client, case: Any) -> Any:
    """One generated case through Django's test client: middleware, DRF, the JSON guard,
    the view, its services and the database."""
    from schemathesis.core import NOT_SET

    headers = {k: str(v) for k, v in (case.headers or {}).items() if k.lower() not in ("content-type", "content-length", "host")}
    query = urlencode(case.query or {}, doseq=True)
    path = case.formatted_path + (f"?{query}" if query else "")
    if case.method.upper() == "GET":
        return client.get(path, headers=headers)
    body = b"" if case.body is NOT_SET else case.body if isinstance(case.body, bytes) else json.dumps(case.body)
    return client.generic(case.method.upper(), path, body, content_type=case.media_type or "application/json", headers=headers)


@pytest.mark.parametrize(
    ("label", "mode"),
    [(label, mode) for label, negative in OPERATIONS.items() for mode in ("positive", "negative") if mode == "positive" or negative],
)
def test_no_request_gets_a_server_error(owner: Any, label: str, mode: str) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    client = Client()
    if label not in ANONYMOUS:
        client.force_login(owner)
    answered: list[int] = []

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
              phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(case=operations()[label].as_strategy(generation_mode=GenerationMode(mode)),
           kind=st.sampled_from(POISONS), pick=st.integers(min_value=0, max_value=63))
    def request(case: Any, kind: str | None, pick: int) -> None:
        poison(case, kind, pick)
        response = send(client, case)
        sent = (case.method, case.formatted_path, case.query, case.body, kind)
        assert response.status_code < 500, (*sent, response.status_code, response.content[:300])
        answered.append(response.status_code)
        if response.status_code == 404 and not response.headers["content-type"].startswith("application/json"):
            return  # a path no URL matches (an id that is not a UUID): Django's own 404 page
        if response.status_code >= 400:
            error = response.json()["error"]
            assert HTTP_STATUS.get(error["code"], 400) == response.status_code or response.status_code in (404, 415), (*sent, error)

    request()
    assert answered, "every case was filtered away"
