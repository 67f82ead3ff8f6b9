"""Start a real `harness-engine serve` for tests and examples.

Ports are picked by the server (port 0; the bound addresses are read from its banner),
the data directory is a fresh temp dir unless one is given, and `Serve.stop()` stops
the process. The binary is `HARNESS_ENGINE_BIN`, else `target/debug/harness-engine` of
the source checkout this file sits in, else `harness-engine` on `PATH`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

# clients/python/src/harness_engine/testing.py -> the repository root
REPO = Path(__file__).resolve().parents[4]


def binary() -> str:
    explicit = os.environ.get("HARNESS_ENGINE_BIN")
    if explicit:
        return explicit
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    built = Path(target) / "debug" / "harness-engine"
    if built.exists():
        return str(built)
    return shutil.which("harness-engine") or str(built)


@dataclass
class Serve:
    api: str
    admin: str
    token: str
    data_dir: Path
    proc: subprocess.Popen[str]
    _tmp: str | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def database(self) -> Path:
        return self.data_dir / "state.db"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


def start(data_dir: Path | None = None, extra_args: list[str] | None = None) -> Serve:
    """Starts `serve`; with `data_dir`, reuses that directory (a restart: the server
    prints no token then, so keep the first one)."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="he-py-")
        data_dir = Path(tmp) / "data"
    args = [
        binary(),
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--data-dir",
        str(data_dir),
        *(extra_args or []),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    assert proc.stdout is not None
    api = admin = token = ""
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while not admin:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"serve exited before printing its addresses: {lines}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"serve printed no admin address within 30s: {lines}")
        line = line.rstrip("\n")
        lines.append(line)
        if line.startswith("api: "):
            api = line.split()[1]
        elif line.startswith("admin: "):
            admin = line.split()[1]
        elif line.startswith("token: "):
            token = line.split(" ", 1)[1].strip()
    # Keep draining stdout so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    for _ in range(200):
        try:
            with urllib.request.urlopen(f"{admin}/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.05)
    return Serve(api=api, admin=admin, token=token, data_dir=data_dir, proc=proc, _tmp=tmp, lines=lines)
