"""Readers for recorded arrival traces; each returns an :class:`ArrivalProcess` that replays it.

Three formats (``format: auto`` tells them apart by their first line):

- request timestamps, one request per row: the Azure LLM inference format (a ``TIMESTAMP``
  column of date-times, e.g. ``../shared/data/traces/azure-llm-2023/``) or a ``timestamp_s``
  column of seconds;
- a rate series with the header ``time_s,rate_rps`` (piecewise-constant rate from each
  row's time to the next);
- ServeGen per-client window files without header: ``timestamp_s, rate, cv, distribution,
  shape, scale`` per 10-minute window (a folder of them is a superposition of clients).

A malformed file raises :class:`~rlsched.errors.ConfigError` naming the file, the field
(column and row) and the value.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from rlsched.errors import ConfigError
from rlsched.workloads.arrivals import (
    ArrivalProcess,
    RateSeriesArrivals,
    RenewalWindow,
    ServeGenArrivals,
    TimestampArrivals,
)

FORMATS = ("auto", "timestamps", "rate-series", "servegen")


def _rows(path: Path) -> list[list[str]]:
    try:
        with path.open(newline="") as handle:
            return [row for row in csv.reader(handle) if row and any(cell.strip() for cell in row)]
    except OSError as exc:
        raise ConfigError(path, "file", str(path), f"cannot read the trace: {exc.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(path, "file", str(path), f"not a CSV text file ({exc})") from None


def _number(path: Path, field: str, text: str, minimum: float | None = 0.0) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(path, field, text, "not a number") from None
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise ConfigError(path, field, text, f"must be a finite number >= {minimum}")
    return value


def detect_format(path: Path) -> str:
    """``timestamps``, ``rate-series`` or ``servegen`` from the file's first line (or a folder)."""
    if path.is_dir():
        return "servegen"
    rows = _rows(path)
    if not rows:
        raise ConfigError(path, "file", str(path), "the trace is empty")
    header = [cell.strip() for cell in rows[0]]
    if "TIMESTAMP" in header or "timestamp_s" in header:
        return "timestamps"
    if header[:2] == ["time_s", "rate_rps"]:
        return "rate-series"
    if len(header) == 6:
        return "servegen"
    raise ConfigError(path, "header", ",".join(header), "expected a TIMESTAMP or timestamp_s column, the header time_s,rate_rps, or a 6-column ServeGen window file")


def load_trace(path: str | Path, fmt: str = "auto", rate_scale: float = 1.0, time_warp: float = 1.0, offset_s: float = 0.0) -> ArrivalProcess:
    """Read a trace file and return the process replaying it.

    :param fmt: one of :data:`FORMATS`
    :param rate_scale: multiplies the request rate
    :param time_warp: trace seconds replayed per simulated second
    :param offset_s: trace time at simulated time 0, seconds
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise ConfigError(path, "format", fmt, f"allowed: {', '.join(FORMATS)}")
    if not path.exists():
        raise ConfigError(path, "file", str(path), "no such trace file")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "timestamps":
        times = read_timestamps_s(path)
        period = float(times[-1] + (times[-1] / max(times.size - 1, 1)))  # one mean gap after the last
        return TimestampArrivals(times, period, rate_scale, time_warp, offset_s)
    if fmt == "rate-series":
        times, rates = read_rate_series(path)
        step = float(np.median(np.diff(times))) if times.size > 1 else 1.0
        return RateSeriesArrivals(times, rates, float(times[-1] + step), rate_scale, time_warp, offset_s)
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    if not files:
        raise ConfigError(path, "file", str(path), "the folder holds no ServeGen *.csv files")
    clients = [read_servegen_windows(f) for f in files]
    period = max(w[-1].start_s + w[-1].length_s for w in clients)
    return ServeGenArrivals(clients, period, rate_scale, time_warp, offset_s)


def read_timestamps_s(path: Path) -> np.ndarray:
    """Request times in seconds from the first request, sorted."""
    rows = _rows(path)
    header = [cell.strip() for cell in rows[0]]
    column = "timestamp_s" if "timestamp_s" in header else "TIMESTAMP"
    if column not in header:
        raise ConfigError(path, "header", ",".join(header), "needs a TIMESTAMP or timestamp_s column")
    k = header.index(column)
    cells = []
    for n, row in enumerate(rows[1:], start=2):
        if k >= len(row):
            raise ConfigError(path, f"{column}[line {n}]", None, "missing value")
        cells.append(row[k].strip())
    if not cells:
        raise ConfigError(path, column, None, "the trace has no requests")
    if column == "timestamp_s":
        times = np.array([_number(path, f"timestamp_s[line {n}]", c, None) for n, c in enumerate(cells, start=2)])
    else:
        try:
            stamps = np.array([c.replace(" ", "T") for c in cells], dtype="datetime64[ns]")
        except ValueError:
            bad = next(n for n, c in enumerate(cells, start=2) if not _is_datetime(c))
            raise ConfigError(path, f"TIMESTAMP[line {bad}]", cells[bad - 2], "not a date-time such as 2023-11-16 18:15:46.68") from None
        times = (stamps - stamps.min()).astype("timedelta64[ns]").astype(np.int64) / 1e9
    times = np.sort(times - times.min())
    return times


def _is_datetime(text: str) -> bool:
    try:
        np.datetime64(text.replace(" ", "T"), "ns")
        return True
    except ValueError:
        return False


def read_rate_series(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(segment start times relative to the first, rates) from a ``time_s,rate_rps`` CSV."""
    rows = _rows(path)
    if [c.strip() for c in rows[0][:2]] != ["time_s", "rate_rps"]:
        raise ConfigError(path, "header", ",".join(rows[0]), "a rate series starts with the header time_s,rate_rps")
    times, rates = [], []
    for n, row in enumerate(rows[1:], start=2):
        if len(row) < 2:
            raise ConfigError(path, f"rate_rps[line {n}]", None, "missing value")
        times.append(_number(path, f"time_s[line {n}]", row[0], None))
        rates.append(_number(path, f"rate_rps[line {n}]", row[1]))
        if len(times) > 1 and times[-1] <= times[-2]:
            raise ConfigError(path, f"time_s[line {n}]", row[0], "times must increase")
    if not times:
        raise ConfigError(path, "rate_rps", None, "the series has no rows")
    t = np.array(times)
    return t - t[0], np.array(rates)


def read_servegen_windows(path: Path) -> list[RenewalWindow]:
    """One ServeGen client: its windows (timestamp_s, rate, cv, distribution, shape, scale)."""
    rows = _rows(path)
    if not rows:
        raise ConfigError(path, "file", str(path), "the ServeGen file is empty")
    starts, raw = [], []
    for n, row in enumerate(rows, start=1):
        if len(row) != 6:
            raise ConfigError(path, f"line {n}", ",".join(row), "a ServeGen row has 6 columns: timestamp_s,rate,cv,distribution,shape,scale")
        start = _number(path, f"timestamp_s[line {n}]", row[0], None)
        if starts and start <= starts[-1]:
            raise ConfigError(path, f"timestamp_s[line {n}]", row[0], "window times must increase")
        rate = _number(path, f"rate[line {n}]", row[1])
        dist = row[3].strip().lower()
        if dist not in ("gamma", "weibull", ""):
            raise ConfigError(path, f"distribution[line {n}]", row[3], "allowed: Gamma, Weibull or empty")
        shape = scale = 0.0
        if dist:
            shape = _number(path, f"shape[line {n}]", row[4])
            scale = _number(path, f"scale[line {n}]", row[5])
            if shape <= 0 or scale <= 0:
                raise ConfigError(path, f"shape/scale[line {n}]", f"{row[4]},{row[5]}", "must be > 0")
        starts.append(start)
        raw.append((rate, dist or "poisson", shape, scale))
    t = np.array(starts) - starts[0]
    step = float(np.median(np.diff(t))) if t.size > 1 else 600.0
    lengths = np.append(np.diff(t), step)
    return [RenewalWindow(float(s), float(length), r, d, sh, sc) for s, length, (r, d, sh, sc) in zip(t, lengths, raw, strict=True)]
