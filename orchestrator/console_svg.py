"""A run's branch DAG as an inline SVG, drawn on the server (the console's run page).

The same picture ``phasegate inspect --tree`` prints (render_tree.py), laid out left to right:
the main chain is the top row, one box per committed checkpoint (a dashed box for the phase
still to run, or for a merge still waiting for its branches); under each forking checkpoint,
one row per branch, a box spanning from the fork to its merge, labelled with the branch's
status and its checkpoints. A winner is drawn bold, a discarded branch dashed.

Only presentation attributes are used (no ``style``), so the console's Content-Security-Policy
needs no ``'unsafe-inline'``; every text goes through ``html.escape``.
"""

from __future__ import annotations

from html import escape
from itertools import pairwise
from typing import Any

NODE_W, NODE_H, GAP_X, ROW_H, PAD = 120, 34, 36, 52, 14
# A run with thousands of phases would draw a picture nobody can read: the last ones only.
MAX_NODES = 120
LABEL_CHARS = 16
COLORS = {"done": ("#e8eaf6", "#3949ab"), "next": ("#ffffff", "#3949ab"),
          "merged": ("#e8f5e9", "#2e7d32"), "running": ("#fff8e1", "#f9a825"),
          "discarded": ("#f5f5f5", "#9e9e9e"), "failed": ("#ffebee", "#c62828")}


def _clip(text: str, size: int = LABEL_CHARS) -> str:
    return text if len(text) <= size else text[: size - 1] + "…"


def _box(x: float, y: float, w: float, label: str, title: str, kind: str, *,
         dashed: bool = False, bold: bool = False) -> str:
    fill, stroke = COLORS.get(kind, COLORS["done"])
    dash = ' stroke-dasharray="5 3"' if dashed else ""
    width = 2.5 if bold else 1.2
    return (f'<g class="node node-{escape(kind)}"><title>{escape(title)}</title>'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{NODE_H}" rx="6" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{width}"{dash}/>'
            f'<text x="{x + w / 2:.0f}" y="{y + NODE_H / 2 + 4:.0f}" text-anchor="middle" '
            f'font-size="12" font-family="sans-serif" fill="#212121">{escape(label)}</text></g>')


def _edge(x1: float, y1: float, x2: float, y2: float, *, dashed: bool = False) -> str:
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    return (f'<path d="M{x1:.0f},{y1:.0f} C{(x1 + x2) / 2:.0f},{y1:.0f} {(x1 + x2) / 2:.0f},'
            f'{y2:.0f} {x2:.0f},{y2:.0f}" fill="none" stroke="#757575" stroke-width="1.2"'
            f'{dash} marker-end="url(#arrow)"/>')


def main_nodes(run: dict[str, Any], checkpoints: list[dict[str, Any]],
               forks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The top row: committed main checkpoints, open merges, then the phase to run next."""
    main = {c["seq"]: c for c in checkpoints if c["branch"] == "main" and c["kind"] == "phase"}
    merges = {f["fork_seq"] + 1: f for f in forks}
    nodes = []
    for seq in sorted(set(main) | set(merges)):
        checkpoint = main.get(seq)
        if checkpoint is None:
            fork = merges[seq]
            if fork["status"] == "open":
                nodes.append({"seq": seq, "phase": fork["merge_phase"], "kind": "next",
                              "title": f"seq {seq} {fork['merge_phase']}: waiting for branches"})
            continue
        nodes.append({"seq": seq, "phase": checkpoint["phase"], "kind": "done",
                      "title": f"seq {seq} {checkpoint['phase']} (tier "
                               f"{checkpoint.get('tier_label') or checkpoint.get('tier')})"})
    seqs = {n["seq"] for n in nodes}
    if run.get("current_phase") and run["seq"] not in seqs and not run.get("finished_at"):
        nodes.append({"seq": run["seq"], "phase": run["current_phase"], "kind": "next",
                      "title": f"seq {run['seq']} {run['current_phase']}: {run['status']}"})
    return nodes


def dag_svg(run: dict[str, Any], checkpoints: list[dict[str, Any]],
            forks: list[dict[str, Any]]) -> str:
    """The picture as an ``<svg>`` element (an empty string when there is nothing to draw)."""
    nodes = main_nodes(run, checkpoints, forks)
    if not nodes:
        return ""
    skipped = max(0, len(nodes) - MAX_NODES)
    nodes = nodes[skipped:]
    x_of = {n["seq"]: PAD + i * (NODE_W + GAP_X) for i, n in enumerate(nodes)}
    parts: list[str] = []
    for left, right in pairwise(nodes):
        parts.append(_edge(x_of[left["seq"]] + NODE_W, PAD + NODE_H / 2, x_of[right["seq"]],
                           PAD + NODE_H / 2, dashed=right["kind"] == "next"))
    rows = 0
    for fork in forks:
        start = x_of.get(fork["fork_seq"])
        if start is None:
            continue
        end = x_of.get(fork["fork_seq"] + 1, start + 2 * NODE_W + GAP_X)
        for k, branch in enumerate(fork["branches"], start=1):
            rows = max(rows, k)
            parts.extend(_branch(fork, branch, start, end, PAD + k * ROW_H))
    for node in nodes:
        label = _clip(f"{node['seq']} {node['phase']}")
        parts.append(_box(x_of[node["seq"]], PAD, NODE_W, label, node["title"], node["kind"],
                          dashed=node["kind"] == "next"))
    width = PAD * 2 + len(nodes) * (NODE_W + GAP_X)
    height = PAD * 2 + NODE_H + rows * ROW_H
    note = (f'<text x="{PAD}" y="{height - 2}" font-size="11" fill="#616161">'
            f'{skipped} earlier checkpoints not drawn</text>' if skipped else "")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="dag" width="{width}" '
            f'height="{height + (12 if skipped else 0)}" role="img" '
            f'aria-label="branch graph of run {escape(str(run["workflow_id"]))}">'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            'fill="#757575"/></marker></defs>' + "".join(parts) + note + "</svg>")


def _branch(fork: dict[str, Any], branch: dict[str, Any], start: float, end: float,
            y: float) -> list[str]:
    status = str(branch["status"])
    steps = ", ".join(("x" if s["kind"] == "discarded" else "") + f"{s['seq']} {s['phase']}"
                      for s in branch["steps"]) or "no checkpoint yet"
    winner = branch["branch"] == fork.get("winner")
    kind = status if status in COLORS else "done"
    x, w = start + NODE_W / 2, max(NODE_W, end - start)
    label = _clip(f"{branch['branch']} {status}", 28)
    title = f"branch {branch['branch']}: {status}; {steps}" + (" (winner)" if winner else "")
    merged_in = status in ("merged",) or winner
    return [_edge(start + NODE_W / 2, PAD + NODE_H, x + 10, y + NODE_H / 2),
            _box(x + 10, y, w - 20, label, title, kind, dashed=status == "discarded",
                 bold=winner),
            _edge(x + w - 10, y + NODE_H / 2, end + NODE_W / 2, PAD + NODE_H,
                  dashed=not merged_in)]
