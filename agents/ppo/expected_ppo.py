"""PPO whose clipped objective is taken in expectation over every action, from every action's advantage.

PPO estimates its clipped objective ``E_a~pi_old[min(r(a) A(a), clip(r(a)) A(a))]`` from the
one action each step took. Where an environment can tell what *every* action would have
earned (each candidate's paired advantage over the planner's choice, all on the same traffic:
:meth:`~rlsched.agents.ppo.surrogate.SurrogateChoiceEnv.slot_advantages` on the tabulated
surrogate, :meth:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv.slot_advantages` on the
request-level simulator), the expectation can be computed exactly instead:
``sum_a pi_old(a) min(r(a) A(a), clip(r(a)) A(a))`` over the unmasked actions.

Why this matters here: the planner's own choice has advantage 0, and a departure from it is
rare. A one-sample estimate then moves the policy only where it happened to depart, and its
shared scorer drifts in every other state (stop 57's run lost 0.8% this way). With every
action's advantage each state pulls the scores of all its candidates at once: the expected
(all-action) policy gradient (Allen et al., "Mean Actor-Critic", 2017; Ciosek & Whiteson,
"Expected Policy Gradients", 2018), kept within PPO's trust region by its clipping. Rollouts,
the critic, the entropy bonus, minibatches and epochs stay MaskablePPO's.

With ``advantage_replay`` > 0 each update also trains on the states of that many earlier
rollouts, with their recorded advantages. Where the branches follow the planner, this stays
sound because each advantage is the planner's (a slot's paired advantage over the planner's
move, both branches followed by the planner), not the collecting policy's: an old state's
advantages are as true now as when measured. Only the mix of states drifts toward those that
earlier policies visited. Where the branches follow the policy (``branch_follow: policy``), a
replayed advantage is an earlier policy's, which the clip keeps near the current one for a few
updates. The clip still holds each update near the policy before it, which is recomputed on
every state.
Why: on the request-level simulator a choice costs about 1.5 s of branches, so a rollout holds
only 64 of them. Used for one update of ten epochs, they barely moved the deterministic policy.
Fitted on the same recorded choices over many passes, the scorer picked better slots on other
seeds' choices (docs/history-candidate-policy.md, stop 87).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import explained_variance
from torch.nn import functional as F

from rlsched.agents.ppo.candidate_env import ACTION_ADVANTAGES_KEY


class ActionAdvantages(BaseCallback):
    """Collects every step's ``info[ACTION_ADVANTAGES_KEY]`` into ``model.action_advantages``
    (``[n_steps, n_envs, actions]``) for :class:`ExpectedPPO`'s update."""

    def _on_rollout_start(self) -> None:
        self.rows: list[np.ndarray] = []

    def _on_step(self) -> bool:
        self.rows.append(np.stack([info[ACTION_ADVANTAGES_KEY] for info in self.locals["infos"]]))
        return True

    def _on_rollout_end(self) -> None:
        advantages = np.stack(self.rows).astype(np.float32)
        self.model.action_advantages = advantages
        masks = self.model.rollout_buffer.action_masks.reshape(advantages.shape).astype(bool)
        self.logger.record("expected/positive_actions", float((advantages > 0).sum() / max(masks.sum(), 1)))
        self.logger.record("expected/states_with_a_better_action", float((advantages.max(axis=-1) > 0).mean()))


class ExpectedPPO(MaskablePPO):
    """MaskablePPO with the clipped objective in expectation over every unmasked action (see
    the module docstring). Train it with :class:`ActionAdvantages` among the callbacks.

    Its policy loss does not read the critic. Where returns are large (a step that sums many
    intervals' rewards, :attr:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv.choices_only`),
    set ``vf_coef`` to 0: the value loss (about 2e4 there) dominates the one gradient norm PPO
    clips, and the policy's step shrank to nothing (approx_kl about 1e-5 per update, measured)."""

    action_advantages: np.ndarray | None = None

    def __init__(self, *args: Any, advantage_replay: int = 0, **kwargs: Any) -> None:
        """``advantage_replay``: earlier rollouts each update also trains on (module docstring); 0: none."""
        if advantage_replay < 0:
            raise ValueError(f"advantage_replay {advantage_replay}: expected >= 0")
        self.advantage_replay = advantage_replay
        #: (observations, masks, advantages, returns) of the last ``advantage_replay`` rollouts
        #: (made at the first update, so that a loaded model's holds its own ``advantage_replay``)
        self._replay: deque[tuple[torch.Tensor, ...]] | None = None
        super().__init__(*args, **kwargs)

    def _excluded_save_params(self) -> list[str]:
        # the replay holds rollouts, not the model: a resumed run collects it anew
        return [*super()._excluded_save_params(), "_replay"]

    def learn(self, *args: Any, callback: Any = None, **kwargs: Any) -> ExpectedPPO:
        callbacks = callback if isinstance(callback, list) else ([callback] if callback is not None else [])
        if not any(isinstance(c, ActionAdvantages) for c in callbacks):
            callbacks = [*callbacks, ActionAdvantages()]
        return super().learn(*args, callback=callbacks, **kwargs)

    def train(self) -> None:
        assert self.action_advantages is not None, "no action advantages collected (ActionAdvantages callback)"
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        buffer = self.rollout_buffer
        actions = self.action_advantages.shape[-1]
        observations = torch.as_tensor(buffer.observations.reshape(-1, *buffer.obs_shape))
        masks = torch.as_tensor(buffer.action_masks.reshape(-1, actions)).bool()
        advantages = torch.as_tensor(self.action_advantages.reshape(-1, actions))
        returns = torch.as_tensor(buffer.returns.reshape(-1))
        current = (observations, masks, advantages, returns)  # the buffer allocates new arrays each rollout
        if self.advantage_replay:
            if self._replay is None:
                self._replay = deque(maxlen=self.advantage_replay)
            observations, masks, advantages, returns = (torch.cat(parts) for parts in zip(*self._replay, current, strict=True))
            self._replay.append(current)
        with torch.no_grad():
            old_log_probs = self._log_probs(observations, masks)
        old_probs = old_log_probs.exp()
        losses: dict[str, list[float]] = {"policy": [], "value": [], "entropy": [], "kl": [], "clip": []}
        for _ in range(self.n_epochs):
            for batch in torch.randperm(len(observations)).split(self.batch_size):
                distribution = self.policy.get_distribution(observations[batch], action_masks=masks[batch].numpy())
                log_probs = distribution.distribution.logits  # normalised log-probabilities, masked ones near -inf
                ratio = torch.where(masks[batch], (log_probs - old_log_probs[batch]).exp(), torch.zeros_like(log_probs))
                clipped = torch.min(ratio * advantages[batch], ratio.clamp(1 - clip_range, 1 + clip_range) * advantages[batch])
                policy_loss = -(old_probs[batch] * clipped).sum(dim=-1).mean()
                value_loss = F.mse_loss(returns[batch], self.policy.predict_values(observations[batch]).flatten())
                entropy = distribution.entropy().mean()
                loss = policy_loss - self.ent_coef * entropy + self.vf_coef * value_loss
                self.policy.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
                with torch.no_grad():
                    terms = torch.where(masks[batch], old_probs[batch] * (old_log_probs[batch] - log_probs), torch.zeros_like(log_probs))
                    losses["kl"].append(float(terms.sum(dim=-1).mean()))
                    losses["clip"].append(float(((ratio - 1).abs() > clip_range)[masks[batch]].float().mean()))
                losses["policy"].append(policy_loss.item())
                losses["value"].append(value_loss.item())
                losses["entropy"].append(entropy.item())
            self._n_updates += 1
        self.logger.record("train/policy_gradient_loss", np.mean(losses["policy"]))
        self.logger.record("train/value_loss", np.mean(losses["value"]))
        self.logger.record("train/entropy_loss", -np.mean(losses["entropy"]))
        self.logger.record("train/approx_kl", np.mean(losses["kl"]))
        self.logger.record("train/clip_fraction", np.mean(losses["clip"]))
        self.logger.record("train/explained_variance", explained_variance(buffer.values.flatten(), buffer.returns.flatten()))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        self.logger.record("train/states_trained_on", len(observations))

    def _log_probs(self, observations: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Every action's log-probability under the current policy (masked ones near -inf)."""
        return self.policy.get_distribution(observations, action_masks=masks.numpy()).distribution.logits
