"""Errors that name what was wrong, where, and what is allowed.

Every bad input (config, trace, scenario, calibration file, action, policy output) surfaces
as one of these; the CLI turns them into a one-line message and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class RlschedError(Exception):
    """Base class of every error rlsched reports to a user."""


class ConfigError(RlschedError):
    """A file's field holds a value that is missing, malformed or not allowed.

    :param source: the file (or other origin, e.g. "--layout") the value came from
    :param field: dotted path of the field inside it, e.g. ``gi_profiles[3].start_slots``
    :param value: the offending value (``None`` when the field is missing)
    :param reason: what is wrong and what is allowed
    """

    def __init__(self, source: str | Path, field: str, value: Any, reason: str) -> None:
        self.source = str(source)
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{self.source}: field '{field}' = {value!r}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str, Any, str]]:
        # Raised in a worker process (e.g. recording surrogate episodes), it must cross back
        # whole: the default pickling passes only the message and fails to rebuild it.
        return (type(self), (self.source, self.field, self.value, self.reason))
