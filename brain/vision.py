"""The vision turn: "看看这是什么" with an image goes to the ``vision`` model role.

Which image (``memory.personal.images.image_for_request``): the device's image whose ``about`` is
this request's id; else, when the words ask about something seen, the same device's latest
image from the last ``IMAGE_REQUEST_WINDOW_SECONDS`` (120 s). No image: the ordinary main
turn.

The request (``vision_messages``): the run's usual messages (system prompt, history, the
owner's words), with the last user message turned into OpenAI-compatible content parts —
the words as ``{"type": "text"}`` and the image as ``{"type": "image_url", "image_url":
{"url": "data:image/jpeg;base64,…"}}`` — and, before it, a system message with what the
image analyzers recognized ("people recognized: 王阿姨"), or that nobody enrolled was
recognized, so the model never names anyone else. No tools: a vision turn talks, it does
not act.

The settings are ``llm.roles.resolve("vision")``, read once when the turn starts (one
call per run; the run's pinned ``brain``/``delegation`` roles are untouched). Not
configured: the owner is told so in one sentence of the platform's (``NOT_CONFIGURED``),
never a guess. The answer streams through the runner's ``CheckedStream`` like every reply;
the numbers the platform measured on the image (width, height, bytes) count as evidence for
it, any other number must be backed by a receipt as usual (``admit_image_numbers``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async

from brain import trace
from brain.models import Run
from capabilities import truth
from llm import roles
from llm.client import BrainError, complete
from llm.usage import CallContext
from memory.personal import images
from memory.personal.models import ImageRecord
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

NOT_CONFIGURED = "要看图片需要一个视觉模型（vision 角色），现在还没有配置，所以我看不到这张图，也不会去猜。"
VISION_SYSTEM = (
    "The owner shows you an image from their own device (a first-person photo from their glasses, or from their phone). "
    "Answer their words about it briefly. Say only what you can see; when you are not sure, say so."
)


def image_for_run(run: Run, *, may_be_linked: bool = True) -> ImageRecord | None:
    """The image this run's request is about, if any (``memory.personal.images.image_for_request``;
    ``may_be_linked=False``: the claim read that no image names this request)."""
    inbound = run.inbound
    return images.image_for_request(
        device_id=run.origin_device_id, client_id=inbound.client_id, text=inbound.text, at=inbound.created_at,
        may_be_linked=may_be_linked,
    )


def people_fact(image: ImageRecord) -> str:
    """What the platform knows about who is in the image, for the model."""
    names = [str(p["name"]) for p in image.people if isinstance(p, dict) and p.get("name")]
    if names:
        return (
            f"People recognized in the image (enrolled by the owner): {'、'.join(dict.fromkeys(names))}. "
            "Anyone else in it is unknown: never guess who they are."
        )
    if image.analyzed_at is not None:
        return "No person the owner enrolled was recognized in this image: never guess who anyone in it is."
    return "Nobody in this image was identified: never guess who anyone in it is."


def vision_messages(messages: list[dict[str, Any]], image: ImageRecord, uri: str) -> list[dict[str, Any]]:
    """``messages`` with the last user message as text + image content parts, and the
    image's facts (``people_fact``) as a system message before it."""
    last = messages[-1]
    words = last.get("content") if isinstance(last.get("content"), str) else ""
    facts = {"role": "system", "content": f"{VISION_SYSTEM}\n{people_fact(image)}"}
    content = [{"type": "text", "text": words}, {"type": "image_url", "image_url": {"url": uri}}]
    return [*messages[:-1], facts, {"role": "user", "content": content}]


def admit_image_numbers(check: truth.ReplyCheck | None, image: ImageRecord) -> None:
    """The image's measured width, height and size are facts the platform holds: the
    checker accepts them in the answer (they are not receipts' numbers, so nothing else
    about the checker changes)."""
    if check is not None:
        check.ev.loose.update(float(n) for n in (image.width, image.height, image.size_bytes))


async def vision_turn(run: Run, messages: list[dict[str, Any]], on_text: Callable[[str], Awaitable[None]], image: ImageRecord) -> str:
    """One turn with the ``vision`` role; returns the text streamed to ``on_text``. Raises
    ``BrainError`` when the call fails (an honest notice, as for the main turn)."""
    try:
        role = await database_sync_to_async(roles.resolve)("vision")
    except YimiError as exc:
        if exc.code != "role_not_configured":
            log_event("model_settings_unusable", run_id=str(run.id), code=exc.code, role="vision")
            raise BrainError("brain_not_configured", f"the vision role's settings cannot be used ({exc.code})") from None
        log_event("vision_not_configured", run_id=str(run.id))
        await on_text(NOT_CONFIGURED)
        return NOT_CONFIGURED
    uri = await database_sync_to_async(images.data_uri)(image)
    await database_sync_to_async(images.mark_used)(image.id, run.id)

    async def first_token(delta: str) -> None:
        trace.mark(run, "first_token")
        await on_text(delta)

    trace.mark(run, "brain_request")
    completion = await complete(vision_messages(messages, image, uri), on_text=first_token, role_settings=role,
                                usage_for=CallContext(run.id))
    text = completion.text.strip()
    if not text:
        raise BrainError("brain_bad_response", "the vision model's answer was empty")
    log_event("vision_answered", run_id=str(run.id), image_id=str(image.id))
    return text


async def release(image: ImageRecord) -> None:
    """The request ended: a request-only image (a guest's) is deleted now."""
    await database_sync_to_async(images.release_after_run)(image.id)
