"""Vet a torch.export archive (.pt2) before and while torch loads it: nothing in it may be unpickled or run.

``torch.export.load`` does more than read tensors. It unpickles weights and constants whose payload config says
``use_pickle`` (``torch.load(weights_only=False)``), script and opaque objects (``torch._C._pickle_load_obj``,
``pickle.loads``), and the sample inputs and legacy-format blobs with a weights-only load that falls back to a
full unpickle when that fails. It also evaluates text from the program's JSON as Python: symbolic-shape
expressions go through ``sympy.sympify`` (``eval``), ``guards_code`` is ``exec``'d by ``program.module()``, node
targets are looked up as attributes of ``torch``/``operator``/``math`` and called, and names become generated
source code. AOTInductor entries load native libraries.

Two lines of defence, both skipped when the user trusts the file (``--trust-pickle``):

* :func:`check_archive` reads entry names, JSON configs and pickle opcodes with :mod:`zipfile` and
  :mod:`pickletools` (never unpickling anything) and refuses, naming the entry, whatever would be unpickled or
  run. A pickle torch loads weights-only first is accepted only when every global it references is on torch's
  weights-only allow-list, so that load cannot fail over to a full unpickle.
* :func:`guard_load` wraps the load: ``torch.load`` is forced to ``weights_only=True``; ``pickle.load(s)``,
  ``torch._C._pickle_load_obj`` and the AOTInductor loader raise; ``sympy.sympify`` refuses unsafe text.
  :func:`check_program` then vets the loaded program's call targets and guard code before ``module()`` runs.

Torch's own logging during the load is captured, so a failing file yields one line of text. The guard and the capture
act in the loading thread only (:mod:`gleak.models.thread_scope`): the other threads of a host program that imports
gleak keep unpickling and logging undisturbed.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import math
import operator
import pickle
import pickletools
import re
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from gleak.errors import GleakError, shorten
from gleak.io import show
from gleak.models.thread_scope import Override, logs_captured, overridden, warnings_dropped

MAX_JSON_BYTES = 256 * 1024 * 1024
MAX_BLOB_BYTES = 4 * 1024 * 1024 * 1024  # sample inputs and legacy blobs read whole for inspection
MAX_EXPRESSION_CHARS = 10_000
REFUSE = "refusing to load it without --trust-pickle"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*\Z")  # FQNs, node and argument names: nothing that could end a literal
_WORD = re.compile(r"\w+\Z", re.ASCII)
_SYMBOL = re.compile(r"[a-z]+[0-9]+\Z")  # sympy symbols torch creates: s0, u3, zuf1, ...
_FREE_TEXT = frozenset({"metadata", "as_string", "as_strings", "torch_version"})  # kept as data, never code
_SYMPY_CONSTANTS = frozenset({"oo", "zoo", "nan", "true", "false", "True", "False", "None", "E", "pi", "I"})
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_OPERATOR_TARGETS = frozenset({
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne", "lt", "le", "gt",
    "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift", "getitem", "truth",
})
_TORCH_SYM_TARGET = re.compile(r"_?sym_[a-z_]+\Z")
_OP_PART = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*\Z")
_PICKLE_GLOBAL_OPS = frozenset({"STACK_GLOBAL", "INST", "OBJ", "EXT1", "EXT2", "EXT4"})


class UnsafeArchiveError(GleakError):
    """The archive holds something that loading would unpickle or execute."""


# --------------------------------------------------------------------------- static inspection


def check_archive(path: Path) -> None:
    """Refuse (GleakError naming the entry) a .pt2 whose loading would unpickle or execute anything."""
    where = show(path)
    try:
        with zipfile.ZipFile(path) as zf:
            _Inspector(zf, where).run(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:  # truncated or garbled zip structures
        raise GleakError(f"{where} is not a readable torch.export archive: {type(exc).__name__}: "
                         f"{shorten(str(exc), 120)}") from None


@dataclass
class _Inspector:
    """Walks the entries torch.export.load would read. torch's zip reader finds entries case-insensitively, so
    lookups here do too (names differing only in case are refused outright)."""

    zf: zipfile.ZipFile
    where: str
    names: list[str] = field(default_factory=list)
    by_lower: dict[str, str] = field(default_factory=dict)

    def refuse(self, entry: str, problem: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"{self.where}: entry {entry!r} {problem}; {REFUSE}")

    def missing(self, entry: str, what: str = "") -> GleakError:
        return GleakError(f"{self.where}: entry {entry!r}{what} is missing; the archive is incomplete")

    def find(self, name: str) -> str | None:
        return self.by_lower.get(name.lower())

    def read(self, entry: str, limit: int) -> bytes:
        size = self.zf.getinfo(entry).file_size
        if size > limit:
            raise GleakError(f"{self.where}: entry {entry!r} is {size:,} bytes; at most {limit:,} are read")
        return self.zf.read(entry)

    def run(self, path: Path) -> None:
        self.names = self.zf.namelist()
        self.by_lower = {n.lower(): n for n in self.names}
        if len(self.by_lower) != len(self.names):
            dup = next(n for n in self.names if [m.lower() for m in self.names].count(n.lower()) > 1)
            raise UnsafeArchiveError(f"{self.where}: the archive has several entries named {dup!r} (torch and "
                                     f"Python's zipfile could read different ones); {REFUSE}")
        if self.find("version") is not None:  # torch.export.load's fallback for the pre-2.7 format
            self.check_legacy()
        root = self.names[0].split("/", 1)[0] + "/" if self.names and "/" in self.names[0] else None
        if root is not None and self.find(root + "archive_version") is not None:
            self.check_pt2(path, root)

    # ------------------------------------------------------------------ current format
    def check_pt2(self, path: Path, root: str) -> None:
        outside = [n for n in self.names if not n.lower().startswith(root.lower())]
        if outside:
            raise self.refuse(outside[0], f"lies outside the archive folder {root!r}")
        self.cross_check(path, root)
        rel = {n[len(root):].lower(): n for n in self.names}
        aoti = [n for r, n in rel.items() if r.startswith("data/aotinductor/")]
        if aoti:
            raise self.refuse(aoti[0], "is AOTInductor-compiled native code, which loading would run")
        for r in sorted(r for r in rel if r.startswith("models/")):
            model = rel[r][len(root) + len("models/"):-len(".json")]  # torch cuts the suffix whatever it is
            self.check_program_json(rel[r])
            sample = f"{root}data/sample_inputs/{model}.pt"
            self.check_torch_save(self.find(sample), sample, required=True)
            for kind in ("weights", "constants"):
                legacy = self.find(f"{root}data/{kind}/{model}.pt")
                if legacy is not None:
                    self.check_torch_save(legacy, legacy, required=True)
                else:
                    self.check_payloads(root, kind, model)

    def cross_check(self, path: Path, root: str) -> None:
        """torch reads the archive with its own zip reader: both must see the same entries."""
        try:  # torch internal: the zip reader torch.export.load itself uses (a differential to rule out)
            reader = torch._C.PyTorchFileReader(str(path))
            theirs = set(reader.get_all_records())
        except Exception:  # torch cannot open it either; loading fails before reading anything
            return
        ours = {n[len(root):] for n in self.names}
        if theirs != ours:
            differ = sorted(theirs ^ ours)
            raise self.refuse(root + differ[0], "is seen by torch's zip reader but not by Python's zipfile "
                                                "(or the reverse)")

    def check_payloads(self, root: str, kind: str, model: str) -> None:
        config_label = f"{root}data/{kind}/{model}_{kind}_config.json"
        config_entry = self.find(config_label)
        if config_entry is None:
            raise self.missing(config_label)
        config = self.read_json(config_entry)
        config = config.get("config") if isinstance(config, dict) else None
        if not isinstance(config, dict):
            raise GleakError(f"{self.where}: entry {config_entry!r} has no 'config' object")
        for fqn, meta in config.items():
            if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
                raise GleakError(f"{self.where}: entry {config_entry!r}: {kind} {fqn!r} has no path_name")
            expected = f"{root}data/{kind}/{meta['path_name']}"
            entry = self.find(expected) or expected
            if not _NAME.match(fqn):
                raise self.refuse(config_entry, f"names a {kind[:-1]} {shorten(repr(fqn), 60)}, which is not a "
                                                "plain dotted name")
            if meta.get("use_pickle"):
                raise self.refuse(entry, "is a pickle (use_pickle)")
            if meta["path_name"].startswith(("custom_obj_", "opaque_obj_")):
                raise self.refuse(entry, "is a pickled Python or TorchScript object")
            if self.find(expected) is None:
                raise self.missing(expected, f" ({kind[:-1]} {fqn!r})")

    # ------------------------------------------------------------------ pre-2.7 format
    def check_legacy(self) -> None:
        program = self.find("serialized_exported_program.json")
        if program is not None:
            self.check_program_json(program)
        for name in ("serialized_state_dict", "serialized_constants", "serialized_example_inputs"):
            for suffix in (".pt", ".json"):  # both are handed to a load that may fall back to a full unpickle
                entry = self.find(name + suffix)
                if entry is not None:
                    self.check_torch_save(entry, entry, required=False)

    # ------------------------------------------------------------------ pickles
    def check_torch_save(self, entry: str | None, label: str, required: bool) -> None:
        """``entry`` must be empty or a torch.save zip whose data.pkl only references weights-only globals."""
        if entry is None:
            if required:
                raise self.missing(label)
            return
        data = self.read(entry, MAX_BLOB_BYTES)
        if not data:
            return
        problem = torch_save_problem(data)
        if problem is not None:
            raise self.refuse(entry, problem)

    # ------------------------------------------------------------------ program JSON
    def read_json(self, entry: str) -> Any:
        try:
            return json.loads(self.read(entry, MAX_JSON_BYTES))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise GleakError(f"{self.where}: entry {entry!r} is not valid JSON ({type(exc).__name__})") from None

    def check_program_json(self, entry: str) -> None:
        problem = program_json_problem(self.read_json(entry))
        if problem is not None:
            raise self.refuse(entry, problem)


def torch_save_problem(data: bytes) -> str | None:
    """Why a weights-only ``torch.load`` of ``data`` could fail over to a full unpickle, or None."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = zf.namelist()
            lowered = [n.lower() for n in names]
            roots = {n.split("/", 1)[0] for n in names}
            if len(set(lowered)) != len(lowered) or len(roots) != 1 or not all("/" in n for n in names):
                return "is a torch.save archive with an ambiguous layout"
            root = roots.pop()
            if f"{root}/constants.pkl" in names or any(n.startswith(f"{root}/code/") for n in names):
                return "is a TorchScript archive, not torch.save data"
            if f"{root}/data.pkl" not in names:
                return "is a torch.save archive without data.pkl"
            pickled = zf.read(f"{root}/data.pkl")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return "is a pickle, not a torch.save zip archive"
    problem = pickle_problem(pickled)
    return None if problem is None else f"holds a pickle that {problem}"


def pickle_problem(data: bytes) -> str | None:
    """Why torch's weights-only unpickler would refuse ``data`` for its globals, or None (opcodes only)."""
    allowed = _weights_only_globals()
    try:
        for opcode, arg, _pos in pickletools.genops(data):
            if opcode.name == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                if f"{module}.{name}" not in allowed:
                    return f"references {shorten(module + '.' + name, 80)}, which weights-only loading refuses"
            elif opcode.name in _PICKLE_GLOBAL_OPS:
                return f"uses the {opcode.name} opcode, which weights-only loading refuses"
    except Exception as exc:  # pickletools raises ValueError and friends on malformed input
        return f"is not a well-formed pickle ({type(exc).__name__})"
    return None


def _weights_only_globals() -> set[str]:
    """Globals torch's weights-only unpickler accepts (its defaults and those the user marked safe)."""
    try:  # torch internal: the allow-list itself is not public (torch.serialization only adds to it)
        from torch import _weights_only_unpickler as wo

        allowed = set(wo._get_allowed_globals())
        return allowed | set(wo._get_user_allowed_globals())  # type: ignore[no-untyped-call]  # torch: no hints
    except (ImportError, AttributeError):  # a torch without this helper: accept no globals at all
        return set()


# --------------------------------------------------------------------------- the program's JSON


def program_json_problem(doc: Any) -> str | None:
    """Why a serialized ExportedProgram (models/*.json) would run code when loaded, or None."""
    try:
        return _walk(doc, "", 0)
    except RecursionError:
        return "is nested too deeply"


def _walk(value: Any, key: str, depth: int) -> str | None:
    if depth > 200:
        return "is nested too deeply"
    if key in _FREE_TEXT:
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            # range constraints are keyed by symbolic expressions ('2*s0'), which are only looked up
            if not (sympy_text_safe(k) if key == "range_constraints" else _NAME.match(k)):
                return f"has a key {shorten(repr(k), 60)} that is not a plain name"
            problem = _walk(v, k, depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        for v in value:
            problem = _walk(v, key, depth + 1)
            if problem:
                return problem
        return None
    if not isinstance(value, str):
        return None
    if key in ("target", "as_operator"):
        return None if target_allowed(value) else (
            f"calls {shorten(repr(value), 80)}, which is not a PyTorch operator")
    if key == "expr_str" and not sympy_text_safe(value):
        return f"has a shape expression {shorten(repr(value), 80)} that is not plain arithmetic"
    if key == "guards_code" and not guard_text_safe(value):
        return f"has guard code {shorten(repr(value), 80)} that is not a plain shape check"
    if key in ("expr_str", "guards_code"):
        return None
    if key == "class_fqn":
        return f"uses the custom class {shorten(repr(value), 60)} (a TorchScript object)"
    if key in ("in_spec", "out_spec"):
        return _treespec_problem(value)
    if not _NAME.match(value):
        return f"has a {key or 'value'} {shorten(repr(value), 60)} that is not a plain name"
    return None


def _treespec_problem(text: str) -> str | None:
    """Pytree specs are JSON; their dict keys end up in generated source code, so they must be plain names."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return "has a pytree spec that is not JSON"
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            context = item.get("context")
            if isinstance(context, str):
                try:
                    stack.append({"_keys": json.loads(context)})
                except (json.JSONDecodeError, RecursionError):
                    return "has a pytree spec whose context is not JSON"
            stack.extend(v for k, v in item.items() if k != "context")
        elif isinstance(item, str) and not _NAME.match(item):
            return f"has a pytree key {shorten(repr(item), 60)} that is not a plain name"
    return None


def target_allowed(target: str) -> bool:
    """Whether a serialized call target is a PyTorch operator or one of the plain symbolic-shape helpers."""
    parts = target.split(".")
    if parts[:2] == ["torch", "ops"]:
        return 4 <= len(parts) <= 5 and all(_OP_PART.match(p) for p in parts[2:])
    if len(parts) == 2 and parts[0] == "_operator":
        return parts[1] in _OPERATOR_TARGETS
    if len(parts) == 2 and parts[0] == "math":
        return not parts[1].startswith("_") and callable(getattr(math, parts[1], None))
    if len(parts) == 2 and parts[0] == "torch":
        return bool(_TORCH_SYM_TARGET.match(parts[1]))
    return False


@cache
def _sympy_classes() -> frozenset[str]:
    """Names of the symbolic classes expressions may construct (``Mul(Integer(2), Symbol('s0'))``): sympy's and
    torch's sympy.Basic subclasses. Classes only; sympy's functions (sympify, S, lambdify, ...) evaluate text."""
    try:
        import sympy
        import torch.utils._sympy.functions as functions  # torch internal: the sympy classes its shapes use
    except ImportError:
        return frozenset()
    found: set[str] = set()
    for namespace in (vars(sympy), vars(functions)):
        found.update(n for n, v in namespace.items()
                     if isinstance(v, type) and issubclass(v, sympy.Basic) and not n.startswith("_"))
    return frozenset(found)


def sympy_text_safe(text: str) -> bool:
    """Whether ``text`` is plain symbolic arithmetic: symbolic classes, symbols, numbers and operators."""
    return _expression_safe(text, lambda n: n in _SYMPY_CONSTANTS or bool(_SYMBOL.match(n)), _sympy_classes(),
                            False)


def guard_text_safe(text: str) -> bool:
    """Whether guard code is a plain shape check such as ``L['x'].size()[0] <= 64``."""
    calls = _sympy_classes() | {"IsNonOverlappingAndDenseIndicator"}
    return _expression_safe(text, lambda n: n in ("L", "inf", "True", "False"), calls, True)


def _expression_safe(text: str, name_ok: Callable[[str], bool], calls: frozenset[str],
                     guard: bool) -> bool:
    if len(text) > MAX_EXPRESSION_CHARS:
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return False
    allowed_nodes = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Constant, ast.Name,
                     ast.Tuple,
                     ast.Call, ast.keyword, ast.Load, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
                     *((ast.Subscript, ast.Attribute) if guard else ()))
    for node in ast.walk(tree):
        if not isinstance(node, allowed_nodes) or isinstance(node, (ast.In, ast.NotIn, ast.Is, ast.IsNot)):
            return False
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str) and not _WORD.match(node.value):
                return False
            if not isinstance(node.value, (str, int, float, bool, type(None))):
                return False
        elif isinstance(node, ast.Call):
            if not _call_allowed(node.func, calls, guard) or any(k.arg is None for k in node.keywords):
                return False
        elif isinstance(node, ast.Attribute):
            if not _attribute_allowed(node):
                return False
        elif isinstance(node, ast.Name) and not (name_ok(node.id) or node.id in calls or
                                                 (guard and node.id == "math")):
            return False
    return True


def _call_allowed(func: ast.expr, calls: frozenset[str], guard: bool) -> bool:
    if isinstance(func, ast.Name):
        return func.id in calls
    return guard and isinstance(func, ast.Attribute) and _attribute_allowed(func)


def _attribute_allowed(node: ast.Attribute) -> bool:
    if node.attr.startswith("_"):
        return False
    if isinstance(node.value, ast.Name) and node.value.id == "math":
        return callable(getattr(math, node.attr, None))
    return node.attr in _GUARD_METHODS and isinstance(node.value, ast.Subscript)


# --------------------------------------------------------------------------- the loaded program


def check_program(program: Any, path: Path) -> None:
    """Refuse a loaded ExportedProgram whose graph calls non-operators or whose guard code is not a shape check
    (checked before ``program.module()`` turns them into code)."""
    where = show(path)
    for gm in program.graph_module.modules():
        graph = getattr(gm, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op == "call_function" and not _callable_allowed(node.target):
                raise UnsafeArchiveError(f"{where}: node {node.name!r} calls {shorten(repr(node.target), 80)}, "
                                         f"which is not a PyTorch operator; {REFUSE}")
    # torch internal: the guard code program.module() exec's has no public accessor
    for code in getattr(program, "_guards_code", None) or []:
        if not guard_text_safe(code):
            raise UnsafeArchiveError(f"{where}: guard code {shorten(repr(code), 80)} is not a plain shape check; "
                                     f"{REFUSE}")


def _callable_allowed(target: Any) -> bool:
    # torch internal: the operator classes are only exposed through torch._ops
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator)):
        return True
    module, name = getattr(target, "__module__", None), getattr(target, "__name__", "")
    if module in ("_operator", "operator"):
        return name in _OPERATOR_TARGETS and getattr(operator, name, None) is target
    if module == "math":
        return getattr(math, name, None) is target
    return bool(_TORCH_SYM_TARGET.match(name)) and getattr(torch, name, None) is target


# --------------------------------------------------------------------------- guarding the load itself


@dataclass
class LoadGuard:
    """What happened while torch loaded: the first refusal, and torch's captured log records."""

    path: Path
    refused: UnsafeArchiveError | None = None
    records: list[logging.LogRecord] = field(default_factory=list)

    def refuse(self, what: str) -> UnsafeArchiveError:
        if self.refused is None:
            self.refused = UnsafeArchiveError(f"{show(self.path)}: loading tried to {what}; {REFUSE}")
        return self.refused

    def cause(self, exc: BaseException) -> BaseException:
        """The error behind ``exc``: a refusal, else the first exception torch logged, else ``exc``."""
        if self.refused is not None:
            return self.refused
        for record in self.records:
            if record.exc_info and record.exc_info[1] is not None:
                return record.exc_info[1]
        return exc


@contextmanager
def guard_load(path: Path, trusted: bool) -> Iterator[LoadGuard]:
    """Run a torch.export load inside: what torch logs or warns from this thread is captured (nothing reaches stderr)
    and, unless ``trusted``, every unpickling or unsafe evaluation entry point raises instead of running.

    Both act in the calling thread only (:mod:`gleak.models.thread_scope`): a host program's other threads keep
    unpickling, loading and logging as before while gleak vets a file."""
    guard = LoadGuard(path)
    overrides: list[Override] = [warnings_dropped()]
    if not trusted:
        overrides += _safe_replacements(guard)
    with logs_captured(guard.records), overridden(overrides):
        yield guard


def _safe_replacements(guard: LoadGuard) -> list[Override]:
    """The entry points through which torch.export.load could unpickle, evaluate or load native code. Torch has no
    public hook for what its loader may run, so two of them are torch internals: ``torch._C._pickle_load_obj``
    (TorchScript and opaque objects), ``pt2_archive._package._load_aoti`` (AOTInductor libraries); each is covered
    by tests/test_model_formats.py (payload tests) and checked to exist by tests/test_public_api.py."""

    def load(original: Callable[..., Any]) -> Callable[..., Any]:
        def weights_only(f: Any, *args: Any, weights_only: bool | None = None, **kwargs: Any) -> Any:
            if weights_only is False:
                raise guard.refuse("unpickle data with torch.load(weights_only=False)")
            return original(f, *args, weights_only=True, **kwargs)
        return weights_only

    def refuse(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def refused(*_args: Any, **_kwargs: Any) -> Any:
                raise guard.refuse(what)
            return refused
        return make

    out: list[Override] = [
        (torch, "load", load),
        (pickle, "loads", refuse("unpickle an object with pickle.loads")),
        (pickle, "load", refuse("unpickle an object with pickle.load")),
        # torch internal: the C++ unpickler of TorchScript/opaque objects, which torch.export.load calls directly
        (torch._C, "_pickle_load_obj", refuse("unpickle a TorchScript object")),
    ]
    try:  # torch internal: the AOTInductor loader (native code) of torch.export.load
        from torch.export.pt2_archive import _package

        if hasattr(_package, "_load_aoti"):  # torch internal (above); older torch loads AOTI elsewhere
            out.append((_package, "_load_aoti", refuse("load AOTInductor native code")))
    except ImportError:
        pass
    try:
        import sympy

        def sympify(original: Callable[..., Any]) -> Callable[..., Any]:
            def checked(a: Any, *args: Any, **kwargs: Any) -> Any:
                if isinstance(a, str) and not sympy_text_safe(a):
                    raise guard.refuse(f"evaluate the expression {shorten(repr(a), 80)}")
                return original(a, *args, **kwargs)
            return checked

        out.append((sympy, "sympify", sympify))
    except ImportError:
        pass
    return out
