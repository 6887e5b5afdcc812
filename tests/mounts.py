"""A real tmpfs for tests that need a mount of their own (a full disk, a workspace that is
unmounted under a run). Needs root, as CI runs; elsewhere the test is skipped."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def mount_tmpfs(where: Path, size: str) -> None:
    """Mount a tmpfs of `size` (e.g. "1m") on the folder `where`, made if missing; the
    caller unmounts it (`umount -l`)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    where.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
