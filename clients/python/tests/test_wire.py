"""The sync client's HTTP/1.1 transport (`harness_engine._wire`) against a scripted
peer: the framings a proxy in front of the data plane may use, and the failure classes
the retry rules depend on. The data-plane suites cover the ordinary path against the
real server; this file covers what that server never sends."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from harness_engine._wire import Pool, WireError


class Peer:
    """A one-thread TCP server: `script(conn, request_bytes)` answers each request read
    from a connection; returning False closes that connection."""

    def __init__(self, script: Callable[[socket.socket, bytes], bool]) -> None:
        self.script = script
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[bytes] = []
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
                    if b"\r\n\r\n" not in buf:
                        break
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    request, buf = head + b"\r\n\r\n" + buf[:length], buf[length:]
                    self.requests.append(request)
                    if not self.script(conn, request):
                        break

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def peer_factory() -> Iterator[Callable[[Callable[[socket.socket, bytes], bool]], Peer]]:
    peers: list[Peer] = []

    def make(script: Callable[[socket.socket, bytes], bool]) -> Peer:
        peers.append(Peer(script))
        return peers[-1]

    yield make
    for p in peers:
        p.close()


def test_keep_alive_reuses_one_connection_and_sends_a_well_formed_request(peer_factory) -> None:
    def ok(conn: socket.socket, _req: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"a\": 1}")
        return True

    peer = peer_factory(ok)
    pool = Pool(peer.url + "/base/", timeout=5)
    for _ in range(3):
        reply = pool.request("POST", "/v1/x", {"stream": "a b/c"}, {"X-K": "v"}, None, {"k": [1]})
        assert reply.status_code == 200 and reply.json() == {"a": 1}
        assert reply.headers.get("content-type") == "application/json"
    pool.close()
    assert peer.connections == 1
    first = peer.requests[0].decode()
    assert first.startswith("POST /base/v1/x?stream=a%20b%2Fc HTTP/1.1\r\n")
    assert "Content-Type: application/json\r\n" in first
    assert "X-K: v\r\n" in first and "Host: 127.0.0.1:" in first
    assert "Content-Length: 9\r\n" in first and first.endswith('\r\n\r\n{"k":[1]}')


def test_chunked_bodies_and_interim_responses_are_read_whole(peer_factory) -> None:
    def chunked(conn: socket.socket, _req: bytes) -> bool:
        conn.sendall(
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        return True

    pool = Pool(peer_factory(chunked).url, timeout=5)
    reply = pool.request("GET", "/", None, {}, None, None)
    assert (reply.status_code, reply.content) == (201, b"hello world")
    # The connection is still usable: the framing consumed exactly the response.
    assert pool.request("GET", "/", None, {}, None, None).content == b"hello world"
    pool.close()


def test_connection_close_and_a_server_closed_idle_connection_cost_no_request(peer_factory) -> None:
    def once(conn: socket.socket, _req: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
        return False  # keep-alive announced, but the server hangs up right after

    peer = peer_factory(once)
    pool = Pool(peer.url, timeout=5)
    for _ in range(3):
        assert pool.request("DELETE", "/x", None, {}, None, None).status_code == 204
        # Let the close reach this side before the next checkout looks at the socket.
        threading.Event().wait(0.05)
    pool.close()
    # Each request found its idle connection closed and opened a new one instead of
    # failing after sending (which a non-idempotent call could not retry).
    assert peer.connections == 3 and len(peer.requests) == 3


def test_failures_say_whether_the_request_may_have_landed(peer_factory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(WireError) as refused:
        Pool(f"http://127.0.0.1:{port}", timeout=2).request("GET", "/", None, {}, None, None)
    assert refused.value.sent is False

    def hang_up(_conn: socket.socket, _req: bytes) -> bool:
        return False  # read the request, answer nothing

    with pytest.raises(WireError) as lost:
        Pool(peer_factory(hang_up).url, timeout=2).request("POST", "/", None, {}, b"x", None)
    assert lost.value.sent is True

    def short(conn: socket.socket, _req: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        return False

    with pytest.raises(WireError, match="3 of 10"):
        Pool(peer_factory(short).url, timeout=2).request("GET", "/", None, {}, None, None)


def test_header_injection_is_refused_before_anything_is_sent(peer_factory) -> None:
    peer = peer_factory(lambda conn, req: False)
    pool = Pool(peer.url, timeout=2)
    with pytest.raises(ValueError, match="CR or LF"):
        pool.request("GET", "/", None, {"X-Evil": "a\r\nHost: other"}, None, None)
    with pytest.raises(ValueError, match="http:// or https://"):
        Pool("ftp://example", timeout=1)
    pool.close()
    assert peer.requests == []
