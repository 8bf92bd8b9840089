"""``placetool search --method rl``: train a policy on the problem with REINFORCE.

Options (keyword arguments of the method; the CLI passes those it is given):
``policy`` (seq2seq | hierarchical | gdp; default gdp, or the saved one's kind with
``init_from``), ``init_from`` (a folder saved by ``placetool rl pretrain`` or by an
earlier run, or the name of a bundled policy such as ``gdp``: fine-tune it, or with
``--budget-evals 1`` place zero-shot), ``zero_shot`` (with ``init_from``: place with the
policy's mode alone, no search; a mode that does not fit in device memory is then fitted
into it by :func:`placetool.search.memory.fit_memory`, a few more evaluations, as far as
the budget goes; default: zero-shot when the budget is one evaluation), ``logdir`` (each
run writes TensorBoard scalars and a checkpoint to its own subfolder), ``warm_start`` (default True: like ``sa`` and
``tpe``, score the cheap baselines first and start the policy with that placement as its
mode, also when fine-tuning a pre-trained policy, whose network then decides where
samples move off that mode; False: learn from the network and compute-time prior
alone), ``explore`` (with a warm start, how many groups a sample moves off the mode on
average at first, default 3), plus policy knobs
(``hidden``, ``max_groups``, ``n_groups``, ``tanh_c``, ``temperature``, ``layers``...)
and trainer knobs (the flat keys of :class:`placetool.rl.config.TrainConfig`; ``guide=0`` turns off the
exploration aimed at the critical path, :mod:`placetool.rl.guide`; ``min_moves=0`` lets
the chance to leave the mode fall towards 0 as the policy learns, which stalls the search;
fine-tuning a pre-trained gdp policy also scores each step's winners together, ``merge``,
draws compound moves to the end of the budget, ``compound_until=1``, moves the policy's mode
to a step's best sample when that beats the mode, ``follow``, and draws sa's ``region`` moves
among the compound kinds, each kind by how often it improved lately, ``compound_kinds``,
``compound_adapt``).

The budget is the search budget: every sampled placement is one evaluation. The result's
metadata says where the best placement came from (``source``: ``warm start NAME``,
``policy at step N``, ``compound move off the policy's mode at step N``, ``the policy's
winning samples of step N, merged`` or ``policy's mode (zero-shot)``), how many new bests
each kind of sample found (``improvements``), how many compound moves and merged rows were
scored (``compound_samples``, ``merged_samples``), the compound kinds and their odds at the
end (``compound_kinds``, ``kind_odds``), whether the mode followed the best samples
(``follow``) and how the result compares with the warm start (``vs_warm_start``).
"""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path

import numpy as np

from placetool.search import Budget, SearchError
from placetool.search.registry import Positive, register

DEFAULT_POLICY = "gdp"
#: what ``placetool search --method rl`` should run with when the user gives no budget
DEFAULT_BUDGET = Budget(seconds=120.0)
#: trainer settings for a single search with the gdp policy (measured in benchmarks/README.md):
#: the network frozen (lr 0: its logits are a fixed prior, and the residual table learns in
#: closed-form numpy steps, ~5x the samples/s of a TF pass per step), leave-one-out baseline,
#: plain gradient steps on the table large enough that a winning sample moves the mode, and
#: samples aimed at the mode's critical path and towards each group's neighbours (rl.guide),
#: which never stop leaving the mode (without the floor the table's steps drive the chance
#: to leave towards 0 within ~20 s on nmt/k80x4 and the search stalls). 24 of each step's
#: 32 samples are compound moves along the mode's critical path in the budget's first half
#: (``compound=24, compound_until=0.5``): they lead the mode into a better basin (gnmt4,
#: transformer, inception_v3), and the policy's own draws then polish it, so the best is
#: usually one the policy sampled. A compound row teaches the table only within 10% of the
#: best (``compound_slack=0.1``): rows that merely beat their batch would sharpen the table
#: around the mode and stall nmt. Compound moves throughout, from the middle on, or teaching
#: from every row each lose on nmt or gnmt4 (benchmarks/README.md, "Compound moves: how
#: many, when, ...", "... only late in the budget", "... that teach only near the best",
#: "Compound moves early, teaching near the best: the default")
GDP_SEARCH_DEFAULTS = {"lr": 0.0, "baseline": "loo", "residual_optimizer": "sgd", "residual_lr": 20.0,
                       "samples": 32, "entropy": 0.0, "guide": 16.0, "min_moves": 1.0,
                       "compound": 24, "compound_until": 0.5, "compound_slack": 0.1}
#: added to those when the search fine-tunes a pre-trained policy (``init_from``): each
#: step's winners on disjoint groups are also scored together (``merge``), and compound
#: moves are drawn to the end of the budget. Over 60 s merging ended better on all 6
#: fine-tuning runs measured (inception_v3 3 seeds, transformer 2, gnmt8 1: 0.6-3.2%) but
#: on only 2 of 6 searches from scratch (nmt 3.8% and 5.6% worse on two seeds); with it,
#: compound moves to the end gained 1.7-3.9% more on inception_v3 and 0.5% on gnmt8, and
#: lost 0.2% on transformer (benchmarks/README.md, "`merge` by default when fine-tuning ...").
#: The mode also moves to a step's best sample that beats it (``follow``): the table's own
#: steps moved it too slowly, so the samples kept leaving a mode 1-5% behind the best (gnmt8).
#: With sa's ``region`` moves among the compound kinds, drawn by sa's adaptive odds, the
#: minute ended better than sa's on gnmt8 on 3 of 3 seeds (2.3-4.7%) and on inception_v3 on
#: 2 of 3 (1.4-1.5%; 0.6% behind on the third), and 0.2-1.0% behind on transformer; region
#: moves without ``follow`` stalled gnmt8. A search from scratch keeps its slower mode:
#: ``follow`` there cost nmt 4-5% on 2 seeds (gnmt4 0.8-1.1% better) (benchmarks/README.md,
#: "The mode follows the best sample ...")
FINE_TUNE_DEFAULTS = {"merge": True, "compound_until": 1.0, "follow": True, "compound_kinds": "chain,pull,swap,region",
                      "compound_adapt": True}
#: the table's step size without a warm start: logits start near 0, where steps of 20
#: collapse the policy onto its first lucky sample (measured on the tests' tiny problem)
COLD_RESIDUAL_LR = 2.0

_POLICY_KNOBS = {"hidden", "max_groups", "n_groups", "tanh_c", "temperature", "layers", "heads", "group_layers",
                 "max_devices"}


def bundled_policy(name: str) -> Path | None:
    """The folder of a policy shipped with placetool (``data/policies/NAME``), if any."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
        return None
    from placetool.costmodel.presets import data_dir

    d = data_dir() / "policies" / name
    return d if (d / "policy.json").is_file() else None


def resolve_policy_folder(init_from) -> Path:
    """A path as given, or a bundled policy's folder when no such path exists."""
    p = Path(init_from)
    if not p.exists():
        b = bundled_policy(str(init_from))
        if b is not None:
            return b
    return p


def run_folder(logdir, label: str) -> Path:
    """A fresh subfolder of ``logdir`` for one run: LABEL-date-time (-2, -3... if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(logdir) / f"{label}-{stamp}"
    d, i = base, 1
    while d.exists():
        i += 1
        d = base.with_name(f"{base.name}-{i}")
    return d


@register("rl", budget=DEFAULT_BUDGET, summary="REINFORCE placement policies (TensorFlow; see `placetool rl`)")
def rl(problem, budget, seed, tracker, policy: str | None = None, init_from=None, logdir=None,
       warm_start: bool = True, explore: Positive = 3.0, zero_shot: bool | None = None, **options):
    """REINFORCE with a seq2seq / hierarchical / GDP policy; metadata says what it learnt."""
    from . import policies
    from .tfutil import set_seed, tf
    from .config import TrainConfig
    from .trainer import Trainer

    knobs = {k: options.pop(k) for k in list(options) if k in _POLICY_KNOBS}
    if policy is not None and policy not in policies.POLICIES:
        raise SearchError(f"unknown policy {policy!r} (known: {', '.join(policies.POLICIES)})")
    if not explore > 0:
        raise SearchError(f"rl: explore must be positive, got {explore!r}")
    if zero_shot and init_from is None:
        raise SearchError("rl: zero_shot places with a pre-trained policy: give one with init_from "
                          "(--init-from gdp on the command line)")
    folder = resolve_policy_folder(init_from) if init_from is not None else None
    kind = policy or (policies.saved_kind(folder) if folder is not None else DEFAULT_POLICY)
    defaults = dict(GDP_SEARCH_DEFAULTS) if kind == "gdp" else {}
    if kind == "gdp" and folder is not None:
        defaults.update(FINE_TUNE_DEFAULTS)
    if "compound_from" in options:
        # a window the user opens runs to the end unless they close it too
        defaults.pop("compound_until", None)
    cfg = TrainConfig.from_options({**defaults, **options})
    if folder is not None and knobs:
        raise SearchError(f"rl: {', '.join(sorted(knobs))} cannot change a policy loaded with init_from")
    # a pre-trained policy with one evaluation places zero-shot: its own mode, no seeds
    if zero_shot is None:
        zero_shot = folder is not None and budget.evals is not None and budget.evals <= 1
    if zero_shot and kind == "gdp" and logdir is None:
        # nothing to train and nothing to log: the network runs in numpy, without TensorFlow
        return _zero_shot_numpy(folder, policy, problem, tracker, cfg)
    tf()  # user mistakes above are reported before TensorFlow loads
    set_seed(seed)
    residual = None
    if folder is not None:
        pol, meta = policies.load(folder, expect_policy=policy, n_devices=problem.n_devices)
        # a policy pre-trained without its residual table fine-tunes with one
        if not pol.residual:
            pol.residual = True
        residual = policies.saved_residual(meta, problem, pol.atoms_for(problem))
    else:
        ok = set(inspect.signature(policies.POLICIES[kind].__init__).parameters) | {"hidden", "max_groups",
                                                                                    "tanh_c", "temperature"}
        bad = sorted(set(knobs) - ok)
        if bad:
            raise SearchError(f"rl: policy {kind!r} has no option {', '.join(bad)}")
        pol = policies.make(kind, problem.n_devices, seed=seed, **knobs)
    seeded, start_us = None, None
    if warm_start and residual is None and pol.residual and not zero_shot:
        residual, seeded = _warm_start(pol, problem, budget, seed, tracker, explore, pretrained=folder is not None)
        if seeded is not None:
            start_us = tracker.best_step_us
    if kind == "gdp" and seeded is None and "residual_lr" not in options:
        cfg.update.residual_lr = COLD_RESIDUAL_LR
    label = f"{problem.graph.name}-{problem.cluster.name}-{pol.kind}-s{seed}"
    run_dir = run_folder(logdir, label) if logdir else None
    trainer = Trainer(pol, [problem], cfg, seed=seed, trackers=[tracker], logdir=run_dir, residuals=[residual])
    task = trainer.tasks[0]
    task.start_us = start_us
    atoms = task.atoms
    fitted = 0
    if zero_shot:
        summary, fitted = _place_zero_shot(trainer, task, tracker)
    else:
        summary = trainer.train(done=tracker.done)
    if tracker.best_assignment is None:
        # start-up (TensorFlow, features) outlasted a seconds budget: answer anyway, as
        # a one-shot method does, with the policy's mode
        from placetool.search.tracker import score

        score(tracker, _mode(pol, task))
        source = "policy's mode, scored after the budget (start-up took all of it)"
    elif zero_shot:
        source = _zero_shot_source(tracker, fitted)
    elif seeded is not None and not (task.best < start_us):
        source = f"warm start {seeded}"
    elif task.best_step is not None and task.best_origin == "compound":
        source = f"compound move off the policy's mode at step {task.best_step}"
    elif task.best_step is not None and task.best_origin == "merged":
        source = f"the policy's winning samples of step {task.best_step}, merged"
    elif task.best_step is not None:
        source = f"policy at step {task.best_step}"
    else:
        source = "policy (no feasible placement found)"
    return {"policy": pol.kind, "atoms": atoms.n, "groups": problem.n_groups,
            "coarsened": atoms.n < problem.n_groups, "steps": summary["steps"],
            "samples_per_step": cfg.sampling.samples, "init_from": str(folder) if folder is not None else None,
            "logdir": str(run_dir) if run_dir else None, "warm_start": seeded,
            "warm_start_us": start_us, "mode_start_us": task.mode_start_us, "source": source,
            "vs_warm_start": (tracker.best_step_us / start_us) if start_us else None,
            "guide_updates": task.guide_updates, "improvements": dict(task.improvements),
            "compound_samples": task.compound_samples, "merge": cfg.compound.merge,
            "merged_samples": task.merged_samples, "follow": cfg.sampling.follow,
            "compound_kinds": list(cfg.compound.kind_names()),
            "kind_odds": task.odds.as_dict() if task.odds is not None and not zero_shot else None,
            "samples_per_second": summary["samples"] / max(summary["seconds"], 1e-9)}


def _zero_shot_source(tracker, fitted: int) -> str:
    """What a zero-shot result's ``source`` says: the mode, and whether it was fitted."""
    source = "policy's mode (zero-shot)" + (f", {fitted} groups moved to fit in memory" if fitted else "")
    if not tracker.best_feasible and tracker.evaluations > 1:
        source += "; out of memory still, after fitting"
    elif not tracker.best_feasible:
        source += "; out of memory (with zero_shot=true, more evaluations let groups move until it fits)"
    return source


def _zero_shot_numpy(folder, policy, problem, tracker, cfg) -> dict:
    """A saved gdp network's zero-shot placement, its forward pass in numpy
    (:mod:`placetool.rl.gdp_net`): the mode of the network's logits plus the residual
    table saved for this very problem, if any, fitted into memory as
    :func:`_place_zero_shot` does. The same placement as through TensorFlow."""
    from placetool.search.memory import fit_memory
    from placetool.search.tracker import score

    from . import gdp_net, policies
    from .trainer import frozen_mode

    t0 = time.perf_counter()
    _, pcfg, meta, ws = policies.read(folder, expect_policy=policy, n_devices=problem.n_devices)
    w = policies.gdp_weights(folder, pcfg, ws)
    atoms = gdp_net.atoms(problem, int(pcfg["max_devices"]))
    net = gdp_net.logits(gdp_net.NUMPY, w, gdp_net.inputs(atoms), float(pcfg["tanh_c"])).astype(np.float64)
    residual = policies.saved_residual(meta, problem, atoms)
    table = residual[0].astype(np.float64) if residual is not None else 0.0
    mode = atoms.expand(frozen_mode(net, table, atoms.allowed))  # as the TensorFlow path's _mode
    placed, _ = fit_memory(problem, mode, tracker)
    if tracker.best_assignment is None:  # a seconds budget spent before the first evaluation
        score(tracker, mode)
    fitted = int(np.count_nonzero(placed != mode))
    seconds = time.perf_counter() - t0
    return {"policy": "gdp", "atoms": atoms.n, "groups": problem.n_groups, "coarsened": False, "steps": 0,
            "samples_per_step": cfg.sampling.samples, "init_from": str(folder), "logdir": None, "warm_start": None,
            "warm_start_us": None, "mode_start_us": float(tracker.history[0][2]) if tracker.history else None,
            "source": _zero_shot_source(tracker, fitted), "vs_warm_start": None, "guide_updates": 0,
            "improvements": {"policy": 0, "compound": 0, "merged": 0}, "compound_samples": 0,
            "merge": cfg.compound.merge, "merged_samples": 0, "follow": cfg.sampling.follow,
            "compound_kinds": list(cfg.compound.kind_names()),
            "kind_odds": None, "samples_per_second": tracker.evaluations / max(seconds, 1e-9)}


def _mode(pol, task) -> np.ndarray:
    """The policy's mode on the task as a (1 x groups) assignment."""
    mode = (task.frozen.greedy(),) if task.frozen else pol.greedy(task.obs)
    return pol.assignment(task.atoms, mode)


def _place_zero_shot(trainer, task, tracker) -> tuple[dict, int]:
    """Score the policy's mode, fitted into device memory if it does not fit (as far as
    the budget goes); returns the run's summary and how many groups the fitting moved."""
    from placetool.search.memory import fit_memory

    t0 = time.perf_counter()
    a = np.asarray(_mode(trainer.policy, task)[0], np.int32)
    before = tracker.evaluations
    placed, _ = fit_memory(task.problem, a, tracker)
    if before == 0 and tracker.history:  # nothing was scored before: the first best is the mode
        task.mode_start_us = float(tracker.history[0][2])
    if tracker.best_assignment is not None:
        trainer.log({"best_step_us": tracker.best_step_us, "greedy_step_us": task.mode_start_us or np.inf,
                     "lower_bound_us": task.scale})
        if trainer.writer is not None:
            trainer.writer.flush()
    return {"steps": 0, "samples": tracker.evaluations - before,
            "seconds": round(time.perf_counter() - t0, 3)}, int(np.count_nonzero(placed != a))


#: logit given to the warm-start device of each atom by the coarse policies (seq2seq):
#: after the C=5 tanh clip the margin is about 4, so samples explore around it
WARM_LOGIT = 5.5


def warm_margin(atoms, explore: float) -> np.ndarray:
    """Per-atom logit margin of the warm-start device over each other allowed device such
    that a sample moves about ``explore`` atoms off the warm start in all: an atom with
    k allowed devices leaves with probability ~ (k-1) e^-m = explore / atoms."""
    k = atoms.allowed.sum(axis=1)
    return np.maximum(np.log(np.maximum(k - 1, 1) * atoms.n / explore), 1.0).astype(np.float32)


def _warm_start(pol, problem, budget, seed, tracker, explore, pretrained: bool = False):
    """Residual tables that make the best cheap placement the policy's mode.

    Like ``sa`` and ``tpe``, the cheap baselines and list schedulers registered in
    :func:`placetool.search.seed_methods` are scored first (through the tracker, so they
    count against the budget, with at most 20% of a time budget). For gdp (one atom per
    group) the table reproduces that placement exactly as the argmax; for the coarse
    policies each atom's device is the most common device of its groups. A
    ``pretrained`` gdp network keeps its preferences among the other devices
    (:meth:`GDP.anchor_table`); a fresh one has none worth keeping, and its samples leave
    the mode uniformly. Returns (tables or None, name of the seed used or None).
    """
    from placetool.search.seeding import seed_assignments

    seeds, _ = seed_assignments(problem, budget, seed, tracker, share=0.2)
    if not seeds:
        return None, None
    # the seed the tracker holds as best (feasible first), so the warm start is the result so far
    best = tracker.best_assignment
    match = [(n, a) for _, n, a in seeds if best is not None and np.array_equal(a, best)]
    name, a = match[0] if match else (seeds[0][1], seeds[0][2])
    atoms = pol.atoms_for(problem)
    priors = pol.residual_priors(atoms)
    if priors[0].shape != (atoms.n, problem.n_devices):  # the hierarchical grouper: no device table
        return None, f"{name} (scored only)"
    votes = np.zeros((atoms.n, problem.n_devices))
    np.add.at(votes, (atoms.members, a), 1.0)
    votes[~atoms.allowed] = -1.0
    dev = np.argmax(votes, axis=1)
    if pretrained and hasattr(pol, "anchor_table"):
        return [pol.anchor_table(pol.obs(atoms), atoms, dev, explore), *priors[1:]], name
    if hasattr(pol, "warm_table"):
        table = pol.warm_table(pol.obs(atoms), atoms, dev, warm_margin(atoms, explore))
        return [table, *priors[1:]], name
    table = np.zeros_like(priors[0])
    table[np.arange(atoms.n), dev] = WARM_LOGIT
    return [table, *priors[1:]], name
