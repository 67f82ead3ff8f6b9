"""Effects through the run ledger (`harness_engine.effects`) against a live `serve` and a
payments provider running as its own process (`payments_service.py`): a refund is issued
once whatever happens between the call and its record. A worker SIGKILLed after the
provider applied the refund and before the outcome was recorded, a dropped answer, a
refusal and a provider that cannot be asked: afterwards the provider holds exactly one
refund, and the ledger says how its outcome became known."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness_engine import HarnessClient
from harness_engine.effects import (
    EffectContext,
    EffectNeedsHuman,
    EffectRefused,
    Lookup,
    effect,
    run_effect,
)

HERE = Path(__file__).parent


class Payments:
    def __init__(self, url: str) -> None:
        self.url = url

    def _req(self, method: str, path: str, body: object | None = None, key: str | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Idempotency-Key", key)
        return urllib.request.urlopen(req, timeout=5)

    def mode(self, mode: str) -> None:
        self._req("POST", "/mode", {"mode": mode}).read()

    def count(self) -> int:
        return json.loads(self._req("GET", "/count").read())["count"]

    def refund(self, key: str, order: str, amount_cents: int) -> dict:
        """The tool: a refused refund raises EffectRefused; anything else unexpected
        (a dropped connection) propagates and is recorded as unknown."""
        try:
            return json.loads(
                self._req("POST", "/refunds", {"order": order, "amount_cents": amount_cents}, key).read()
            )
        except urllib.error.HTTPError as e:
            if e.code == 422:
                raise EffectRefused("refund declined") from e
            raise

    def lookup(self, key: str) -> Lookup | None:
        try:
            return Lookup("confirmed", json.loads(self._req("GET", f"/refunds/{key}").read()))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return Lookup("refused")
            return None  # the provider cannot say


@pytest.fixture
def payments() -> Iterator[Payments]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "payments_service.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("port: "), line
        yield Payments(f"http://127.0.0.1:{int(line.split()[1])}")
    finally:
        proc.kill()
        proc.wait()


def context(client: HarnessClient, binding_id: str) -> EffectContext:
    return EffectContext(
        worker=client.worker(binding_id),
        run_id="run-1",
        turn_id="t1",
        agent_id="refunds.v3",
        versions={"model": "scripted-1", "tools": "payments@1"},
    )


def started(client: HarnessClient) -> str:
    b = client.bind("refunds.v3", f"refund-{uuid.uuid4().hex}", "deepagents")
    w = client.worker(b)
    w.append_event(
        {"type": "RunStarted", "run_id": "run-1", "turn_id": "t1", "agent_id": "refunds.v3",
         "versions": {"model": "scripted-1"}, "payload": {}}
    )
    return b.binding_id


ARGS = {"order": "A-1", "amount_cents": 2000}


def test_a_confirmed_refund_is_returned_not_repeated(client, payments) -> None:
    b = started(client)
    first = run_effect(context(client, b), "issue_refund", ARGS, lambda k: payments.refund(k, **ARGS))
    # A replacement worker regenerating the same intent gets the recorded result.
    again = run_effect(
        context(client, b), "issue_refund", ARGS,
        lambda k: pytest.fail("a confirmed effect must not be called again"),
    )
    assert again == first and first["refund_id"] == "rf_1"
    assert payments.count() == 1
    w = client.worker(b)
    [(key, e)] = [(k, w.get_effect(k)) for k in [_key(b)]]
    assert (e["status"], e["via"], e["attempts"]) == ("confirmed", "direct", 1), e


def _key(binding_id: str) -> str:
    from harness_engine.effects import effect_key

    return effect_key(binding_id, "t1", "issue_refund", ARGS)


def test_a_worker_killed_after_the_provider_applied_it_is_reconciled(server, client, payments) -> None:
    b = started(client)
    # The first worker: a process of its own, SIGKILLed inside the tool after the
    # provider applied the refund and before the outcome could be recorded.
    script = textwrap.dedent(
        """
        import os, signal, sys
        sys.path.insert(0, os.environ["TESTS_DIR"])
        from harness_engine import HarnessClient
        from harness_engine.effects import run_effect
        from test_effects import ARGS, Payments, context
        client = HarnessClient(os.environ["API"], token=os.environ["TOKEN"])
        payments = Payments(os.environ["PAYMENTS"])
        def tool(key):
            payments.refund(key, **ARGS)
            os.kill(os.getpid(), signal.SIGKILL)
        run_effect(context(client, os.environ["BINDING"]), "issue_refund", ARGS, tool)
        """
    )
    env = dict(os.environ, TESTS_DIR=str(HERE), API=server.api, TOKEN=server.token,
               PAYMENTS=payments.url, BINDING=b)
    killed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    w = client.worker(b)
    assert w.get_effect(_key(b))["status"] == "attempted"
    assert payments.count() == 1
    # The replacement resumes the turn: reconciled by key, never issued again.
    result = run_effect(
        context(client, b), "issue_refund", ARGS,
        lambda k: pytest.fail("an attempted effect is reconciled, not called again"),
        lookup=payments.lookup,
    )
    assert result["refund_id"] == "rf_1"
    assert payments.count() == 1
    e = w.get_effect(_key(b))
    assert (e["status"], e["via"], e["attempts"]) == ("confirmed", "reconciliation", 1), e


def test_a_dropped_answer_is_unknown_then_reconciled(client, payments) -> None:
    b = started(client)
    payments.mode("drop")
    result = run_effect(
        context(client, b), "issue_refund", ARGS, lambda k: payments.refund(k, **ARGS),
        lookup=payments.lookup, backoff=0.01,
    )
    assert result["refund_id"] == "rf_1" and payments.count() == 1
    e = client.worker(b).get_effect(_key(b))
    assert (e["status"], e["via"]) == ("confirmed", "reconciliation"), e


def test_a_refused_refund_may_be_tried_again(client, payments) -> None:
    b = started(client)
    payments.mode("refuse")

    @effect("issue_refund", lookup=payments.lookup)
    def issue_refund(key: str, order: str, amount_cents: int) -> dict:
        return payments.refund(key, order=order, amount_cents=amount_cents)

    with pytest.raises(EffectRefused):
        issue_refund(context(client, b), **ARGS)
    assert client.worker(b).get_effect(_key(b))["status"] == "refused"
    assert payments.count() == 0
    payments.mode("ok")
    assert issue_refund(context(client, b), **ARGS)["refund_id"] == "rf_1"
    e = client.worker(b).get_effect(_key(b))
    assert (e["status"], e["attempts"]) == ("confirmed", 2), e
    assert payments.count() == 1


def test_an_outcome_nobody_can_tell_waits_for_a_person(client, payments) -> None:
    b = started(client)
    payments.mode("blind")
    with pytest.raises(EffectNeedsHuman):
        run_effect(
            context(client, b), "issue_refund", ARGS, lambda k: payments.refund(k, **ARGS),
            lookup=payments.lookup, reconcile_attempts=2, backoff=0.01,
        )
    e = client.worker(b).get_effect(_key(b))
    assert e["status"] == "awaiting_human", e
    # Nothing retries it, not even with the provider back: a person decides.
    payments.mode("ok")
    with pytest.raises(EffectNeedsHuman):
        run_effect(
            context(client, b), "issue_refund", ARGS,
            lambda k: pytest.fail("an effect awaiting a person must not be called"),
            lookup=payments.lookup,
        )
    assert payments.count() == 1
