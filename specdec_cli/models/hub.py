"""Model files on the Hugging Face hub: where they are on disk, and fetching them.

Everything goes through huggingface-hub, so `HF_TOKEN`, `HF_ENDPOINT`, `HF_HOME`
/ `HF_HUB_CACHE` and `HF_HUB_OFFLINE` mean what they mean to `hf download`, and a
pulled file lands in the same cache that llama.cpp's `-hf`, LM Studio's importer
and every other huggingface-hub tool read.

One thing is done by hand: resuming. Since huggingface-hub 1.31 an interrupted
`hf_hub_download` starts again from zero on the next run (its partial file is
process-unique and deleted on failure, huggingface_hub#4196), which is not
acceptable for a 40 GB target. So `pull` asks the hub for the file's metadata
(`get_hf_file_metadata`), appends to a partial blob kept under the same cache
folder with huggingface-hub's own `http_get` (Range requests, retries), checks
the size and the sha256 the hub reports, moves it to the blob's final name and
lets `hf_hub_download` create the snapshot entry (it finds the blob and
transfers nothing). Until that last rename nothing in `snapshots/` points at
the file, so a half-written download never looks complete.

A file downloaded some other way can also be dropped into `models_dir()` under
its hub file name; `local_path` finds it there.

Nothing here prints: progress goes to a `ProgressSink` the caller supplies.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from platformdirs import user_data_dir

from specdec_cli.errors import SpecdecError, env_directory

SHA256 = re.compile(r"[0-9a-f]{64}")
PARTIAL_SUFFIX = ".specdec-partial"


class DownloadError(SpecdecError):
    """A hub file could not be fetched; the message says how to get it by hand."""


class ProgressSink(Protocol):
    """Receives a transfer's progress (the CLI renders it; tests count it)."""

    def start(self, label: str, total: int | None, done: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def finish(self) -> None: ...


@dataclass(frozen=True)
class HubFile:
    repo: str
    file: str
    revision: str = "main"
    sha256: str | None = None  # when models.toml pins the content

    def __str__(self) -> str:
        return f"{self.repo}/{self.file}"


def models_dir() -> Path:
    """A plain folder for files fetched by hand (SPECDEC_MODELS_DIR overrides)."""
    return env_directory("SPECDEC_MODELS_DIR", Path(user_data_dir("specdec")) / "models")


def endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def file_url(f: HubFile) -> str:
    from huggingface_hub import hf_hub_url

    return str(hf_hub_url(f.repo, f.file, revision=f.revision))


def cached_path(f: HubFile) -> Path | None:
    """The file in huggingface-hub's cache, or None (no network)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(f.repo, f.file, revision=f.revision)
    return Path(found) if isinstance(found, str) else None


def local_path(f: HubFile) -> Path | None:
    """Where the file is on disk: the hub cache, else `models_dir()`; None if neither."""
    cached = cached_path(f)
    if cached is not None and cached.exists():
        return cached
    manual = models_dir() / Path(f.file).name
    return manual if manual.is_file() else None


def fetch_by_hand(f: HubFile) -> str:
    """The way round the network that every download error ends with."""
    manual = models_dir() / Path(f.file).name
    return f"download {file_url(f)} by hand to {manual} (e.g. `curl -L -C - -o {manual} URL`): specdec looks there too"


def _storage(f: HubFile) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=f.repo, repo_type="model")


def _markers(f: HubFile, blobs: Path) -> list[Path]:
    """The `.name` markers of kept parts of this file (any version of it) in `blobs`."""
    if not blobs.is_dir():
        return []
    found = []
    for marker in blobs.glob(f"*{PARTIAL_SUFFIX}.name"):
        try:
            if marker.read_text(encoding="utf-8").strip() == f"{f.repo}/{f.file}":
                found.append(marker)
        except OSError:
            continue
    return found


def partial_bytes(f: HubFile) -> int:
    """Bytes kept from interrupted pulls of this file (0 if none); no network."""
    parts = (m.with_suffix("") for m in _markers(f, _storage(f) / "blobs"))
    return sum(p.stat().st_size for p in parts if p.exists())


def _same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def _progress_class(sink: ProgressSink | None, label: str) -> Any:
    """A tqdm stand-in for huggingface-hub's `tqdm_class` hook that feeds `sink`."""

    class _Bar:
        def __init__(self, *_: Any, total: int | None = None, initial: int = 0, **__: Any) -> None:
            if sink is not None:
                sink.start(label, total, initial)

        def update(self, n: int = 1) -> None:
            if sink is not None:
                sink.advance(n)

        def close(self) -> None:
            pass

        def __enter__(self) -> _Bar:
            return self

        def __exit__(self, *_: object) -> None:
            pass

    return _Bar


def _sha256(path: Path, sink: ProgressSink | None, label: str) -> str:
    h = hashlib.sha256()
    if sink is not None:
        sink.start(f"{label} (checking sha256)", path.stat().st_size, 0)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            h.update(block)
            if sink is not None:
                sink.advance(len(block))
    if sink is not None:
        sink.finish()
    return h.hexdigest()


def _explain(exc: BaseException, f: HubFile, resumable: bool = False) -> DownloadError:
    """One actionable line for whatever the hub client raised."""
    import httpx2
    from huggingface_hub import errors

    where = f"{f.repo}/{f.file}"
    hand = fetch_by_hand(f)
    if resumable:
        hand = f"run the same command again to resume, or {hand}"
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return DownloadError(f"HF_HUB_OFFLINE is set, so {where} cannot be downloaded: unset it, or {hand}")
    if isinstance(exc, errors.GatedRepoError):
        return DownloadError(
            f"{f.repo} is gated: accept its licence at {endpoint()}/{f.repo} and set HF_TOKEN to a token "
            f"that may read it (HTTP {_status(exc)})"
        )
    if isinstance(exc, errors.RemoteEntryNotFoundError | errors.EntryNotFoundError):
        return DownloadError(
            f"{endpoint()} has no file {f.file!r} in {f.repo} (HTTP {_status(exc)}): the models.toml entry "
            f"is out of date or wrong; fix its `file`, or {hand}"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return DownloadError(f"{f.repo} has no revision {f.revision!r} (HTTP {_status(exc)})")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return DownloadError(
            f"{endpoint()} has no repository {f.repo!r}, or it is private and HF_TOKEN is not set "
            f"(HTTP {_status(exc)}); {hand}"
        )
    if isinstance(exc, errors.HfHubHTTPError):
        later = hand if resumable else f"run again later, or {hand}"
        return DownloadError(f"{endpoint()} answered HTTP {_status(exc)} for {where}; {later}")
    if isinstance(exc, httpx2.TransportError):
        return DownloadError(f"cannot reach {endpoint()} ({type(exc).__name__}: {exc}); {hand}")
    return DownloadError(f"downloading {where} failed: {exc}; {hand}")


def _status(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(getattr(response, "status_code", "?"))


def pull(f: HubFile, sink: ProgressSink | None = None) -> Path:
    """Fetch `f` into the hub cache (resuming a kept partial) and return its path."""
    import httpx2
    from huggingface_hub import errors, get_hf_file_metadata, hf_hub_download

    already = local_path(f)
    if already is not None:
        return already
    url = file_url(f)
    try:
        meta = get_hf_file_metadata(url)
    except (errors.HfHubHTTPError, errors.OfflineModeIsEnabled, httpx2.TransportError) as exc:
        raise _explain(exc, f) from exc
    if not meta.etag or not meta.commit_hash:
        raise DownloadError(
            f"{endpoint()} did not answer like a Hugging Face hub for {f} (no ETag or X-Repo-Commit header): "
            f"check HF_ENDPOINT; {fetch_by_hand(f)}"
        )
    if f.sha256 and SHA256.fullmatch(meta.etag) and meta.etag != f.sha256:
        raise DownloadError(
            f"{f} on {endpoint()} has sha256 {meta.etag[:12]}..., but models.toml pins {f.sha256[:12]}...: "
            "the file changed on the hub; update the entry's sha256 (or remove it) after checking the new file"
        )
    blobs = _storage(f) / "blobs"
    blob = blobs / meta.etag
    if not blob.exists():
        blobs.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock, Timeout

        lock = FileLock(str(blobs / f"{meta.etag}{PARTIAL_SUFFIX}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise DownloadError(f"another `specdec models pull` is downloading {f} now; let it finish") from None
        try:
            _fetch_blob(f, meta, blob, sink)
        finally:
            lock.release()
    try:
        # The blob is in place, so this only records the snapshot entry and the ref.
        return Path(hf_hub_download(f.repo, f.file, revision=f.revision))
    except (errors.HfHubHTTPError, errors.OfflineModeIsEnabled, httpx2.TransportError) as exc:
        raise _explain(exc, f) from exc


def _fetch_blob(f: HubFile, meta: Any, blob: Path, sink: ProgressSink | None) -> None:
    """Append to the kept partial until it is the whole file, check it, and move it to `blob`."""
    import httpx2
    from huggingface_hub import errors
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    blobs, label = blob.parent, Path(f.file).name
    part = blobs / f"{meta.etag}{PARTIAL_SUFFIX}"
    marker = blobs / f"{meta.etag}{PARTIAL_SUFFIX}.name"
    for other in _markers(f, blobs):  # parts of an older version of this file
        if other != marker:
            other.with_suffix("").unlink(missing_ok=True)
            other.unlink(missing_ok=True)
    marker.write_text(f"{f.repo}/{f.file}\n", encoding="utf-8")
    kept = part.stat().st_size if part.exists() else 0
    if meta.size is not None and kept > meta.size:
        part.unlink()  # cannot be a prefix of this file: start again
        kept = 0
    if meta.size is not None:
        free = shutil.disk_usage(blobs).free
        if free < meta.size - kept:
            raise DownloadError(
                f"{f} needs {human_bytes(meta.size - kept)} more, but {blobs} has {human_bytes(free)} free; free some space and "
                f"run again ({human_bytes(kept)} already downloaded is kept)"
            )
    url = file_url(f)
    headers = build_hf_headers()
    location = meta.location or url
    if not _same_origin(location, url):
        headers.pop("authorization", None)  # a signed CDN URL: the token stays with the hub
    try:
        with part.open("ab") as fh:
            http_get(
                location,
                fh,
                resume_size=kept,
                headers=headers,
                expected_size=meta.size,
                tqdm_class=_progress_class(sink, label),
            )
    except (errors.HfHubHTTPError, httpx2.TransportError, OSError) as exc:
        done = part.stat().st_size if part.exists() else 0
        total = f" of {human_bytes(meta.size)}" if meta.size else ""
        raise DownloadError(
            f"downloading {f} stopped after {human_bytes(done)}{total}, which is kept: {_explain(exc, f, resumable=True)}"
        ) from exc
    finally:
        if sink is not None:
            sink.finish()
    if SHA256.fullmatch(meta.etag):
        digest = _sha256(part, sink, label)
        if digest != meta.etag:
            part.unlink()
            raise DownloadError(
                f"{f}: the downloaded bytes have sha256 {digest[:12]}..., the hub says {meta.etag[:12]}...; "
                "the corrupt part was deleted: run again"
            )
    os.replace(part, blob)
    marker.unlink(missing_ok=True)


def human_bytes(n: int) -> str:
    """Decimal units, as the hub's file listings show sizes."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
