"""The package ships `py.typed`; its own code must type-check strictly, so users of the
adapters get real types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "harness_engine"


def test_package_is_strictly_typed() -> None:
    assert (PACKAGE / "py.typed").exists()
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports", "--no-incremental", str(PACKAGE)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
