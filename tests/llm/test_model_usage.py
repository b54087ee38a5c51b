"""Usage records: every model call — main turn, sub-agent, report, failed or not — leaves
one row with the provider's own counts (reported), NULL counts when the provider said
nothing (unknown, never 0), or local counts labelled estimated; costs come from the
deployer's price file or are unknown. The console plots usage by role and day (owner only)
and a run's page lists its calls."""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from brain import agents, runner
from brain.agent_loop import execute_agent_task
from brain.models import Run
from brain.runner import execute_run
from brain.services import accept_utterance
from llm import roles, usage
from llm.client import BrainError, complete
from llm.fake_server import FakeBrainServer, Script
from llm.models import ModelUsage
from llm.usage import CallContext, TokenUsage
from tests.conftest import db_async, new_client_id, script, use_brain

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "天气怎么样 today?"}]


@pytest.fixture
def silent_brain(db: Any) -> Iterator[FakeBrainServer]:
    """A demo brain that never reports usage (``fake_brain --no-usage``), as the brain role."""
    server = FakeBrainServer(script=Script(), report_usage=False)
    server.start_in_thread()
    use_brain(server.base_url)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def no_packs(tmp_path: Path, settings: Any) -> None:
    (tmp_path / "packs").mkdir()
    settings.YIMI_PACKS_DIR = tmp_path / "packs"


def price_file(tmp_path: Path, settings: Any, prices: list[dict[str, Any]], currency: str = "USD") -> Path:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"currency": currency, "prices": prices}), encoding="utf-8")
    settings.YIMI_MODEL_PRICES_FILE = str(path)
    return path


def prompt_tokens_of(request: dict[str, Any]) -> int:
    """What the demo brain reports for a request (llm/fake_server.py, "Usage")."""
    return math.ceil(sum(len(m["content"]) for m in request["messages"] if isinstance(m.get("content"), str)) / 4)


def rows() -> list[ModelUsage]:
    return list(ModelUsage.objects.order_by("created_at", "id"))


# --- recorded from a real stream ------------------------------------------------------------------


async def test_main_turn_subagent_and_report_record_the_usage_the_brain_reported(make_device: Any, brain: Any, no_packs: None) -> None:
    script(brain, match="Background task finished", reply="Done, all of it.")
    script(brain, match="look it up", reply="Found: nothing to do.")
    script(brain, match="hello", reply="Hi there.")
    sim = await db_async(make_device)()
    accepted = await db_async(accept_utterance)(sim.device, new_client_id(), "hello")
    assert await execute_run(accepted.run_id) == "succeeded"
    task = await db_async(agents.delegate)(accepted.run_id, "look it up")
    assert await execute_agent_task(task.id) == "succeeded"

    assert all(r["stream_options"] == {"include_usage": True} for r in brain.script.requests)
    recorded = await db_async(rows)()
    assert [(r.role, r.agent_task_id) for r in recorded] == [("brain", None), ("delegation", task.id), ("brain", None)]
    replies = ["Hi there.", "Found: nothing to do.", "Done, all of it."]
    for row, request, reply in zip(recorded, brain.script.requests, replies):
        assert row.run_id == accepted.run_id and row.outcome == "ok" and row.model == "yimi-demo" and row.provider == "demo"
        assert row.tokens_source == "reported"
        assert (row.input_tokens, row.output_tokens) == (prompt_tokens_of(request), math.ceil(len(reply) / 4))
        assert row.cache_read_tokens == 0 and row.cache_write_tokens is None
        assert row.cost is None and row.cost_source == "unknown"  # no price file: unknown, never 0


async def test_usage_is_unknown_not_zero_when_the_provider_reports_none(make_device: Any, silent_brain: Any, tmp_path: Path, settings: Any) -> None:
    price_file(tmp_path, settings, [{"provider": "demo", "model": "yimi-demo", "input": 1, "output": 2}])
    sim = await db_async(make_device)()
    accepted = await db_async(accept_utterance)(sim.device, new_client_id(), "hello")
    assert await execute_run(accepted.run_id) == "succeeded"
    assert silent_brain.script.requests[0]["stream_options"] == {"include_usage": True}  # asked, not answered
    [row] = await db_async(rows)()
    assert row.tokens_source == "unknown" and row.outcome == "ok"
    assert (row.input_tokens, row.output_tokens, row.cache_read_tokens, row.cache_write_tokens) == (None, None, None, None)
    assert row.cost is None and row.cost_source == "unknown"  # a price cannot make up for missing counts


async def test_a_rule_can_leave_usage_out_and_a_role_can_stop_asking_for_it(brain: Any) -> None:
    script(brain, reply="ok", usage=False)
    settings_now = await db_async(roles.resolve)("brain")
    completion = await complete(MESSAGES, role_settings=settings_now)
    assert completion.usage == usage.UNKNOWN_USAGE
    brain.script.rules.clear()
    await db_async(use_brain)(brain.base_url, include_usage=False)  # for an endpoint that rejects stream_options
    completion = await complete(MESSAGES, role_settings=await db_async(roles.resolve)("brain"))
    assert "stream_options" not in brain.script.requests[-1] and completion.usage == usage.UNKNOWN_USAGE
    assert [r.tokens_source for r in await db_async(rows)()] == ["unknown", "unknown"]


async def test_local_counting_is_labelled_estimated(silent_brain: Any, tmp_path: Path, settings: Any) -> None:
    price_file(tmp_path, settings, [{"provider": "demo", "model": "yimi-demo", "input": 1, "output": 2}])
    script(silent_brain, reply="晴天, sunny all day")
    await db_async(use_brain)(silent_brain.base_url, estimate_usage=True)
    completion = await complete(MESSAGES, role_settings=await db_async(roles.resolve)("brain"))
    expected = usage.estimate_tokens(MESSAGES, "晴天, sunny all day")
    assert completion.usage == expected and expected.source == "estimated"
    [row] = await db_async(rows)()
    assert row.tokens_source == "estimated" and (row.input_tokens, row.output_tokens) == (expected.input_tokens, expected.output_tokens)
    assert row.cache_read_tokens is None and row.cache_write_tokens is None  # nothing here can tell what was cached
    assert row.cost_source == "estimated"
    assert row.cost == (Decimal(expected.input_tokens) * 1 + Decimal(expected.output_tokens) * 2) / 1_000_000


def test_the_local_count_is_one_token_per_cjk_character_and_one_per_four_others() -> None:
    assert usage.count_text_tokens("你好世界") == 4
    assert usage.count_text_tokens("abcdefgh") == 2 and usage.count_text_tokens("abcdefghi") == 3
    assert usage.count_text_tokens("你好 ab") == 3  # 2 CJK + ceil(3 / 4)
    estimate = usage.estimate_tokens([{"role": "user", "content": "你好"}], "abcd")
    assert (estimate.input_tokens, estimate.output_tokens) == (usage.MESSAGE_OVERHEAD + 2, 1)


# --- failures ------------------------------------------------------------------------------------


async def test_a_failed_call_is_recorded_with_its_error_code(make_device: Any, brain: Any) -> None:
    script(brain, status=500)
    sim = await db_async(make_device)()
    accepted = await db_async(accept_utterance)(sim.device, new_client_id(), "hello")
    assert await execute_run(accepted.run_id) == "failed"
    await db_async(use_brain)("http://127.0.0.1:9/v1")  # nothing listens
    with pytest.raises(BrainError):
        await complete(MESSAGES, role_settings=await db_async(roles.resolve)("brain"))
    failed, unreachable = await db_async(rows)()
    assert (failed.outcome, failed.run_id, failed.role) == ("brain_error", accepted.run_id, "brain")
    assert unreachable.outcome == "brain_unreachable" and unreachable.run_id is None
    for row in (failed, unreachable):
        assert row.tokens_source == "unknown" and row.input_tokens is None and row.cost is None


async def test_a_runs_main_call_is_recorded_in_the_stores_trip_and_on_the_way_out_of_a_crash(
    make_device: Any, brain: Any, monkeypatch: Any
) -> None:
    """The main turn's usage record waits for the reply's store (one database trip for
    both); a run that breaks between its call and its store still writes it as it ends."""
    script(brain, reply="Noted.")
    sim = await db_async(make_device)()
    trips: list[str] = []
    real_record_call = usage.record_call

    def counted(*args: Any, **kwargs: Any) -> Any:
        trips.append("record_call")
        return real_record_call(*args, **kwargs)

    monkeypatch.setattr(usage, "record_call", counted)
    real_store = runner._store_outcome

    def store(*args: Any, **kwargs: Any) -> Any:
        trips.append("store")
        return real_store(*args, **kwargs)

    monkeypatch.setattr(runner, "_store_outcome", store)
    accepted = await db_async(accept_utterance)(sim.device, new_client_id(), "hello")
    assert await execute_run(accepted.run_id) == "succeeded"
    assert trips == ["store", "record_call"]  # written inside the store's trip
    [row] = await db_async(rows)()
    assert (row.run_id, row.outcome, row.role) == (accepted.run_id, "ok", "brain")

    async def broken_last(self: Any) -> None:
        raise RuntimeError("Redis went away mid-reply")

    monkeypatch.setattr(runner.push.ReplyChunks, "last", broken_last)
    trips.clear()
    second = await db_async(accept_utterance)(sim.device, new_client_id(), "hello again")
    with pytest.raises(RuntimeError):
        await execute_run(second.run_id)
    assert trips == ["record_call"]  # no store: written on the way out
    assert [r.run_id for r in await db_async(rows)()] == [accepted.run_id, second.run_id]


async def test_a_usage_record_that_cannot_be_written_does_not_break_the_reply(brain: Any) -> None:
    script(brain, reply="still here")
    ghost = CallContext(run_id=uuid.uuid4())  # no such run: the row violates its foreign key
    completion = await complete(MESSAGES, role_settings=await db_async(roles.resolve)("brain"), usage_for=ghost)
    assert completion.text == "still here" and completion.usage is not None and completion.usage.source == "reported"
    assert await db_async(ModelUsage.objects.count)() == 0


# --- usage objects and prices --------------------------------------------------------------------


def test_openai_and_anthropic_style_usage_objects() -> None:
    openai = usage.usage_from_provider({"prompt_tokens": 1000, "completion_tokens": 50, "prompt_tokens_details": {"cached_tokens": 600}})
    assert openai == TokenUsage(1000, 50, 600, None, "reported")
    compatible = usage.usage_from_provider(
        {"prompt_tokens": 1000, "completion_tokens": 50, "cache_read_input_tokens": 700, "cache_creation_input_tokens": 200}
    )
    assert compatible == TokenUsage(1000, 50, 700, 200, "reported")
    # Anthropic's own shape: input_tokens leaves out the cache, the record's input includes it
    anthropic = usage.usage_from_provider({"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 10})
    assert anthropic == TokenUsage(160, 20, 50, 10, "reported")
    assert usage.usage_from_provider(None) is None
    assert usage.usage_from_provider({"prompt_tokens": -3, "completion_tokens": "many"}) is None


async def test_cost_comes_from_the_price_file_and_is_unknown_without_a_price(brain: Any, tmp_path: Path, settings: Any) -> None:
    price_file(tmp_path, settings, [{"provider": "demo", "model": "yimi-demo", "input": 2, "output": "8", "cache_read": 0.5}])
    reported = {"prompt_tokens": 1000, "completion_tokens": 500, "prompt_tokens_details": {"cached_tokens": 400}}
    script(brain, reply="priced", usage=reported)
    role_settings = await db_async(roles.resolve)("brain")
    await complete(MESSAGES, role_settings=role_settings)
    unpriced = dataclasses.replace(await db_async(roles.resolve)("brain"), model="no-price-model")
    await complete(MESSAGES, role_settings=unpriced)
    priced, missing = await db_async(rows)()
    # 600 uncached × 2 + 400 cached × 0.5 + 500 out × 8, per million
    assert (priced.cost, priced.currency, priced.cost_source) == (Decimal("0.0054"), "USD", "priced")
    assert missing.model == "no-price-model" and missing.tokens_source == "reported"
    assert (missing.cost, missing.cost_source) == (None, "unknown")


def test_prices_cover_the_cache_honestly() -> None:
    price = usage.Price(Decimal(2), Decimal(8), None, None, "USD")
    # cache reads reported but not priced: charged at the input price, labelled estimated
    assert usage.cost_of(TokenUsage(1000, 0, 400, None, "reported"), price) == (Decimal("0.002"), "estimated")
    assert usage.cost_of(TokenUsage(1000, 0, 0, None, "reported"), price)[1] == "priced"
    discounted = usage.Price(Decimal(2), Decimal(8), Decimal("0.5"), None, "USD")
    # the table prices the cache lower, the provider did not say what was cached: an upper bound
    assert usage.cost_of(TokenUsage(1000, 0, None, None, "reported"), discounted) == (Decimal("0.002"), "estimated")
    assert usage.cost_of(TokenUsage(None, None, None, None, "unknown"), discounted) == (None, "unknown")


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not valid JSON"),
        ({"prices": []}, "currency"),
        ({"currency": "USD", "prices": [{"provider": "p", "model": "m", "input": -1, "output": 1}]}, "≥ 0"),
        ({"currency": "USD", "prices": [{"provider": "p", "model": "m", "output": 1}]}, "input"),
    ],
)
def test_an_invalid_price_file_is_refused_and_leaves_costs_unknown(tmp_path: Path, settings: Any, content: Any, message: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    settings.YIMI_MODEL_PRICES_FILE = str(path)
    with pytest.raises(usage.YimiError) as err:
        usage.load_prices()
    assert err.value.code == "invalid_price_file" and message in err.value.message
    row = usage.record_call(CallContext(), role="brain", provider="p", model="m", tokens=TokenUsage(10, 10, None, None, "reported"),
                            duration_ms=5, outcome="ok")
    assert row.cost is None and row.cost_source == "unknown"


# --- the console -----------------------------------------------------------------------------------


@pytest.fixture
def second_superuser(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("second-admin", password="pw-pw-pw-pw")


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def seed_usage(run: Run | None = None) -> tuple[str, str]:
    now = timezone.now()
    yesterday = now - timedelta(days=1)
    reported = TokenUsage(1200, 300, 200, None, "reported")
    usage.record_call(CallContext(run.id if run else None), role="brain", provider="demo", model="yimi-demo", tokens=reported,
                      duration_ms=850, outcome="ok", now=now)
    usage.record_call(CallContext(), role="delegation", provider="demo", model="yimi-demo",
                      tokens=TokenUsage(400, 100, None, None, "estimated"), duration_ms=300, outcome="ok", now=now)
    usage.record_call(CallContext(), role="delegation", provider="demo", model="yimi-demo", tokens=usage.UNKNOWN_USAGE,
                      duration_ms=40, outcome="brain_timeout", now=yesterday)
    return f"{timezone.localdate(now):%m-%d}", f"{timezone.localdate(yesterday):%m-%d}"


def test_the_usage_page_plots_roles_and_days_for_the_owner(owner: Any) -> None:
    today, yesterday = seed_usage()
    response = logged_in(owner).get("/admin/llm/modelusage/")
    assert response.status_code == 200
    page = response.content.decode()
    start = page.index('class="usage-plot"')
    svg = page[start: page.index("</svg>", start)]
    assert "tokens per day (input + output)" in svg and f">{today}<" in svg and f">{yesterday}<" in svg
    assert ">brain<" in svg and ">delegation<" in svg  # the legend names the roles
    assert "~2k<" in svg  # today's total, 1500 reported + 500 estimated, marked as partly estimated
    assert "?1<" in svg and "unknown" in svg  # yesterday's call without usage is counted, not drawn as zero
    table = page[page.index('id="usage-by-day"'):]
    assert "1 / 0 / 0" in table and "0 / 1 / 0" in table and "0 / 0 / 1" in table
    assert "unknown for 1 call" in page  # no price file
    assert logged_in(owner).get("/admin/llm/modelusage/", {"days": "0"}).status_code == 200  # refused, default shown
    index = logged_in(owner).get("/admin/").content.decode()
    section = index[index.index('class="app-task-models'):]  # "Models and persona" (accounts.console)
    section = section[: section.index("</table>")]
    assert "/admin/llm/modelusage/" in section and "/admin/llm/modelselection/" in section


def test_the_usage_page_is_refused_to_another_staff_account(owner: Any, second_superuser: Any) -> None:
    seed_usage()
    staff = logged_in(second_superuser)
    assert staff.get("/admin/llm/modelusage/").status_code == 403
    row = ModelUsage.objects.first()
    assert row is not None and staff.get(f"/admin/llm/modelusage/{row.pk}/change/").status_code == 403
    assert "/admin/llm/modelusage/" not in staff.get("/admin/").content.decode()


def test_a_runs_page_lists_its_model_calls(owner: Any, make_device: Any, tmp_path: Path, settings: Any) -> None:
    price_file(tmp_path, settings, [{"provider": "demo", "model": "yimi-demo", "input": 2, "output": 8, "cache_read": 0.5}])
    sim = make_device()
    run = Run.objects.get(id=accept_utterance(sim.device, new_client_id(), "what did this cost").run_id)
    seed_usage(run)
    page = logged_in(owner).get(f"/admin/brain/run/{run.id}/change/").content.decode()
    assert "model calls" in page.lower()
    assert "in 1200, out 300, cache read 200 (reported)" in page
    assert "0.0045 USD (priced)" in page  # 1000 × 2 + 200 × 0.5 + 300 × 8, per million
    assert "850" in page
    assert "brain_timeout" not in page  # another run's (no run's) call is not listed here
