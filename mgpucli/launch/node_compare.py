"""What each node of a job is about to run, and how the nodes differ (pure, stdlib only: the values are passed in).

The nodes of one job meet on the job (its run id, :func:`mgpucli.launch.plan._shared_id`), never on what they run;
once they have met, before any worker starts, each puts what it is about to run in the rendezvous store
(:mod:`mgpucli.launch.rendezvous_watch`) and every node compares all of them alike. Any difference stops every node
with exit 2, each differing item named with each node's value. What is compared, item by item (a name as the user
would write it, the value as text):

* the job: a recipe, every key of the recipe as composed with the overrides and resolved (``optim.lr``), or a
  script, its path (or module), its arguments and its content (a digest of the file);
* the options that change what the workers do: ``--resume``, ``--overwrite``, ``--max-restarts``, ``--probe``'s
  steps, ``--audit``, ``--local-rank-arg``;
* mgpu's and torch's versions.

What may differ (:data:`PER_NODE`): what a node decides for itself and no other node sees, i.e. the launcher's own
options (``--log-dir``, ``--show-rank``, ``--stall-s``, the processes per node) and the recipe's keys for this node's
CPU threads per worker and its launcher's stall watch. Paths are compared as written: a relative run dir or data
path is the same text on every node, however each node's working directory is mounted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PER_NODE = ("trainer.cpu_threads", "trainer.stall_s")  # recipe keys each node sets for itself
NOT_SET = "(not set)"
SHOWN = 8  # differences listed; the rest are counted
_LONGEST = 60  # characters of a value shown


def recipe_items(recipe: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Every leaf of a recipe (a plain container: mappings and lists) as ``dotted.key -> value``; a list is one
    value. The keys of :data:`PER_NODE` are left out."""
    items: dict[str, str] = {}
    for key, value in recipe.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            items.update(recipe_items(value, f"{name}."))
        elif name not in PER_NODE:
            items[name] = shown(value)
    return items


def shown(value: Any) -> str:
    """A value as the user wrote it: text as is, anything else as JSON (``0.05``, ``[64, 64]``, ``null``)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def job_items(job: Mapping[str, str], options: Mapping[str, str | None], versions: Mapping[str, str]) -> dict[str, str]:
    """What a node compares: its job's items (:func:`recipe_items`, or a script's), the options that are given
    (``None``: not given, so absent), the versions."""
    given = {name: value for name, value in options.items() if value is not None}
    return {**dict(job), **given, **{f"{name} version": value for name, value in versions.items()}}


def script_items(words: Sequence[str], digest: str) -> dict[str, str]:
    """A script's items: what runs (``main.py`` or ``-m pkg.train``), its arguments, a digest of its source."""
    head = 2 if words[:1] == ["-m"] else 1
    return {"script": " ".join(words[:head]), "script arguments": " ".join(words[head:]) or "(none)",
            "script content": f"sha256 {digest[:12]}"}


@dataclass(frozen=True)
class Difference:
    """One item the nodes do not agree on: each node's value (:data:`NOT_SET` where a node has none)."""

    item: str
    values: dict[str, str]  # node label ("node 1") -> value

    def describe(self) -> str:
        """``optim.lr: 0.05 on node 0, 0.2 on node 1`` (nodes that agree are grouped: ``on nodes 0, 2``)."""
        groups: dict[str, list[str]] = {}
        for node, value in self.values.items():
            groups.setdefault(value, []).append(node)
        parts = [f"{_cut(value)} on {_nodes(nodes)}" for value, nodes in groups.items()]
        return f"{self.item}: {', '.join(parts)}"


def differences(nodes: Mapping[str, Mapping[str, str]]) -> list[Difference]:
    """Every item on which the nodes (label -> its items, in node order) differ, in the order of the first node's
    items, then the items only later nodes have."""
    order: dict[str, None] = {}
    for items in nodes.values():
        order.update(dict.fromkeys(items))
    found = []
    for item in order:
        values = {label: items.get(item, NOT_SET) for label, items in nodes.items()}
        if len(set(values.values())) > 1:
            found.append(Difference(item, values))
    return found


def refusal(found: Sequence[Difference]) -> tuple[str, str]:
    """(the message, the hint) that stop every node: each difference on a line, the first :data:`SHOWN`."""
    lines = [f"  {d.describe()}" for d in found[:SHOWN]]
    if len(found) > SHOWN:
        lines.append(f"  ... and {len(found) - SHOWN} more")
    message = "\n".join(["the nodes met, but they are not running the same job, so none of them starts:", *lines])
    hint = ("Start every node with the same mgpu launch command (the same recipe and overrides, or the same script "
            "and arguments, the same --resume/--max-restarts) and the same mgpu and torch. Only what a node decides "
            f"for itself may differ: --log-dir, --show-rank, --stall-s, the processes per node, {', '.join(PER_NODE)}.")
    return message, hint


def _cut(value: str) -> str:
    return value if len(value) <= _LONGEST else value[: _LONGEST - 3] + "..."


def _nodes(labels: list[str]) -> str:
    """``node 1``, or ``nodes 0, 2`` (labels are ``node N`` or ``node N (host)``)."""
    if len(labels) == 1:
        return labels[0]
    return "nodes " + ", ".join(label.removeprefix("node ") for label in labels)
