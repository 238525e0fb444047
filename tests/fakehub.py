"""A local HTTP server that answers the way the Hugging Face hub's file endpoints do.

`HEAD/GET {endpoint}/{owner}/{name}/resolve/{revision}/{file}` answers like the hub
for an LFS file: a 302 to a signed CDN URL on another origin, carrying
`X-Repo-Commit`, `X-Linked-Etag` (the sha256) and `X-Linked-Size`; missing files
are 404 with `X-Error-Code: EntryNotFound`, unknown repos 401 `RepoNotFound`,
gated repos 401 `GatedRepo` without the right bearer token. The "CDN" (the same
server reached as `localhost` instead of `127.0.0.1`, so a different origin)
serves the bytes with `Range` support. Knobs make a transfer drop the connection
after some bytes, or refuse GETs with 503, to test interrupted downloads.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class FakeHub:
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)
    gated: dict[str, str] = field(default_factory=dict)  # repo -> token it needs
    cut_after: int | None = None  # bytes per CDN response before the connection drops
    refuse_gets: bool = False  # CDN answers 503
    refuse_after_cut: bool = False  # after the first dropped transfer, refuse_gets turns on (the network is gone)
    stall_after: int | None = None  # bytes per CDN response before it hangs (until `release` is set)
    release: threading.Event = field(default_factory=threading.Event)
    corrupt: bool = False  # CDN flips a byte: the sha256 the hub announced will not match
    log: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_GET(self) -> None:
                hub._handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, repo: str, file: str, data: bytes) -> str:
        self.files[(repo, file)] = data
        return hashlib.sha256(data).hexdigest()

    def cdn_gets(self) -> list[Request]:
        return [r for r in self.log if r.path.startswith("/cdn/") and r.method == "GET"]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ serving
    def _blob(self, sha: str) -> bytes | None:
        for data in self.files.values():
            if hashlib.sha256(data).hexdigest() == sha:
                return data
        return None

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        self.log.append(
            Request("HEAD" if head else "GET", h.path, h.headers.get("Range"), h.headers.get("Authorization"))
        )
        path = h.path.split("?")[0]
        if path.startswith("/cdn/"):
            return self._cdn(h, path.removeprefix("/cdn/"), head)
        parts = path.strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._reply(h, 404, {"X-Error-Code": "EntryNotFound"})
        repo, file = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
        if not any(r == repo for r, _ in self.files):
            return self._reply(h, 401, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
        needs = self.gated.get(repo)
        if needs is not None and h.headers.get("Authorization") != f"Bearer {needs}":
            return self._reply(
                h, 401, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model is restricted"}
            )
        data = self.files.get((repo, file))
        if data is None:
            return self._reply(h, 404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
        sha = hashlib.sha256(data).hexdigest()
        return self._reply(
            h,
            302,
            {
                "Location": f"http://localhost:{self.port}/cdn/{sha}?X-Amz-Signature=fake",
                "X-Repo-Commit": COMMIT,
                "X-Linked-Etag": f'"{sha}"',
                "X-Linked-Size": str(len(data)),
                "ETag": '"0000000000000000000000000000000000000000"',
            },
        )

    def _cdn(self, h: BaseHTTPRequestHandler, sha: str, head: bool) -> None:
        data = self._blob(sha)
        if data is None:
            return self._reply(h, 404, {})
        if self.refuse_gets and not head:
            return self._reply(h, 503, {})
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng.removeprefix("bytes=").split("-")[0])
        if self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        body = data[start:]
        status = 206 if start else 200
        headers = {"Content-Length": str(len(body)), "ETag": f'"{sha}"', "Accept-Ranges": "bytes"}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return None
        if self.stall_after is not None and len(body) > self.stall_after:
            h.wfile.write(body[: self.stall_after])
            h.wfile.flush()
            self.release.wait(60)
            h.close_connection = True
            return None
        if self.cut_after is not None and len(body) > self.cut_after:
            h.wfile.write(body[: self.cut_after])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)  # mid-body: the client sees the connection drop
            if self.refuse_after_cut:
                self.refuse_gets = True
            return None
        h.wfile.write(body)
        return None

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, headers: dict[str, str]) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", "0")
        h.end_headers()
