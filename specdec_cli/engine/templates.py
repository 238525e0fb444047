"""Apply a GGUF's own chat template (Jinja) the way llama-cpp-python does, with bounds.

A chat template is code from a downloaded file. Jinja's sandbox blocks attribute
access to Python internals but not cost, so rendering here is also bounded:

- time: a trace function (every call, and every line of the template's own
  code) stops it after RENDER_SECONDS (a loop that emits nothing is still stopped);
- memory: the same trace function stops it once the process has grown by
  MEMORY_GROWTH bytes (string doubling in a loop);
- size: no single operation may build a string or list longer than MAX_CHARS
  (`'a' * 10**9`, `'x'|center(10**9)`, `'%999999999s' % x`, `replace('', s)`),
  no integer argument may exceed it, `**` is bounded, and the output is
  streamed and stopped at MAX_CHARS;
- depth: calls may nest MAX_NESTED_CALLS deep (a macro calling itself), whatever
  Python's recursion limit is (raised, as test runners and some applications
  do, C's stack would overflow first: a crash, not an error);
- every failure (syntax, a sandbox refusal, `1/0`, recursion, memory) becomes a
  `ChatTemplateError` naming the model file and suggesting `--raw`.
"""

from __future__ import annotations

import datetime
import functools
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

from specdec_cli.errors import SpecdecError, UnsupportedModelError

RENDER_SECONDS = 2.0
MEMORY_GROWTH = 256 * 2**20
MAX_CHARS = 4_000_000  # a rendered conversation longer than this fits no context we load
MAX_TEMPLATE_CHARS = 1_000_000  # real templates are a few kB (the largest known, with tool schemas, ~30 kB)
MAX_POWER = 4096  # bits a `**` result may have
MAX_NESTED_CALLS = 100  # real templates nest a few calls (a macro, a filter); each level is several C frames
_NESTING = threading.local()  # calls in progress in this thread's template (servers render in several threads)
_WIDTH = re.compile(r"(\d+)")


class ChatTemplateError(SpecdecError):
    """The model's chat template failed, refused, or exceeded a bound."""


class _Stop(Exception):
    """Raised inside the template by a bound; carries the reason."""


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


def _check_int(value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CHARS:
        raise _Stop(f"an argument of {value:,} is past the template bound ({MAX_CHARS:,})")


def _check_size(value: Any) -> Any:
    if _size(value) > MAX_CHARS:
        raise _Stop(f"a value of {_size(value):,} items is past the template bound ({MAX_CHARS:,})")
    return value


def _check_format(fmt: Any) -> None:
    """Widths and precisions in a format string ('%999999999s', '{:>999999999}')."""
    if isinstance(fmt, str):
        for m in _WIDTH.finditer(fmt):
            if len(m.group(1)) > 7 or int(m.group(1)) > MAX_CHARS:
                raise _Stop(f"a format width of {m.group(1)} is past the template bound ({MAX_CHARS:,})")


def _bounded_join(parts: tuple[Any, ...]) -> str:
    texts = [p if isinstance(p, str) else str(p) for p in parts]
    if sum(len(t) for t in texts) > MAX_CHARS:
        raise _Stop(f"a concatenation (~) is past the template bound ({MAX_CHARS:,})")
    return "".join(texts)


def _check_growth(name: str, owner: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a str method or filter would build, refused before it is built; returns the arguments to use."""
    if not isinstance(owner, str):
        if name in ("join", "do_join") and isinstance(owner, list | tuple):  # the join filter: (items, separator)
            sep = len(str(args[0])) if args else 0
            if len(owner) * max(sep, 1) > MAX_CHARS or sum(_size(x) for x in owner) > MAX_CHARS:
                raise _Stop("a join is past the template bound")
        return args
    if name in ("format", "do_format"):
        _check_format(owner)
    elif name in ("replace", "do_replace") and args:
        old, new = str(args[0]), str(args[1]) if len(args) > 1 else ""
        grown = len(owner) + (owner.count(old) if old else len(owner) + 1) * len(new)
        if grown > MAX_CHARS:
            raise _Stop(f"a replace building {grown:,} characters is past the template bound")
    elif name == "join" and args:  # str.join(items)
        items = list(args[0])
        if sum(_size(x) for x in items) + len(owner) * len(items) > MAX_CHARS:
            raise _Stop("a join is past the template bound")
        args = (items, *args[1:])
    return args


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose integer arguments, growth and result are bounded."""
    name = getattr(fn, "__name__", "")

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        for a in (*args, *kwargs.values()):
            _check_int(a)
        values = [a for a in args if not _is_context(a)]  # filters may take the eval context first
        if values:
            _check_growth(name, values[0], tuple(values[1:]))
        return _check_size(fn(*args, **kwargs))

    return call


def _is_context(value: Any) -> bool:
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(value, EvalContext | Context)


def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if _size(seq) and isinstance(n, int) and _size(seq) * n > MAX_CHARS:
                        raise _Stop(f"a repetition of {_size(seq) * n:,} items is past the bound ({MAX_CHARS:,})")
            elif operator == "**":
                if isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                    if right * max(abs(left).bit_length(), 1) > MAX_POWER:
                        raise _Stop(f"{left} ** {right} is past the template bound")
            elif operator == "+":
                if _size(left) + _size(right) > MAX_CHARS:
                    raise _Stop("a concatenation is past the template bound")
            elif operator == "%":
                _check_format(left)
            return _check_size(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            for a in (*args, *kwargs.values()):
                _check_int(a)
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, str):
                args = _check_growth(getattr(__obj, "__name__", ""), owner, args)
            depth = getattr(_NESTING, "depth", 0)
            if depth >= MAX_NESTED_CALLS:
                raise _Stop(f"its calls nest more than {MAX_NESTED_CALLS} deep")
            _NESTING.depth = depth + 1
            try:
                return _check_size(super().call(__context, __obj, *args, **kwargs))
            finally:
                _NESTING.depth = depth

        def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:  # str.format / format_map: the widths are known when it is looked up
                _check_format(value.__self__)
            return wrapped

    from jinja2.compiler import CodeGenerator

    class BoundedConcat(CodeGenerator):
        """`a ~ b` through a bounded join (string doubling in a loop is the cheapest way to fill memory)."""

        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.bounded_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    BoundedSandbox.code_generator_class = BoundedConcat
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    env.bounded_join = _bounded_join  # type: ignore[attr-defined]
    env.filters = {name: _guarded(fn) for name, fn in env.filters.items()}

    def raise_exception(message: str) -> Any:
        raise SpecdecError(f"the model's chat template refused the conversation: {message}")

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(str(fmt)[:256])
    return env


class _Budget:
    """The trace function: time and memory bounds on the template's own frames, read every `EVERY` events (a
    clock and /proc read on each was most of a short conversation's rendering time)."""

    EVERY = 64

    def __init__(self) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.base = _rss()
        self.count = 0

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Stop(f"rendering took more than {RENDER_SECONDS:g} s")
        if self.base is not None:
            now = _rss()
            if now is not None and now - self.base > MEMORY_GROWTH:
                raise _Stop(f"rendering used more than {MEMORY_GROWTH // 2**20} MB")

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        # Every call counts (a filter such as wordwrap runs Python code for a long time); only the template's
        # own frames are traced line by line (a loop that calls nothing). Between two reads at most EVERY
        # events run, each bounded in size (MAX_CHARS), so the bounds hold within a fraction of a second.
        self.count += 1
        if self.count >= self.EVERY:
            self.count = 0
            self.check()
        return self._local if frame.f_code.co_filename == "<template>" else None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.count += 1
        if self.count >= self.EVERY:
            self.count = 0
            self.check()
        return self._local


_STATM: dict[str, int] = {}


def _rss() -> int | None:
    """Resident memory now (Linux /proc), read without allocating much; None elsewhere."""
    try:
        fd = _STATM.get("fd")
        if fd is None:
            fd = _STATM["fd"] = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(fd, 64, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    return _environment().from_string(template)


def _bounded(fn: Callable[[], str]) -> str:
    budget = _Budget()
    previous = sys.gettrace()
    sys.settrace(budget.trace)
    try:
        return fn()
    finally:
        sys.settrace(previous)


def render(
    template: str | None,
    messages: Sequence[Mapping[str, str]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    source: str = "the model",
) -> str:
    """The conversation as the template writes it; `source` (the model file) names the culprit in errors."""
    if not template:
        raise UnsupportedModelError(
            "this model has no chat template in its GGUF metadata (a base model?): pass --raw to feed the prompt as is"
        )

    def fail(reason: str) -> ChatTemplateError:
        return ChatTemplateError(
            f"the chat template in {source} failed: {reason}; pass --raw to feed the prompt without it"
        )

    if len(template) > MAX_TEMPLATE_CHARS:
        raise fail(f"it is {len(template):,} characters long (the bound is {MAX_TEMPLATE_CHARS:,})")

    def run() -> str:
        compiled = _compile(template)
        parts: list[str] = []
        total = 0
        for piece in compiled.generate(
            messages=[dict(m) for m in messages],
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        ):
            total += len(piece)
            if total > MAX_CHARS:
                raise _Stop(f"its output passed {MAX_CHARS:,} characters")
            parts.append(piece)
        return "".join(parts)

    try:
        return _bounded(run)
    except SpecdecError:
        raise
    except _Stop as exc:
        raise fail(str(exc)) from None
    except RecursionError:
        raise fail("it recursed too deeply") from None
    except MemoryError:
        raise fail("it ran out of memory") from None
    except Exception as exc:  # any error a template can raise: syntax, sandbox, 1/0, overflow, type errors
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise fail(f"{type(exc).__name__}{': ' + text if text else ''}") from None
