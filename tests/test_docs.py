"""The docs say what the code does: generated parts current, every module named, every file and link
real, every figure from a results file.

A figure a person typed into a page after a run goes stale the day the code changes; so the pages'
measured figures are rendered from results files (benchmarks/report.py, through cog blocks that
scripts/docgen.py runs), and prose outside those blocks may not carry one.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
COG_BLOCK = re.compile(r"\[\[\[cog.*?\[\[\[end\]\]\]", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def prose(page: Path) -> str:
    """A page without its generated blocks and code blocks: what a person wrote."""
    return FENCE.sub("", COG_BLOCK.sub("", text(page)))


def test_generated_parts_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        docgen = importlib.import_module("docgen")
        rc = docgen.main(["--check"])
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert rc == 0, "stale generated docs: run `.venv/bin/python scripts/docgen.py`\n" + capsys.readouterr().out


def test_the_architecture_page_names_every_module_and_no_other() -> None:
    page = text(ROOT / "docs" / "architecture.md")
    named = set(re.findall(r"`([\w/.-]+\.(?:py|sh))`", page))
    modules = {str(p.relative_to(ROOT / "specdec_cli")) for p in (ROOT / "specdec_cli").rglob("*.py")}
    modules |= {str(p.relative_to(ROOT)) for d in ("benchmarks", "scripts") for p in (ROOT / d).iterdir()
                if p.suffix in (".py", ".sh")}  # fmt: skip
    unnamed = sorted(modules - named)
    assert not unnamed, f"modules the architecture page does not name: {unnamed}"
    stale = {n for n in named if not ((ROOT / "specdec_cli" / n).exists() or (ROOT / n).exists())}
    assert not stale, f"the architecture page names modules that do not exist: {sorted(stale)}"


# Paths a page or a source file may name: the repository's own folders (and specdec_cli's, as the
# package's modules are often named from inside it).
PATH = re.compile(r"(?<![\w/.-])((?:specdec_cli|tests|benchmarks|scripts|docs|engine|cli|render|server|bench|models|"
                  r"pairs)/[\w/.*-]*\w\.(?:py|md|sh|json|jsonl|toml|svg))(?:::([\w*]+))?")  # fmt: skip


def _named_files() -> list[tuple[str, str, str | None]]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    # (pyproject.toml names where files go inside the wheel, not files of the checkout)
    files = [ROOT / f for f in tracked if f.endswith((".py", ".md", ".sh", ".toml")) and f != "pyproject.toml"]
    files += [p for p in PAGES if p not in files]
    out = []
    for f in files:
        for path, test in PATH.findall(text(f)):
            out.append((str(f.relative_to(ROOT)), path, test or None))
    return out


def test_nothing_names_a_file_that_is_not_in_the_repository() -> None:
    missing = []
    for where, path, test in _named_files():
        candidates = [ROOT / path, ROOT / "specdec_cli" / path]
        if "*" in path:
            found = [c for c in candidates if list(c.parent.glob(c.name))]
        else:
            found = [c for c in candidates if c.exists()]
        if not found:
            if not path.startswith("benchmarks/results/"):  # the folder benchmarks write to by default (ignored)
                missing.append(f"{where}: {path}")
            continue
        if test:  # a test named after "::" (a * for several) must be in that file
            names = re.findall(r"^def (test_\w+)", text(found[0]), flags=re.M)
            if not fnmatch.filter(names, test):
                missing.append(f"{where}: {path}::{test}")
    assert not missing, f"named but not in the repository: {missing}"


def test_nothing_refers_to_files_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"FACTS\.md|STYLE\.md|\.\./shared|/work/\.library")
    hits = [f for f in tracked if not f.startswith("docs/results/") and f != "tests/test_docs.py"
            and (ROOT / f).is_file() and outside.search((ROOT / f).read_text(errors="replace"))]  # fmt: skip
    hits += [str(p.relative_to(ROOT)) for p in PAGES if outside.search(text(p))]
    assert not hits, f"files naming something outside the repository: {sorted(set(hits))}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to hyphens."""
    s = re.sub(r"[`*]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", text(page)), flags=re.M):
        s = slug(heading)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_every_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text(page))):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, f"broken links: {broken}"


def test_every_kept_results_file_backs_a_page_and_every_one_a_page_uses_is_kept() -> None:
    kept = {p.name for p in (ROOT / "docs" / "results").glob("*.json")}
    used = {name for page in PAGES for name in re.findall(r"[\w.-]+\.json", " ".join(COG_BLOCK.findall(text(page))))}
    assert not kept - used, f"results files no page renders: {sorted(kept - used)}"
    assert not used - kept, f"results files a page renders that are not kept: {sorted(used - kept)}"


# A measured figure: a speedup (1.37x), a rate (tok/s), a time (12 ms, 3.4 s), a share (82%). Settings the
# pages mention are allowed where the code still says so (the check below each).
FIGURE = re.compile(r"\b\d+(?:\.\d+)?\s?(?:x\b|ms\b|s\b|%|tok(?:ens)?/s)")


def _settings() -> dict[str, bool]:
    import inspect

    from specdec_cli.engine.drafters import auto
    from specdec_cli.engine.drafters.gate import ShadowScore
    from specdec_cli.engine.estimates import MIN_GAIN, Acceptance
    from specdec_cli.server.app import SHUTDOWN_GRACE_SECONDS

    return {
        "5%": auto.RETRY_SHARE == 0.05 and abs(MIN_GAIN - 1.05) < 1e-9,  # the retry budget, the gain a choice needs
        "80%": auto.MODEL_PRIOR == 0.8 and ShadowScore.LONG_PRIOR == 0.8,  # starting acceptances: a draft, a long match
        "50%": inspect.signature(Acceptance).parameters["prior"].default == 0.5,  # an in-context lookup's
        "5 s": SHUTDOWN_GRACE_SECONDS == 5.0,
    }


def test_no_measured_figure_outside_a_generated_block() -> None:
    allowed = _settings()
    assert all(allowed.values()), f"a setting the docs state has changed: {allowed}"
    found = []
    for page in PAGES:
        if page.name == "CHANGELOG.md":
            continue
        for line in prose(page).splitlines():
            for m in FIGURE.finditer(line):
                if m.group().replace(" ", " ") not in allowed:
                    found.append(f"{page.relative_to(ROOT)}: {m.group()!r} in {line.strip()[:100]!r}")
    assert not found, f"figures typed into the docs (render them from a results file, benchmarks/report.py): {found}"


def test_a_pair_called_the_default_is_the_default() -> None:
    """A line that names a models.toml pair and calls it the default names the shipped file's default (the suite's
    own user file names another: tests/conftest.py)."""
    from specdec_cli.models import registry

    reg = registry.load(registry.bundled_models_toml())
    named = re.compile(r"`(" + "|".join(re.escape(p) for p in sorted(reg.pairs, key=len, reverse=True)) + r")`")
    seen = []
    for page in PAGES:
        for line in prose(page).splitlines():
            if "(the default)" in line and (m := named.search(line)):
                seen.append((page.name, m.group(1)))
    assert seen and all(pair == reg.default for _, pair in seen), seen
