"""Which pod states the fleet view reports as terminations (kubernetes client models)."""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodStatus,
)

from phasegate.orchestrator.fleet import recent_terminations


def pod(name: str, *, reason: str | None = None, last: str | None = None, exit_code: int = 1,
        minute: int = 0) -> V1Pod:
    when = datetime(2026, 11, 29, 10, minute, tzinfo=UTC)
    last_state = V1ContainerState(terminated=V1ContainerStateTerminated(
        reason=last, exit_code=exit_code, finished_at=when)) if last else V1ContainerState()
    status = V1ContainerStatus(
        name="worker", image="i", image_id="i", ready=True, restart_count=1,
        state=V1ContainerState(running=V1ContainerStateRunning()), last_state=last_state)
    return V1Pod(metadata=V1ObjectMeta(name=name), status=V1PodStatus(
        reason=reason, start_time=when, container_statuses=[] if reason else [status]))


def test_oom_kills_and_evictions_newest_first_completed_ignored() -> None:
    pods = [pod("a", last="OOMKilled", exit_code=137, minute=5), pod("b", reason="Evicted",
            minute=1), pod("c", last="Completed", exit_code=0, minute=9),
            pod("d", last="Error", minute=7), pod("e")]
    found = recent_terminations(pods)
    assert [(t.pod, t.reason) for t in found] == [("d", "Error"), ("a", "OOMKilled"),
                                                  ("b", "Evicted")]
    assert found[1].exit_code == 137 and found[2].container is None
    assert len(recent_terminations(pods, limit=1)) == 1
