"""A web page on another origin streams a chat from `specdec serve`, in a real headless Chromium.

The page is served from its own port (another origin than the API's). Chromium maps the names
`allowed.test` and `other.test` to 127.0.0.1, so the same page comes from three origins: this
machine's (allowed by default), one the server names with `--cors-origin`, and one it does not
(the browser must refuse the page the answer). Chromium is Debian's (`bash scripts/test.sh`
installs it); Playwright (PyPI) drives it and downloads no browser of its own.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.server_fixtures import live_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
KEY = "sesame"

PAGE = b"""<!doctype html><meta charset="utf-8"><title>chat</title><pre id="out"></pre>
<script>
// What a chat page does: POST with a key (so the browser sends a preflight), read the SSE stream as it comes.
async function chat(api, key) {
  const out = document.getElementById("out");
  let chunks = 0;
  try {
    const r = await fetch(api + "/chat/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer " + key},
      body: JSON.stringify({messages: [{role: "user", content: "Say hello."}], max_tokens: 24, temperature: 0,
                            stream: true}),
    });
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return {text: out.textContent, chunks, done: false, status: r.status};
      buffer += decoder.decode(value, {stream: true});
      let i;
      while ((i = buffer.indexOf("\\n")) >= 0) {
        const line = buffer.slice(0, i).trim();
        buffer = buffer.slice(i + 1);
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") return {text: out.textContent, chunks, done: true, status: r.status};
        const delta = JSON.parse(line.slice(6)).choices[0]?.delta?.content;
        if (delta) { out.textContent += delta; chunks += 1; }
      }
    }
  } catch (e) {
    return {error: String(e)};
  }
}
</script>
"""


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def page_port() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.slow  # the real model, in a subprocess
def test_a_page_on_another_origin_streams_a_chat_in_headless_chromium(page_port: int) -> None:
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM), f"no Chromium at {CHROMIUM}: `bash scripts/test.sh` installs Debian's chromium"
    named = f"http://allowed.test:{page_port}"
    with live_server("--ctx-size", "1024", "--api-key", KEY, "--cors-origin", named) as server, sync_playwright() as pw:
        expected = httpx.post(f"{server.base_url}/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                              json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 24,
                                    "temperature": 0}, timeout=120).json()["choices"][0]["message"]["content"]  # fmt: skip
        browser = pw.chromium.launch(executable_path=CHROMIUM, timeout=60_000, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync",
            "--host-resolver-rules=MAP allowed.test 127.0.0.1, MAP other.test 127.0.0.1"])  # fmt: skip
        try:
            results = {}
            for origin in (f"http://127.0.0.1:{page_port}", named, f"http://other.test:{page_port}"):
                page = browser.new_page()
                page.goto(f"{origin}/", timeout=30_000)
                results[origin] = page.evaluate("([api, key]) => chat(api, key)", [server.base_url, KEY])
                page.close()
        finally:
            browser.close()
    for origin in (f"http://127.0.0.1:{page_port}", named):
        got = results[origin]
        assert got.get("done") and got["status"] == 200, (origin, got)
        assert got["text"] == expected and got["chunks"] > 1, (origin, got)  # streamed, token by token
    refused = results[f"http://other.test:{page_port}"]
    assert "Failed to fetch" in refused.get("error", ""), refused  # the browser kept the answer from that page
