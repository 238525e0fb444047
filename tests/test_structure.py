"""The package's shape: no import cycles (lazy imports included), one module imports llama.cpp's bindings,
no module over 400 lines."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import specdec_cli

ROOT = Path(specdec_cli.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, mods: dict[str, Path]) -> list[str]:
    """Every module an import anywhere in the file names (inside functions and TYPE_CHECKING too):
    `from package import module` names the module; `from module import name`, the module."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                      for a in node.names]  # fmt: skip
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_no_import_cycles() -> None:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for name in _imports(path, mods):
            if name in mods and name != mod:
                graph[mod].add(name)
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the cycle


def test_only_native_imports_the_bindings() -> None:
    mods = _modules()
    importers = {m for m, p in mods.items() if any(n.startswith("llama_cpp") for n in _imports(p, mods))}
    assert importers == {"specdec_cli.engine.native"}


def test_no_module_over_400_lines() -> None:
    sizes = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    assert {m: n for m, n in sizes.items() if n > 400} == {}


def test_every_error_has_one_exit_code_and_one_http_answer() -> None:
    """errors.py is the one table: the server answers each class from it (server/http_errors.py's `api_error`)."""
    from specdec_cli import errors
    from specdec_cli.server.http_errors import api_error

    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SpecdecError)]
    assert len(classes) >= 9
    for cls in classes:
        assert cls.exit_code in (errors.ExitCode.ERROR, errors.ExitCode.USAGE), cls
        api = api_error(cls("why"))
        assert (api.status, api.type, api.code, api.param) == (cls.http_status, cls.http_type, cls.http_code,
                                                                 cls.http_param)  # fmt: skip
        assert api.status == {errors.InternalError: 500, errors.RpcError: 503, errors.DeviceError: 503}.get(cls, 400), cls
    assert api_error(errors.ContextError("long")).code == "context_length_exceeded"
    assert api_error(errors.UsageError("bad")).code == "invalid_value"
    assert errors.UsageError.exit_code == 2 and errors.ModelFileError.exit_code == 1
