"""``rlsched train --engine rllib``: PPO on Ray RLlib over the same environment, for scale-out.

Ray is an optional extra (``pip install 'rlsched[distributed]'``). Only :mod:`.config` and
:mod:`.export` import without it; :func:`require_ray` is called before anything that needs
ray, so a missing extra ends in one clear message (exit 2) instead of an ImportError.
"""

from __future__ import annotations

from rlsched.errors import ConfigError

#: What installs the engine.
EXTRA_HINT = "pip install 'rlsched[distributed]' (or: make install-distributed)"


def require_ray() -> None:
    """Raise :class:`ConfigError` naming the extra when Ray RLlib is not installed."""
    try:
        import ray.rllib  # noqa: F401
    except ImportError as exc:
        raise ConfigError("--engine", "engine", "rllib", f"needs Ray RLlib, which is not installed ({exc.name}): {EXTRA_HINT}") from None
