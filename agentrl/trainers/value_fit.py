"""A critic head refit in closed form: ridge regression of returns on standardised features.

    fit = RidgeValueFit(window=8)
    fit.add(features, returns, games)       # one PPO step's model tokens: (N, H), (N,), (N,)
    result = fit.refit(critic.head)         # the head now predicts returns from features

Why: a value head trained by one Adam step per PPO step on a few episodes never catches the
returns (explained variance stays near 0), yet the same features, standardised, read the
game's state (a ridge probe finds the oracle's distance at R² 0.6-0.7). A least-squares fit on
the last ``window`` steps' tokens is exact where gradient steps only creep, and it cannot
diverge. Its strength is chosen by K-fold cross-validation over games, not over tokens: the
tokens of one game share its return, so a fold must hold whole games out, or a fit that only
remembers games would look perfect. The head predicts the next step's batch before seeing it;
that out-of-sample error is what ``critic/vf_explained_var`` reports (``critic/head_explained_var``
when ``critic.sibling_pseudocount`` blends other values in).
"""

from __future__ import annotations

import collections
import dataclasses

import torch
from torch import nn

from agentrl.trainers.policy import FeatureStandardizer

__all__ = ["RidgeFit", "RidgeValueFit", "ALPHAS"]

ALPHAS = (1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
"""Ridge strengths tried, per row (the penalty is ``alpha * rows``: on standardised features
the Gram's diagonal is ``rows``, so alpha is the shrinkage relative to the data)."""
FOLDS = 4
"""Cross-validation folds over games."""


@dataclasses.dataclass(frozen=True)
class RidgeFit:
    """One refit: the chosen strength, its cross-validated R² and the rows it read."""

    alpha: float
    cv_r2: float
    rows: int
    games: int

    def metrics(self) -> dict[str, float]:
        return {"critic/ridge_alpha": self.alpha, "critic/ridge_cv_r2": self.cv_r2,
                "critic/ridge_rows": float(self.rows), "critic/ridge_games": float(self.games)}


class RidgeValueFit:
    """The last ``window`` steps' (features, returns, game) rows, and the ridge refit on them."""

    def __init__(self, window: int, *, alphas: tuple[float, ...] = ALPHAS, folds: int = FOLDS):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.steps: collections.deque = collections.deque(maxlen=window)
        self.alphas, self.folds = alphas, folds

    def add(self, features: torch.Tensor, returns: torch.Tensor, games: torch.Tensor) -> None:
        """One step's rows: ``features`` ``(N, H)``, ``returns`` ``(N,)``, ``games`` ``(N,)``
        (ids that are equal for the rows of one game of this step)."""
        self.steps.append((features.detach().double().cpu(), returns.detach().double().cpu(),
                           games.detach().long().cpu()))

    def refit(self, head: nn.Module) -> RidgeFit | None:
        """Set ``head`` (``Sequential(FeatureStandardizer, Linear(H, 1))``) to the ridge fit of
        the window's rows, at the strength cross-validation over games prefers; None (head
        unchanged) when the window holds fewer than two games."""
        if not (isinstance(head, nn.Sequential) and len(head) == 2
                and isinstance(head[0], FeatureStandardizer) and isinstance(head[1], nn.Linear)):
            raise TypeError("a ridge refit needs a head of a FeatureStandardizer and a Linear")
        x, y, games = self._rows()
        ids = torch.unique(games, return_inverse=True)[1]
        count = int(ids.max()) + 1 if len(ids) else 0
        if count < 2:
            return None
        mean, std = x.mean(0), x.std(0, unbiased=False).clamp(min=1e-6)
        z = (x - mean) / std
        fold = ids % min(self.folds, count)
        alpha, cv_r2 = self._choose(z, y, fold)
        weight, bias = _solve(z, y, alpha * len(y))
        norm, out = head
        with torch.no_grad():
            norm.mean.copy_(mean.to(norm.mean))
            norm.var.copy_((std ** 2 - norm.eps).clamp(min=0).to(norm.var))
            norm.count.fill_(float(len(y)))
            out.weight.copy_(weight.to(out.weight)[None])
            out.bias.fill_(float(bias))
        return RidgeFit(alpha=alpha, cv_r2=cv_r2, rows=len(y), games=count)

    def _rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xs, ys, gs = [], [], []
        for index, (x, y, g) in enumerate(self.steps):  # a game is one step's game id
            xs.append(x)
            ys.append(y)
            gs.append(g * len(self.steps) + index)
        if not xs:
            return torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0), torch.zeros(0)
        return torch.cat(xs), torch.cat(ys), torch.cat(gs)

    def _choose(self, z: torch.Tensor, y: torch.Tensor, fold: torch.Tensor) -> tuple[float, float]:
        """The strength with the least held-out squared error summed over folds, and its R²
        against each held-out fold's prediction by the training folds' mean."""
        errors = torch.zeros(len(self.alphas), dtype=torch.float64)
        baseline = 0.0
        gram, cross = z.T @ z, z.T @ y
        total_sum, total_z = y.sum(), z.sum(0)
        for k in torch.unique(fold):
            held = fold == k
            zk, yk = z[held], y[held]
            n = int((~held).sum())
            # the training folds' centred Gram and cross-products, by subtraction
            s_z, s_y = total_z - zk.sum(0), total_sum - yk.sum()
            g = gram - zk.T @ zk - torch.outer(s_z, s_z) / n
            c = cross - zk.T @ yk - s_z * s_y / n
            mu_z, mu_y = s_z / n, s_y / n
            values, vectors = torch.linalg.eigh(g)
            projected = vectors.T @ c
            for i, alpha in enumerate(self.alphas):
                w = vectors @ (projected / (values.clamp(min=0) + alpha * n))
                predicted = (zk - mu_z) @ w + mu_y
                errors[i] += ((yk - predicted) ** 2).sum()
            baseline += float(((yk - mu_y) ** 2).sum())
        best = int(torch.argmin(errors))
        r2 = 1.0 - float(errors[best]) / baseline if baseline > 0 else 0.0
        return self.alphas[best], r2


def _solve(z: torch.Tensor, y: torch.Tensor, penalty: float) -> tuple[torch.Tensor, float]:
    """Ridge weights on centred ``z`` and the intercept (unpenalised)."""
    mu_z, mu_y = z.mean(0), y.mean()
    zc = z - mu_z
    eye = torch.eye(z.shape[1], dtype=z.dtype)
    weight = torch.linalg.solve(zc.T @ zc + penalty * eye, zc.T @ (y - mu_y))
    return weight, float(mu_y - mu_z @ weight)
