"""``dispatch``: HEFT whose device choice also weighs a rule learnt over many graphs.

HEFT sends each op to the device where it finishes earliest. That is blind to what the
choice commits: the rest of the op's colocation group follows it, memory fills, tensors
will cross links, a slow device delays the critical path. A *dispatching rule* adds to
each candidate's finish time a weighted sum of six terms that say so, each in µs and
relative to the other candidates (:func:`placetool.search.listsched_kernels._rule_terms`:
memory, backlog, slowness, traffic, group, commitments). Device slots are
interchangeable between problems, so a rule over relations like these means the same on
a graph it has never seen, unlike per-device preferences.

The method places with a small portfolio of such rules, learnt by ``placetool rl
pretrain --policy rule`` (the cross-entropy method against the simulator over many
graphs and clusters, each rule trained for what it adds to the ones before:
``rl/rule.py``), and plain HEFT (every weight 0); the tracker keeps the
placement the simulator finds fastest, so a rule that does not suit a graph is not
picked. The portfolio ships as ``data/policies/dispatch/policy.json``, a few rows of six
numbers in JSON: a rule file is read as data and never runs code. Like the other list
schedulers the method is memory-constrained by the simulator's account
(:func:`placetool.search.listsched._schedule_portfolio`); ``metadata["picked"]`` says which
rule (1, 2, ...; 0: HEFT) gave the result. HEFT is scheduled last: under a seconds budget
the rules are tried first. Among the starting points of sa, tpe and rl it comes before
``m-etf`` and ``heft``: its memory rounds run breadth first, HEFT's among them, so within
a tight seeding share it holds HEFT's first rounds and its best rule's placement (on
gnmt8/k40x8, sa at 10 s ends at 1,090.7-1,101.3 ms from it, against 1,437.1-1,472.3
with m-etf and heft first, when dispatch never finished).

Example: the shipped rule on synthetic-1k and k80x4::

    >>> from placetool.costmodel import CostModel, presets
    >>> from placetool.search import Budget, Problem, run
    >>> p = Problem(CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4")))
    >>> r = run("dispatch", p, Budget(evals=20), seed=0)
    >>> r.feasible, r.metadata["policy"], r.metadata["picked"] in range(len(r.metadata["rules"]) + 1)
    (True, 'dispatch', True)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placetool.costmodel.errors import atomic_write, read_parsed

from .errors import SearchError
from .listsched import _schedule_portfolio
from .rule_kernels import N_RULE
from .registry import register

#: the rule's terms, in the order of its weights
TERMS = ("memory", "backlog", "slowness", "traffic", "group", "commitments")
FORMAT = "placetool.dispatch-rule"
VERSION = 1
#: the bundled rule (``data/policies/NAME``) the method uses unless told otherwise
DEFAULT_RULE = "dispatch"

assert len(TERMS) == N_RULE


@dataclass(frozen=True)
class Rules:
    """A portfolio of dispatching rules: ``weights`` (float64[K, N_RULE], a row per rule,
    a column per :data:`TERMS`), where it came from (``source``: a folder) and what its
    file says of its training (``meta``)."""

    weights: np.ndarray
    source: str = ""
    meta: dict = field(default_factory=dict)


def rule_path(name_or_path) -> Path:
    """The ``policy.json`` of a rule: a file, a folder holding one, or a bundled name."""
    p = Path(name_or_path)
    if p.is_dir():
        return p / "policy.json"
    if p.exists() or p.suffix == ".json":
        return p
    from placetool.costmodel.presets import data_dir

    return data_dir() / "policies" / str(name_or_path) / "policy.json"


def read_rules(name_or_path) -> Rules:
    """Load a portfolio; SearchError names the file and the field that is wrong.

    Only JSON is read: a format tag, a version, the term names (which must be
    :data:`TERMS`, in order) and ``weights``, a list of rules, each one finite number
    per term (an empty list is HEFT alone)."""
    path = rule_path(name_or_path)
    doc = read_parsed(path, lambda p: json.loads(p.read_text()), SearchError, "dispatching rule",
                      "not a dispatching rule", (UnicodeDecodeError, json.JSONDecodeError, RecursionError),
                      missing=f"dispatch: no rule at {path} (give a folder written by `placetool rl pretrain "
                              f"--policy rule`, or a bundled name such as {DEFAULT_RULE!r})")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SearchError(f"{path}: field 'format' must be {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise SearchError(f"{path}: field 'version' is {doc.get('version')!r}; this placetool reads version {VERSION}")
    if doc.get("terms") != list(TERMS):
        raise SearchError(f"{path}: field 'terms' must be {list(TERMS)}")
    w = doc.get("weights")
    if not isinstance(w, list) or not all(
            isinstance(row, list) and len(row) == N_RULE
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in row)
            for row in w):
        raise SearchError(f"{path}: field 'weights' must be a list of rules, each {N_RULE} finite numbers")
    meta = {k: v for k, v in doc.items() if k not in ("format", "version", "terms", "weights")}
    return Rules(np.array(w, np.float64).reshape(len(w), N_RULE), str(path.parent), meta)


def write_rules(folder, weights, meta: dict | None = None) -> Path:
    """Write ``folder/policy.json`` whole or not at all (:func:`atomic_write`)."""
    w = np.asarray(weights, np.float64)
    w = w.reshape(-1, N_RULE) if w.size else w.reshape(0, N_RULE)
    if w.ndim != 2 or not np.isfinite(w).all():
        raise ValueError(f"a dispatching rule has {N_RULE} finite weights, got {weights!r}")
    doc = {"format": FORMAT, "version": VERSION, "terms": list(TERMS), "weights": [[float(x) for x in row] for row in w],
           **(meta or {})}
    path = Path(folder) / "policy.json"
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    return path


def schedule_with(weights):
    """A ``schedule(data)`` for :func:`_schedule_portfolio`: HEFT's order, the rule's choice."""
    w = np.asarray(weights, np.float64)

    def schedule(data):
        gdev, out = data.eft(data.rank_u(), rule=w)
        return gdev, out, None

    return schedule


@register("dispatch", seed_rank=3, summary="HEFT and learnt dispatching rules pre-trained over many graphs "
                              "(data/policies/dispatch), the fastest placement kept; memory-constrained")
def dispatch(problem, budget, seed, tracker, policy: str = DEFAULT_RULE, links: str = "queued"):
    """HEFT with each rule of ``policy`` added to its device choice, then HEFT itself;
    the fastest placement is the result (see the module docstring)."""
    rules = read_rules(policy)
    # the rules first, in the order they were learnt (on the training set HEFT was the
    # best of the four on 9 problems of 36), so that a budget that ends early has tried
    # them; their memory rounds breadth first, so that one that fits early is not kept
    # waiting behind another's eight
    order = [*range(1, len(rules.weights) + 1), 0]
    weights = [rules.weights[i - 1] if i else np.zeros(N_RULE) for i in order]
    ran = _schedule_portfolio(problem, tracker, [schedule_with(w) for w in weights], links)
    best = tracker.best_assignment
    # the first schedule whose result is the tracker's best gave it
    k, meta, _ = next((x for x in ran if best is not None and np.array_equal(x[2], best)), ran[0])
    picked = order[k]
    return {"policy": str(policy), "rules": rules.weights.tolist(), "picked": picked,
            "scheduled": len(ran), **meta}
