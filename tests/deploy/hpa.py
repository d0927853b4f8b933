"""The replica decision of Kubernetes' HorizontalPodAutoscaler controller, for one External
metric with an AverageValue target, as kube-controller-manager computes it
(pkg/controller/podautoscaler: horizontal.go and replica_calculator.go):

- proposal = ceil(total / target), unless total / (target * statusReplicas) is within the
  tolerance of 1, in which case the replica count stays. With 0 replicas the ratio is
  +Inf for any load (so the first message wakes one worker) and NaN for none (stay at 0);
- the proposal is recorded, then stabilised: scale up to no more than the lowest
  recommendation of the scale-up window, down to no less than the highest of the
  scale-down window;
- then rate-limited by the behaviour policies (Pods / Percent per period, measured from the
  replica count at the start of the period, combined by selectPolicy);
- then clamped to [minReplicas, maxReplicas]. minReplicas 0 (HPAScaleToZero) keeps
  autoscaling active at zero replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance


@dataclass(frozen=True)
class Policy:
    kind: str  # "Pods" or "Percent"
    value: int
    period_s: int


@dataclass(frozen=True)
class Rules:
    window_s: int
    select: str  # "Max", "Min" or "Disabled"
    policies: tuple[Policy, ...]
    tolerance: float = DEFAULT_TOLERANCE


# Defaults the API server fills in when behavior (or part of it) is left out.
DEFAULT_UP = Rules(0, "Max", (Policy("Pods", 4, 15), Policy("Percent", 100, 15)))
DEFAULT_DOWN = Rules(300, "Max", (Policy("Percent", 100, 15),))


def _rules(raw: dict[str, Any] | None, default: Rules) -> Rules:
    if not raw:
        return default
    policies = tuple(Policy(p["type"], int(p["value"]), int(p["periodSeconds"]))
                     for p in raw.get("policies", [])) or default.policies
    return Rules(
        window_s=int(raw.get("stabilizationWindowSeconds", default.window_s)),
        select=raw.get("selectPolicy", "Max"),
        policies=policies,
        tolerance=float(raw.get("tolerance", DEFAULT_TOLERANCE)),
    )


@dataclass(frozen=True)
class HpaSpec:
    min_replicas: int
    max_replicas: int
    target_average: float
    up: Rules
    down: Rules

    @classmethod
    def from_manifest(cls, hpa: dict[str, Any]) -> HpaSpec:
        spec = hpa["spec"]
        # The queue metric; the second one (phasegate_timers_due_soon, waits due within the
        # minute) is 0 in these simulations, and the HPA takes the larger recommendation.
        metric, *others = spec["metrics"]
        assert metric["external"]["metric"]["name"] == "phasegate_queue_messages"
        assert [m["external"]["metric"]["name"] for m in others] in (
            [], ["phasegate_timers_due_soon"])
        target = metric["external"]["target"]
        assert target["type"] == "AverageValue"
        behavior = spec.get("behavior", {})
        return cls(
            min_replicas=int(spec.get("minReplicas", 1)),
            max_replicas=int(spec["maxReplicas"]),
            target_average=float(target["averageValue"]),
            up=_rules(behavior.get("scaleUp"), DEFAULT_UP),
            down=_rules(behavior.get("scaleDown"), DEFAULT_DOWN),
        )


def external_average_value_replicas(
    status_replicas: int, total: float, target: float, up_tol: float, down_tol: float
) -> int:
    """replica_calculator.GetExternalPerPodMetricReplicas."""
    with_zero = status_replicas == 0
    if with_zero:
        ratio = math.nan if total == 0 else math.inf
    else:
        ratio = total / (target * status_replicas)
    within = (1 - down_tol) <= ratio <= (1 + up_tol)  # False for NaN and Inf
    if within:
        return status_replicas
    return math.ceil(total / target)


@dataclass
class HorizontalPodAutoscaler:
    spec: HpaSpec
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)

    def reconcile(self, now: float, spec_replicas: int, status_replicas: int,
                  total: float) -> int:
        """One sync of the controller: the replica count it writes to the scale subresource."""
        s = self.spec
        current = spec_replicas
        if current == 0 and s.min_replicas != 0:
            return 0  # autoscaling disabled by an explicit scale to zero
        if current > s.max_replicas:
            desired = s.max_replicas
        elif current < s.min_replicas:
            desired = s.min_replicas
        else:
            proposal = external_average_value_replicas(
                status_replicas, total, s.target_average, s.up.tolerance, s.down.tolerance)
            desired = max(0, proposal)
            desired = self._normalize(now, current, desired)
        if desired != current:
            events = self.up_events if desired > current else self.down_events
            events.append((now, abs(desired - current)))
        return desired

    def _normalize(self, now: float, current: int, desired: int) -> int:
        if not self.recommendations:  # maybeInitScaleDownStabilizationWindow
            self.recommendations.append((now, current))
        stabilized = self._stabilize(now, current, desired)
        return self._rate_limit(now, current, stabilized)

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        up_cutoff = now - self.spec.up.window_s
        down_cutoff = now - self.spec.down.window_s
        up_rec, down_rec = desired, desired
        old_index = None
        for i, (ts, rec) in enumerate(self.recommendations):
            if ts > up_cutoff:
                up_rec = min(rec, up_rec)
            if ts > down_cutoff:
                down_rec = max(rec, down_rec)
            if ts < up_cutoff and ts < down_cutoff:
                old_index = i
        recommendation = max(current, up_rec)
        recommendation = min(recommendation, down_rec)
        if old_index is not None:
            self.recommendations[old_index] = (now, desired)
        else:
            self.recommendations.append((now, desired))
        return recommendation

    def _changed_in(self, now: float, period_s: int, events: list[tuple[float, int]]) -> int:
        return sum(change for ts, change in events if ts > now - period_s)

    def _rate_limit(self, now: float, current: int, desired: int) -> int:
        s = self.spec
        if desired > current:
            limit = self._limit(now, current, s.up, up=True)
            limit = max(limit, current)
            ceiling = min(s.max_replicas, limit)
            return min(desired, ceiling)
        if desired < current:
            limit = self._limit(now, current, s.down, up=False)
            limit = min(limit, current)
            floor = max(s.min_replicas, limit)
            return max(desired, floor)
        return desired

    def _limit(self, now: float, current: int, rules: Rules, *, up: bool) -> int:
        if rules.select == "Disabled":
            return current
        # Max selects the policy allowing the biggest change; Min the smallest.
        biggest = (rules.select != "Min")
        pick = max if biggest == up else min
        result: int | None = None
        for p in rules.policies:
            added = self._changed_in(now, p.period_s, self.up_events)
            removed = self._changed_in(now, p.period_s, self.down_events)
            start = current - added + removed
            if up:
                proposed = (start + p.value if p.kind == "Pods"
                            else math.ceil(start * (1 + p.value / 100)))
            else:
                proposed = (start - p.value if p.kind == "Pods"
                            else int(start * (1 - p.value / 100)))
            result = proposed if result is None else pick(result, proposed)
        assert result is not None
        return result
