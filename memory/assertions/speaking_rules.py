"""What speaking preferences may not do: the deterministic check (no model calls).

Speaking preferences choose tone, expressions and habits (≤1,500 characters). They may
not change three things, each a rule with an id and the reason the owner is told:

- ``identity``: Yimi's name and what she is (Yimi/依米, the owner's private AI assistant);
  renaming her, making her claim to be a human, or play someone else.
- ``locked_persona``: the persona is set by the platform, not by preferences: its
  definition (persona, backstory, system prompt), gender, age, or the relationship to
  the owner (partner roles).
- ``protected_rules``: the platform's rules that protect the owner: consent before
  outward effects, payment authorization every time, honesty about results, privacy
  toward guests, and the instructions themselves ("ignore your rules").

The check normalizes the text (NFKC, lower case, whitespace collapsed) and matches a
fixed list of patterns in Chinese and English. It is deliberately simple and
predictable: the same text always gets the same answer, and the tests list examples of
both sides. It depends on the standard library only, so the memory pack's fake uses it
too.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

MAX_CHARS = 1500


@dataclass(frozen=True)
class Violation:
    rule: str
    reason: str
    matched: str


@dataclass(frozen=True)
class _Rule:
    rule: str
    reason: str
    patterns: tuple[re.Pattern[str], ...]


def _p(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


RULES: tuple[_Rule, ...] = (
    _Rule(
        "identity",
        "Speaking preferences cannot change who Yimi is: her name stays Yimi (依米) and she stays "
        "the owner's AI assistant; she does not claim to be a human or play someone else.",
        _p(
            r"你叫(?!我|俺|咱)",
            r"你的名字(是|叫|改)",
            r"(给你|把你)?改(个)?名",
            r"称呼你自己|自称",
            r"你(现在|以后|从今以后|从现在起)?(就)?是(一个|个)?(真人|人类|活人|男人|女人|男生|女生|男孩|女孩)",
            r"你不是(ai|人工智能|机器人|助手|依米|yimi)",
            r"扮演|假装(你是|成)|冒充|装成",
            r"(从现在起|从今以后|以后)你(就)?是(?!我的助手)",
            r"\byour name is\b",
            r"\bcall yourself\b",
            r"\b(you are|you're) now\b",
            r"\bfrom now on,? you are\b",
            r"\bpretend (to be|you are|you're)\b",
            r"\b(act|role-?play) as (a|an|my|the)\b",
            r"\b(you are|you're) (a )?(human|real person|person|man|woman|girl|boy)\b",
            r"\b(you are|you're) not (an? )?(ai|assistant|bot|yimi)\b",
        ),
    ),
    _Rule(
        "locked_persona",
        "The persona is locked: speaking preferences can set tone, expressions and habits, "
        "not the persona's definition, backstory, gender, age or relationship to the owner.",
        _p(
            r"人设|角色设定|人格设定|性格设定|你的设定|背景故事|系统提示",
            r"(做|当)我的?(女朋友|男朋友|恋人|老婆|老公|妻子|丈夫)",
            r"你的(性别|年龄)|你是(男|女)的",
            r"\bpersona\b",
            r"\bbackstory\b",
            r"\bsystem prompt\b",
            r"\b(be|act like) my (girlfriend|boyfriend|wife|husband|lover|partner)\b",
            r"\byour (gender|age) (is|should)\b",
        ),
    ),
    _Rule(
        "protected_rules",
        "Speaking preferences cannot relax the rules that protect the owner: confirming before "
        "sending, deleting or acting; authorizing every payment; reporting results honestly; "
        "keeping the owner's information from guests.",
        _p(
            r"(忽略|无视|忘掉|忘记|绕过|覆盖|不要管|不用管).{0,8}(指令|规则|设定|提示词|限制|约束)",
            r"(不用|不要|别|无需|不必|跳过|省掉)(再)?(问我|确认|征求|授权|验证)",
            r"(直接|自动)(帮我)?(付款|支付|付钱|转账|下单|购买)",
            r"(假装|谎称)(已经)?(完成|做好|办好|成功|发送|付款)",
            r"(没|没有)(做|完成|办好|成功).{0,6}也(说|告诉我|回答)",
            r"(告诉|透露|分享给|说给)(客人|陌生人|访客|别人|其他人)",
            r"\b(ignore|disregard|forget|override|bypass)\b.{0,20}\b(instructions|rules|guidelines|prompt|restrictions)\b",
            r"\b(don't|do not|never|no need to|stop) (ask(ing)?|confirm(ing)?|check(ing)? with)( me)?\b",
            r"\bskip (the )?(confirmation|authori[sz]ation|approval)\b",
            r"\b(pay|buy|order|transfer)\b.{0,20}\b(automatically|without asking)\b",
            r"\b(pretend|claim|say)\b.{0,20}\b(worked|succeeded|it'?s done|was done)\b",
            r"\b(share|tell|reveal)\b.{0,40}\b(guests?|strangers?|visitors?)\b",
        ),
    ),
)


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).lower()).strip()


def check(text: str) -> Violation | None:
    """The first rule the text breaks, or None when it is an acceptable preference."""
    normalized = normalize(text)
    squeezed = normalized.replace(" ", "")  # Chinese is matched without spaces
    for rule in RULES:
        for pattern in rule.patterns:
            found = pattern.search(normalized) or (pattern.search(squeezed) if not pattern.pattern.startswith(r"\b") else None)
            if found:
                return Violation(rule.rule, rule.reason, found.group(0))
    return None


def problem(text: object) -> tuple[str, str, dict[str, str]] | None:
    """(error code, message, details) when ``text`` may not be stored, else None."""
    if not isinstance(text, str):
        return "invalid_request", "the speaking preferences must be text", {}
    if len(text) > MAX_CHARS:
        return "preference_too_long", f"speaking preferences are at most {MAX_CHARS} characters (got {len(text)})", {}
    violation = check(text)
    if violation is not None:
        return "preference_rejected", violation.reason, {"rule": violation.rule, "matched": violation.matched}
    return None
