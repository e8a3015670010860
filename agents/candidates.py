"""Candidate configurations for one decision, and what the planner's value model predicts for each.

A decision among a few dozen whole configurations is cheap where solving the planner's MILP
is not (tens to hundreds of ms): :class:`CandidateLibrary` keeps a library of the planner's
own solutions and values every one of them, plus the running configuration, at the current
forecast with the planner's model (:meth:`rlsched.solver.planner.Planner.evaluate`: the
predicted Goodput over the lookahead and the cost of moving there from the running
configuration). The library planner (``planner-library``) takes the best of them; a learned
scorer can choose among them instead.

Where the library comes from:

- at reset, the planner's solutions for the long-run mean rates scaled jointly by
  :data:`JOINT_RATE_SCALES` and for one tenant at a time scaled by
  :data:`SINGLE_TENANT_RATE_SCALES` (the others at their means): the loads a node of this
  shape is likely to see, whatever its traffic;
- while running, a forecast whose rates fall in a bin (:data:`FORECAST_BIN_RATIO`) no
  solution was made for asks the planner for one; it joins the library at the next decision
  (:meth:`CandidateLibrary.refresh`), so no decision waits for the MILP.

Where the solve runs: in evaluation and training, at once, in the decision's own time (so an
episode is reproducible; the report counts the solves' time apart). With ``background=True``
(the daemon) on a worker thread beside the decision loop, started once the decision is made
(:meth:`CandidateLibrary.start_solves`), by a snapshot of the planner taken when the load was
asked for (:meth:`~rlsched.solver.planner.Planner.snapshot`); a solution joins at the first
decision after it is done, and the decision never waits for it. Where each solve is done
before the next decision, the decisions are those of the solves made at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.solver.planner import Planner

#: Multiples of every inference tenant's long-run mean rate the library is seeded with.
JOINT_RATE_SCALES: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
#: Multiples of one tenant's mean rate (the others at their means) the library is seeded with.
SINGLE_TENANT_RATE_SCALES: tuple[float, ...] = (0.25, 3.0)
#: Forecast rates within this ratio of each other share a bin; a bin seen for the first time
#: asks the planner for a solution. 1.3 measured on default seeds 0-2 (library planner):
#: 1.15 gave the same Goodput (3,802,312 against 3,803,472) with ten times the solves.
FORECAST_BIN_RATIO = 1.3
#: Rates below this count as this, requests/s (the log bins need a positive rate).
MIN_BINNED_RATE_RPS = 1e-3
#: Most entries a library holds. Unbounded, it grows with every new load bin, and every
#: decision values all of it: 51 entries after a one-hour `default` episode, and one more
#: every decision on 8 GPUs / 32 tenants (a new bin each time), so a daemon's decisions would
#: slow down without end. Past the bound the entry longest out of use is dropped (its loads
#: are solved again if they come back). 64 measured on the held-out suite, seeds 0-1
#: (library planner): 24 and 32 lost 1.2-2.4% on heldout-deploy, 64 nothing anywhere.
MAX_LIBRARY_ENTRIES = 64
#: Solves a library with a worker (``background``) keeps unfinished at most. A new load asked for
#: beyond them is not queued, and is asked for again at the next decision while it lasts: where
#: solves take longer than the decision interval (a large node) a queue would only grow, and
#: its answers would be for loads long gone. Two: a new load and the one a bin up (``solve_ahead``).
MAX_UNFINISHED_SOLVES = 2
#: How long a worker's solve waits once started, seconds: the decision it was asked in returns
#: first (see :meth:`CandidateLibrary._solve_after_decision`). Small against a decision interval (10 s).
SOLVE_START_DELAY_S = 0.05
#: An entry ranked this high (by the planner's objective) under a forecast is in use.
IN_USE_RANK = 3
#: Candidates offered to a chooser per decision (slot 0: keep the running configuration).
CANDIDATES = 12
#: Intervals of measured rates the burst forecast takes its maximum over.
BURST_WINDOW = 6

Windows = Sequence[Mapping[str, float]]


@dataclass(frozen=True)
class ScoredCandidates:
    """Candidates of one decision and the planner model's prediction for each.

    :param configurations: the candidates; index 0 is the running configuration
    :param value: predicted Goodput over the lookahead, request-equivalents
    :param cost: predicted cost of moving there from the running configuration (0 for index 0)
    """

    configurations: list[Configuration]
    value: np.ndarray
    cost: np.ndarray

    @property
    def objective(self) -> np.ndarray:
        """The planner's objective of each candidate: value minus cost."""
        return self.value - self.cost

    def best(self) -> int:
        """Index of the candidate with the largest objective (the running one on ties)."""
        return int(np.argmax(self.objective))


class CandidateLibrary:
    """The planner's solutions for one node, grown as new loads appear (see the module docstring).

    :param env: the environment (its scenario, performance and memory models, and the
        running configuration a multi-GPU node is planned from); call :meth:`seed` once it is reset
    :param planner: the planner whose solutions and model are used
    :param background: solve new loads on a worker thread (see the module docstring); the
        seed solves still run at once
    :param from_running: solve every load from the configuration running when it was asked
        for (an entry is then a move the planner would make from there), not only on a node
        of several GPUs (see :meth:`_solve`)
    :param solve_ahead: with each new load bin, also ask for the bin one step up (every rate
        times :data:`FORECAST_BIN_RATIO`): the move a rising load will call for, solved before
        the load gets there (see :meth:`request`)
    """

    def __init__(self, env: GpuShareEnv, planner: Planner, background: bool = False, from_running: bool = False,
                 solve_ahead: bool = False) -> None:
        self.env = env
        self.planner = planner
        self.from_running = from_running
        self.solve_ahead = solve_ahead
        self.configurations: list[Configuration] = []
        #: Per entry of :attr:`configurations`: the load bins it was solved for (seed loads: none),
        #: and the decision it last ranked in the top :data:`IN_USE_RANK` under a forecast.
        self.bins: list[set[tuple[int, ...]]] = []
        self.last_used: list[int] = []
        self.decisions = 0
        self.pending: list[tuple[Configuration, tuple[int, ...] | None]] = []
        self.seen_bins: set[tuple[int, ...]] = set()
        self.solves = 0
        self.solve_ms = 0.0
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="candidate-library") if background else None
        self.running: list[tuple[Future[Configuration], tuple[int, ...]]] = []
        self.requested: list[tuple[tuple[int, ...], list, Configuration | None, Mapping[str, float] | None, Planner]] = []
        #: Ask for no solves (a training branch's copy of a library: what it would ask for is
        #: the main line's to solve, and a branch's solve would cost the branch a MILP).
        self.frozen = False

    def seed(self, windows_count: int) -> None:
        """Solve the seed loads (see the module docstring), each held over ``windows_count`` windows."""
        means = {t.name: t.arrivals.mean_rate_rps() for t in self.env.scenario.inference_tenants()}
        loads = [{n: r * scale for n, r in means.items()} for scale in JOINT_RATE_SCALES]
        loads += [{n: r * (scale if n == one else 1.0) for n, r in means.items()} for one in means for scale in SINGLE_TENANT_RATE_SCALES]
        for rates in loads:
            self.pending.append((self._solve([rates] * windows_count, self.env.current), None))
        self.refresh()

    def request(self, windows: Windows, rate_cv: Mapping[str, float] | None = None) -> None:
        """Ask for the planner's solution of ``windows`` if its bin is new (joins at :meth:`refresh`);
        with :attr:`solve_ahead`, also for ``windows`` one bin up.

        Why ahead: a bin's solution is the planner's answer at the load it was asked for (from
        the configuration then running), on a rising load often to keep; the move the next
        interval's load calls for is then not in the library. On train-retrain (seed 0) a bin's
        solution was to keep, and one interval later the library without a MILP check moved
        resnet and bert into one 3g where the MILP put them apart. Solving ahead, it earned
        0.983x what the MILP check does on train-retrain (seeds 0-1), against 0.958x
        (docs/history-candidate-policy.md, stop 79).

        :param rate_cv: the forecast's spread per tenant (the planner's ``rate_cv``; None: steady)
        """
        self._request(windows, rate_cv)
        if self.solve_ahead:
            self._request([{n: r * FORECAST_BIN_RATIO for n, r in w.items()} for w in windows], rate_cv)

    def _request(self, windows: Windows, rate_cv: Mapping[str, float] | None) -> None:
        key = self.bin_of(windows)
        if key in self.seen_bins or self.frozen:
            return
        if self.worker is None:
            self.seen_bins.add(key)
            self.pending.append((self._solve(windows, self.env.current, rate_cv), key))
        elif len(self.running) + len(self.requested) < MAX_UNFINISHED_SOLVES:
            self.seen_bins.add(key)
            # The worker solves with a snapshot of the planner as it stands: the decision loop
            # goes on valuing candidates with ``planner`` (and sets its next interval's state) meanwhile.
            self.requested.append((key, list(windows), self.env.current, rate_cv, self.planner.snapshot()))

    def start_solves(self) -> None:
        """Start the solves asked for in this decision on the worker (``background``); a policy
        calls it once its decision is made (:meth:`refresh` starts any left). Started at once,
        a solve competed with the rest of the decision for the interpreter: on ``default``
        ``candidate-ppo``'s network took 3 ms a pass, not 0.1 (stop 80)."""
        for key, windows, running, rate_cv, solver in self.requested:
            self.running.append((self.worker.submit(self._solve_after_decision, windows, running, rate_cv, solver), key))
        self.requested = []

    def _solve_after_decision(self, windows: Windows, running: Configuration | None, rate_cv: Mapping[str, float] | None,
                              solver: Planner) -> Configuration:
        """:meth:`_solve` on the worker, :data:`SOLVE_START_DELAY_S` after it is started: a solve
        that took the interpreter at once ran before the decision had returned (8 ms of the
        worker's CPU inside an 8-GPU decision; none with the delay; stop 80)."""
        time.sleep(SOLVE_START_DELAY_S)
        return self._solve(windows, running, rate_cv, solver)

    def add(self, configuration: Configuration) -> None:
        """Add a solution the planner made outside the library's own solves (e.g. a decision's
        MILP); it joins at :meth:`refresh`, for no load bin."""
        self.pending.append((configuration, None))

    @staticmethod
    def bin_of(windows: Windows) -> tuple[int, ...]:
        """The load bin of a forecast: its first window's rates, binned by :data:`FORECAST_BIN_RATIO`."""
        return tuple(round(math.log(max(r, MIN_BINNED_RATE_RPS)) / math.log(FORECAST_BIN_RATIO)) for r in windows[0].values())

    def refresh(self) -> None:
        """Start a decision: add the solutions done so far to the library (a background solve
        still running joins later), then drop the entries longest out of use beyond
        :data:`MAX_LIBRARY_ENTRIES`."""
        self.decisions += 1
        self.start_solves()
        for future, key in [r for r in self.running if r[0].done()]:
            self.running.remove((future, key))
            self.pending.append((future.result(), key))  # a solve that raised raises here, in the decision loop
        for configuration, key in self.pending:
            if configuration not in self.configurations:
                self.configurations.append(configuration)
                self.bins.append(set())
                self.last_used.append(self.decisions)
            if key is not None:
                self.bins[self.configurations.index(configuration)].add(key)
        self.pending = []
        while len(self.configurations) > MAX_LIBRARY_ENTRIES:
            index = int(np.argmin(self.last_used))  # the oldest on ties
            self.seen_bins -= self.bins[index]
            del self.configurations[index], self.bins[index], self.last_used[index]

    def score(self, windows: Windows, current: Configuration, accuracy: Mapping[str, float], record_use: bool = True) -> ScoredCandidates:
        """The running configuration and every library entry, valued at ``windows``.

        :param record_use: mark the entries ranked in the top :data:`IN_USE_RANK` as in use
            (False for a look that is not the node's decision, e.g. a training branch)
        """
        return self.score_forecasts([windows], current, accuracy, record_use)[0]

    def score_forecasts(self, forecasts: Sequence[Windows], current: Configuration, accuracy: Mapping[str, float],
                        record_use: bool = True) -> list[ScoredCandidates]:
        """:meth:`score` at each forecast, the options valued at all of them at once."""
        entries = [i for i, c in enumerate(self.configurations) if c != current]
        candidates = [current] + [self.configurations[i] for i in entries]
        scored = [self._scored(candidates, assessed) for assessed in self.planner.assess_forecasts(candidates, forecasts, current, accuracy)]
        if record_use:
            for s in scored:
                self.mark_used(candidates, s.objective)
        return scored

    def mark_used(self, candidates: Sequence[Configuration], objective: Sequence[float]) -> None:
        """Mark the library entries among ``candidates`` ranked in the top :data:`IN_USE_RANK`
        by ``objective`` as in use at this decision (the running configuration's entry too)."""
        for candidate in np.argsort(-np.asarray(objective), kind="stable")[:IN_USE_RANK]:
            if candidates[candidate] in self.configurations:
                self.last_used[self.configurations.index(candidates[candidate])] = self.decisions

    def value(self, candidates: Sequence[Configuration], windows: Windows, accuracy: Mapping[str, float]) -> ScoredCandidates:
        """``candidates`` valued at ``windows``; the first is the running configuration."""
        return self._scored(candidates, self.planner.assess_many(candidates, windows, candidates[0], accuracy))

    @staticmethod
    def _scored(candidates: Sequence[Configuration], assessed: Sequence[tuple[float, float, float]]) -> ScoredCandidates:
        value, cost = (np.array([a[k] for a in assessed], dtype=float) for k in (0, 1))
        cost[0] = 0.0
        return ScoredCandidates(list(candidates), value, cost)

    def _solve(self, windows: Windows, running: Configuration | None, rate_cv: Mapping[str, float] | None = None,
               solver: Planner | None = None) -> Configuration:
        """The planner's configuration for ``windows``; ``running``: the node's configuration
        when the solve was asked for; ``solver``: the planner that solves (default :attr:`planner`)."""
        started = time.perf_counter()
        # By default an entry is the best configuration for its load, not the best move from the
        # running one (the scoring prices the move); a node of several GPUs is still planned from
        # the running one (one MILP per GPU: the joint MILP over symmetric GPUs takes seconds).
        # ``from_running`` plans from it on one GPU too (``queue-slo-library``).
        current = None if self.env.scenario.gpu_count == 1 and not self.from_running else running
        configuration = (solver or self.planner).plan(list(windows), current, rate_cv=rate_cv).configuration
        self.solves += 1
        self.solve_ms += (time.perf_counter() - started) * 1e3
        return configuration


def offer_slots(gains: list[np.ndarray]) -> list[int]:
    """The candidates offered: keep (index 0), then the best under each forecast of ``gains``
    (each candidate's predicted gain over keeping under the EWMA forecast, under the burst one)
    in turn, until :data:`CANDIDATES`."""
    # While fewer than CANDIDATES are offered, an order's first CANDIDATES + 1 entries hold one
    # not offered yet: the rest of the order is never read.
    orders = [np.argsort(-g, kind="stable")[: CANDIDATES + 1].tolist() for g in gains]
    offered = [0]
    while len(offered) < min(CANDIDATES, len(gains[0])):
        for order in orders:
            nxt = next((i for i in order if i not in offered), None)
            if nxt is not None and len(offered) < CANDIDATES:
                offered.append(int(nxt))
    return offered


class BurstForecast:
    """The burst forecast a candidate offer ranks under (:func:`offer_slots`): per inference
    tenant, the largest of its last :data:`BURST_WINDOW` intervals' measured arrival rates,
    requests/s."""

    def __init__(self) -> None:
        self.history: deque[dict[str, float]] = deque(maxlen=BURST_WINDOW)

    def record(self, last_rps: Mapping[str, float]) -> dict[str, float]:
        """Add the last interval's measured rates; the burst rates, for the tenants of ``last_rps``."""
        self.history.append(dict(last_rps))
        return {n: max(h[n] for h in self.history) for n in last_rps}
