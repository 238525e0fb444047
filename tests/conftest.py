"""Shared fixtures: the packaged models and a derived draft, built once per session."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdec_cli.api import Speculator
from specdec_cli.engine import native
from specdec_cli.engine.model import Model
from specdec_cli.models import loading, packaged
from specdec_cli.models.loading import ModelChoice
from tests.fakes import open_fake

N_CTX = 1024
# Threads for the models tests load: two (these machines' cores), fewer where other work keeps cores busy as the
# session starts. With a second load on both cores, two threads made a decode crawl (engine/native.py,
# default_threads), and the suite with it; a token's logits are the same at any thread count (test_threads.py).
# Under pytest-xdist (scripts/test.sh runs a worker a core) one each: two workers' two threads each on two cores
# would be that second load.
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, native.default_threads()[0])

# A test that asks for one of these loads or derives a real GGUF model: it is `slow` (minutes in all).
REAL_MODEL_FIXTURES = frozenset({
    "smol_path", "smol_q2k_path", "gemma_path", "gemma_q2k_path", "smol", "smol_q2k", "smol_twin", "gemma",
    "gemma_q2k", "truncated_gguf", "corrupt_draft_path", "corrupt_target_path",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every real-model test `slow`, so `pytest -m "not slow"` is the fake-model and pure-maths suite."""
    for item in items:
        if REAL_MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests do not inherit the colour settings of the shell that runs them (NO_COLOR in a profile turned the
    legend's colours off, and a test of them failed): a test about them sets them itself. Nor the machine's
    load: every model, in this process or a command's, gets THREADS (without it, a CLI run on a busy machine
    added a line about the free cores to what a test reads)."""
    for name in ("NO_COLOR", "FORCE_COLOR", "CLICOLOR_FORCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPECDEC_THREADS", str(THREADS))


# The pair a test gets when it names none. The shipped default (models.toml) has an F32 target, which decodes
# several times slower on these 2-core machines: the suite runs on the quicker pair of the same model, written
# as the user file's `default`, and tests/test_first_run.py runs the shipped default itself.
SUITE_DEFAULT_PAIR = "smollm2-135m-q2k"


def user_dirs(home: Path) -> dict[str, str]:
    """A user config folder whose models.toml names only the suite's default pair, and an empty models folder."""
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "models.toml").write_text(f'default = "{SUITE_DEFAULT_PAIR}"\n')
    return {"SPECDEC_CONFIG_DIR": str(home / "config"), "SPECDEC_MODELS_DIR": str(home / "models")}


@pytest.fixture(scope="session", autouse=True)
def _session_user_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same for fixtures wider than a test (a module's server starts before a test's own folders)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in user_dirs(tmp_path_factory.mktemp("session-user")).items():
            mp.setenv(name, value)
        yield


@pytest.fixture(autouse=True)
def _no_user_files(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read the developer's own models.toml or hand-fetched models."""
    for name, value in user_dirs(tmp_path_factory.mktemp("user")).items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def fake_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model file a test opens is tests/fakes.py's `FakeGGUF`; calibration (timings cached per file) stays
    off. Modules of fake-model tests use it throughout: `pytestmark = pytest.mark.usefixtures("fake_models")`."""
    monkeypatch.setattr(loading, "OPENER", open_fake)
    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")


@pytest.fixture(scope="session")
def smol_path() -> Path:
    return packaged.smollm2_path()


@pytest.fixture(scope="session")
def smol_q2k_path(smol_path: Path) -> Path:
    """The default pair's draft: SmolLM2 requantized to Q2_K (cached across runs)."""
    return packaged.derived_draft(smol_path, "Q2_K")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return packaged.gemma3_path()


@pytest.fixture(scope="session")
def smol(smol_path: Path) -> Iterator[Model]:
    m = Model(smol_path, n_ctx=N_CTX, n_threads=THREADS)
    yield m
    m.close()


@pytest.fixture(scope="session")
def smol_q2k(smol_q2k_path: Path) -> Iterator[Model]:
    m = Model(smol_q2k_path, n_ctx=N_CTX, n_threads=THREADS)
    yield m
    m.close()


@pytest.fixture(scope="session")
def smol_twin(smol_path: Path) -> Iterator[Model]:
    """A second context on the target file: draft == target."""
    m = Model(smol_path, n_ctx=N_CTX, n_threads=THREADS)
    yield m
    m.close()


@pytest.fixture(scope="session")
def gemma(gemma_path: Path) -> Iterator[Model]:
    m = Model(gemma_path, n_ctx=N_CTX, n_threads=THREADS)
    yield m
    m.close()


@pytest.fixture(scope="session")
def gemma_q2k_path(gemma_path: Path) -> Path:
    return packaged.derived_draft(gemma_path, "Q2_K")


@pytest.fixture(scope="session")
def gemma_q2k(gemma_q2k_path: Path) -> Iterator[Model]:
    m = Model(gemma_q2k_path, n_ctx=N_CTX, n_threads=THREADS)
    yield m
    m.close()


@pytest.fixture
def truncated_gguf(tmp_path: Path, smol_path: Path) -> Path:
    """The first 3 MB of a real model: a valid header, tensor data cut off."""
    out = tmp_path / "truncated.gguf"
    with smol_path.open("rb") as src:
        out.write_bytes(src.read(3_000_000))
    return out


@pytest.fixture
def not_gguf(tmp_path: Path) -> Path:
    out = tmp_path / "model.gguf"
    out.write_bytes(b"<html>404 not found</html>" * 10)
    return out


@pytest.fixture
def string_io() -> io.StringIO:
    return io.StringIO()


def corrupt_copy(src: Path, dst: Path, *, at: float = 0.6, n_bytes: int = 2_000_000, seed: int = 0) -> Path:
    """A copy of a GGUF with random bytes written into its tensor data (it still loads)."""
    import numpy as np

    data = bytearray(src.read_bytes())
    start = int(len(data) * at)  # well past the header and vocabulary: inside tensor data
    data[start : start + n_bytes] = np.random.default_rng(seed).bytes(n_bytes)
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture(scope="session")
def corrupt_draft_path(smol_q2k_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corrupt_copy(smol_q2k_path, tmp_path_factory.mktemp("corrupt") / "corrupt-draft.gguf")


@pytest.fixture(scope="session")
def corrupt_target_path(smol_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corrupt_copy(smol_path, tmp_path_factory.mktemp("corrupt") / "corrupt-target.gguf")


def wrap(target: Model, draft: Model | None = None, drafter: str = "model", draft_max: int | None = None) -> Speculator:
    """A Speculator over models a fixture already loaded (not closed by the test: the fixture owns them)."""
    choice = ModelChoice(target.path, draft.path if draft else None, None, draft_max)
    return Speculator(choice, target, draft, drafter=drafter, ngram=(2, 4), n_threads=THREADS)
