"""The candidate scorer: one network for any node, scoring each candidate with shared weights.

For MaskablePPO on :class:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv` (whole
configurations) and :class:`~rlsched.agents.ppo.expert_env.ExpertChoiceEnv` (whom the hedge
follows), each described by a :class:`ScorerLayout`. Each
candidate's features, with the observation's global features appended, go through the same
MLP to one score; the scores are the logits of the masked categorical over candidates. A
learnable multiple of the candidate's predicted gain at the EWMA forecast is added to its
score, so before any update the policy already prefers what the library planner would apply
(the warm start is built in, not cloned), and PPO learns a residual: *which* candidate and
*when*. The critic reads the candidates' mean embedding and the global features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from torch import nn

from rlsched.agents.ppo.candidate_env import CANDIDATE_FEATURES, CANDIDATES, DAEMON_OBSERVERS, GLOBAL_FEATURES, OBSERVER_FEATURES

#: Initial weight of the planner's predicted gain in each score (a gain of 1% of the node's
#: requests per lookahead then weighs 0.2 nats). The deterministic policy is the planner's
#: choice at any positive weight; a smaller one explores more: at 200 the first PPO run's
#: entropy stayed at 0.05 nats and its updates at approx_kl 0.
PLANNER_GAIN_WEIGHT = 20.0


@dataclass(frozen=True)
class ScorerLayout:
    """How an observation is laid out: ``slots`` rows of ``features``, then ``globals``;
    ``prior`` names the feature whose multiple is added to each slot's score."""

    slots: int
    features: tuple[str, ...]
    globals: tuple[str, ...]
    prior: str
    residual_sees_prior: bool = True
    """False: the per-slot MLP reads the prior feature as 0, so the residual cannot simply
    amplify (or undo) the prior in every state; it must score the slots by their other features"""


#: The candidate-choice environment's layout (the planner's predicted gain as the prior).
CANDIDATE_LAYOUT = ScorerLayout(CANDIDATES, CANDIDATE_FEATURES, GLOBAL_FEATURES, "gain_ewma")
#: The layout of each observer (:data:`~rlsched.agents.ppo.candidate_env.OBSERVERS`); through the
#: daemon observer the prior is the daemon planner objective's gain.
CANDIDATE_LAYOUTS = {"plain": CANDIDATE_LAYOUT,
                     **{kind: ScorerLayout(CANDIDATES, OBSERVER_FEATURES[kind], GLOBAL_FEATURES, "gain") for kind in DAEMON_OBSERVERS}}


class CandidateScorer(nn.Module):
    """Scores (actor latent: one logit per slot) and a critic latent from the observation.

    :param hidden: width of the shared per-slot MLP and of the critic's
    :param prior_weight: initial weight of the layout's prior feature in each score
    :param layout: the observation's layout
    :param learn_prior: let training change the prior's weight (False: a constant, so that
        only the per-slot residual can move the policy away from the prior, state by state)
    """

    def __init__(self, hidden: int = 64, prior_weight: float = PLANNER_GAIN_WEIGHT, layout: ScorerLayout = CANDIDATE_LAYOUT,
                 learn_prior: bool = True) -> None:
        super().__init__()
        self.slots = layout.slots
        self.features = len(layout.features)
        self.globals = len(layout.globals)
        self.embed = nn.Sequential(nn.Linear(self.features + self.globals, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.score = nn.Linear(hidden, 1)
        if learn_prior:
            self.prior_weight = nn.Parameter(torch.tensor(float(prior_weight)))
        else:
            self.register_buffer("prior_weight", torch.tensor(float(prior_weight)))
        self.critic = nn.Sequential(nn.Linear(hidden + self.globals, hidden), nn.Tanh())
        self.latent_dim_pi = layout.slots
        self.latent_dim_vf = hidden
        self._prior = layout.features.index(layout.prior)
        self.residual_sees_prior = layout.residual_sees_prior
        hide = torch.ones(self.features)
        hide[self._prior] = 0.0
        self.register_buffer("_hide_prior", hide)

    def _embed(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = observation[:, : self.slots * self.features].reshape(-1, self.slots, self.features)
        glob = observation[:, self.slots * self.features:]
        seen = rows if self.residual_sees_prior else rows * self._hide_prior
        joined = torch.cat([seen, glob.unsqueeze(1).expand(-1, self.slots, -1)], dim=-1)
        return rows, glob, self.embed(joined)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(observation), self.forward_critic(observation)

    def forward_actor(self, observation: torch.Tensor) -> torch.Tensor:
        rows, _, embedded = self._embed(observation)
        return self.score(embedded).squeeze(-1) + self.prior_weight * rows[..., self._prior]

    def forward_critic(self, observation: torch.Tensor) -> torch.Tensor:
        _, glob, embedded = self._embed(observation)
        return self.critic(torch.cat([embedded.mean(dim=1), glob], dim=-1))


class CandidateScorerPolicy(MaskableActorCriticPolicy):
    """MaskablePPO's actor-critic with :class:`CandidateScorer` in place of the MLP extractor;
    the scores are the logits (no action layer mixes slots)."""

    def __init__(self, *args: Any, hidden: int = 64, prior_weight: float = PLANNER_GAIN_WEIGHT,
                 layout: ScorerLayout = CANDIDATE_LAYOUT, learn_prior: bool = True, **kwargs: Any) -> None:
        self.hidden, self.prior_weight, self.layout, self.learn_prior = hidden, prior_weight, layout, learn_prior
        kwargs.setdefault("ortho_init", False)  # keeps the score layer small and the prior weight as set
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = CandidateScorer(self.hidden, self.prior_weight, self.layout, self.learn_prior)

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        with torch.no_grad():  # the residual starts at zero: the warm start is exactly the prior's choice
            # (a residual of 0.01 nats flipped near-ties between the planner's candidates)
            self.mlp_extractor.score.weight.zero_()
            self.mlp_extractor.score.bias.zero_()
        self.action_net = nn.Identity()
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)  # type: ignore[call-arg]
