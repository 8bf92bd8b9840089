"""``placetool search --method rl``: train a policy on the problem with REINFORCE.

Options (keyword arguments of the method; the CLI passes those it is given):
``policy`` (seq2seq | hierarchical | gdp; default gdp, the fastest per step, or the saved one's kind with
``init_from``), ``init_from`` (a folder saved by ``placetool rl pretrain`` or by an
earlier run's ``logdir``: fine-tune it, or with ``--budget-evals 1`` place zero-shot),
``logdir`` (TensorBoard scalars and a checkpoint in ``logdir/policy``), ``warm_start``
(default True: like ``sa`` and ``tpe``, score the cheap baselines first and start the
policy's residual logits at the best of them; False: learn from the compute-time prior
alone), plus policy knobs
(``hidden``, ``max_groups``, ``n_groups``, ``tanh_c``, ``temperature``) and trainer knobs
(see :class:`placetool.rl.trainer.TrainConfig`).

The budget is the search budget: every sampled placement is one evaluation. The method's
own default, :data:`DEFAULT_BUDGET` (about 2 minutes on 2 cores), is what the demo uses.
"""

from __future__ import annotations

import inspect

import numpy as np

from placetool.search.base import Budget, SearchError, register

DEFAULT_POLICY = "gdp"
#: what ``placetool search --method rl`` should run with when the user gives no budget
DEFAULT_BUDGET = Budget(seconds=120.0)

_POLICY_KNOBS = {"hidden", "max_groups", "n_groups", "tanh_c", "temperature", "layers", "heads"}


@register("rl", budget=DEFAULT_BUDGET, summary="REINFORCE placement policies (TensorFlow; see `placetool rl`)")
def rl(problem, budget, seed, tracker, policy: str | None = None, init_from=None, logdir=None,
       warm_start: bool = True, **options):
    """REINFORCE with a seq2seq / hierarchical / GDP policy; metadata says what it learnt."""
    from . import policies
    from .tfutil import set_seed, tf
    from .trainer import TrainConfig, Trainer

    knobs = {k: options.pop(k) for k in list(options) if k in _POLICY_KNOBS}
    cfg = TrainConfig.from_options(options)
    if policy is not None and policy not in policies.POLICIES:
        raise SearchError(f"unknown policy {policy!r} (known: {', '.join(policies.POLICIES)})")
    tf()  # user mistakes above are reported before TensorFlow loads
    set_seed(seed)
    residual = None
    if init_from is not None:
        if knobs:
            raise SearchError(f"rl: {', '.join(sorted(knobs))} cannot change a policy loaded with init_from")
        pol, meta = policies.load(init_from, expect_policy=policy, n_devices=problem.n_devices)
        # a policy pre-trained without its residual table fine-tunes with one
        if not pol.residual:
            pol.residual = True
        residual = policies.saved_residual(meta, problem, pol.atoms_for(problem))
    else:
        kind = policy or DEFAULT_POLICY
        ok = set(inspect.signature(policies.POLICIES[kind].__init__).parameters) | {"hidden", "max_groups",
                                                                                    "tanh_c", "temperature"}
        bad = sorted(set(knobs) - ok)
        if bad:
            raise SearchError(f"rl: policy {kind!r} has no option {', '.join(bad)}")
        pol = policies.make(kind, problem.n_devices, seed=seed, **knobs)
    seeded = None
    if warm_start and init_from is None and pol.residual:
        residual, seeded = _warm_start(pol, problem, budget, seed, tracker)
    trainer = Trainer(pol, [problem], cfg, seed=seed, trackers=[tracker], logdir=logdir, residuals=[residual])
    summary = trainer.train(done=tracker.done)
    atoms = trainer.tasks[0].atoms
    return {"policy": pol.kind, "atoms": atoms.n, "groups": problem.n_groups,
            "coarsened": atoms.n < problem.n_groups, "steps": summary["steps"],
            "samples_per_step": cfg.samples, "init_from": str(init_from) if init_from else None,
            "logdir": str(logdir) if logdir else None, "warm_start": seeded}


#: logit given to the warm-start device of each atom: after the C=5 tanh clip the margin
#: is about 4, i.e. ~93% on that device with 5 devices, so samples explore around it
WARM_LOGIT = 5.5


def _warm_start(pol, problem, budget, seed, tracker):
    """Residual tables that start the policy near the best cheap placement.

    Like ``sa`` and ``tpe``, the cheap baselines and list schedulers registered in
    :func:`placetool.search.seed_methods` are scored first (through the tracker, so they
    count against the budget, with at most 20% of a time budget); each atom's device is
    the most common device of its groups in the best of them. Returns (tables or None,
    name of the seed used or None).
    """
    try:
        from placetool.search.annealing import seed_assignments
    except ImportError:
        return None, None
    seeds, _ = seed_assignments(problem, budget, seed, tracker, share=0.2)
    if not seeds:
        return None, None
    _, name, a = seeds[0]
    atoms = pol.atoms_for(problem)
    priors = pol.residual_priors(atoms)
    if priors[0].shape != (atoms.n, problem.n_devices):  # the hierarchical grouper: no device table
        return None, f"{name} (scored only)"
    votes = np.zeros((atoms.n, problem.n_devices))
    np.add.at(votes, (atoms.members, a), 1.0)
    votes[~atoms.allowed] = -1.0
    dev = np.argmax(votes, axis=1)
    table = np.zeros_like(priors[0])
    table[np.arange(atoms.n), dev] = WARM_LOGIT
    return [table, *priors[1:]], name
