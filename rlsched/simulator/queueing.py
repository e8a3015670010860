"""The request-level core of the simulator: one inference server's queue over one interval.

Every request has an arrival time; the server forms batches dynamically (Triton/Clipper
style: start a batch as soon as ``batch_max`` requests wait, or when the oldest waiting
request has waited ``timeout_s``, never before the server is free), serves each batch for
a time drawn from the tenant's per-batch service curve, and records each request's
completion (latency histogram, SLO hit) or drop (arrival finds the bounded queue full, or the
request outwaited the tenant's queue timeout).

The loop is inherently sequential (a batch's start depends on the previous batch's end),
so it is compiled with numba; everything around it (arrival generation, service curves,
statistics) is vectorised numpy. State that crosses a decision boundary (waiting requests,
the batch in flight, when the server is next free) lives in small numpy arrays owned by
the caller, so one call per tenant per decision step is all the Python the hot path does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: Latency histogram: 64 bins per octave (a bin is at most 1/64 = 1.6% wide), from
#: HIST_MIN_S up to HIST_MIN_S * 2**32 (~9 hours); longer latencies land in the last bin.
#: The bin of a latency is read from its float64 bits (exponent and top 6 mantissa bits),
#: which costs a shift instead of a logarithm per request.
HIST_SUB_BITS = 6
HIST_MIN_EXPONENT = -17
HIST_MIN_S = 2.0**HIST_MIN_EXPONENT  # ~7.6 microseconds
HIST_BINS = 32 << HIST_SUB_BITS
_HIST_SHIFT = 52 - HIST_SUB_BITS
_HIST_OFFSET = (1023 + HIST_MIN_EXPONENT) << HIST_SUB_BITS

# Slots of the per-tenant state vector (float64) carried across decision steps.
S_HEAD = 0  # ring-buffer index of the oldest waiting request
S_WAITING = 1  # waiting requests (not in service)
S_SERVER_FREE_S = 2  # when the server finishes its current batch, seconds
S_FLIGHT_N = 3  # requests in the batch in flight (0 if none)
S_FLIGHT_DONE_S = 4  # completion time of the batch in flight, seconds
STATE_SIZE = 5

# Slots of the per-interval output vector (float64).
O_ARRIVED = 0
O_DROPPED = 1
O_COMPLETED = 2
O_ON_TIME = 3  # completed with latency <= slo
O_LATENCY_SUM_S = 4  # sum of latencies of completed requests, seconds
O_BUSY_S = 5  # time the server spent serving batches inside the interval, seconds
O_BATCHES = 6  # batches started
O_BATCHED_REQUESTS = 7  # requests put into those batches
OUT_SIZE = 8


#: Standard normal quantile of 0.99, to fit a lognormal to (mean, p99).
Z99 = 2.3263478740408408


def lognormal_sigma(mean_ms: np.ndarray, p99_ms: np.ndarray) -> np.ndarray:
    """The sigma of the lognormal batch service time with these means and p99s (the draw of
    :func:`serve_interval`): the smaller root of sigma^2/2 - Z99 sigma + ln(p99 / mean) = 0;
    0 where the p99 does not exceed the mean."""
    ratio = np.maximum(np.asarray(p99_ms, dtype=float) / np.maximum(np.asarray(mean_ms, dtype=float), 1e-12), 1.0)
    return Z99 - np.sqrt(np.maximum(Z99 * Z99 - 2.0 * np.log(ratio), 0.0))


def new_state() -> np.ndarray:
    """An empty server: nothing waiting, nothing in flight, free from time 0."""
    return np.zeros(STATE_SIZE)


def histogram_edges_ms() -> np.ndarray:
    """Upper edges of the latency histogram bins, milliseconds (HIST_BINS values)."""
    k = np.arange(1, HIST_BINS + 1)
    sub = 1 << HIST_SUB_BITS
    return 1000.0 * np.ldexp(1.0 + (k % sub) / sub, (k // sub) + HIST_MIN_EXPONENT)


@njit(cache=True)
def histogram_bin(latency_s: float) -> int:
    """The histogram bin of a latency in seconds (for tests and offline tools)."""
    scratch = np.empty(1)
    scratch[0] = latency_s
    k = (scratch.view(np.int64)[0] >> _HIST_SHIFT) - _HIST_OFFSET
    return min(max(k, 0), HIST_BINS - 1)


def percentile_ms(hist: np.ndarray, q: float) -> float:
    """The q-th percentile (0..100) of the latencies counted in ``hist``, milliseconds.

    Reads the upper edge of the bin holding the percentile, so it errs high by at most
    one bin (1.6%); NaN for an empty histogram.
    """
    total = int(hist.sum())
    if total == 0:
        return float("nan")
    rank = max(1, math.ceil(total * q / 100.0))
    index = int(np.searchsorted(np.cumsum(hist), rank))
    return float(_EDGES_MS[index])


@njit(cache=True, inline="always")
def _record_batch(done_s: float, buf: np.ndarray, first: int, count: int, slo_s: float, hist: np.ndarray, out: np.ndarray, scratch: np.ndarray, scratch_bits: np.ndarray) -> None:
    """Count the completion at ``done_s`` of ``count`` requests stored from ``buf[first]`` (ring).

    ``scratch_bits`` is an int64 view of the one-element ``scratch``: the bit pattern of a
    latency gives its histogram bin.
    """
    cap = buf.shape[0]
    on_time = 0
    latency_sum_s = 0.0
    idx = first
    # Requests wait in arrival order, so the on-time ones are a suffix: later arrivals.
    for _ in range(count):
        latency_s = done_s - buf[idx]
        idx += 1
        if idx == cap:
            idx = 0
        latency_sum_s += latency_s
        if latency_s <= slo_s:
            on_time += 1
        scratch[0] = latency_s
        k = (scratch_bits[0] >> _HIST_SHIFT) - _HIST_OFFSET
        if k < 0:
            k = 0
        elif k >= HIST_BINS:
            k = HIST_BINS - 1
        hist[k] += 1
    out[O_COMPLETED] += count
    out[O_ON_TIME] += on_time
    out[O_LATENCY_SUM_S] += latency_sum_s


@njit(cache=True)
def serve_interval(
    arrivals_s: np.ndarray,
    t_start_s: float,
    t_end_s: float,
    available_from_s: float,
    wait_buf: np.ndarray,
    flight_buf: np.ndarray,
    state: np.ndarray,
    service_mean_s: np.ndarray,
    service_sigma: np.ndarray,
    batch_max: int,
    timeout_s: float,
    slo_s: float,
    rng: np.random.Generator,
    hist: np.ndarray,
    out: np.ndarray,
    queue_timeout_s: float = math.inf,
) -> None:
    """Advance one tenant's server from ``t_start_s`` to ``t_end_s``.

    :param arrivals_s: sorted arrival times of the requests arriving in the interval, seconds
    :param available_from_s: the server starts no batch before this time (the end of a
        restart or reconfiguration downtime; requests keep queueing meanwhile), seconds
    :param wait_buf: ring buffer of waiting requests' arrival times; its length is the
        queue bound (an arrival that finds it full is dropped)
    :param flight_buf: arrival times of the batch in flight (length >= any batch size)
    :param state: the carried state vector (``S_*`` slots), updated in place
    :param service_mean_s: service time of a batch of b requests, index b (0 unused), seconds
    :param service_sigma: lognormal sigma of that service time (0: deterministic); the
        draw is mean * exp(sigma z - sigma^2 / 2), so its mean stays ``service_mean_s[b]``
    :param batch_max: largest batch the server forms (< len(service_mean_s))
    :param timeout_s: longest the oldest waiting request is held for a fuller batch, seconds
    :param slo_s: latency objective, seconds (a completion within it is on time)
    :param rng: the tenant's service-jitter Generator (numba draws from the same stream)
    :param hist: latency histogram (``HIST_*`` bins), incremented in place
    :param out: interval statistics (``O_*`` slots), incremented in place
    :param queue_timeout_s: a request that has waited longer than this when the server forms
        its next batch is rejected (counted as dropped), as Triton's queue policy with
        ``timeout_action: REJECT`` does; inf: every request is served, however late
    """
    cap = wait_buf.shape[0]
    n_new = arrivals_s.shape[0]
    scratch = np.empty(1)
    scratch_bits = scratch.view(np.int64)
    head = int(state[S_HEAD])
    waiting = int(state[S_WAITING])
    free_s = state[S_SERVER_FREE_S]
    last_done_s = free_s  # what is carried: downtime is re-applied by the caller each step
    out[O_ARRIVED] += n_new

    # The batch in flight at the last boundary completes first (if it does in this interval).
    flight_n = int(state[S_FLIGHT_N])
    if flight_n > 0:
        done_s = state[S_FLIGHT_DONE_S]
        out[O_BUSY_S] += min(done_s, t_end_s) - t_start_s
        if done_s <= t_end_s:
            _record_batch(done_s, flight_buf, 0, flight_n, slo_s, hist, out, scratch, scratch_bits)
            flight_n = 0
    if free_s < available_from_s:
        free_s = available_from_s

    i = 0  # next new arrival to admit
    while flight_n == 0:
        # Admit every arrival up to the moment the server is free.
        while i < n_new and arrivals_s[i] <= free_s:
            if waiting < cap:
                tail = head + waiting
                wait_buf[tail - cap if tail >= cap else tail] = arrivals_s[i]
                waiting += 1
            else:
                out[O_DROPPED] += 1.0
            i += 1
        if waiting == 0:
            if i >= n_new:
                break
            # Idle server: the next arrival opens the batch.
            wait_buf[head] = arrivals_s[i]
            waiting = 1
            if free_s < arrivals_s[i]:
                free_s = arrivals_s[i]
            i += 1
        if waiting >= batch_max:
            start_s = free_s
        else:
            deadline_s = wait_buf[head] + timeout_s
            if deadline_s < free_s:
                deadline_s = free_s
            start_s = deadline_s
            # Wait for a full batch, but no longer than the oldest request's timeout.
            while i < n_new and arrivals_s[i] <= deadline_s:
                if waiting < cap:
                    tail = head + waiting
                    wait_buf[tail - cap if tail >= cap else tail] = arrivals_s[i]
                    waiting += 1
                else:
                    out[O_DROPPED] += 1.0
                i += 1
                if waiting >= batch_max:
                    start_s = arrivals_s[i - 1]
                    break
            if start_s >= t_end_s:
                break  # decided in the next interval, with its arrivals
            if waiting < batch_max and deadline_s > t_end_s:
                break
        if start_s >= t_end_s:
            break
        # Reject the requests that have outwaited the queue policy's timeout (oldest first:
        # they wait in arrival order). What is left forms the batch; if nothing is, the
        # server is idle from here and the next arrival opens a batch.
        expired = 0
        while expired < waiting and start_s - wait_buf[head] > queue_timeout_s:
            head += 1
            if head == cap:
                head = 0
            expired += 1
        if expired:
            out[O_DROPPED] += expired
            waiting -= expired
            if waiting == 0:
                free_s = start_s
                continue
        b = waiting if waiting < batch_max else batch_max
        service_s = service_mean_s[b]
        sigma = service_sigma[b]
        if sigma > 0.0:
            z = rng.standard_normal()
            service_s *= math.exp(sigma * z - 0.5 * sigma * sigma)
        done_s = start_s + service_s
        out[O_BATCHES] += 1.0
        out[O_BATCHED_REQUESTS] += b
        out[O_BUSY_S] += min(done_s, t_end_s) - start_s
        if done_s <= t_end_s:
            _record_batch(done_s, wait_buf, head, b, slo_s, hist, out, scratch, scratch_bits)
        else:
            idx = head
            for j in range(b):
                flight_buf[j] = wait_buf[idx]
                idx += 1
                if idx == cap:
                    idx = 0
            flight_n = b
            state[S_FLIGHT_DONE_S] = done_s
        head += b
        if head >= cap:
            head -= cap
        waiting -= b
        free_s = done_s
        last_done_s = done_s

    # Arrivals after the last decision point of this interval just queue (or drop).
    while i < n_new:
        if waiting < cap:
            tail = head + waiting
            wait_buf[tail - cap if tail >= cap else tail] = arrivals_s[i]
            waiting += 1
        else:
            out[O_DROPPED] += 1.0
        i += 1
    state[S_HEAD] = head
    state[S_WAITING] = waiting
    state[S_SERVER_FREE_S] = last_done_s
    state[S_FLIGHT_N] = flight_n


_EDGES_MS = histogram_edges_ms()


@njit(cache=True)
def close_interval(hist_step: np.ndarray, hist_total: np.ndarray, percentiles: np.ndarray, result_ms: np.ndarray, edges_ms: np.ndarray) -> None:
    """Add the interval's histogram to the run's and read percentiles (0..100) from it, ms.

    Each percentile is the upper edge (``edges_ms``) of the bin holding it (errs high by at
    most 1.6%);
    NaN when the interval completed nothing.
    """
    total = 0
    for k in range(HIST_BINS):
        total += hist_step[k]
        hist_total[k] += hist_step[k]
    for p in range(percentiles.shape[0]):
        if total == 0:
            result_ms[p] = np.nan
            continue
        rank = max(1, int(math.ceil(total * percentiles[p] / 100.0)))
        seen = 0
        for k in range(HIST_BINS):
            seen += hist_step[k]
            if seen >= rank:
                result_ms[p] = edges_ms[k]
                break


def replay_poisson_p99_ms(mean_ms: np.ndarray, p99_ms: np.ndarray, batch_max: int, rate_rps: float, timeout_ms: float,
                          requests: int, seed: int = 0) -> float:
    """The p99 latency of ``requests`` Poisson arrivals at ``rate_rps`` through one server
    (:func:`serve_interval`, lognormal service as in the simulator), ms; inf when the queue
    bound of 4096 waiting requests overflowed (the server cannot keep up).

    The planner's latency estimate is fitted against and tested with this replay.

    :param mean_ms: mean batch latency for batch 1..``batch_max`` (or longer), ms
    :param p99_ms: p99 batch latency for the same batches, ms
    """
    rng = np.random.default_rng(seed)
    arrivals_s = np.cumsum(rng.exponential(1.0 / rate_rps, requests))
    mean = np.asarray(mean_ms, dtype=float)[:batch_max]
    service_mean_s = np.concatenate([[0.0], mean / 1000.0])
    service_sigma = np.concatenate([[0.0], lognormal_sigma(mean, np.asarray(p99_ms, dtype=float)[:batch_max])])
    hist = np.zeros(HIST_BINS, dtype=np.int64)
    out = np.zeros(OUT_SIZE)
    serve_interval(arrivals_s, 0.0, float(arrivals_s[-1]) + 1e6, 0.0, np.zeros(4096), np.zeros(batch_max), new_state(),
                   service_mean_s, service_sigma, batch_max, timeout_ms / 1000.0, math.inf, rng, hist, out)
    return math.inf if out[O_DROPPED] > 0 else percentile_ms(hist, 99.0)


def sorted_log(arrivals_s: np.ndarray) -> np.ndarray:
    """A request log's arrival times as floats in increasing order: the log itself where it is
    so already, as a backend keeps it. Why: a planner replays and bins each tenant's log many
    times an interval, and checking the order takes a tenth of sorting it again."""
    log = np.asarray(arrivals_s, dtype=float)
    return log if log.size < 2 or bool(np.all(log[1:] >= log[:-1])) else np.sort(log)


def _replay(arrivals_s: np.ndarray, rate_rps: float, mean_ms: np.ndarray, batch_max: int, timeout_ms: float,
            slo_ms: float = math.inf, queue_timeout_ms: float | None = None) -> tuple[np.ndarray, float] | None:
    """(the :func:`serve_interval` outputs, the span served, seconds) of a request log
    ``arrivals_s`` stretched in time so its rate is ``rate_rps``, served with mean batch
    latencies ``mean_ms`` (batch 1..``batch_max``, ms; no jitter) from an empty queue, by a
    server that rejects what waited longer than ``queue_timeout_ms`` (None: serves it all);
    None with no rate or fewer than two distinct arrival times."""
    replayed = _replay_rates(arrivals_s, np.array([rate_rps], dtype=float), mean_ms, batch_max, timeout_ms, slo_ms, queue_timeout_ms)
    if replayed is None:
        return None
    outs, horizons_s = replayed
    return (outs[0], float(horizons_s[0])) if horizons_s[0] >= 0.0 else None


#: The service-jitter stream handed to replays: they serve without jitter, so it is never drawn from.
_NO_JITTER_RNG = np.random.default_rng(0)


def _replay_rates(arrivals_s: np.ndarray, rates_rps: np.ndarray, mean_ms: np.ndarray, batch_max: int, timeout_ms: float,
                  slo_ms: float = math.inf, queue_timeout_ms: float | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_replay` at each of ``rates_rps`` in one compiled call (a planner replays one log
    at several rates per placement): per rate its outputs (rows) and span served, seconds (-1
    where the rate is not positive); None with fewer than two distinct arrival times."""
    log = sorted_log(arrivals_s)
    if log.size < 2 or log[-1] <= log[0]:
        return None
    mean = np.asarray(mean_ms, dtype=float)[:batch_max]
    service_mean_s = np.concatenate([[0.0], mean / 1000.0])
    return _replay_kernel(log - log[0], np.asarray(rates_rps, dtype=float), service_mean_s, batch_max, timeout_ms / 1000.0,
                          slo_ms / 1000.0, math.inf if queue_timeout_ms is None else queue_timeout_ms / 1000.0, _NO_JITTER_RNG)


@njit(cache=True)
def _replay_kernel(offsets_s: np.ndarray, rates_rps: np.ndarray, service_mean_s: np.ndarray, batch_max: int, timeout_s: float,
                   slo_s: float, queue_timeout_s: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The loop of :func:`_replay_rates`: ``offsets_s`` (a sorted log less its first arrival)
    stretched to each rate and served by :func:`serve_interval` from an empty queue."""
    n = offsets_s.shape[0]
    rate_log = n / offsets_s[n - 1]
    outs = np.zeros((rates_rps.shape[0], OUT_SIZE))
    horizons_s = np.full(rates_rps.shape[0], -1.0)
    service_sigma = np.zeros_like(service_mean_s)
    for k in range(rates_rps.shape[0]):
        if rates_rps[k] <= 0.0:
            continue
        times_s = offsets_s * (rate_log / rates_rps[k])  # >1 slows the pattern down to the target rate
        horizons_s[k] = times_s[n - 1]
        serve_interval(times_s, 0.0, horizons_s[k], 0.0, np.zeros(max(4096, n)), np.zeros(batch_max), np.zeros(STATE_SIZE),
                       service_mean_s, service_sigma, batch_max, timeout_s, slo_s, rng, np.zeros(HIST_BINS, dtype=np.int64),
                       outs[k], queue_timeout_s)
    return outs, horizons_s


def replay_busy_fraction(arrivals_s: np.ndarray, rate_rps: float, mean_ms: np.ndarray, batch_max: int, timeout_ms: float) -> float:
    """The fraction of time one server is busy serving a logged arrival pattern at another
    rate: ``arrivals_s`` (a request log, seconds) stretched in time so its rate is
    ``rate_rps``, served by :func:`serve_interval` with mean batch latencies ``mean_ms``
    (batch 1..``batch_max``, ms; no jitter) from an empty queue.

    What a priority-fill instance leaves its fillers is 1 minus this (the simulator measures
    it request by request). The fluid batcher (smallest batch that carries the mean rate)
    is busy nearly all the time; clustered arrivals form full batches and leave far more
    idle time: on the DeepSeek-R1 c35 trace at 238 req/s a resnet50 7g server is busy 0.27
    of the time, where the fluid batcher says 0.63.

    :returns: busy fraction in [0, 1]; 0 with no rate or fewer than two arrivals
    """
    replayed = _replay(arrivals_s, rate_rps, mean_ms, batch_max, timeout_ms)
    if replayed is None:
        return 0.0
    out, horizon_s = replayed
    return min(1.0, float(out[O_BUSY_S]) / horizon_s)


def replay_on_time_fraction(arrivals_s: np.ndarray, rate_rps: float, mean_ms: np.ndarray, batch_max: int, timeout_ms: float,
                            slo_ms: float, queue_timeout_ms: float | None = None) -> float:
    """The fraction of a logged arrival pattern's requests answered within ``slo_ms`` when it
    comes at another rate: the log replayed as :func:`replay_busy_fraction` does, by a server
    that rejects what waited longer than ``queue_timeout_ms`` (None: serves it all).

    The planner's on-time table sees a rate and an index of dispersion; requests that arrive
    in clusters of tens within milliseconds wait behind each other's batches even where the
    server is idle most of the time. On ``train-bursty-high`` (the Azure LLM conversation
    trace, 150x) resnet50 alone in an H100 4g was late for 5.1% of its requests per interval;
    the table predicted 0.14%, this replay of the previous interval's log 4.4%
    (docs/planner-bursts.md, stop 58).

    :returns: on-time fraction in [0, 1]; 1 with no rate or fewer than two arrivals
    """
    return float(replay_on_time_fractions(arrivals_s, np.array([rate_rps]), mean_ms, batch_max, timeout_ms, slo_ms, queue_timeout_ms)[0])


def replay_on_time_fractions(arrivals_s: np.ndarray, rates_rps: np.ndarray, mean_ms: np.ndarray, batch_max: int, timeout_ms: float,
                             slo_ms: float, queue_timeout_ms: float | None = None) -> np.ndarray:
    """:func:`replay_on_time_fraction` at each of ``rates_rps``, in one compiled call (a planner's
    SLO guard replays one log at several rates per placement)."""
    rates_rps = np.asarray(rates_rps, dtype=float)
    replayed = _replay_rates(arrivals_s, rates_rps, mean_ms, batch_max, timeout_ms, slo_ms, queue_timeout_ms)
    if replayed is None:
        return np.ones(rates_rps.shape[0])
    outs, horizons_s = replayed
    answered = outs[:, O_COMPLETED] + outs[:, O_DROPPED]
    fractions = np.divide(outs[:, O_ON_TIME], answered, out=np.ones_like(answered), where=answered > 0)
    return np.where(horizons_s >= 0.0, fractions, 1.0)
