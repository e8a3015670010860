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
"""

from __future__ import annotations

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

    def _log_probs(self, observations: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Every action's log-probability under the current policy (masked ones near -inf)."""
        return self.policy.get_distribution(observations, action_masks=masks.numpy()).distribution.logits
