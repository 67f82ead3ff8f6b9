"""The sync client's HTTP/1.1 transport: a small keep-alive connection pool on sockets.

Why not httpx here: a worker's checkpoint write is one round trip on the turn's critical
path, and the general-purpose stacks cost more Python per call than the server spends
on the request (measured against a release `harness-engine serve` on one machine,
median of an empty GET: `httpx.Client` 0.42 ms, `http.client` 0.15 ms, most of it
parsing response headers through `email.parser`). This module speaks the small part of
HTTP/1.1 the data plane uses: one request at a time per connection, bodies with
`Content-Length` (and chunked responses, should a proxy produce them), keep-alive. The
async client keeps httpx. Both hand the parsers the same small surface (`Reply`):
status code, case-insensitive headers, body bytes, `json()`.

Failure classes matter to the retry rules (`_core.should_retry`): `WireError.sent` is
False only when the request cannot have reached the server (no connection could be
made); anything after that is ambiguous.
"""

from __future__ import annotations

import base64
import json as _json
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any, BinaryIO, Protocol
from urllib.parse import quote, unquote, urlsplit

# Bounds on what a response may send before the body, so a confused peer cannot make
# the client buffer without end.
_MAX_LINE = 65536
_MAX_HEADERS = 200


class Headers(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...


class Reply(Protocol):
    """What a `Call`'s parser reads from a response (httpx.Response has it too)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Headers: ...

    @property
    def content(self) -> bytes: ...

    def json(self) -> Any: ...


class _HeaderMap:
    __slots__ = ("_h",)

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._h = {k.lower(): v for k, v in pairs}

    def get(self, key: str, default: Any = None) -> Any:
        return self._h.get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return self._h[key.lower()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._h


class WireReply:
    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status: int, headers: _HeaderMap, content: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        return _json.loads(self.content)


class WireError(Exception):
    """A transport failure. `sent` is False when the request never left this process."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _Protocol(Exception):
    """The peer broke HTTP/1.1 framing."""


class _Conn:
    __slots__ = ("sock", "rfile")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb")

    def close(self) -> None:
        try:
            self.rfile.close()
        finally:
            self.sock.close()

    def stale(self) -> bool:
        """An idle connection the server closed reads as ready (EOF); one with bytes
        the client never asked for is no better."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


def _line(rfile: BinaryIO) -> bytes:
    line = rfile.readline(_MAX_LINE + 1)
    if not line:
        raise _Protocol("the server closed the connection")
    if len(line) > _MAX_LINE:
        raise _Protocol("response line too long")
    return line


def _read_chunked(rfile: BinaryIO) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = _line(rfile).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise _Protocol(f"bad chunk size {size_line!r}") from None
        if size == 0:
            while _line(rfile) not in (b"\r\n", b"\n"):  # trailers
                pass
            return b"".join(parts)
        parts.append(_read_exact(rfile, size))
        if _line(rfile) not in (b"\r\n", b"\n"):
            raise _Protocol("chunk not followed by CRLF")


def _read_exact(rfile: BinaryIO, n: int) -> bytes:
    data = rfile.read(n)
    if len(data) != n:
        raise _Protocol(f"body ended after {len(data)} of {n} bytes")
    return data


def _clean(value: str, what: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError(f"{what} must not contain CR or LF: {value!r}")
    return value


class Pool:
    """Keep-alive connections to one endpoint, shared by threads (one request per
    connection at a time; idle ones are reused newest first, at most `max_idle` kept)."""

    def __init__(
        self, endpoint: str, timeout: float, max_idle: int = 32, proxy: str | None = None
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must be an http:// or https:// URL, got {endpoint!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        default_port = 443 if self._https else 80
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if self._port == default_port else f"{host}:{self._port}"
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._max_idle = max_idle
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self._closed = False
        self._ssl = ssl.create_default_context() if self._https else None
        # Through an HTTP proxy: connections go to the proxy, requests name the absolute
        # URL (RFC 9112 §3.2.2), credentials in the proxy URL become Proxy-Authorization.
        self._via: tuple[str, int] | None = None
        self._absolute = ""
        self._proxy_auth: str | None = None
        if proxy is not None:
            p = urlsplit(proxy)
            if p.scheme != "http" or not p.hostname:
                raise ValueError(f"proxy must be an http:// URL, got {proxy!r}")
            if self._https:
                raise ValueError("https endpoints through a proxy are not supported")
            self._via = (p.hostname, p.port or 80)
            self._absolute = f"http://{self._host_header}"
            if p.username is not None:
                user = f"{unquote(p.username)}:{unquote(p.password or '')}"
                self._proxy_auth = "Basic " + base64.b64encode(user.encode()).decode("ascii")

    def _connect(self) -> _Conn:
        host, port = self._via or (self._host, self._port)
        try:
            sock = socket.create_connection((host, port), timeout=self._timeout)
        except OSError as e:
            what = "proxy " if self._via else ""
            raise WireError(f"cannot connect to {what}{host}:{port}: {e}", sent=False) from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._host)
        except OSError as e:
            sock.close()
            raise WireError(f"TLS to {self._host}:{self._port} failed: {e}", sent=False) from e
        return _Conn(sock)

    def _checkout(self) -> _Conn:
        while True:
            with self._lock:
                if self._closed:
                    raise WireError("the client is closed", sent=False)
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect()
            if not conn.stale():
                return conn
            conn.close()

    def _checkin(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        headers: dict[str, str],
        content: bytes | None,
        json: Any,
    ) -> WireReply:
        target = self._prefix + path
        if params:
            target += "?" + "&".join(
                f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params.items()
            )
        body = content
        if json is not None:
            body = _json.dumps(json, separators=(",", ":")).encode()
            headers.setdefault("Content-Type", "application/json")
        target = self._absolute + target
        lines = [f"{method} {_clean(target, 'request target')} HTTP/1.1", f"Host: {self._host_header}"]
        if self._proxy_auth is not None:
            lines.append(f"Proxy-Authorization: {self._proxy_auth}")
        lines.extend(f"{_clean(k, 'header name')}: {_clean(v, 'header value')}" for k, v in headers.items())
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body) if body is not None else 0}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        conn = self._checkout()
        try:
            conn.sock.sendall(head + body if body else head)
            reply, keep = self._read_reply(conn.rfile, method)
        except (OSError, _Protocol) as e:
            conn.close()
            raise WireError(f"{type(e).__name__}: {e}", sent=True) from e
        if keep:
            self._checkin(conn)
        else:
            conn.close()
        return reply

    @staticmethod
    def _read_reply(rfile: BinaryIO, method: str) -> tuple[WireReply, bool]:
        while True:
            status_line = _line(rfile)
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise _Protocol(f"bad status line {status_line[:80]!r}")
            try:
                status = int(parts[1])
            except ValueError:
                raise _Protocol(f"bad status line {status_line[:80]!r}") from None
            pairs: list[tuple[str, str]] = []
            while True:
                line = _line(rfile)
                if line in (b"\r\n", b"\n"):
                    break
                if len(pairs) >= _MAX_HEADERS:
                    raise _Protocol("too many response headers")
                name, sep, value = line.decode("latin-1").partition(":")
                if not sep:
                    raise _Protocol(f"bad header line {line[:80]!r}")
                pairs.append((name.strip(), value.strip()))
            if 100 <= status < 200:  # informational: the real answer follows
                continue
            break
        headers = _HeaderMap(pairs)
        connection = (headers.get("connection") or "").lower()
        keep = parts[0] == b"HTTP/1.1" and "close" not in connection
        if method == "HEAD" or status in (204, 304):
            return WireReply(status, headers, b""), keep
        if "chunked" in (headers.get("transfer-encoding") or "").lower():
            return WireReply(status, headers, _read_chunked(rfile)), keep
        length = headers.get("content-length")
        if length is None:  # delimited by the end of the connection
            return WireReply(status, headers, rfile.read()), False
        try:
            n = int(length)
        except ValueError:
            raise _Protocol(f"bad Content-Length {length!r}") from None
        return WireReply(status, headers, _read_exact(rfile, n)), keep

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
