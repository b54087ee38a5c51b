"""What a sentence of a reply claims, and how a reply is cut into sentences.

``status_claims`` finds the status words (``STATUS_WORDS``) a sentence uses;
``CLAIM_STATUSES`` says which receipt statuses back each claim. ``proof_claims`` finds the
claims only a verified read-back can back (``PROOF_WORDS``: the recipient got it, or read
it), unless negated (``PROOF_NEGATORS``) or another claim (``PROOF_NOT_FOLLOWED_BY``: 已读取, 会收到通知); ``PROOF_CLAIMS`` says which effect actions prove
each and the reason a sentence making it without that proof is removed with. ``suggests_retry`` says
whether a sentence suggests doing the action again (``RETRY_WORDS``/``RETRY_PATTERNS``,
unless one of ``NEGATORS`` comes before). ``split_sentences`` cuts a reply into pieces that
join back to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# ---------------------------------------------------------------------------------------
# Status words, retry suggestions
# ---------------------------------------------------------------------------------------

# Checked in this order; a match is blanked before the next category is looked for, so
# 没有成功 is a failure claim and not also a success claim.
STATUS_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("partial", ("只完成了一部分", "完成了一部分", "只办好了一部分", "办好了一部分", "部分完成", "部分成功",
                 "成功了一部分", "partially")),
    ("working", ("还在办", "正在", "处理中", "进行中", "排队", "排上队", "还没完成", "还没有完成", "尚未完成",
                 "还没办完", "还没好", "等你确认", "等待确认", "等你的确认",
                 "in progress", "still working", "still running", "working on it", "queued", "pending",
                 "not done yet", "not finished yet", "waiting for your confirmation")),
    ("failed", ("失败", "没成功", "没有成功", "未成功", "不成功", "没办成", "没能", "没发出去", "没有发出",
                "未发送", "没发送", "出错", "没完成", "没有完成", "未完成", "办不了",
                "failed", "fail", "unsuccessful", "did not go through", "didn't go through", "not sent",
                "wasn't sent", "was not sent", "couldn't", "could not", "didn't work", "did not work")),
    ("cancelled", ("已取消", "取消了", "已经取消", "cancelled", "canceled")),
    ("noted", ("记下了", "记下来了", "记住了", "已记住", "已记下", "已记录", "记录好了", "记好了", "已保存",
               "保存好了", "保存了", "存好了", "帮你记着", "noted", "saved", "remembered", "i'll remember")),
    ("done", ("办好了", "办完了", "已完成", "完成了", "完成", "已发送", "发送了", "发好了", "发出去了", "已发出",
              "成功", "搞定", "弄好了", "做好了", "写好了", "已写入", "已办妥",
              "done", "sent", "finished", "completed", "succeeded", "successfully", "success")),
)
# Which receipt statuses back a claim.
CLAIM_STATUSES: dict[str, frozenset[str]] = {
    "partial": frozenset({"partial"}),
    "working": frozenset({"running", "queued", "waiting"}),
    "failed": frozenset({"failed"}),
    "cancelled": frozenset({"cancelled"}),
    "noted": frozenset({"succeeded"}),
    "done": frozenset({"succeeded"}),
}
# Claims that no receipt status can back, only a ``verified`` effect whose action reads the
# outcome back at the far end: that the recipient got a message (``deliver``: found again in
# her mailbox or room), or read it (``seen``: her read receipt). A send is only ever
# acknowledged by a server (``capabilities.receipts`` rule 6), so "发好了" may pass on a
# succeeded send while "Alice 会收到" needs the read-back. claim → (the effect actions that
# prove it, the reason code a sentence making it unproven is removed with).
PROOF_CLAIMS: dict[str, tuple[frozenset[str], str]] = {
    "read": (frozenset({"seen"}), "read_not_proven"),
    "delivered": (frozenset({"deliver", "seen"}), "delivery_not_proven"),
}
# Checked in this order, a match blanked before the next (已读 is a read claim, not also a
# delivery claim).
PROOF_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("read", ("已读", "已经读了", "has read", "have read", "has seen it", "has seen your", "read your message")),
    ("delivered", ("会收到", "能收到", "收得到", "就收到了", "已送达", "已经送达", "送达了", "已经送到",
                   "will receive", "will get it", "will get your", "has received", "delivered")),
)
# A proof word after one of these in its clause (at most ``PROOF_NEGATOR_WINDOW`` characters
# back, not past a comma) is not a claim: a negation or a doubt (不会收到, 还不知道会不会收到,
# 是否已送达, "not sure she will receive it") or a condition (如果她收到, "once it is delivered").
PROOF_NEGATORS = ("不", "没", "未", "否", "无法", "难说", "难以", "如果", "要是", "一旦", "等到",
                  "not", "never", "no", "whether", "if", "unsure", "unknown", "unclear", "cannot", "can't", "don't know",
                  "when", "once", "until", "after")
PROOF_NEGATOR_WINDOW = 20
# A proof word followed by one of these is another claim: 已读取 is a read of data (a tool's
# ``read`` effect, backed by its receipt like any done claim), and 会收到通知/提醒 ("you will
# get a notice") is Yimi's promise of her own notice (a watch, a reminder), not a message's
# delivery to someone.
PROOF_NOT_FOLLOWED_BY: dict[str, re.Pattern[str]] = {
    "read": re.compile(r"取"),
    "delivered": re.compile(r"\s*(?:一条|一个|个|条|到)?\s*(?:通知|提醒)|\s*(?:an?\s+|the\s+|my\s+)?(?:notification|notice|reminder)",
                            re.IGNORECASE),
}
_CLAUSE_MARKS = re.compile(r"[，,、：:；;—]")
RETRY_WORDS = (
    "再发一次", "再发一遍", "再发", "再发送", "重新发送", "重新发", "重发", "再试一次", "再试一下", "再试试",
    "再试", "重试", "再来一次", "重来", "再做一次", "重做", "再执行", "重新执行", "再提交", "重新提交",
    "再运行", "重新运行", "再跑一次",
    "again", "retry", "resend", "re-send", "try again", "redo", "re-run", "rerun",
)
NEGATORS = ("不要", "不用", "别", "无需", "不必", "不需要", "没必要", "勿", "不能", "不可以",
            "don't", "do not", "no need", "not", "never", "shouldn't", "should not")


_A_NOT_A = ("要不要", "能不能", "可不可以", "用不用", "需不需要", "需要不需要")


def _phrase_re(phrases: Iterable[str]) -> re.Pattern[str]:
    parts = []
    for p in sorted(phrases, key=len, reverse=True):
        e = re.escape(p)
        parts.append(rf"\b{e}\b" if p.isascii() else e)
    return re.compile("|".join(parts), re.IGNORECASE)


_STATUS_RES = tuple((claim, _phrase_re(words)) for claim, words in STATUS_WORDS)
_PROOF_RES = tuple((claim, _phrase_re(words)) for claim, words in PROOF_WORDS)
_PROOF_PHRASES = tuple(p.lower() for _, words in PROOF_WORDS for p in words)
_PROOF_NEGATOR_RE = _phrase_re(PROOF_NEGATORS)
# Beyond the word list: 再 + verb + 一次/一遍 (再设一次, 再写一遍) and 重新 + a doing verb.
RETRY_PATTERNS = (r"再[\u4e00-\u9fff]{1,2}一[次遍]", r"重新(?:发|做|执行|提交|运行|创建|设|写|下单|支付|付|来|弄|订)")
_RETRY_RE = re.compile(_phrase_re(RETRY_WORDS).pattern + "|" + "|".join(RETRY_PATTERNS), re.IGNORECASE)


# A sentence that contains no status phrase makes no claim, and the six patterns need not
# run (most sentences of a reply): a substring test of every phrase on the lowered sentence
# comes first. IGNORECASE also folds these non-ASCII letters into ASCII ones, which lower()
# does not do the same way; a sentence with one of them takes the patterns always
# (tests/capabilities/test_truth.py checks that the list is whole).
FOLDS_INTO_ASCII = frozenset("\u0130\u0131\u017f\u212a")  # İ ı ſ K (Kelvin)
_PHRASES = tuple(p.lower() for _, words in STATUS_WORDS for p in words)


def status_claims(sentence: str) -> set[str]:
    """The status claims a sentence makes (partial/working/failed/cancelled/noted/done).
    A question makes no claim."""
    s = sentence.strip()
    if _is_question(s):
        return set()
    if FOLDS_INTO_ASCII.isdisjoint(s):
        low = s.lower()
        if not any(phrase in low for phrase in _PHRASES):
            return set()
    return _scan_status(s)


def _scan_status(s: str) -> set[str]:
    claims: set[str] = set()
    work = s
    for claim, rx in _STATUS_RES:
        def blank(m: re.Match[str], claim: str = claim) -> str:
            claims.add(claim)
            return "\x00" * len(m.group())
        work = rx.sub(blank, work)
    return claims


def _is_question(s: str) -> bool:
    return s.endswith(("?", "？")) or re.search(r"吗\W*$", s) is not None


def proof_claims(sentence: str) -> set[str]:
    """The claims of ``PROOF_WORDS`` a sentence makes (read/delivered): each a phrase not
    negated in its clause (``PROOF_NEGATORS``). A question makes no claim."""
    s = sentence.strip()
    if _is_question(s):
        return set()
    if FOLDS_INTO_ASCII.isdisjoint(s) and not any(phrase in s.lower() for phrase in _PROOF_PHRASES):
        return set()
    return _scan_proof(s)


def _scan_proof(s: str) -> set[str]:
    claims: set[str] = set()
    work = s
    for claim, rx in _PROOF_RES:
        def blank(m: re.Match[str], claim: str = claim) -> str:
            before = _CLAUSE_MARKS.split(m.string[max(0, m.start() - PROOF_NEGATOR_WINDOW) : m.start()])[-1]
            other = PROOF_NOT_FOLLOWED_BY[claim].match(m.string, m.end())
            if not _PROOF_NEGATOR_RE.search(before) and not other:
                claims.add(claim)
            return "\x00" * len(m.group())
        work = rx.sub(blank, work)
    return claims


def suggests_retry(sentence: str) -> bool:
    """Whether a sentence suggests doing the action again (a negated one does not)."""
    low = sentence.lower()
    for m in _RETRY_RE.finditer(low):
        before = low[max(0, m.start() - 14) : m.start()]
        for question in _A_NOT_A:  # 要不要再发一次 asks, it does not negate
            before = before.replace(question, "")
        if not any(re.search(rf"\b{re.escape(n)}\b" if n.isascii() else re.escape(n), before) for n in NEGATORS):
            return True
    return False


# ---------------------------------------------------------------------------------------
# Sentences
# ---------------------------------------------------------------------------------------

_ENDERS = set("。！？!?；;\n")
_CLOSERS = set("”’\"'）)」』】")


def split_sentences(text: str) -> list[str]:
    """Split at 。！？!?；; and newlines, and at "." followed by a space or the end (so
    decimals such as 3.5 stay whole). Each piece keeps its closing marks and trailing
    whitespace, so ``"".join(split_sentences(t)) == t``."""
    out: list[str] = []
    start, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _ENDERS or (ch == "." and (i + 1 == n or text[i + 1].isspace())):
            j = i + 1
            while j < n and (text[j] in _ENDERS or text[j] in _CLOSERS or text[j].isspace()):
                j += 1
            out.append(text[start:j])
            start = i = j
            continue
        i += 1
    if start < n:
        out.append(text[start:])
    return out
