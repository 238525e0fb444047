"""The pages' lists of drafters, commands and options say what the code has, as tests/test_docs.py checks
the architecture page's list of modules.

The truth is read from the code: the drafters from `DrafterKind` (engine/settings.py), the commands and
every command's options from the Typer app (cli/__init__.py). Each checker takes a page's text and returns
what it finds wrong, one line each, so the tests below can also run it over a page with a mismatch planted
and see it reported:

- a list of the drafters (`"auto" | "model" | ...`, `<auto|model|...>`, `"auto"`, `"model"` or ...,
  bullets each opening with `--drafter X`) names every drafter and nothing else; a list of what auto chose
  per step (`model`, `ngram`, ..., `plain`: `stats.drafters`) names every drafter that proposes, and
  `plain`; every `--drafter X` names a drafter;
- every `specdec ...` command line (in a code block or a backticked span) names a command that exists and
  only options that command takes; every other `--option` in the prose is some command's, or one of
  another tool's named below; a list of commands names commands, and a list of the commands that take an
  option (`--rpc` works on `run`, `chat`, ...) names every command that takes it and no other.

Not checked: docs/reference/cli.md's option tables (generated from the Typer app itself), the blocks
scripts/docgen.py renders from results files (the command lines a past run recorded), the CHANGELOG (the
options a release had).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
GENERATED = {ROOT / "docs" / "reference" / "cli.md"}  # the Typer app's help, rendered by scripts/docgen.py
COG_BLOCK = re.compile(r"\[\[\[cog.*?\[\[\[end\]\]\]", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")

# Options of other programs that a page may name in prose, outside a command line of that program.
FOREIGN_OPTIONS = {
    "--fast",  # scripts/test.sh: the tests not marked slow
    "--check",  # scripts/docgen.py: fail where a generated block is stale
    "--rehearse",  # scripts/gpu-check.sh: the GPU check's steps on the CPU
    "--quick",  # scripts/gpu-check.sh: exactness alone, for a device lease's last minutes
    "--graphs",  # scripts/gpu-check.sh: what a change to graph reuse needs
    "--slot-prompt-similarity",  # llama-server's: how it picks a slot (docs/design.md compares)
}
# A command line whose program is one of these (or a path to a script) is another tool's: its options are not
# specdec's. `python -m specdec_cli` is specdec.
FOREIGN_PROGRAMS = {"bash", "sh", "python", "python3", "pip", "cmake", "pytest", "git", "curl", "apt", "apt-get",
                    "llama-server", "llama-bench", "llama-cli", "llama-speculative-simple", "llama-lookup",
                    "nvidia-smi", "nvcc", "ruff", "mypy", "hf", "huggingface-cli", "docker", "grep", "uvicorn"}  # fmt: skip


# ------------------------------------------------------------------ the truth, from the code
@dataclass(frozen=True)
class Cli:
    """The Typer app: every command path ("run", "models list") with its options; groups with their commands."""

    options: dict[str, frozenset[str]]  # every command and group ("" the root): its options, short and long
    groups: dict[str, frozenset[str]]  # "" is the root: the top-level commands

    @property
    def every_option(self) -> frozenset[str]:
        return frozenset().union(*self.options.values())


@cache
def cli() -> Cli:
    import typer

    from specdec_cli.cli import app

    root = typer.main.get_command(app)
    options: dict[str, frozenset[str]] = {}
    groups: dict[str, frozenset[str]] = {}

    def walk(cmd: Any, path: str) -> None:
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
        options[path] = frozenset(opts | {"--help"})
        subs = getattr(cmd, "commands", None)
        if subs:
            groups[path] = frozenset(subs)
            for name, sub in subs.items():
                walk(sub, f"{path} {name}".strip())

    walk(root, "")
    return Cli(options, groups)


@cache
def drafters() -> tuple[str, ...]:
    from specdec_cli.engine.settings import DrafterKind

    return tuple(str(k) for k in DrafterKind)


@cache
def step_choices() -> tuple[str, ...]:
    """What `stats.drafters` counts a step under: the drafter that proposed it (auto and none propose
    nothing themselves), or `plain` (engine/stats.py)."""
    from specdec_cli.engine.settings import AUTO, NONE

    return (*(d for d in drafters() if d not in (AUTO, NONE)), "plain")


# ------------------------------------------------------------------ reading a page
def blank(pattern: re.Pattern[str], text: str) -> str:
    """`text` with `pattern`'s matches blanked (newlines kept), so line numbers stay what they were."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line of the code blocks, a line ending in a backslash joined to the next."""
    out: list[tuple[int, str]] = []
    for m in FENCE.finditer(text):
        first = line_of(text, m.start())
        pending: tuple[int, str] | None = None
        for i, line in enumerate(m.group().splitlines()[1:-1], first + 1):
            n, joined = pending if pending else (i, "")
            joined += line
            if joined.endswith("\\"):
                pending = (n, joined[:-1] + " ")
            else:
                out.append((n, joined))
                pending = None
    return out


def segments(line: str) -> list[list[str]]:
    """A command line's commands, each as its words: quoted strings blanked to "Q", comments cut, split at
    `|`, `&&`, `||` and `;`."""
    out, quote = [], None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
            out.append("Q")
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            break
        else:
            out.append(ch)
    return [seg.split() for seg in re.split(r"\|\||&&|[|;]", "".join(out))]


def program(words: list[str]) -> tuple[str | None, list[str]]:
    """("specdec", its arguments), (another program's name, []) or (None, []) where the words start no command."""
    words = list(words)
    while words and (
        words[0] in ("$", "sudo", "env", "time", "exec") or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0])
    ):
        words.pop(0)
    if not words:
        return None, []
    name = words[0].rsplit("/", 1)[-1]
    if name == "specdec":
        return "specdec", words[1:]
    if name.startswith("python") and words[1:3] == ["-m", "specdec_cli"]:
        return "specdec", words[3:]
    if name in FOREIGN_PROGRAMS or "/" in words[0] or name.endswith((".sh", ".py")):
        return name, []
    return None, []


def placeholder(word: str) -> bool:
    """COMMAND, NAME, <cmd>, ...: a word that stands for another."""
    return bool(re.fullmatch(r"[A-Z][A-Z_]*|<.*>|\.\.\.|\[.*\]", word))


# ------------------------------------------------------------------ the checkers
def check_command_line(args: list[str], where: str) -> list[str]:
    """The words after `specdec`: a command that exists, and only options it takes (a `--drafter` value a drafter)."""
    c = cli()
    path, rest = "", list(args)
    while path in c.groups and rest and not rest[0].startswith("-"):
        word = rest.pop(0)
        if placeholder(word):
            return []
        if "/" in word:  # `specdec models list/show/path/pull`: each one
            return [p for w in word.split("/") for p in check_command_line([*path.split(), w, *rest], where)]
        if word not in c.groups[path]:
            return [f"{where}: `specdec {(path + ' ' + word).strip()}`: no such command"]
        path = f"{path} {word}".strip()
    known = c.options[path]
    problems = []
    for i, word in enumerate(rest):
        if not re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", word):
            continue
        opt, _, value = word.partition("=")
        if opt not in known:
            problems.append(f"{where}: `specdec {path}` has no option {opt}")
        elif opt == "--drafter":
            value = value or (rest[i + 1] if i + 1 < len(rest) else "")
            problems += check_drafter_value(value, where)
    return problems


def check_drafter_value(value: str, where: str) -> list[str]:
    if re.fullmatch(r"[a-z]+", value) and value not in drafters():
        return [f"{where}: --drafter {value}: no such drafter (the drafters: {', '.join(drafters())})"]
    return []


def option_problems(text: str) -> list[str]:
    """Commands and options named on a page that the Typer app does not have."""
    text = blank(COG_BLOCK, text)
    problems = []
    for n, line in code_lines(text):
        for words in segments(line):
            name, args = program(words)
            if name == "specdec":
                problems += check_command_line(args, f"line {n}")
    prose = blank(FENCE, text)
    foreign = []  # spans of prose that are command lines: specdec's (checked here) or another program's
    for m in SPAN.finditer(prose):
        where = f"line {line_of(prose, m.start())}"
        for words in segments(m.group(1)):
            name, args = program(words)
            if name == "specdec":
                problems += check_command_line(args, where)
            if name is not None:
                foreign.append((m.start(), m.end()))
    for m in re.finditer(r"(?<![\w-])(--[a-zA-Z][\w-]*)(?:[ =]([a-z]+)\b)?", prose):
        if any(a <= m.start() < b for a, b in foreign):
            continue  # a command line's, checked above (or another program's)
        where = f"line {line_of(prose, m.start())}"
        opt = m.group(1)
        if opt not in cli().every_option and opt not in FOREIGN_OPTIONS:
            problems.append(f"{where}: {opt} is no command's option")
        elif opt == "--drafter" and m.group(2):
            problems += check_drafter_value(m.group(2), where)
    return problems


# A list: items in backticks or double quotes (or both, or bare between `|`), joined by `|`, commas, "or", "and";
# a quoted word before a colon is a JSON key, no item.
_ITEM = r'(?:`"?[\w-]+"?`|"[\w-]+"(?!\s*:)|\bNone\b|\bnull\b)'
_SEP = r"(?:\s*\\?\|\s*|\s*[,/]\s*(?:or\s+|and\s+)?|\s+or\s+|\s+and\s+)"
QUOTED_LIST = re.compile(rf"{_ITEM}(?:{_SEP}{_ITEM}){{2,}}")
METAVAR_LIST = re.compile(r"<([\w-]+(?:\\?\|[\w-]+){2,})>")
BULLETS = re.compile(r"(?:^[ \t]*[-*] .*\n(?:[ \t]+\S.*\n)*)+", re.M)
PARENTHESIS = re.compile(r"\([^()\n]*(?:\n[^()\n]+)*\)")


def _lists(text: str) -> list[tuple[int, list[str]]]:
    """(line, items) for every list of three or more items, wherever it stands: in prose, code, a table."""
    found: dict[tuple[int, int], list[str]] = {}
    # A list whose items each carry a note in parentheses ("auto" (...), "model" (...) or "none") reads as one
    # with the notes blanked out; blanking keeps every position, so a list seen both ways is kept whole.
    for t in (text, blank(PARENTHESIS, text)):
        for m in QUOTED_LIST.finditer(t):
            found[m.span()] = [w.strip('`"') for w in re.findall(_ITEM, m.group())]
        for m in METAVAR_LIST.finditer(t):
            found[m.span()] = re.split(r"\\?\|", m.group(1))
    whole = [s for s in found if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in found)]
    return [(line_of(text, s[0]), found[s]) for s in sorted(whole)]


def drafter_list_problems(text: str) -> list[str]:
    """Lists of the drafters that leave one out or name one that does not exist."""
    names, choices = set(drafters()), set(step_choices())
    proposing = names - {"auto", "none"}  # the names no other list on a page uses
    problems = []

    def compare(where: str, items: list[str], truth: set[str], what: str) -> None:
        missing = [d for d in (drafters() if truth is names else step_choices()) if d not in items]
        extra = [i for i in items if i not in truth and i not in ("None", "null")]
        if missing or extra:
            problems.append(f"{where}: a list of {what} ({', '.join(items)}): "
                            + "; ".join(filter(None, [missing and f"leaves out {', '.join(missing)}",
                                                      extra and f"names {', '.join(extra)}, not one"])))  # fmt: skip

    for n, items in _lists(text):
        if len(items) < 3 or not proposing & set(items) or len((names | choices) & set(items)) < 2:
            continue  # not a list of drafters (tool_choice's "auto", "none", "required"; stop reasons ...)
        if "plain" in items:
            compare(f"line {n}", items, choices, "what auto chose per step")
        else:
            compare(f"line {n}", items, names, "the drafters")
    for m in BULLETS.finditer(text):
        given = re.findall(r"^[ \t]*[-*] `--drafter ([\w-]+)`", m.group(), flags=re.M)
        if len(given) >= 3:
            compare(f"line {line_of(text, m.start())}", given, names, "the drafters (`--drafter X` bullets)")
    return problems


OPTION_THEN_COMMANDS = re.compile(
    r"`(--[\w-]+)[^`]*`\s*(?:\(|works on\s+|is taken by\s+)((?:`[^`]+`(?:\s*,\s*|\s+and\s+|\s+or\s+)?){2,})"
)


def command_list_problems(text: str) -> list[str]:
    """Lists of commands that name one that does not exist, and lists of the commands taking an option
    that leave one out."""
    c = cli()
    text = blank(COG_BLOCK, text)
    commands = {p for p in c.options if p} | {p for p in c.groups if p}
    problems = []

    def command(item: str) -> str | None:
        """The command an item names (`run`, `specdec heads train`, `pair-check --probe`), or None."""
        words = item.removeprefix("specdec ").split()
        path = ""
        while words and not words[0].startswith("-") and f"{path} {words[0]}".strip() in commands:
            path = f"{path} {words.pop(0)}".strip()
        return path or None

    for n, items in _lists(text):
        if len(items) >= 3 and sum(command(i) is not None for i in items) >= 2:
            unknown = [i for i in items if command(i) is None]
            if unknown:
                problems.append(f"line {n}: a list of commands ({', '.join(items)}) names {', '.join(unknown)}: "
                                "no such command")  # fmt: skip
    for m in OPTION_THEN_COMMANDS.finditer(text):
        opt, items = m.group(1), re.findall(r"`([^`]+)`", m.group(2))
        named = [command(i) for i in items]
        if sum(x is not None for x in named) < 2:
            continue
        taking = {p for p, opts in c.options.items() if p and opt in opts}
        missing = sorted(taking - set(named))
        extra = [i for i, x in zip(items, named, strict=True) if x is not None and x not in taking]
        if missing or extra:
            problems.append(f"line {line_of(text, m.start())}: the commands that take {opt} ({', '.join(items)}): "
                            + "; ".join(filter(None, [missing and f"leaves out {', '.join(missing)}",
                                                      extra and f"{', '.join(extra)} does not take it"])))  # fmt: skip
    return problems


# ------------------------------------------------------------------ the pages
def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_lists_of_drafters_match_the_code(page: Path) -> None:
    problems = drafter_list_problems(_text(page))
    assert not problems, f"{_id(page)}: lists of drafters that are not the code's ({', '.join(drafters())}):\n" + \
        "\n".join(problems)  # fmt: skip


@pytest.mark.parametrize("page", [p for p in PAGES if p not in GENERATED], ids=_id)
def test_commands_and_options_exist(page: Path) -> None:
    problems = option_problems(_text(page)) + command_list_problems(_text(page))
    assert not problems, f"{_id(page)}: commands and options the Typer app does not have:\n" + "\n".join(problems)


def test_the_checkers_find_the_lists_the_pages_have() -> None:
    """A checker whose patterns stopped matching would pass every page: it must still see the lists there are."""

    def drafter_lists(page: str) -> int:
        return sum(1 for _, items in _lists(_text(ROOT / page)) if set(drafters()) & set(items) >= {"model", "ngram"})

    for page in ("docs/api.md", "docs/reference/json.md"):
        assert drafter_lists(page), f"no list of drafters found in {page}"
    assert BULLETS.search(_text(ROOT / "docs" / "usage.md")), "no bullets found in docs/usage.md"
    assert any(len(re.findall(r"^[ \t]*[-*] `--drafter", m.group(), flags=re.M)) >= 3
               for m in BULLETS.finditer(_text(ROOT / "docs" / "usage.md"))), "no `--drafter X` bullets in docs/usage.md"  # fmt: skip
    for page in ("docs/rpc.md", "docs/pool.md"):
        assert OPTION_THEN_COMMANDS.search(_text(ROOT / page)), f"no list of the commands taking an option in {page}"
    specdec_lines = [line for _, line in code_lines(_text(ROOT / "README.md")) if "specdec " in line]
    assert len(specdec_lines) >= 10, "the README's command lines were not found"


# ------------------------------------------------------------------ each check fails on a planted mismatch
def _planted(page: str, old: str, new: str) -> str:
    text = _text(ROOT / page)
    assert old in text, f"{page} no longer has {old!r}: plant the mismatch elsewhere"
    return text.replace(old, new, 1)


def test_a_drafter_left_out_or_made_up_is_reported() -> None:
    text = ('`drafter` is `"auto"`, `"model"`, `"ngram"`, `"heads"` or `"none"`.\n'
            '`speculative: {"drafter": "auto" | "model" | "ngram" | "heads" | "none"}`\n'
            "| `--drafter <auto\\|model\\|ngram\\|heads\\|none>` | who drafts |\n"
            "| `stats.drafters` | per choice (`heads`, `model`, `ngram`, `plain`) |\n")  # fmt: skip
    assert drafter_list_problems(text) == []
    for old, new in [('`"heads"` or', "or"), ('| "heads" |', "|"), ("\\|heads\\|", "\\|"), ("`heads`, ", ""),
                     ('`"heads"` or', '`"heads"`, `"pool"` or'), ('| "none"', '| "pool" | "none"'),
                     ("\\|none>", "\\|none\\|cross>"), ("`plain`", "`pool`, `plain`")]:  # fmt: skip
        planted = text.replace(old, new, 1)
        assert planted != text
        problems = drafter_list_problems(planted)
        assert len(problems) == 1, (new, problems)
        assert ("leaves out heads" in problems[0]) or re.search(r"names (pool|cross), not one", problems[0]), problems


def test_a_drafter_left_out_of_a_page_is_reported() -> None:
    # the API page's prose list, and its generated signature's docstring (a list with a note after each name)
    problems = drafter_list_problems(_planted("docs/api.md", ', `"heads"` (with `heads=` naming the heads\' file)', ""))
    assert any("leaves out heads" in p for p in problems), problems
    problems = drafter_list_problems(_planted("docs/api.md", '"heads" (Medusa heads', '"pool" (Medusa heads'))
    assert any("leaves out heads" in p and "names pool" in p for p in problems), problems
    # usage.md's bullets, one per drafter
    text = _text(ROOT / "docs" / "usage.md")
    bullet = re.search(r"^- `--drafter heads`.*\n(?:  .*\n)*", text, flags=re.M)
    assert bullet, "docs/usage.md has no `--drafter heads` bullet"
    problems = drafter_list_problems(text.replace(bullet.group(), ""))
    assert problems and "leaves out heads" in problems[0], problems
    problems = drafter_list_problems(text.replace("- `--drafter model`", "- `--drafter cross`"))
    assert any("names cross, not one" in p for p in problems), problems


def test_a_command_or_option_that_does_not_exist_is_reported() -> None:
    page = "docs/usage.md"
    assert option_problems(_text(ROOT / page)) == []
    line = 'specdec run "..." --no-draft'
    for new, expected in [
        ('specdec run "..." --no-draft --bogus-flag', "`specdec run` has no option --bogus-flag"),
        ('specdec run "..." -z', "`specdec run` has no option -z"),
        ('specdec run "..." --api-key sesame', "`specdec run` has no option --api-key"),  # serve's, not run's
        ('specdec run "..." --drafter pool', "--drafter pool: no such drafter"),
        ('specdec quantize "..."', "`specdec quantize`: no such command"),
        ('specdec models delete x', "`specdec models delete`: no such command"),
        ('.venv/bin/specdec run "..." \\\n  --bogus-flag', "has no option --bogus-flag"),  # a continued line
    ]:  # fmt: skip
        problems = option_problems(_planted(page, line, new))
        assert len(problems) == 1 and expected in problems[0], (new, problems)
    # in prose: a backticked command line, an option alone, a drafter named by its option
    for old, new, expected in [
        ("`--no-draft` runs", "`specdec run --no-drafts` runs", "`specdec run` has no option --no-drafts"),
        ("`--no-draft` runs", "`--no-drafts` runs", "--no-drafts is no command's option"),
        ("`--drafter model`:", "`--drafter pool`:", "--drafter pool: no such drafter"),
        ("`specdec run --raw`", "`specdec runs --raw`", "`specdec runs`: no such command"),
    ]:  # fmt: skip
        problems = option_problems(_planted(page, old, new))
        assert len(problems) == 1 and expected in problems[0], (new, problems)
    # another program's options are its own
    assert (
        option_problems("`bash scripts/test.sh --fast`\n```sh\npip install --upgrade x\ncmake --build b\n```\n") == []
    )
    # a comment or a quoted prompt is no option
    assert option_problems('```sh\nspecdec run "say --hello" --json   # not --this\n```\n') == []


def test_a_list_of_commands_that_is_wrong_is_reported() -> None:
    assert command_list_problems(_text(ROOT / "docs" / "pool.md")) == []
    problems = command_list_problems(
        _planted("docs/pool.md", "(`run`, `chat`, `serve`, `bench`;", "(`run`, `chat`, `serve`;")
    )
    assert len(problems) == 1 and "leaves out bench" in problems[0], problems
    problems = command_list_problems(_planted("docs/pool.md", "(`run`, `chat`, `serve`, `bench`;",
                                              "(`run`, `chat`, `serve`, `bench`, `rpc-server`;"))  # fmt: skip
    assert len(problems) == 1 and "rpc-server does not take it" in problems[0], problems
    problems = command_list_problems("`run`, `chat`, `quantize` and `serve` accept such a pair\n")
    assert len(problems) == 1 and "names quantize: no such command" in problems[0], problems
