"""The Gaussian process both Bayesian-optimization tuners use (scikit-learn), on log objective.

The objective spans orders of magnitude (a trickle's few milliseconds, an overloaded
configuration's seconds), so the GP models log J: a relative difference is then the same
distance everywhere and expected improvement in log units is a relative improvement. Inputs are
index coordinates (one notch = 1 on every axis). Kernel: constant * Matern(5/2, one length scale
per axis) + white noise. Hyperparameters are refitted every ``refit_every`` observations and
reused in between (fitting them is the expensive part), each fit warm-started from the last.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
from scipy.optimize import minimize
from scipy.stats import norm
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel


class LogGP:
    def __init__(self, dims: int, *, seed: int, refit_every: int = 4) -> None:
        self._kernel: Kernel = ConstantKernel(1.0, (1e-2, 1e2)) * Matern(
            length_scale=np.full(dims, 2.0), length_scale_bounds=(0.3, 30.0), nu=2.5
        ) + WhiteKernel(1e-2, (1e-5, 1.0))
        self._seed = seed
        self._refit_every = refit_every
        self._fitted_at = -refit_every
        self.model: GaussianProcessRegressor | None = None

    def fit(self, x: np.ndarray, values: np.ndarray) -> None:
        """Fit on (n, dims) coordinates and their objective values (positive)."""
        y = np.log(np.maximum(values, 1e-9))
        optimize = len(y) - self._fitted_at >= self._refit_every
        gp = GaussianProcessRegressor(
            kernel=self._kernel,
            normalize_y=True,
            optimizer=_bounded_lbfgs if optimize else None,
            random_state=self._seed,
        )
        with warnings.catch_warnings():
            # Bounds reached on a few points are expected early on; the fit is still usable.
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(x, y)
        if optimize:
            self._kernel = gp.kernel_
            self._fitted_at = len(y)
        self.model = gp

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of log J at ``x``."""
        assert self.model is not None, "fit first"
        mu, sd = self.model.predict(x, return_std=True)
        return np.asarray(mu), np.maximum(np.asarray(sd), 1e-9)


def _bounded_lbfgs(
    obj_func: Callable[[np.ndarray], tuple[float, np.ndarray]],
    initial_theta: np.ndarray,
    bounds: np.ndarray,
) -> tuple[np.ndarray, float]:
    """L-BFGS-B on the log marginal likelihood from the previous hyperparameters, with few
    iterations: a warm start rarely needs more, and an unbounded search costs seconds per fit."""
    result = minimize(
        obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds, options={"maxiter": 25}
    )
    return result.x, float(result.fun)


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """EI for minimization: E[max(best - f, 0)] with f ~ N(mu, sd^2)."""
    z = (best - mu) / sd
    return (best - mu) * norm.cdf(z) + sd * norm.pdf(z)
