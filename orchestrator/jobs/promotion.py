"""The promotion gate: whether a finished job's adapter replaces the champion of its rule and key.

A rule opts in with a `promote:` block under `launch:` (docs/rules.md, "Promotion"), parsed
into a `PromotionPolicy` that travels with the job (`TrainingRequest.promotion`, then the
job's `JobContext`), so a rule reloaded while the job runs does not change how it is judged.
The trainer scores the candidate and the champion it was given on the same held-out split
(`runtimes/trainer/evaluation.py`); once the job succeeded, `orchestrator/service.py` calls
`decide` with those scores and the champion the store names now, records the decision, moves
the champion only when it says so, and announces it on `finetune.completed`.

Pure: no I/O, no clock. What counts as better, in order:

1. a job that reported no adapter has nothing to promote;
2. a champion that changed while the job ran voids the comparison (it was made against
   another adapter);
3. a candidate without the metric cannot be judged;
4. with no champion, the first adapter is promoted;
5. a champion the trainer could not evaluate (`champion_error`) is kept: a candidate is never
   promoted over an adapter it was not compared with;
6. otherwise the candidate must beat the champion's score by *more than* `min_delta` in the
   policy's direction; a tie, or a gain of `min_delta` or less, keeps the champion.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


class Mode(enum.StrEnum):
    """Which direction of a metric is better."""

    MIN = "min"
    MAX = "max"


METRICS: Mapping[str, Mode] = MappingProxyType(
    {"eval_loss": Mode.MIN, "perplexity": Mode.MIN, "token_accuracy": Mode.MAX}
)
"""The metrics a gate may compare (the trainer reports each for the candidate and, prefixed
`champion_`, for the champion), with the direction that is better when a rule names none."""

DEFAULT_METRIC = "eval_loss"
CHAMPION_PREFIX = "champion_"
"""The champion's score of metric `m` is reported as `champion_<m>`."""
CHAMPION_ERROR = "champion_error"
"""Reported instead of the champion's scores when the trainer could not evaluate it."""


@dataclass(frozen=True, slots=True)
class PromotionPolicy:
    """A rule's `promote:` block: what "better" means for its adapters."""

    metric: str = DEFAULT_METRIC
    """One of `METRICS`."""
    mode: Mode = Mode.MIN
    """`min` or `max`: which direction of `metric` is better."""
    min_delta: float = 0.0
    """How much better than the champion a candidate must be, strictly more than this."""

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown promotion metric {self.metric!r}")
        if not math.isfinite(self.min_delta) or self.min_delta < 0:
            raise ValueError(f"min_delta must be a finite number >= 0, got {self.min_delta!r}")

    @classmethod
    def for_metric(cls, metric: str = DEFAULT_METRIC, *, min_delta: float = 0.0) -> PromotionPolicy:
        """The policy for *metric* in its usual direction (`METRICS`)."""
        return cls(metric=metric, mode=METRICS[metric], min_delta=min_delta)

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "mode": self.mode.value, "min_delta": self.min_delta}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PromotionPolicy:
        """The inverse of `to_json`.

        Raises:
            ValueError: a field is missing or invalid.
        """
        try:
            return cls(
                metric=str(data["metric"]),
                mode=Mode(data["mode"]),
                min_delta=float(data["min_delta"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a promotion policy: {exc!r}") from exc


class Verdict(enum.StrEnum):
    """Why the gate decided as it did; the first two promote."""

    NO_CHAMPION = "no-champion"
    BETTER = "better"
    NOT_BETTER = "not-better"
    TIE = "tie"
    NO_ADAPTER = "no-adapter"
    METRIC_MISSING = "metric-missing"
    CHAMPION_ERROR = "champion-error"
    CHAMPION_CHANGED = "champion-changed"

    @property
    def promotes(self) -> bool:
        return self in (Verdict.NO_CHAMPION, Verdict.BETTER)


@dataclass(frozen=True, slots=True)
class PromotionDecision:
    """What the gate decided about one job's adapter, with both scores and the reason."""

    policy: PromotionPolicy
    verdict: Verdict
    reason: str
    """One sentence for people: the scores compared and why that promotes or not."""
    candidate: float | None = None
    """The candidate's score of `policy.metric`."""
    champion: float | None = None
    """The champion's score of `policy.metric` on the same split."""
    champion_uri: str | None = None
    """The champion the candidate was compared with (None: there was none)."""
    candidate_uri: str | None = None
    """The candidate adapter judged: the one that becomes the champion when promoted."""

    @property
    def promoted(self) -> bool:
        return self.verdict.promotes

    def to_json(self) -> dict[str, Any]:
        """The `promotion` object of `finetune.completed` (docs/events.md)."""
        return {
            **self.policy.to_json(),
            "candidate": self.candidate,
            "champion": self.champion,
            "champion_uri": self.champion_uri,
            "candidate_uri": self.candidate_uri,
            "verdict": self.verdict.value,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PromotionDecision:
        """The inverse of `to_json`.

        Raises:
            ValueError: a field is missing or invalid.
        """
        try:
            return cls(
                policy=PromotionPolicy.from_json(data),
                verdict=Verdict(data["verdict"]),
                reason=str(data["reason"]),
                candidate=_optional_float(data.get("candidate")),
                champion=_optional_float(data.get("champion")),
                champion_uri=data.get("champion_uri"),
                candidate_uri=data.get("candidate_uri"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a promotion decision: {exc!r}") from exc


def decide(  # noqa: PLR0911 -- one return per rule of the module docstring, in its order
    policy: PromotionPolicy,
    *,
    adapter_uri: str | None,
    metrics: Mapping[str, Any],
    evaluated_champion: str | None,
    current_champion: str | None,
) -> PromotionDecision:
    """Whether the adapter of a succeeded job replaces the champion (see the module docstring).

    Args:
        policy: the job's `promote:` block.
        adapter_uri: where the job's adapter is (None: it reported none).
        metrics: the job's reported metrics: `<metric>` for the candidate and, when it was
            given a champion, `champion_<metric>` or `champion_error`.
        evaluated_champion: the champion the job was launched to compare with (None: none).
        current_champion: the champion the store names now (None: none).
    """
    metric = policy.metric

    def verdict(
        outcome: Verdict,
        reason: str,
        candidate: float | None = None,
        champion: float | None = None,
    ) -> PromotionDecision:
        return PromotionDecision(
            policy=policy,
            verdict=outcome,
            reason=reason,
            candidate=candidate,
            champion=champion,
            champion_uri=evaluated_champion,
            candidate_uri=adapter_uri,
        )

    candidate = _score(metrics.get(metric))
    champion = _score(metrics.get(f"{CHAMPION_PREFIX}{metric}"))
    if not adapter_uri:
        return verdict(Verdict.NO_ADAPTER, "the job reported no adapter: nothing to promote")
    if evaluated_champion != current_champion:
        return verdict(
            Verdict.CHAMPION_CHANGED,
            f"the champion changed while the job ran (it was compared with "
            f"{evaluated_champion or 'no champion'}; the champion is now "
            f"{current_champion or 'none'}): its comparison no longer holds",
            candidate,
            champion,
        )
    if candidate is None:
        return verdict(
            Verdict.METRIC_MISSING,
            f"the candidate has no {metric} (the trainer held out no examples to evaluate "
            "on): an adapter that was not measured is not promoted",
            None,
            champion,
        )
    if evaluated_champion is None:
        return verdict(
            Verdict.NO_CHAMPION,
            f"no champion yet: the first adapter is promoted ({metric} {candidate:.6g})",
            candidate,
        )
    error = metrics.get(CHAMPION_ERROR)
    if error:
        return verdict(
            Verdict.CHAMPION_ERROR,
            f"the champion could not be evaluated ({error}): a candidate is never promoted "
            "over a champion it was not compared with",
            candidate,
        )
    if champion is None:
        return verdict(
            Verdict.METRIC_MISSING,
            f"the champion has no {metric}: the candidate was not compared with it",
            candidate,
        )
    gain = champion - candidate if policy.mode is Mode.MIN else candidate - champion
    compared = f"{metric} {candidate:.6g} against the champion's {champion:.6g}"
    if gain == 0:
        return verdict(Verdict.TIE, f"{compared}: a tie keeps the champion", candidate, champion)
    if gain <= policy.min_delta:
        why = (
            "worse"
            if gain < 0
            else f"better by {gain:.6g}, not more than min_delta {policy.min_delta:g}"
        )
        return verdict(Verdict.NOT_BETTER, f"{compared}: {why}", candidate, champion)
    return verdict(
        Verdict.BETTER,
        f"{compared}: better by {gain:.6g}, more than min_delta {policy.min_delta:g}",
        candidate,
        champion,
    )


def scores(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The candidate's scores among *metrics*: every gate metric it has as a finite number
    (what the champion store keeps with a promoted adapter)."""
    return {name: score for name in METRICS if (score := _score(metrics.get(name))) is not None}


def _score(value: Any) -> float | None:
    """A finite number, or None (absent, not a number, NaN or infinite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
