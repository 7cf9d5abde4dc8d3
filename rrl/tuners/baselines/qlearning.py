"""Plain tabular Q-learning over configurations (no regions: RRL with radius 0).

Same MDP as RRL (per workload state, actions = configurations, discount 0, reward = -J), the
classic update Q(c) <- Q(c) + alpha_n (r - Q(c)) with alpha_n = 1 / n(c), Q initialised to 0
(optimistic, since every reward is negative, so every configuration gets tried once) and
epsilon-greedy action choice. What it lacks is the region update: one measurement teaches it
about one configuration only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rrl.tuners.ask_tell import TuningProblem
from rrl.tuners.measurement import Measurement


@dataclass(frozen=True)
class QLearningSettings:
    epsilon: float = 0.05
    """Probability of a uniformly random action."""


class QLearning:
    def __init__(
        self,
        problem: TuningProblem,
        rng: np.random.Generator,
        settings: QLearningSettings | None = None,
    ) -> None:
        self.settings = settings or QLearningSettings()
        self.rng = rng
        self.q = np.zeros(problem.space.size)  # Q(s, c) = expected reward = -J
        self.n = np.zeros(problem.space.size, dtype=np.int64)
        self.default = problem.space.flat(problem.default)

    def propose(self) -> int:
        if self.rng.random() < self.settings.epsilon:
            return int(self.rng.integers(self.q.size))
        greedy = np.flatnonzero(self.q == self.q.max())
        return int(self.rng.choice(greedy))

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        reward = -value
        self.n[flat] += 1
        alpha = 1.0 / self.n[flat]
        self.q[flat] += alpha * (reward - self.q[flat])  # td_target = reward (discount 0)

    def recommend(self) -> int:
        visited = np.flatnonzero(self.n > 0)
        if visited.size == 0:
            return self.default
        return int(visited[np.argmax(self.q[visited])])

    def describe(self) -> dict[str, Any]:
        return {"phase": "epsilon-greedy", "configurations_measured": int((self.n > 0).sum())}
