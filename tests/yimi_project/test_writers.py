"""One writer per table (docs/architecture.md): every "the only code that writes ``Model``" is true.

A module claims its tables in its docstring: "the only code that writes ``A`` and ``B``", "the
only writer of ``A``" (the sentence with the phrase names the models, ``Model.field`` claims one
column); a model claims its writer in its own docstring: "Written only by ``app.module``". The
test reads the application code (the apps of ``pyproject.toml``'s layers contract, not tests,
migrations or bench) with ``ast`` and finds every write of a claimed model outside its writer:

- ORM writes on the model's manager or a queryset of it, ``create``, ``bulk_create``,
  ``bulk_update``, ``get_or_create``, ``update_or_create``, ``update``, ``delete``, however
  chained (``Model.objects.filter(...).update(...)``, a queryset kept in a name first);
- ``save()`` / ``delete()`` on an instance that is clearly of the model: made by ``Model(...)``,
  read by ``Model.objects.get/first/last/create/...``, iterated from a queryset of it, or a
  parameter annotated with the model; ``statements.insert/insert_with/Part`` of such an instance
  (``yimi_project.infra.statements``);
- SQL written by hand: ``INSERT INTO`` / ``UPDATE`` / ``DELETE FROM`` followed by the model's
  table, spelled out or as ``Model._meta.db_table`` (directly or through a name);
- a part of an app's ``queries.py`` that writes (step 3: statements across apps are assembled
  from parts each owner exports), where another module takes it (``part_writes``); statement
  text an app's ``queries.py`` builds for its own tables is its writer's (``in_own_queries``).

Names resolve the way the module binds them: an import of the model's class, a class defined
there, ``apps.get_model("app", "Model")``. An instance handed over by another function is not
followed (precise, not clever): the test can miss a write, never invent one. Django admin's own
saves (an editable ``ModelAdmin``) are not seen either.

A hand-built statement's text in its app's ``queries.py`` (``<app>.queries``) is built for the
app's writer to run: a write found there is the writer's when the writer is of the same app.

A write outside the writer is allowed only when it is listed in ``EXCEPTIONS`` below with its
reason, and the exception is named where the rule is: in the claiming module's docstring or in
docs/architecture.md.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.apps import apps as django_apps
from django.conf import settings
from django.db.models import Model

BASE = Path(settings.BASE_DIR)
ARCHITECTURE = BASE / "docs" / "architecture.md"
SKIPPED_DIRS = {"migrations", "__pycache__", "tests", "bench"}

#: A module docstring's claim: the sentence holding one of these names the models.
CLAIM = re.compile(r"only\s+code\s+that\s+writes|only\s+writer\s+of|the\s+code\s+that\s+writes", re.IGNORECASE)
#: A model's claim in its own docstring.
WRITTEN_ONLY_BY = re.compile(r"written\s+only\s+by\s+``([\w.]+)``", re.IGNORECASE)
NAMED = re.compile(r"``([A-Z]\w*)(?:\.(\w+))?``")

QS_WRITES = {"create", "bulk_create", "bulk_update", "get_or_create", "update_or_create", "update", "delete"}
QS_METHODS = {
    "all", "filter", "exclude", "select_for_update", "select_related", "prefetch_related", "order_by", "only",
    "defer", "using", "annotate", "distinct", "none", "alias", "reverse",
}
INSTANCE_GETTERS = {"get", "first", "last", "latest", "earliest", "create", "aget", "afirst", "alast", "acreate"}
PAIR_GETTERS = {"get_or_create", "update_or_create", "aget_or_create", "aupdate_or_create"}
INSTANCE_WRITES = {"save", "delete", "asave", "adelete"}
MANAGERS = {"objects", "_default_manager", "_base_manager"}
STATEMENT_WRITES = {"insert", "insert_with", "Part"}
SQL_WRITE = re.compile(r"(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s*$", re.IGNORECASE)
SQL_WRITE_NAMED = re.compile(r"(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?(\w+)\"?", re.IGNORECASE)


@dataclass(frozen=True)
class Allowed:
    """A write of ``model`` by ``module``'s ``functions`` that its writer's claim does not cover.
    ``named`` is how docs/architecture.md or the writer's docstring names it."""

    module: str
    functions: frozenset[str]
    model: str
    named: str
    reason: str


EXCEPTIONS = (
    Allowed(
        "brain.services", frozenset({"_accept"}), "AdmissionRecord", "brain.services.accept_utterance",
        "the hot text path inserts the admission record with its entry and run in one statement (query budget); "
        "accept_utterance and accept_voice_utterance both store through _accept",
    ),
    Allowed(
        "brain.services", frozenset({"_accept"}), "TimelineEntry", "brain.services.accept_utterance",
        "the hot text path inserts the utterance's entry with its admission and run in one statement (query budget)",
    ),
    Allowed(
        "brain.queries", frozenset({"accept_parts"}), "AdmissionRecord", "brain.services.accept_utterance",
        "the hot text path's one statement takes the admission's part (accounts.queries.admission_part)",
    ),
    Allowed(
        "brain.queries", frozenset({"accept_parts"}), "TimelineEntry", "brain.services.accept_utterance",
        "the hot text path's one statement takes the entry's part (memory.queries.entry_part)",
    ),
    Allowed(
        "brain.queries", frozenset({"finish_sql"}), "TimelineEntry", "brain.services.finish_run",
        "finish_run inserts the reply's entry in the statement that closes the run (query budget), "
        "from memory's part (memory.queries.entry_insert)",
    ),
    Allowed(
        "releases.notices", frozenset({"notify_owner"}), "TimelineCounter", "releases.notices.notify_owner",
        "a release notice creates and locks the owner's counter row before append_entry, to write a notice once",
    ),
    Allowed(
        "memory.timeline.erasure", frozenset({"erase"}), "TimelineEntry", "memory.timeline.erasure",
        "erasing entries for good is its own operation, the only code that erases them",
    ),
    Allowed(
        "memory.timeline.erasure", frozenset({"erase"}), "ImageRecord", "memory.timeline.erasure",
        "an erasure purges the images of the entries it erases in its own transaction (files after the commit)",
    ),
    Allowed(
        "memory.timeline.erasure", frozenset({"erase"}), "MemoryReceipt", "memory.timeline.erasure",
        "an erasure stores its receipt (kind erase) in its own transaction, so a replay returns it",
    ),
    Allowed(
        "memory.assertions.store", frozenset({"_reset_sessions_told"}), "MemorySession", "memory.assertions.store.forget",
        "a forget resets, in its transaction, the injection sessions that were told a forgotten fact",
    ),
    Allowed(
        "llm.role_backup", frozenset({"import_settings", "rotate_master_key"}), "ModelRole", "llm.role_backup",
        "restoring a backup deletes the roles the backup lacks; rotating the master key re-wraps the sealed keys",
    ),
    Allowed(
        "llm.role_backup", frozenset({"rotate_master_key"}), "ModelRoleRevision", "llm.role_backup",
        "rotating the master key re-wraps the revisions' sealed keys in the rotation's transaction",
    ),
    Allowed(
        "llm.role_backup", frozenset({"import_settings"}), "ModelSettingsImport", "llm.role_backup",
        "a restored backup records the environment import as done, so a later start never imports over it",
    ),
)


@cache
def models() -> dict[str, type[Model]]:
    """The project's models by class name (the names are unique)."""
    apps = app_packages()
    found = {m.__name__: m for m in django_apps.get_models() if m.__module__.split(".")[0] in apps}
    assert len(found) == len([m for m in django_apps.get_models() if m.__module__.split(".")[0] in apps])
    return found


@cache
def tables() -> dict[str, str]:
    return {m._meta.db_table: name for name, m in models().items()}


@cache
def app_packages() -> tuple[str, ...]:
    with (BASE / "pyproject.toml").open("rb") as f:
        return tuple(tomllib.load(f)["tool"]["importlinter"]["root_packages"])


@cache
def modules() -> dict[str, ast.Module]:
    """The application code: every module of the apps but tests, migrations and bench."""
    found = {}
    for app in app_packages():
        for path in sorted((BASE / app).rglob("*.py")):
            if SKIPPED_DIRS & set(path.relative_to(BASE).parts):
                continue
            name = ".".join(path.relative_to(BASE).with_suffix("").parts).removesuffix(".__init__")
            found[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return found


# --- claims --------------------------------------------------------------------------------


def sentences(text: str) -> Iterator[str]:
    yield from re.split(r"(?<=[.:;])\s+(?=[A-Z(`])|\n\s*\n", text)


def claims() -> dict[str, dict[str, set[str]]]:
    """Per model, its claimed writer modules, each with the columns it claims (empty: the table)."""
    known = models()
    by_model: dict[str, dict[str, set[str]]] = {}
    for name, tree in modules().items():
        for sentence in (s for doc in claiming_docstrings(tree) for s in sentences(doc)):
            if not (phrase := CLAIM.search(sentence)):
                continue
            for model, column in NAMED.findall(sentence[phrase.start():]):
                if model in known:
                    by_model.setdefault(model, {}).setdefault(name, set()).update({column} if column else set())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in known and (cls_doc := ast.get_docstring(node)):
                for writer in WRITTEN_ONLY_BY.findall(cls_doc):
                    by_model.setdefault(node.name, {}).setdefault(module_of(writer), set())
    return by_model


def claiming_docstrings(tree: ast.Module) -> list[str]:
    """Where a module claims: its docstring and its functions' (``llm.usage.record_call``)."""
    docs = [ast.get_docstring(tree) or ""]
    docs += [ast.get_docstring(n) or "" for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return docs


def module_of(dotted: str) -> str:
    """``app.module`` or ``app.module.function`` → the module."""
    while dotted and dotted not in modules():
        dotted = dotted.rpartition(".")[0]
    assert dotted, f"names no module of the apps: {dotted!r}"
    return dotted


# --- writes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    module: str
    function: str
    line: int
    model: str
    how: str
    columns: tuple[str, ...] = ()  # an ``update(...)``'s columns; () for any other write

    def __str__(self) -> str:
        return f"{self.module.replace('.', '/')}.py:{self.line} ({self.function}) writes {self.model}: {self.how}"


class Scope:
    """What the names of one function (or the module) are bound to, flow-insensitive."""

    def __init__(self, parent: Scope | None, node: ast.AST | None, owner_class: str | None = None) -> None:
        self.parent = parent
        self.values: dict[str, list[ast.expr]] = {}
        self.kinds: dict[str, tuple[str, str]] = {}
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                if arg.annotation is not None and (model := annotated_model(arg.annotation)):
                    self.kinds[arg.arg] = (model, "instance")
                elif arg.arg == "self" and owner_class:
                    self.kinds["self"] = (owner_class, "instance")

    def lookup(self, name: str) -> list[ast.expr]:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            scope = scope.parent
        return []


def annotated_model(annotation: ast.expr) -> str | None:
    """``Model``, ``"Model"``, ``Model | None`` → ``Model``."""
    text = annotation.value if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str) else ast.unparse(annotation)
    parts = [p.strip() for p in text.split("|") if p.strip() != "None"]
    return parts[0] if len(parts) == 1 and parts[0] in models() else None


class Scanner:
    def __init__(self, module: str, tree: ast.Module) -> None:
        self.module = module
        self.tree = tree
        self.classes: dict[str, str] = {}  # local name → model
        self.module_names: set[str] = set()  # names bound to imported modules
        self.writes: list[Write] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in models():
                        self.classes[alias.asname or alias.name] = alias.name
                    else:
                        self.module_names.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.module_names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.ClassDef) and node.name in models() and models()[node.name].__module__ == module:
                self.classes[node.name] = node.name

    # expressions

    def kinds(self, expr: ast.expr, scope: Scope, depth: int = 0) -> set[tuple[str, str]]:
        """What ``expr`` is: pairs of a model and "class" | "queryset" | "instance" | "instances"
        | "pair" (``get_or_create``'s) | "meta" | "table" (its ``db_table``)."""
        if depth > 8:
            return set()
        if isinstance(expr, ast.Name):
            s: Scope | None = scope
            while s is not None:
                if expr.id in s.kinds:
                    return {s.kinds[expr.id]}
                if expr.id in s.values:
                    found: set[tuple[str, str]] = set()
                    for value in s.values[expr.id]:
                        found |= self.kinds(value, s, depth + 1)
                    return found
                s = s.parent
            return {(self.classes[expr.id], "class")} if expr.id in self.classes else set()
        if isinstance(expr, ast.Tuple | ast.List | ast.Set):  # a literal of classes, iterated
            found = set()
            for element in expr.elts:
                found |= {(m, "classes") for m, k in self.kinds(element, scope, depth + 1) if k == "class"}
            return found
        if isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Name) and expr.value.id in self.module_names and expr.attr in models():
                return {(expr.attr, "class")}
            step = {("class", a): "queryset" for a in MANAGERS} | {("class", "_meta"): "meta", ("meta", "db_table"): "table"}
            return {
                (m, step[(k, expr.attr)]) for m, k in self.kinds(expr.value, scope, depth + 1) if (k, expr.attr) in step
            }
        if isinstance(expr, ast.Await):
            return self.kinds(expr.value, scope, depth + 1)
        if isinstance(expr, ast.Subscript):  # an element: ``qs[0]``, ``pair[0]``, a loop's variable
            if isinstance(expr.slice, ast.Slice):
                return {(m, k) for m, k in self.kinds(expr.value, scope, depth + 1) if k == "queryset"}
            element_of = {"queryset": "instance", "instances": "instance", "classes": "class"}
            found = set()
            for m, k in self.kinds(expr.value, scope, depth + 1):
                if k in element_of:
                    found.add((m, element_of[k]))
                elif k == "pair" and isinstance(expr.slice, ast.Constant) and expr.slice.value == 0:
                    found.add((m, "instance"))
            return found
        if not isinstance(expr, ast.Call):
            return set()
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr == "get_model" and expr.args:
            label = ".".join(str(a.value) for a in expr.args if isinstance(a, ast.Constant))
            model = label.rpartition(".")[2]
            return {(model, "class")} if model in models() else set()
        if isinstance(func, ast.Attribute) and func.attr in ("fetch_by_pk", "fetch_instances") and expr.args:
            made = "instance" if func.attr == "fetch_by_pk" else "instances"
            return {(m, made) for m, k in self.kinds(expr.args[0], scope, depth + 1) if k == "class"}
        if isinstance(func, ast.Name) and func.id in ("quote", "str", "list", "sorted", "reversed") and expr.args:
            return {
                (m, "instances" if k == "queryset" and func.id != "quote" and func.id != "str" else k)
                for m, k in self.kinds(expr.args[0], scope, depth + 1)
            }
        if isinstance(func, ast.Attribute) and func.attr == "quote_name" and expr.args:
            return self.kinds(expr.args[0], scope, depth + 1)
        if not isinstance(func, ast.Attribute):  # ``Model(...)``
            return {(m, "instance") for m, k in self.kinds(func, scope, depth + 1) if k == "class"}
        found = set()
        for m, k in self.kinds(func.value, scope, depth + 1):
            if k != "queryset":
                continue
            if func.attr in QS_METHODS:
                found.add((m, "queryset"))
            elif func.attr in INSTANCE_GETTERS:
                found.add((m, "instance"))
            elif func.attr in PAIR_GETTERS:
                found.add((m, "pair"))
        return found

    def tables(self, expr: ast.expr, scope: Scope) -> set[str]:
        found = {m for m, k in self.kinds(expr, scope) if k == "table"}
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and expr.value.strip('"') in tables():
            found.add(tables()[expr.value.strip('"')])
        return found

    # statements

    def scan(self) -> list[Write]:
        top = Scope(None, None)
        self.visit_body(self.tree.body, top, "<module>", None)
        return self.writes

    def bind(self, target: ast.expr, value: ast.expr, scope: Scope) -> None:
        if isinstance(target, ast.Name):
            scope.values.setdefault(target.id, []).append(value)
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                self.bind(t, v, scope)
        elif isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name):
            scope.values.setdefault(target.elts[0].id, []).append(ast.Subscript(value=value, slice=ast.Constant(0)))

    def collect(self, body: list[ast.stmt], scope: Scope) -> None:
        """Bind every assignment of this scope (not of nested functions or classes)."""
        todo = list(body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self.bind(target, node.value, scope)
            elif (isinstance(node, ast.AnnAssign) and node.value is not None) or isinstance(node, ast.NamedExpr):
                self.bind(node.target, node.value, scope)  # type: ignore[arg-type]
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension) and isinstance(node.target, ast.Name):
                scope.values.setdefault(node.target.id, []).append(ast.Subscript(value=node.iter, slice=ast.Constant(None)))
            elif isinstance(node, ast.With | ast.AsyncWith):
                for item in node.items:
                    if item.optional_vars is not None:
                        self.bind(item.optional_vars, item.context_expr, scope)
            todo.extend(ast.iter_child_nodes(node))  # type: ignore[arg-type]

    def visit_body(self, body: list[ast.stmt], scope: Scope, function: str, owner_class: str | None) -> None:
        self.collect(body, scope)
        todo: list[ast.AST] = list(body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = Scope(scope, node, owner_class)
                name = node.name if function == "<module>" else f"{function}.{node.name}"
                self.visit_body(node.body, inner, name, None)
                continue
            if isinstance(node, ast.ClassDef):
                cls = self.classes.get(node.name) if function == "<module>" else None
                name = node.name if function == "<module>" else f"{function}.{node.name}"
                self.visit_body(node.body, Scope(scope, None), name, cls)
                continue
            if isinstance(node, ast.Call):
                self.check_call(node, scope, function)
            elif isinstance(node, ast.JoinedStr):
                self.check_sql(node, scope, function)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                for table in SQL_WRITE_NAMED.findall(node.value):
                    if table in tables():
                        self.add(function, node, tables()[table], f"SQL on {table}")
            todo.extend(ast.iter_child_nodes(node))

    def add(self, function: str, node: ast.AST, model: str, how: str, columns: tuple[str, ...] = ()) -> None:
        self.writes.append(Write(self.module, function, getattr(node, "lineno", 0), model, how, columns))

    def check_call(self, node: ast.Call, scope: Scope, function: str) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            for model, kind in self.kinds(func.value, scope):
                if (kind == "queryset" and func.attr in QS_WRITES) or (kind == "instance" and func.attr in INSTANCE_WRITES):
                    columns = tuple(k.arg for k in node.keywords if k.arg) if func.attr == "update" else ()
                    self.add(function, node, model, f"{ast.unparse(func)}(...)", columns)
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        via = func.value if isinstance(func, ast.Attribute) else None
        if name in STATEMENT_WRITES and node.args and (via is None or (isinstance(via, ast.Name) and via.id == "statements")):
            for model, kind in self.kinds(node.args[0], scope):
                if kind == "instance":
                    self.add(function, node, model, f"statements.{name}({ast.unparse(node.args[0])})")

    def check_sql(self, node: ast.JoinedStr, scope: Scope, function: str) -> None:
        text = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                text += str(part.value)
                for table in SQL_WRITE_NAMED.findall(str(part.value)):
                    if table in tables():
                        self.add(function, node, tables()[table], f"SQL on {table}")
            elif isinstance(part, ast.FormattedValue):
                if keyword := SQL_WRITE.search(text):
                    for model in self.tables(part.value, scope):
                        self.add(function, node, model, f"SQL {keyword.group(0).strip()} {{{ast.unparse(part.value)}}}")
                text += "{}"


@cache
def writes() -> tuple[Write, ...]:
    found: list[Write] = []
    for name, tree in modules().items():
        found += Scanner(name, tree).scan()
    return tuple(found)


@cache
def part_writes() -> tuple[Write, ...]:
    """A part that writes, built in an app's ``queries.py`` (an INSERT's text, a ``statements.Part``),
    writes where another module's statement takes it: each call of it from another module is
    that module's write of the part's model (the part's own app runs its own statements)."""
    parts: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for w in writes():
        if w.module.endswith(".queries"):
            parts.setdefault((w.module, w.function.split(".")[0]), set()).add((w.model, w.how))
    found: list[Write] = []
    for name, tree in modules().items():
        aliases: dict[str, str] = {}  # a local name of a queries module
        functions: dict[str, tuple[str, str]] = {}  # a local name of a queries module's function
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if f"{node.module}.{alias.name}".endswith(".queries"):
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    elif node.module.endswith(".queries"):
                        functions[alias.asname or alias.name] = (node.module, alias.name)
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(function):
                if not isinstance(call, ast.Call):
                    continue
                f = call.func
                target = None
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
                    target = (aliases[f.value.id], f.attr)
                elif isinstance(f, ast.Name) and f.id in functions:
                    target = functions[f.id]
                if target is not None and target[0] != name:
                    for model, how in parts.get(target, ()):
                        found.append(Write(name, function.name, call.lineno, model, f"part {'.'.join(target)} ({how})"))
    return tuple(found)


def all_writes() -> tuple[Write, ...]:
    return writes() + part_writes()


def in_own_queries(write: Write, writers: dict[str, set[str]]) -> bool:
    """Statement text built in an app's ``queries.py`` for the app's own tables: the app's
    writer runs it (step 3: one ``queries.py`` per app holds its hand-built statements)."""
    app = write.module.split(".")[0]
    return write.module == f"{app}.queries" and any(w.split(".")[0] == app for w in writers)


def excepted(write: Write) -> bool:
    top = write.function.split(".")[0]
    return any(
        e.module == write.module and e.model == write.model and top in e.functions for e in EXCEPTIONS
    )


# --- the tests -----------------------------------------------------------------------------


def test_the_claims_are_read() -> None:
    """The claims this test checks are the ones the docstrings make: a module that names the
    phrase names at least one model, and a model has at most one writer per column claimed."""
    found = claims()
    assert len(found) > 40, sorted(found)
    assert set(found["TimelineEntry"]) == {"memory.timeline.entries"}
    assert set(found["Watch"]) == {"schedules.watches"}
    unnamed = []
    for name, tree in modules().items():
        if any(CLAIM.search(doc) for doc in claiming_docstrings(tree)) and not any(name in w for w in found.values()):
            unnamed.append(name)
    assert not unnamed, f"a claim that names no model (write ``Model``): {unnamed}"
    shared = {
        model: writers for model, writers in found.items()
        if len([w for w, columns in writers.items() if not columns]) > 1
    }
    assert not shared, f"more than one module claims the whole table: {shared}"


def test_models_name_their_writer() -> None:
    """"Written only by ``x``" in a model's docstring names a module that claims the model."""
    wrong = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in models() and (doc := ast.get_docstring(node)):
                for writer in WRITTEN_ONLY_BY.findall(doc):
                    module = module_of(writer)
                    doc_of_writer = ast.get_docstring(modules()[module]) or ""
                    if node.name not in doc_of_writer:
                        wrong.append(f"{name}.{node.name}: {writer}")
    assert not wrong, wrong


def test_only_the_writer_writes() -> None:
    """No module writes a table another module claims, but the listed exceptions."""
    found = claims()
    stray = []
    for write in all_writes():
        writers = found.get(write.model)
        if not writers or excepted(write) or in_own_queries(write, writers):
            continue
        if write.module in writers:
            claimed = writers[write.module]  # a claim of columns: only an UPDATE of those
            if not claimed or (write.columns and set(write.columns) <= claimed):
                continue
        stray.append(f"{write} (claimed by {', '.join(sorted(writers))})")
    assert not stray, "writes outside the claimed writer:\n" + "\n".join(stray)


def test_the_exceptions_are_documented_and_used() -> None:
    """An exception is named in docs/architecture.md or in the claiming module's docstring,
    and still happens (a stale one is removed)."""
    architecture = ARCHITECTURE.read_text(encoding="utf-8")
    found = claims()
    for e in EXCEPTIONS:
        docs = [architecture] + [ast.get_docstring(modules()[w]) or "" for w in found.get(e.model, {})]
        assert any(e.named in doc for doc in docs), f"{e} is not named in docs/architecture.md or the writer's docstring"
        assert any(w.module == e.module and w.model == e.model and w.function.split(".")[0] in e.functions for w in all_writes()), \
            f"{e} no longer writes"


def test_the_scanner_sees_writes() -> None:
    """The scanner finds the writers' own writes (so a silent scanner cannot pass the test)."""
    seen = {(w.module, w.model) for w in writes()}
    for expected in [
        ("schedules.watches", "WatchNotice"),  # the ORM's update (SQLite)
        ("schedules.queries", "WatchNotice"),  # hand-built UPDATE on _meta.db_table
        ("capabilities.services", "ToolCall"),  # statements.insert
        ("brain.services", "Run"),
        ("memory.timeline.entries", "TimelineCounter"),  # INSERT INTO {table}
        ("releases.services", "ReleaseEvent"),
    ]:
        assert expected in seen, expected
