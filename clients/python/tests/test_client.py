"""The worker client against a live server: configuration from the sandbox
environment, token rotation, the typed error model, traceparent propagation, and
retries that are safe because of idempotency keys and entry ids (a real TCP proxy
drops responses after the server has acted on the request)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid

import pytest

from harness_engine import (
    AsyncHarnessClient,
    Fence,
    HarnessClient,
    Invalid,
    NotFound,
    RevisionConflict,
    StaleLease,
    TransportError,
    Unauthenticated,
)


def _binding(client):
    return client.bind("agent-client", f"conv-{uuid.uuid4().hex}", "deepagents")


def test_sandbox_environment_configures_the_client(server, tmp_path, monkeypatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(server.token + "\n")
    monkeypatch.setenv("HARNESS_ENGINE_ENDPOINT", server.api)
    monkeypatch.setenv("HARNESS_ENGINE_TOKEN_FILE", str(token_file))
    with HarnessClient() as c:
        assert _binding(c).lease_generation == 1

    monkeypatch.delenv("HARNESS_ENGINE_ENDPOINT")
    with pytest.raises(ValueError, match="HARNESS_ENGINE_ENDPOINT"):
        HarnessClient()


def test_rotated_token_file_is_reread(server, tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("hep_not-a-real-token")
    with HarnessClient(server.api, token_file=str(token_file)) as c:
        with pytest.raises(Unauthenticated) as refused:
            _binding(c)
        assert refused.value.status == 401
        token_file.write_text(server.token)  # the kubelet rotated the projected token
        assert _binding(c).binding_id.startswith("hb_")


def test_error_model_is_typed(client) -> None:
    b = _binding(client)
    w = client.worker(b)
    p = w.write_pending(b"one")
    w.commit(p.state_id, 0, "run-1")
    p2 = w.write_pending(b"two")
    with pytest.raises(RevisionConflict) as conflict:
        w.commit(p2.state_id, 0, "run-2")
    assert conflict.value.actual == 1 and conflict.value.status == 409
    with pytest.raises(StaleLease):
        client.worker(b.binding_id, fence=Fence(0, 7)).load_head()
    with pytest.raises(Invalid):
        w.append("bad\nname", [("a", b"x")])
    with pytest.raises(NotFound):
        client.get_binding("hb_" + "0" * 32)
    assert w.get_object("missing") is None


def test_traceparent_follows_the_current_span_and_baggage_stays_home(client, monkeypatch) -> None:
    from opentelemetry import baggage, context, trace
    from opentelemetry.sdk.trace import TracerProvider

    seen: list[dict[str, str]] = []
    send = client._http.request

    def spy(method, path, params, headers, content, json):  # the headers as sent
        seen.append(dict(headers))
        return send(method, path, params, headers, content, json)

    monkeypatch.setattr(client._http, "request", spy)
    try:
        tracer = TracerProvider().get_tracer("test")
        token = context.attach(baggage.set_baggage("user", "alice"))
        try:
            with tracer.start_as_current_span("turn") as span:
                _binding(client)
                trace_id = format(span.get_span_context().trace_id, "032x")
        finally:
            context.detach(token)
        _binding(client)  # outside any span
    finally:
        monkeypatch.undo()
    inside, outside = seen
    assert inside["traceparent"].split("-")[1] == trace_id
    assert "baggage" not in inside
    assert "traceparent" not in outside
    del trace


class LossyProxy:
    """Forwards TCP to the server, but for the first `drop` connections it closes the
    client side as soon as the server starts answering: the request was executed, the
    caller never hears back (the ambiguous failure a retry must survive)."""

    def __init__(self, upstream: str, drop: int, port: int = 0) -> None:
        host, port_s = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port_s))
        self.drop = drop
        self.connections = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            lossy = self.connections <= self.drop
            threading.Thread(target=self._serve, args=(conn, lossy), daemon=True).start()

    def _serve(self, conn: socket.socket, lossy: bool) -> None:
        up = socket.create_connection(self.upstream)

        def pump_up() -> None:
            try:
                while data := conn.recv(65536):
                    up.sendall(data)
            except OSError:
                pass

        threading.Thread(target=pump_up, daemon=True).start()
        try:
            while data := up.recv(65536):
                if lossy:
                    break  # the answer is lost
                conn.sendall(data)
        except OSError:
            pass
        finally:
            for s in (conn, up):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.sock.close()


def test_retries_after_lost_answers_do_not_duplicate(server, client) -> None:
    b = _binding(client)
    proxy = LossyProxy(server.api, drop=1)
    try:
        with HarnessClient(proxy.url, token=server.token, backoff=0.01) as lossy:
            w = lossy.worker(b)
            appended = w.append("log", [("e-1", b"one")])  # lost once, retried
            assert (appended.appended, appended.duplicates) == (0, 1)
            proxy.drop = proxy.connections + 1  # lose the next answer too
            obj = w.put_object("doc", b"v1", if_none_match=True)
            assert obj.version == 1
            proxy.drop = proxy.connections + 1
            pending = w.write_pending(b"state")
            proxy.drop = proxy.connections + 1
            head = w.commit(pending.state_id, 0, "run-1")  # retried commit, same head
            assert head.revision == 1
    finally:
        proxy.close()
    direct = client.worker(b)
    assert [e.id for e in direct.load_all("log")] == ["e-1"]
    assert direct.load_head().revision == 1


def test_transport_failure_after_retries_is_reported(server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with HarnessClient(f"http://127.0.0.1:{port}", token="x", retries=2, backoff=0.001) as c:
        with pytest.raises(TransportError):
            c.get_binding("hb_" + "0" * 32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_call_outlasts_a_data_plane_restart_within_its_retry_window(server, client) -> None:
    """Nothing listens for a second (the data plane restarting, as in a rolling upgrade of
    the operator), then it is back: a commit in flight retries with backoff and jitter
    until it lands, once. With a window shorter than the outage the caller hears
    TransportError instead."""
    b = _binding(client)
    port = _free_port()
    back: list[LossyProxy] = []

    def come_back() -> None:
        time.sleep(1.0)
        back.append(LossyProxy(server.api, drop=0, port=port))

    threading.Thread(target=come_back, daemon=True).start()
    try:
        with HarnessClient(f"http://127.0.0.1:{port}", token=server.token) as restarting:
            w = restarting.worker(b)
            pending = w.write_pending(b"state during the restart")
            head = w.commit(pending.state_id, 0, "run-restart")
        assert head.revision == 1
        assert back and back[0].connections >= 1
    finally:
        for proxy in back:
            proxy.close()
    assert client.worker(b).load_head().revision == 1
    dead = f"http://127.0.0.1:{_free_port()}"
    with HarnessClient(dead, token="x", retry_window=0.2) as short:
        with pytest.raises(TransportError):
            short.get_binding(b.binding_id)


class ForwardProxy:
    """An HTTP forward proxy (absolute-form request targets, RFC 9112 §3.2.2): records the
    target of every request, forwards it in origin form with `Connection: close`, relays
    the answer."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            self.targets.append(target)
            length = 0
            kept = []
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                if name.lower() not in ("connection", "proxy-authorization"):
                    kept.append(line)
            while len(body) < length:
                body += conn.recv(65536)
            rest = target.removeprefix("http://")
            authority, _, path = rest.partition("/")
            host, _, port = authority.partition(":")
            with socket.create_connection((host, int(port or 80))) as up:
                request = "\r\n".join([f"{method} /{path} {version}", *kept, "Connection: close"])
                up.sendall(request.encode("latin-1") + b"\r\n\r\n" + body)
                while data := up.recv(65536):
                    conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


def test_both_clients_honour_the_same_proxy_variables(server, client, monkeypatch) -> None:
    """HTTP_PROXY sends the sync client (its own HTTP/1.1 pool) and the async client
    (httpx) through the proxy alike; NO_PROXY naming the data plane's host sends both
    straight to it."""
    b = _binding(client)
    proxy = ForwardProxy()
    try:
        for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)

        async def async_get() -> str:
            async with AsyncHarnessClient(server.api, token=server.token) as ac:
                return (await ac.get_binding(b.binding_id)).binding_id

        with HarnessClient(server.api, token=server.token) as sync:
            assert sync.get_binding(b.binding_id).binding_id == b.binding_id
        assert asyncio.run(async_get()) == b.binding_id
        through = [t for t in proxy.targets if t.endswith(f"/v1/bindings/{b.binding_id}")]
        assert len(through) == 2, proxy.targets
        assert all(t.startswith(server.api + "/") for t in through)

        host = server.api.removeprefix("http://").split(":")[0]
        monkeypatch.setenv("NO_PROXY", host)
        before = len(proxy.targets)
        with HarnessClient(server.api, token=server.token) as sync:
            assert sync.get_binding(b.binding_id).binding_id == b.binding_id
        assert asyncio.run(async_get()) == b.binding_id
        assert len(proxy.targets) == before
    finally:
        proxy.close()


def test_a_proxy_the_clients_cannot_use_is_refused_at_construction(monkeypatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "socks5://127.0.0.1:1080")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(ValueError, match="only http:// proxies"):
        HarnessClient("http://data-plane.example:8080", token="x")


def test_bind_names_the_profile_and_memory_policy_for_operator_mode(client) -> None:
    """Operator mode needs `sandbox_profile` for a new conversation (and takes an
    optional `memory_policy`); the request carries both only when given, and `serve`
    (no profiles) accepts and ignores them, answering without a HarnessBinding."""
    from harness_engine._core import bind_call

    plain = bind_call("a", "c", "deepagents", None)
    assert plain.json == {"agent_id": "a", "conversation_id": "c", "harness": "deepagents"}
    named = bind_call("a", "c", "deepagents", None, "python-worker", "research-assistant")
    assert named.json == {
        "agent_id": "a",
        "conversation_id": "c",
        "harness": "deepagents",
        "sandbox_profile": "python-worker",
        "memory_policy": "research-assistant",
    }
    b = client.bind(
        "agent-client", f"conv-{uuid.uuid4().hex}", "deepagents",
        sandbox_profile="python-worker", memory_policy="research-assistant",
    )
    assert b.harness_binding is None and b.lease_generation >= 0

    async def via_async() -> None:
        async with AsyncHarnessClient(client.settings.endpoint, token=client.settings.tokens.get()) as ac:
            again = await ac.bind(b.agent_id, b.conversation_id, "deepagents", sandbox_profile="python-worker")
            assert again.binding_id == b.binding_id

    asyncio.run(via_async())
