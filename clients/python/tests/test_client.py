"""The worker client against a live server: configuration from the sandbox
environment, token rotation, the typed error model, traceparent propagation, and
retries that are safe because of idempotency keys and entry ids (a real TCP proxy
drops responses after the server has acted on the request)."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest

from harness_engine import (
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

    def __init__(self, upstream: str, drop: int) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.drop = drop
        self.connections = 0
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
