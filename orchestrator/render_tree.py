"""``phasegate inspect ID --tree``: a run's branch DAG as a rich tree.

    wf_1a2b  fanout  completed
    ├── * 0 split  fork all -> combine: fan_in (3/3 done)
    │   ├── f0.b0  merged     1 work, 2 refine
    │   ├── f0.b1  merged     1 work, 2 refine
    │   └── f0.b2  merged     1 work, 2 refine
    ├── * 1 combine  <- merge of f0.b0, f0.b1, f0.b2
    └── * 2 publish

The run's main chain is the first level (``*`` a committed checkpoint, ``o`` a merge still
waiting for its branches); under each forking checkpoint its branches, each with its
checkpoints (``x3 refine``: a discarded phase, never merged); the checkpoint at the merge seq
says where it came from (a fan-in, a race winner, or a supervisor's promotion). Without a
terminal the guides are the same characters without colour (render.py's plain console).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from rich.tree import Tree

from phasegate.orchestrator.render import to_text


def tree(run: dict[str, Any], checkpoints: list[dict[str, Any]],
         forks: list[dict[str, Any]], *, color: bool = False) -> str:
    return to_text(tree_view(run, checkpoints, forks), color=color)


def tree_view(run: dict[str, Any], checkpoints: list[dict[str, Any]],
              forks: list[dict[str, Any]]) -> Tree:
    main = {c["seq"]: c for c in checkpoints
            if c["branch"] == "main" and c["kind"] == "phase"}
    by_seq = {f["fork_seq"]: f for f in forks}
    merges = {f["fork_seq"] + 1: f for f in forks}
    view = Tree(Text(f"{run['workflow_id']}  {run['workflow']}  {run['status']}",
                     style="bold"), guide_style="dim")
    for seq in sorted(set(main) | set(merges)):
        checkpoint = main.get(seq)
        if checkpoint is None:  # an open fork: the merge has not run yet
            fork = merges[seq]
            if fork["status"] == "open":
                view.add(Text(f"o {seq} {fork['merge_phase']}  waiting: {_progress(fork)}"))
            continue
        line = f"* {seq} {checkpoint['phase']}"
        if seq in merges:
            line += f"  <- {_merged_from(merges[seq])}"
        if seq in by_seq:
            fork = by_seq[seq]
            line += (f"  fork {fork['mode']} -> {fork['merge_phase']}: "
                     f"{fork['resolution'] or 'open'} ({_progress(fork)})")
        node = view.add(Text(line))
        if seq in by_seq:
            for branch in _branches(by_seq[seq]):
                node.add(branch)
    if not main and not forks:
        view.add(Text("no checkpoints yet"))
    return view


def _branches(fork: dict[str, Any]) -> list[Text]:
    branches = fork["branches"]
    width = max(len(b["branch"]) for b in branches)
    out = []
    for branch in branches:
        steps = ", ".join(("x" if s["kind"] == "discarded" else "") + f"{s['seq']} {s['phase']}"
                          for s in branch["steps"]) or "-"
        winner = "  (winner)" if branch["branch"] == fork["winner"] else ""
        out.append(Text(f"{branch['branch']:<{width}}  {branch['status']:<9}  "
                        f"{steps}{winner}"))
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
