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
checkpoints (``x3 refine``: a discarded phase, never merged); under a branch that forked
again, its nested fork (``fork@3``) with the child branches, and so on down; the checkpoint at
the merge seq says where it came from (a fan-in, a race winner, or a supervisor's promotion),
and a merge phase checkpointed before it is a review round that sent branches round again
(``retried 2``: branches that were retried, ``r1``: a branch's retries). Without a terminal
the guides are the same characters without colour (render.py's plain console).
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
    top = [f for f in forks if f.get("parent_branch", "main") == "main"]
    nested: dict[str, list[dict[str, Any]]] = {}
    for fork in forks:
        if fork.get("parent_branch", "main") != "main":
            nested.setdefault(fork["parent_branch"], []).append(fork)
    by_seq = {f["fork_seq"]: f for f in top}
    merges = {f.get("merge_seq", f["fork_seq"] + 1): f for f in top}
    rounds = {seq: f for f in top
              for seq in range(f["fork_seq"] + 1, f.get("merge_seq", f["fork_seq"] + 1))}
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
        if seq in merges and merges[seq]["status"] != "open":
            line += f"  <- {_merged_from(merges[seq])}"
        elif seq in rounds:
            line += "  (review round: branches sent round again)"
        if seq in by_seq:
            fork = by_seq[seq]
            line += (f"  fork {fork['mode']} -> {fork['merge_phase']}: "
                     f"{fork['resolution'] or 'open'} ({_progress(fork)})")
        node = view.add(Text(line))
        if seq in by_seq:
            _add_branches(node, by_seq[seq], nested)
    if not main and not forks:
        view.add(Text("no checkpoints yet"))
    return view


def _add_branches(node: Tree, fork: dict[str, Any],
                  nested: dict[str, list[dict[str, Any]]]) -> None:
    branches = fork["branches"]
    width = max(len(b["branch"]) for b in branches)
    for branch in branches:
        steps = ", ".join(("x" if s["kind"] == "discarded" else "") + f"{s['seq']} {s['phase']}"
                          for s in branch["steps"]) or "-"
        winner = "  (winner)" if branch["branch"] == fork["winner"] else ""
        retried = f"  r{branch['retries']}" if branch.get("retries") else ""
        child = node.add(Text(f"{branch['branch']:<{width}}  {branch['status']:<9}  "
                              f"{steps}{winner}{retried}"))
        for sub in nested.get(branch["branch"], []):
            _add_branches(child.add(Text(
                f"fork@{sub['fork_seq']} {sub['mode']} -> {sub['merge_phase']}: "
                f"{sub['resolution'] or sub['status']} ({_progress(sub)})")), sub, nested)


def _progress(fork: dict[str, Any]) -> str:
    done = sum(1 for b in fork["branches"] if b["status"] != "running")
    return f"{done}/{fork['branch_count']} done"


def _merged_from(fork: dict[str, Any]) -> str:
    if fork.get("retries"):
        return f"{_merged_plain(fork)}; retried {fork['retries']}"
    return _merged_plain(fork)


def _merged_plain(fork: dict[str, Any]) -> str:
    if fork["resolution"] == "supervisor":
        return f"promoted from {fork['winner']} (supervisor merge)"
    if fork["resolution"] == "race":
        return f"race won by {fork['winner']}"
    merged = [b["branch"] for b in fork["branches"] if b["status"] == "merged"]
    notes = [f"{status}: " + ", ".join(names) for status in ("failed", "stale")
             if (names := [b["branch"] for b in fork["branches"] if b["status"] == status])]
    return "merge of " + ", ".join(merged) + (f" ({'; '.join(notes)})" if notes else "")
