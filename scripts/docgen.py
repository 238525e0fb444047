"""The generated parts of the docs: written by the code they describe, checked by the test suite.

    .venv/bin/python scripts/docgen.py           regenerate every generated block in README.md and docs/
    .venv/bin/python scripts/docgen.py --check   exit 1 when a block is stale (tests/test_docs.py runs this)

The pages hold cog blocks (cogapp, as llm's docs do): `<!-- [[[cog ... ]]] -->` code, its output, then
`<!-- [[[end]]] -->`. The code calls the functions below (the CLI reference from the Typer app, the
error tables from errors.py, the Python API's signatures, the server's request fields from its pydantic
models) and benchmarks/report.py (the benchmark tables, from results files in docs/results/).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "CHANGELOG.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
PROLOGUE = "import docgen; from benchmarks import report, report_gpu"


def cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------ the CLI reference
def _commands() -> Iterator[tuple[str, Any, Any]]:
    """(path, command, its click context) for every command, depth first, in registration order."""
    import typer

    from specdec_cli.cli import app

    root = typer.main.get_command(app)
    click = typer.core._click

    def walk(cmd: Any, path: str, parent: Any) -> Iterator[tuple[str, Any, Any]]:
        ctx = click.Context(cmd, info_name=path.rsplit(" ", 1)[-1], parent=parent)
        yield path, cmd, ctx
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, f"{path} {name}", ctx)

    yield from walk(root, "specdec", None)


def cli_reference() -> str:
    """Every command: what it does, its usage line, and its arguments and options by panel."""
    out = []
    for path, cmd, ctx in _commands():
        depth = path.count(" ")
        if depth == 0:
            continue
        out.append(f"{'#' * (depth + 1)} `{path}`\n")
        out.append(inspect.cleandoc(cmd.help or "") + "\n")
        if getattr(cmd, "commands", None):
            out.append("Commands: " + ", ".join(f"`{path} {n}`" for n in cmd.commands) + ".\n")
            continue
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        out.append(f"```\n{path} {usage}\n```\n")
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in cmd.params:
            record = param.get_help_record(ctx)
            if record is None or getattr(param, "hidden", False):
                continue
            panel = "Arguments" if param.param_type_name == "argument" else (param.rich_help_panel or "Options")
            panels.setdefault(panel, []).append(record)
        for panel, records in panels.items():
            out.append(f"| {panel} | |\n|---|---|")
            out.append("\n".join(f"| `{cell(opts)}` | {cell(help_)} |" for opts, help_ in records) + "\n")
    return "\n".join(out)


# ------------------------------------------------------------------ errors.py's table
def exit_codes() -> str:
    """ExitCode's members with the comment errors.py gives each."""
    from specdec_cli import errors

    source = inspect.getsource(errors.ExitCode)
    meaning = dict(re.findall(r"^\s+(\w+) = \d+\s+#\s*(.+)$", source, flags=re.M))
    rows = [f"| {int(c)} | `{c.name}` | {cell(meaning.get(c.name, ''))} |" for c in errors.ExitCode]
    return "| exit code | name | when |\n|---|---|---|\n" + "\n".join(rows) + "\n"


def error_classes() -> str:
    """Each error class: when it is raised, the CLI's exit code, the server's answer."""
    from specdec_cli import errors

    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SpecdecError)]
    rows = []
    for c in classes:
        bases = ", ".join(b.__name__ for b in c.__bases__ if b is not Exception)
        what = inspect.cleandoc(c.__doc__ or "")
        rows.append(f"| `{c.__name__}` | {cell(bases)} | {cell(what)} | {int(c.exit_code)} | {c.http_status} | "
                    f"`{c.http_type}` | {f'`{c.http_code}`' if c.http_code else ''} | "
                    f"{f'`{c.http_param}`' if c.http_param else ''} |")  # fmt: skip
    header = "| class | is a | raised for | exit code | HTTP status | error type | error code | param |\n"
    return header + "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"


# ------------------------------------------------------------------ the Python API
def _param(p: inspect.Parameter) -> str:
    """One parameter as the source writes it (an enum default as its value)."""
    if isinstance(p.default, enum.Enum):
        p = p.replace(default=p.default.value)
    return str(p).replace("'", "") if p.default is inspect.Parameter.empty or not isinstance(p.default, str) else (
        str(p.replace(default=inspect.Parameter.empty)).replace("'", "") + f" = {p.default!r}")


def signature(fn: Callable[..., Any], name: str | None = None) -> str:
    """`name(params) -> return`, as the source writes the annotations (a bare `*` before keyword-only
    parameters), wrapped for reading."""
    sig = inspect.signature(fn)
    params: list[str] = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in params and not any(x.startswith("*") for x in params):
            params.append("*")
        params.append(_param(p))
    ret = "" if sig.return_annotation is inspect.Signature.empty else f" -> {sig.return_annotation}"
    name = name or fn.__name__
    one = f"{name}({', '.join(params)}){ret}"
    if len(one) <= 100:
        return one
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){ret}"


def doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "")


def api_reference() -> str:
    """The API's entry points with their signatures and docstrings, and the fields of what they return."""
    from specdec_cli import api, generation
    from specdec_cli.engine.settings import GenerateOptions, flag

    parts = [f"### `api.load`\n\n```python\n{signature(api.load, 'api.load')}\n```\n\n{doc(api.load)}\n"]
    for name in ("generate", "stream", "start", "tokenize", "close"):
        fn = getattr(api.Speculator, name)
        parts.append(f"### `Speculator.{name}`\n\n```python\n{signature(fn, name)}\n```\n\n{doc(fn)}\n")
    rows = [f"| `{f.name}` | `{cell(str(f.type))}` | `{f.default!r}` | {f'`{flag(f.name)}`' if flag(f.name) != f.name else ''} |"
            for f in dataclasses.fields(GenerateOptions)]  # fmt: skip
    parts.append("### `GenerateOptions`: the keywords of `generate`, `stream` and `start`\n\n" + doc(GenerateOptions)
                 + "\n\n| keyword | type | default | command-line flag |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")
    for cls in (generation.Generation, generation.Chunk, generation.GenerationRun):
        if dataclasses.is_dataclass(cls):
            fields = [f"`{f.name}`: `{f.type}`" for f in dataclasses.fields(cls)]
        else:  # its properties and methods, each with its docstring's first line
            fields = [f"`{n}{'()' if inspect.isfunction(v) else ''}`: {doc(v).splitlines()[0] if doc(v) else ''}"
                      for n, v in vars(cls).items() if not n.startswith("_") and (inspect.isfunction(v)
                                                                               or isinstance(v, property))]
        parts.append(f"### `{cls.__name__}`\n\n{doc(cls)}\n\n" + "\n".join(f"- {f}" for f in fields) + "\n")
    return "\n".join(parts)


# ------------------------------------------------------------------ the server's request fields
def request_fields() -> str:
    """The fields of the two request bodies (pydantic models), with their types and defaults."""
    from specdec_cli.engine.settings import DrafterKind
    from specdec_cli.server import schemas

    def rows(model: Any, prefix: str = "") -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            ann = str(f.annotation).replace("typing.", "").replace("specdec_cli.server.schemas.", "")
            ann = re.sub(r"<class '(\w+)'>", r"\1", ann).replace("specdec_cli.engine.settings.", "")
            ann = ann.replace("DrafterKind", " | ".join(f'"{k.value}"' for k in DrafterKind))
            default = "required" if f.is_required() else repr(f.default)
            out.append(f"| `{prefix}{name}` | `{cell(ann)}` | {cell(default)} |")
        return out

    body = []
    for title, model in (("`POST /v1/chat/completions`", schemas.ChatRequest),
                         ("`POST /v1/completions`", schemas.CompletionRequest)):  # fmt: skip
        body.append(f"{title}\n\n| field | type | default |\n|---|---|---|\n" + "\n".join(rows(model)) + "\n")
    body.append("Nested: `messages[]`\n\n| field | type | default |\n|---|---|---|\n"
                + "\n".join(rows(schemas.Message)) + "\n")  # fmt: skip
    body.append("`speculative` (specdec's extension)\n\n| field | type | default |\n|---|---|---|\n"
                + "\n".join(rows(schemas.Speculative)) + "\n")  # fmt: skip
    return "\n".join(body)


# ------------------------------------------------------------------ running cog
def main(argv: list[str]) -> int:
    from cogapp import Cog

    check = "--check" in argv
    args = ["cog", "-U", "-I", str(ROOT / "scripts"), "-I", str(ROOT), "-p", PROLOGUE]
    args += ["--check", "--diff", "--check-fail-msg=run `.venv/bin/python scripts/docgen.py`"] if check else ["-r"]
    sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
    return int(Cog().main([*args, *(str(ROOT / p) for p in PAGES)]) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
