"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    write_bytes_atomically(path, text.encode())


def write_bytes_atomically(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; a written result is meant to be read like any other file.
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def emit_json(report: object, folder: str | Path | None, name: str) -> None:
    """A script's JSON report: written atomically to ``folder/name`` (the folder created), or
    printed to stdout without a folder."""
    text = json.dumps(report, indent=1)
    if folder is None:
        print(text)
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_text_atomically(Path(folder) / name, text)
