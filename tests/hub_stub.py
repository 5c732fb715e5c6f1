"""A stand-in for the Hugging Face hub's HTTP API, for pushing without a network.

Point the real hub client at it with ``HF_ENDPOINT`` (and ``HF_HUB_DISABLE_XET=1``, so files
go through the plain preupload + commit API rather than the Xet storage service).  It
answers the calls an upload makes: create the repository, check the model card's metadata,
ask each file's upload mode (it says "regular": the bytes travel inside the commit), and the
commit itself, whose files it keeps (``repos[repo_id][path] = bytes``).  Every request is recorded with its headers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@pytest.fixture()
def closed_port():
    """A local port nothing listens on: held (bound, never listening) so no one else takes it
    while the test runs; a connection to it is refused at once."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


class FakeHub:
    def __init__(self, sock: socket.socket | None = None) -> None:
        """``sock``: serve on this bound socket (a port that refused connections until now)."""
        self.repos: dict[str, dict[str, bytes]] = {}
        self.created: list[dict] = []
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _reply(self, status: int, body: dict | None = None) -> None:
                data = json.dumps(body or {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_HEAD(self) -> None:
                hub.requests.append(("HEAD", self.path, dict(self.headers)))
                self._reply(404)

            def do_GET(self) -> None:
                hub.requests.append(("GET", self.path, dict(self.headers)))
                self._reply(404, {"error": "not in the stub"})

            def do_POST(self) -> None:
                hub.requests.append(("POST", self.path, dict(self.headers)))
                path = self.path.split("?")[0]
                body = self._body()
                if path == "/api/repos/create":
                    payload = json.loads(body)
                    hub.created.append(payload)
                    repo = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
                    hub.repos.setdefault(repo, {})
                    return self._reply(200, {"url": f"{hub.url}/{repo}", "name": repo, "id": repo})
                if path == "/api/validate-yaml":  # the model card's metadata is checked before the upload
                    return self._reply(200, {})
                m = re.fullmatch(r"/api/models/(.+)/preupload/([^/]+)", path)
                if m:
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                       for f in files]})
                m = re.fullmatch(r"/api/models/(.+)/commit/([^/]+)", path)
                if m:
                    repo = m.group(1)
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            value = item["value"]
                            assert value.get("encoding") == "base64", value.keys()
                            hub.repos.setdefault(repo, {})[value["path"]] = base64.b64decode(value["content"])
                    oid = hashlib.sha1(body).hexdigest()
                    return self._reply(200, {"commitUrl": f"{hub.url}/{repo}/commit/{oid}", "commitOid": oid,
                                             "pullRequestUrl": None, "success": True})
                self._reply(404, {"error": f"not in the stub: {path}"})

        if sock is None:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        else:
            self.server = ThreadingHTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
            self.server.socket.close()
            self.server.socket = sock
            self.server.server_activate()  # listen
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
