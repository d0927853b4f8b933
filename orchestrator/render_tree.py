"""``phasegate inspect ID --tree``: a run's branch DAG in plain ASCII.

    wf_1a2b  fanout  completed
    * 0 split  fork all -> combine: fan_in (3/3 done)
    |   +-- f0.b0  merged     1 work, 2 refine
    |   +-- f0.b1  merged     1 work, 2 refine
    |   `-- f0.b2  merged     1 work, 2 refine
    * 1 combine  <- merge of f0.b0, f0.b1, f0.b2
    * 2 publish

The main chain is the column of ``*``; under each forking checkpoint its branches, each with
its checkpoints (``x3 refine``: a discarded phase, never merged); the checkpoint at the merge
seq says where it came from (a fan-in, a race winner, or a supervisor's promotion).
"""

from __future__ import annotations

from typing import Any


def tree(run: dict[str, Any], checkpoints: list[dict[str, Any]],
         forks: list[dict[str, Any]]) -> str:
    main = {c["seq"]: c for c in checkpoints
            if c["branch"] == "main" and c["kind"] == "phase"}
    by_seq = {f["fork_seq"]: f for f in forks}
    merges = {f["fork_seq"] + 1: f for f in forks}
    lines = [f"{run['workflow_id']}  {run['workflow']}  {run['status']}"]
    for seq in sorted(set(main) | set(merges)):
        checkpoint = main.get(seq)
        if checkpoint is None:  # an open fork: the merge has not run yet
            fork = merges[seq]
            if fork["status"] == "open":
                lines.append(f"o {seq} {fork['merge_phase']}  waiting: {_progress(fork)}")
            continue
        line = f"* {seq} {checkpoint['phase']}"
        if seq in merges:
            line += f"  <- {_merged_from(merges[seq])}"
        if seq in by_seq:
            fork = by_seq[seq]
            line += (f"  fork {fork['mode']} -> {fork['merge_phase']}: "
                     f"{fork['resolution'] or 'open'} ({_progress(fork)})")
        lines.append(line)
        if seq in by_seq:
            lines.extend(_branches(by_seq[seq]))
    if not main and not forks:
        lines.append("no checkpoints yet")
    return "\n".join(lines)


def _branches(fork: dict[str, Any]) -> list[str]:
    branches = fork["branches"]
    width = max(len(b["branch"]) for b in branches)
    out = []
    for index, branch in enumerate(branches):
        elbow = "`--" if index == len(branches) - 1 else "+--"
        steps = ", ".join(("x" if s["kind"] == "discarded" else "") + f"{s['seq']} {s['phase']}"
                          for s in branch["steps"]) or "-"
        winner = "  (winner)" if branch["branch"] == fork["winner"] else ""
        out.append(f"|   {elbow} {branch['branch']:<{width}}  {branch['status']:<9}  "
                   f"{steps}{winner}")
    return out


def _progress(fork: dict[str, Any]) -> str:
    done = sum(1 for b in fork["branches"] if b["status"] != "running")
    return f"{done}/{fork['branch_count']} done"


def _merged_from(fork: dict[str, Any]) -> str:
    if fork["resolution"] == "supervisor":
        return f"promoted from {fork['winner']} (supervisor merge)"
    if fork["resolution"] == "race":
        return f"race won by {fork['winner']}"
    merged = [b["branch"] for b in fork["branches"] if b["status"] == "merged"]
    return "merge of " + ", ".join(merged)
