"""One LangGraph graph, run N times against three checkpointers side by side:
`HarnessCheckpointSaver` (a live `harness-engine serve`), `SqliteSaver`
(langgraph-checkpoint-sqlite, a file in a temp dir) and `PostgresSaver`
(langgraph-checkpoint-postgres, a PostgreSQL cluster this script creates with initdb on
a free port in a temp dir, and stops afterwards).

Every run is a new thread of the same three-node graph, invoked with
``durability="sync"`` so each checkpoint is written before the next step starts (the
setting under which a checkpointer's latency is on the turn's critical path, and the one
a worker that must survive a restart uses). The figures:

- checkpoints/s: `put` calls completed per second of wall time over all N runs (the
  graph's own work included, the same for all three);
- put p50/p99 (ms): latency of each `put` call as the graph saw it; put_writes p50 the
  same for `put_writes` (a task's pending writes, one call per step) and get_tuple p50
  for `get_tuple` (the thread's latest checkpoint, read when a run starts);
- ms per run, and beside it the same graph on LangGraph's `InMemorySaver` (a dict in
  the process, measured in the same rounds): that is the graph's own work, which bounds
  every saver, and the difference is what each saver adds to a run. (The calls' summed
  latencies would not say this: LangGraph runs some of them concurrently.)

The savers (the three and `InMemorySaver`) stay open for the whole benchmark and are
measured in ``--rounds`` rounds (default 8); each round runs all four, one after the
other, in an order that rotates from round to round, so a slower or faster stretch of a
shared machine falls on all of them alike. The medians over the rounds are the result.

Printed as a table; the same figures go to target/bench/python.json as one flat object.

    python bench/bench_checkpointers.py --runs 300 --rounds 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from graphs import build  # noqa: E402

from harness_engine import HarnessClient, testing  # noqa: E402
from harness_engine.langgraph import CODEC, HarnessCheckpointSaver  # noqa: E402


class Timed:
    """Wraps a saver's `put`, `put_writes` and `get_tuple` to record each call's latency
    (the three calls a synchronous graph run makes)."""

    def __init__(self, saver: Any) -> None:
        self.latencies: list[float] = []
        self.writes: list[float] = []
        self.reads: list[float] = []
        saver.put = self._wrap(saver.put, self.latencies)
        saver.put_writes = self._wrap(saver.put_writes, self.writes)
        saver.get_tuple = self._wrap(saver.get_tuple, self.reads)

    @staticmethod
    def _wrap(inner: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - t)

        return timed


def measure(name: str, saver: Any, runs: int, warmup: int) -> dict[str, float]:
    graph = build(saver)
    for _ in range(warmup):
        graph.invoke({"steps": []}, {"configurable": {"thread_id": f"warm-{uuid.uuid4().hex}"}}, durability="sync")
    timed = Timed(saver)
    graph = build(saver)
    start = time.perf_counter()
    for _ in range(runs):
        out = graph.invoke(
            {"steps": []}, {"configurable": {"thread_id": f"run-{uuid.uuid4().hex}"}}, durability="sync"
        )
        assert out["steps"] == ["plan:0", "act:1", "reflect:2"], out
    elapsed = time.perf_counter() - start
    lat = sorted(timed.latencies)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return {
        "ms_per_run": elapsed / runs * 1000,
        "get_tuple_p50_ms": statistics.median(timed.reads) * 1000 if timed.reads else 0.0,
        "checkpoints_per_s": len(lat) / elapsed,
        "put_p50_ms": statistics.median(lat) * 1000,
        "put_p99_ms": p99 * 1000,
        "put_writes_p50_ms": statistics.median(timed.writes) * 1000 if timed.writes else 0.0,
        "checkpoints": float(len(lat)),
        "seconds": elapsed,
    }


@contextmanager
def harness_saver(binary: str | None) -> Iterator[Any]:
    if binary:
        os.environ["HARNESS_ENGINE_BIN"] = binary
    # The per-binding write limit (500/s by default) is an operator setting meant to
    # protect the store from one runaway conversation; the benchmark measures the
    # store path, so it raises the limit.
    server = testing.start(extra_args=["--writes-per-second", "1000000", "--write-burst", "1000000"])
    try:
        client = HarnessClient(server.api, token=server.token)
        binding = client.bind("bench", f"conv-{uuid.uuid4().hex}", "deepagents")
        yield HarnessCheckpointSaver(client.worker(binding, codec=CODEC))
        client.close()
    finally:
        server.stop()


@contextmanager
def memory_saver() -> Iterator[Any]:
    from langgraph.checkpoint.memory import InMemorySaver

    yield InMemorySaver()


@contextmanager
def sqlite_saver(tmp: Path) -> Iterator[Any]:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(tmp / "sqlite-saver.db", check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin() -> Path:
    for tool in ("pg_ctl", "initdb"):
        found = shutil.which(tool)
        if found:
            return Path(found).parent
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / "pg_ctl").exists():
            return d
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("bench: installing PostgreSQL from Debian's packages", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "postgresql"], check=True)
        return _pg_bin()
    raise SystemExit("bench: PostgreSQL (initdb, pg_ctl) not found; install postgresql")


@contextmanager
def postgres_saver(tmp: Path) -> Iterator[Any]:
    from langgraph.checkpoint.postgres import PostgresSaver

    bindir = _pg_bin()
    data = tmp / "pgdata"
    port = _free_port()
    # initdb refuses to run as root: run the cluster as an unprivileged user.
    as_user: list[str] = []
    if os.geteuid() == 0:
        user = "postgres"
        shutil.chown(tmp, user=user)
        tmp.chmod(0o755)
        as_user = ["runuser", "-u", user, "--"]
    log = tmp / "postgres.log"
    subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "bench", "--auth=trust", "-E", "UTF8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    opts = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1"
    subprocess.run(
        [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        uri = f"postgresql://bench@127.0.0.1:{port}/postgres?sslmode=disable"
        with PostgresSaver.from_conn_string(uri) as saver:
            saver.setup()
            yield saver
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", "300")))
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "8")))
    parser.add_argument("--binary", help="harness-engine binary (default: HARNESS_ENGINE_BIN, target/debug)")
    parser.add_argument("--out", default=str(testing.REPO / "target" / "bench" / "python.json"))
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="he-bench-py-"))
    names = ["harness", "sqlite", "postgres"]
    # The graph's own work: the same graph on a dict in the process, in the same rounds.
    measured = [*names, "memory"]
    rounds: list[dict[str, dict[str, float]]] = []
    with contextlib.ExitStack() as stack:
        try:
            savers = {
                "harness": stack.enter_context(harness_saver(args.binary)),
                "sqlite": stack.enter_context(sqlite_saver(tmp)),
                "postgres": stack.enter_context(postgres_saver(tmp)),
                "memory": stack.enter_context(memory_saver()),
            }
            for i in range(args.rounds):
                order = measured[i % 4 :] + measured[: i % 4]
                results: dict[str, dict[str, float]] = {}
                for name in order:
                    results[name] = measure(name, savers[name], args.runs, args.warmup if i == 0 else 0)
                rounds.append(results)
                print(
                    f"round {i + 1}/{args.rounds} ({' -> '.join(order)}): "
                    + ", ".join(f"{n} {results[n]['checkpoints_per_s']:.1f}/s" for n in measured),
                    flush=True,
                )
        finally:
            stack.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in rounds)

    print(f"\nLangGraph checkpointers: {args.rounds} rounds of {args.runs} runs of a 3-node graph, durability=sync\n")
    print(f"{'round':<6} " + " ".join(f"{n + ' ckpt/s':>16}" for n in names) + f" {'harness/postgres':>17} {'harness/sqlite':>15}")
    for i, r in enumerate(rounds):
        hp = r["harness"]["checkpoints_per_s"] / r["postgres"]["checkpoints_per_s"]
        hs = r["harness"]["checkpoints_per_s"] / r["sqlite"]["checkpoints_per_s"]
        print(f"{i + 1:<6} " + " ".join(f"{r[n]['checkpoints_per_s']:>16.1f}" for n in names) + f" {hp:>16.2f}x {hs:>14.2f}x")
    print(
        f"\n{'saver':<10} {'checkpoints/s':>14} {'put p50 ms':>11} {'put p99 ms':>11} "
        f"{'put_writes p50':>15} {'get_tuple p50':>14} {'ms/run':>8} {'ms/run over in-memory':>22}"
        "   (medians over the rounds)"
    )
    for name in measured:
        added = statistics.median(r[name]["ms_per_run"] - r["memory"]["ms_per_run"] for r in rounds)
        print(
            f"{name:<10} {median(name, 'checkpoints_per_s'):>14.1f} {median(name, 'put_p50_ms'):>11.2f} "
            f"{median(name, 'put_p99_ms'):>11.2f} {median(name, 'put_writes_p50_ms'):>15.2f} "
            f"{median(name, 'get_tuple_p50_ms'):>14.2f} {median(name, 'ms_per_run'):>8.2f} {added:>22.2f}"
        )
    over_pg = statistics.median(r["harness"]["checkpoints_per_s"] / r["postgres"]["checkpoints_per_s"] for r in rounds)
    over_sqlite = statistics.median(r["harness"]["checkpoints_per_s"] / r["sqlite"]["checkpoints_per_s"] for r in rounds)
    print(f"\nharness / postgres throughput, median of the rounds' ratios: {over_pg:.2f}x (target >= 1.5x)")
    print(f"harness / in-process sqlite throughput, median: {over_sqlite:.2f}x")

    flat: dict[str, float | int | str] = {"runs": args.runs, "rounds": args.rounds}
    for name in measured:
        for k in rounds[0][name]:
            flat[f"{name}.{k}"] = round(median(name, k), 3)
        flat[f"{name}.checkpoints_per_s_by_round"] = [round(r[name]["checkpoints_per_s"], 1) for r in rounds]  # type: ignore[assignment]
        flat[f"{name}.ms_per_run_over_memory"] = round(
            statistics.median(r[name]["ms_per_run"] - r["memory"]["ms_per_run"] for r in rounds), 3
        )
    flat["harness_over_postgres"] = round(over_pg, 3)
    flat["harness_over_sqlite"] = round(over_sqlite, 3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(flat, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
