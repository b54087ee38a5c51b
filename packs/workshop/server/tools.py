"""The workshop pack: Yimi's own way to find and build capabilities (flow F4 of docs/architecture.md).

Every tool is one request to ``/internal/workshop/`` on the platform socket with the
capability of the call being executed (``workshop/internal_views.py``):

- ``find`` (observe): ``capability_find``. A source that could not be searched is an
  ``unknowns`` entry, so "nothing found" is never claimed for it.
- ``build`` (workspace): records and starts a build (``workshop.builds.start_build``); the
  effect is the started build, acknowledged by the platform. A bad spec is ``failed``
  (``invalid_spec``, ``wrapper_too_long``, ``reuse_not_found``: retry forbidden).
- ``builds`` (observe): the recent builds, or one by ``build_id``. A build that passed the
  registry's checks is published at once (no go-live confirmation for a Yimi-built pack);
  one build's summary says the version that went live and its digest, or why not.
- ``pack_revert`` (owner_data: the owner's own set of capabilities changes, which the
  owner asks for in one sentence; other callers meet the gate's confirmation): a
  Yimi-built pack back to its previous version, a first version removed. The receipt says
  which version is online now (read back from the registry), or that none is.

A lost connection is ``unknown`` (a build may or may not have started, a revert may or may
not have happened: check with ``builds``). The fake (``fake/tools.py``) replaces ``call``.
"""

from __future__ import annotations

from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, effect, platform_call, receipt, value

TOOLS = ToolRegistry()
SOURCE = "yimi workshop"
FIND_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200, "description": "a few words for what is needed"}},
    "required": ["query"],
}
BUILD_SCHEMA = {
    "type": "object",
    "properties": {"spec": {"type": "object", "description": "the build spec (see the workshop skill)"}},
    "required": ["spec"],
}
BUILDS_SCHEMA = {"type": "object", "properties": {"build_id": {"type": "string", "description": "one build (default: the recent ones)"}}}
REVERT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 64, "description": "the Yimi-built pack to take back a version of"},
        "digest": {"type": "string", "description": "only if this version (its digest, from builds) is still the one online"},
    },
    "required": ["name"],
}


def call(body: dict[str, Any]) -> tuple[int, Any]:
    """One request to ``/internal/workshop/``: (HTTP status, parsed JSON or None)."""
    return platform_call("POST", "workshop/", body)


def ask(body: dict[str, Any], expect: str, *, changes: bool, what: str = "whether a build started") -> dict[str, Any]:
    """The platform's answer on 200, else the failed/unknown receipt (key ``_receipt``);
    ``what`` is the change that may or may not have happened."""
    try:
        status, payload = call(body)
    except PlatformNotConfigured as exc:
        return {"_receipt": receipt("failed", error=("not_configured", str(exc)), retry="forbidden")}
    except PlatformLost as exc:
        if changes:
            return {"_receipt": receipt("unknown", summary=str(exc), unknowns=[what], retry="after_check",
                                        check_with="builds", error=(exc.code, str(exc)))}
        return {"_receipt": receipt("unknown", summary=str(exc), unknowns=["the answer"], retry="allowed", error=(exc.code, str(exc)))}
    if status == 200 and isinstance(payload, dict) and expect in payload:
        return payload
    error = payload.get("error") if isinstance(payload, dict) else None
    code = str(error.get("code")) if isinstance(error, dict) and error.get("code") else f"http_{status}"
    message = str(error.get("message", "")) if isinstance(error, dict) else f"the platform answered HTTP {status}"
    if status >= 500 and changes:
        return {"_receipt": receipt("unknown", summary=f"the platform failed while making the change (HTTP {status})",
                                    unknowns=[what], retry="after_check", check_with="builds", error=(code, message[:1000]))}
    retry = "allowed" if status >= 500 or status == 429 else "forbidden"
    return {"_receipt": receipt("failed", summary=message or code, retry=retry, error=(code, (message or code)[:1000]))}


@TOOLS("Search the installed packs, the local skill index and the local MCP index for a capability.", FIND_SCHEMA)
def find(args: dict[str, Any]) -> dict[str, Any]:
    answer = ask({"action": "find", "query": args.get("query")}, "results", changes=False)
    if "_receipt" in answer:
        return answer["_receipt"]
    results, sources = answer["results"], answer["sources"]
    missing = [f"the {s['name']} source could not be searched: {s['error']}" for s in sources if s["status"] != "ok"]
    return receipt("succeeded", summary=f"{len(results)} results for {answer['query']!r}", unknowns=missing,
                   values=[value("results", len(results), "result", SOURCE)], content={"items": results, "sources": sources})


@TOOLS("Start a workshop build from a build spec; built and self-tested in the sandbox, checked and (if it passes) published by the registry.", BUILD_SCHEMA)
def build(args: dict[str, Any]) -> dict[str, Any]:
    spec = args.get("spec")
    if not isinstance(spec, dict):
        return receipt("failed", error=("invalid_spec", "spec is a JSON object"), retry="forbidden")
    answer = ask({"action": "build", "spec": spec}, "build", changes=True)
    if "_receipt" in answer:
        return answer["_receipt"]
    started = answer["build"]
    return receipt("succeeded", summary=f"build {started['id']} of {started['name']} started ({started['state']})", retry="forbidden",
                   effects=[effect(f"build:{started['id']}", "start", "service_ack")], content={"build": started})


@TOOLS("The recent workshop builds, or one by build_id.", BUILDS_SCHEMA)
def builds(args: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"action": "builds"}
    if args.get("build_id") is not None:
        body["build_id"] = args["build_id"]
    answer = ask(body, "builds", changes=False)
    if "_receipt" in answer:
        return answer["_receipt"]
    items = answer["builds"]
    summary = describe(items[0]) if args.get("build_id") is not None and len(items) == 1 else f"{len(items)} builds"
    return receipt("succeeded", summary=summary, values=[value("builds", len(items), "build", SOURCE)], content={"items": items})


def describe(build: dict[str, Any]) -> str:
    """One build in a sentence: live (version, digest), or why not, or where it is."""
    published = build.get("published")
    head = f"build {build['id']} of {build['name'] or 'a draft'}"
    if build["state"] == "succeeded" and published:
        now = "is live" if published["online"] else f"was live, now {published['state']}"
        return f"{head}: {published['name']} {published['version']} ({published['digest'][:12]}) {now}"
    if build["state"] == "succeeded":
        return f"{head}: a candidate ({build['candidate_state']}, {build['candidate_digest'][:12]}), not published"
    if build["state"] == "failed":
        return f"{head} failed: {build['error_code']}: {build['error_message'][:300]}"
    return f"{head}: {build['state']} (attempt {build['attempts']}/{build['max_attempts']})"


@TOOLS("Take a Yimi-built pack back to its previous version (a first version is removed), when the owner asks.", REVERT_SCHEMA)
def pack_revert(args: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"action": "revert", "name": args.get("name")}
    if args.get("digest") is not None:
        body["digest"] = args["digest"]
    answer = ask(body, "revert", changes=True, what="whether the pack was reverted")
    if "_receipt" in answer:
        return answer["_receipt"]
    done = answer["revert"]
    gone = done["reverted"]
    taken = f"{gone['version']} ({gone['digest'][:12]}) taken back"
    online = done["online"]
    summary = (f"{done['pack']}: {taken}; {online['version']} ({online['digest'][:12]}) is online now" if online
               else f"{done['pack']}: {taken}; no version is online now, the pack is removed")
    return receipt("succeeded", summary=summary, retry="forbidden", effects=[effect(f"pack:{done['pack']}", "revert", "verified")],
                   content={"revert": done})
