"""The end-of-call topic extractor: deterministic rules over one call's turns (issue 21).

No model is asked: the same turns give the same changes, and every rule is a line below a
reviewer can read. Its output is a list of topic changes, each citing the owner utterance
that caused it, a few counts for the companion report and a short digest of the call.
``EXTRACTOR_VERSION`` moves whenever a rule or the topic list changes (the end-of-call job
is idempotent on it, so a new version summarizes a call again).

The rules, in the order they are tried on each of the owner's utterances (a bare greeting,
"你好", is skipped):

1. **Refusal** ("别聊我老伴", "这个不想说"): the topics it names — or the topic in focus
   when it says "这个/那个" — become ``refused``. A refusal that names no topic ("累了，
   不聊了") is not a refusal of anything: it is rule 2.
2. **Fatigue** ("累了", "不聊了", "先这样"): the owner wants to stop; no topic changes
   (``stats["ended_by_owner"]``).
3. **Short reply** ("嗯", "好", "哦", one character, or a word of ``SHORT_WORDS``): the
   second in a row makes the topic in focus a ``cooldown`` candidate (until ``COOLDOWN``),
   never a refusal; every second one in a row counts a short-reply loop.
4. **Finished** ("讲完了", "听完了", "猜出来了"): the topic in focus (or the call's card)
   is ``done``; it is never offered again as an unfinished thread.
5. **Correction** ("不对，是东风机床厂"): the topics it names (else the last one answered)
   are ``answered`` again with the new words: the newest explicit statement wins, the
   older row stays as its source.
6. **Answer**: every topic the owner's utterance names is ``answered`` (``reopened`` for
   a topic that was refused: the owner brought it up), with Yimi's question on it, if she
   just asked one, as ``last_question``. A reply that names no topic answers nothing,
   whatever Yimi asked (only the call's card goes on: the owner goes along with it); the
   owner's own question about a detail ("哪个厂？") does not tell it.

Yimi's own turns never change a state: a question only sets the topic in focus and the
``last_question`` of the answer that follows (what she merely mentions moves nothing). Turns of anyone but the owner (a guest) are
skipped. A question on a detail already answered, or on a refused topic, is counted
(``repeated_questions``, ``refused_raised``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

EXTRACTOR_VERSION = "rules-1"
COOLDOWN = timedelta(days=2)
QUOTE_CHARS = 200
SUMMARY_CHARS = 400


@dataclass(frozen=True)
class Topic:
    """One topic the extractor knows. A ``detail`` is a single fact (the factory's name):
    once answered it is not asked again. A theme (repairing lathes) can be followed up
    and resumed."""

    key: str
    label: str
    pattern: re.Pattern[str]
    detail: bool = False


def _topic(key: str, label: str, pattern: str, *, detail: bool = False) -> Topic:
    return Topic(key, label, re.compile(pattern, re.I), detail)


# The reviewable topic list. Keys are stable (rows keep them); labels are what a prompt says.
TOPICS: tuple[Topic, ...] = (
    _topic("family.spouse", "老伴", r"老伴|爱人|老头子|老太婆|老婆|老公|wife|husband"),
    _topic("family.children", "儿女孙辈", r"儿子|女儿|孩子|孙子|孙女|外孙|grandchild|my (son|daughter)"),
    _topic("craft.lathe", "修车床", r"车床|机床|修机器|lathe"),
    _topic("work.factory", "工厂名字", r"(哪个|什么|哪家)(厂|工厂)|厂(子)?(叫|名)|[\u4e00-\u9fff]{2,}厂|factory", detail=True),
    _topic("home.hometown", "老家", r"老家|家乡|哪里人|籍贯|hometown", detail=True),
    _topic("food.cooking", "做饭", r"做饭|做菜|下厨|饺子|包子|cooking"),
    _topic("music.opera", "听戏", r"京剧|越剧|豫剧|听戏|唱戏|戏曲|opera"),
    _topic("garden.plants", "养花种菜", r"养花|种花|花草|种菜|阳台|绿萝|吊兰|月季"),
    _topic("drink.tea", "喝茶", r"喝茶|泡茶|茶叶|\btea\b"),
    _topic("health.body", "身体", r"血压|看病|腿疼|腰疼|身体|医院"),
)
BY_KEY = {t.key: t for t in TOPICS}
OPEN_CHAT = "chat.open"  # the conversation itself, when no topic is in focus

REFUSAL = re.compile(r"别(再)?(聊|提|说|问|讲)|不(想|要|愿意|爱)(再)?(聊|提|说|谈|讲)|少(提|说)|don'?t (want to )?(talk|ask) about", re.I)
DEMONSTRATIVE = re.compile(r"这个|那个|这事|那事|这些|那些|它|this|that", re.I)
FATIGUE = re.compile(r"累了|困了|不聊了|先这样|就到这|挂了|歇会|歇一会|i'?m tired|let'?s stop", re.I)
FINISHED = re.compile(r"(讲|听|说|做|弄|干|猜)完了|猜(到|出来|对)了|听过了|就这些了|the end|finished", re.I)
CORRECTION = re.compile(r"不对|记错|说错|搞错|其实是|应该是|更正|not right|actually", re.I)
GREETING = re.compile(r"^(你好|您好|喂|在吗|在不在|早|早上好|中午好|下午好|晚上好|hello|hi|hey)[\s\W]*(小禾|依米|yimi)?[\s\W]*$", re.I)
SHORT_WORDS = {"嗯", "嗯嗯", "哦", "噢", "啊", "好", "好的", "是", "是的", "对", "对对", "行", "还行", "没有", "不知道", "ok", "okay", "yes", "yeah", "mm", "hmm", "uh"}
PUNCTUATION = re.compile(r"[\s\W_]+", re.U)
QUESTION = re.compile(r"[？?]|吗[。！!]?$|呢[。]?$")
SENTENCE = re.compile(r"[^。！？!?；;\n]+[。！？!?；;]?")


@dataclass(frozen=True)
class Turn:
    """One turn of the call, oldest first: ``speaker`` is ``owner``, ``yimi`` or ``other``
    (a guest; skipped). An owner turn always has its timeline ``entry_id``."""

    speaker: str
    text: str
    entry_id: int | None = None


@dataclass(frozen=True)
class Change:
    topic_key: str
    state: str  # answered | refused | cooldown | done
    change: str  # answered | correction | reopened | refused | short_replies | finished
    entry_id: int
    quote: str
    last_question: str
    position: int


@dataclass
class Extraction:
    changes: list[Change] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    owner_entries: list[int] = field(default_factory=list)


def topics_in(text: str) -> list[str]:
    return [t.key for t in TOPICS if t.pattern.search(text)]


def label(topic_key: str, labels: dict[str, str] | None = None) -> str:
    if labels and topic_key in labels:
        return labels[topic_key]
    topic = BY_KEY.get(topic_key)
    return topic.label if topic else topic_key


def is_detail(topic_key: str) -> bool:
    topic = BY_KEY.get(topic_key)
    return bool(topic and topic.detail)


def is_short(text: str) -> bool:
    bare = PUNCTUATION.sub("", text).lower()
    return bare in SHORT_WORDS or len(bare) <= 1


def _question(text: str) -> str:
    """The last sentence of Yimi's turn that asks something ('' if none)."""
    asked = [s.strip() for s in SENTENCE.findall(text) if QUESTION.search(s.strip())]
    return asked[-1] if asked else ""


def extract(
    turns: list[Turn], prior: dict[str, str], *, card_topic: str | None = None, labels: dict[str, str] | None = None
) -> Extraction:
    """Apply the rules (module docstring) to ``turns``. ``prior`` is each topic's state
    before this call ({topic key: state}); ``card_topic`` the call's content card as a topic
    (``card:<id>``), in focus from the start."""
    out = Extraction(stats={"owner_turns": 0, "short_reply_loops": 0, "repeated_questions": 0, "refused_raised": 0,
                            "ended_by_owner": False})
    state = dict(prior)
    focus: str | None = card_topic
    pending: tuple[str | None, str] | None = None  # (topic, question) Yimi asked last
    last_answered: str | None = None
    short_run = 0

    def change(key: str, new: str, why: str, turn: Turn, question: str = "") -> None:
        assert turn.entry_id is not None
        out.changes.append(Change(key, new, why, turn.entry_id, turn.text.strip()[:QUOTE_CHARS], question[:300], len(out.changes)))
        state[key] = new

    for turn in turns:
        text = turn.text.strip()
        if not text:
            continue
        if turn.speaker == "yimi":
            question = _question(text)
            asked = topics_in(question) if question else []
            if asked:  # only her question moves the focus: telling a card's story keeps it on the card
                focus = asked[0]
            if question:
                topic = asked[0] if asked else focus
                pending = (topic, question)
                if topic and state.get(topic) == "refused":
                    out.stats["refused_raised"] += 1
                elif topic and is_detail(topic) and state.get(topic) == "answered":
                    out.stats["repeated_questions"] += 1
            else:
                pending = None
            continue
        if turn.speaker != "owner" or turn.entry_id is None:
            continue
        out.stats["owner_turns"] += 1
        out.owner_entries.append(turn.entry_id)
        named = topics_in(text)
        asked_topic, question = pending if pending else (None, "")
        pending = None
        if GREETING.match(text):  # a greeting is no answer and no short reply
            short_run = 0
            continue
        if REFUSAL.search(text):
            targets = named or ([focus] if focus and DEMONSTRATIVE.search(text) else [])
            if targets:
                for key in targets:
                    change(key, "refused", "refused", turn, question if key == asked_topic else "")
                short_run = 0
                continue
        if FATIGUE.search(text):
            out.stats["ended_by_owner"] = True
            short_run = 0
            continue
        if is_short(text):
            short_run += 1
            if short_run % 2 == 0:  # every second short reply in a row: a loop (counted), the topic cools down once
                out.stats["short_reply_loops"] += 1
                key = asked_topic or focus or OPEN_CHAT
                if state.get(key) != "cooldown":
                    change(key, "cooldown", "short_replies", turn, question if key == asked_topic else "")
            continue
        short_run = 0
        if FINISHED.search(text):
            for key in named or [k for k in (focus,) if k]:
                change(key, "done", "finished", turn, question if key == asked_topic else "")
            continue
        if CORRECTION.search(text):
            targets = named or ([last_answered] if last_answered else [])
            for key in targets:
                change(key, "answered", "correction", turn, question if key == asked_topic else "")
                last_answered = key
            if targets:
                focus = targets[0]
                continue
        asking = QUESTION.search(text) is not None
        # An answer names its topic (a reply beside Yimi's question answers nothing); the
        # owner asking about a detail ("哪个厂？") has not told it.
        targets = [k for k in named if not (asking and is_detail(k))]
        if not targets and focus and focus == card_topic:
            targets = [focus]  # the owner goes along with the card's story or game: in progress
        for key in targets:
            why = "reopened" if state.get(key) == "refused" else "answered"
            change(key, "answered", why, turn, question if key == asked_topic else "")
            last_answered = key
        if named:
            focus = named[0]
    out.summary = digest(out.changes, labels=labels)
    return out


def digest(changes: list[Change], *, labels: dict[str, str] | None = None) -> str:
    """A few words on the call from its changes, newest state per topic: what was talked
    about (with the owner's latest words on it), what they did not want, what finished."""
    latest: dict[str, Change] = {}
    for c in changes:
        latest.pop(c.topic_key, None)
        latest[c.topic_key] = c
    groups: dict[str, list[Change]] = {"answered": [], "refused": [], "done": [], "cooldown": []}
    for c in latest.values():
        groups[c.state].append(c)
    parts = []
    if groups["answered"]:
        said = "；".join(f"{label(c.topic_key, labels)}（「{c.quote[:40]}」）" for c in groups["answered"][-3:])
        parts.append(f"聊了{said}")
    if groups["done"]:
        parts.append("已经讲完：" + "、".join(label(c.topic_key, labels) for c in groups["done"]))
    if groups["cooldown"]:
        parts.append("兴趣不大：" + "、".join(label(c.topic_key, labels) for c in groups["cooldown"]))
    if groups["refused"]:
        parts.append("不想聊：" + "、".join(label(c.topic_key, labels) for c in groups["refused"]))
    text = "。".join(parts) or "简单聊了几句"
    return text[:SUMMARY_CHARS]
