"""The REINFORCE trainer's knobs (:class:`TrainConfig`), grouped by what they steer.

The command line (``placetool search --method rl --option KEY=VALUE``) and saved policies
name the knobs by flat keys (``samples``, ``compound_until``, ``merge``...):
:meth:`TrainConfig.from_options` reads them, :meth:`TrainConfig.options` writes them.

    >>> cfg = TrainConfig.from_options({"samples": 16, "compound": 8, "compound_until": 0.5})
    >>> cfg.sampling.samples, cfg.compound.count, cfg.compound.until
    (16, 8, 0.5)
    >>> TrainConfig.from_options(cfg.options()) == cfg
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from placetool.costmodel.errors import UserError
from placetool.search.registry import Count, NonNegative, Positive, Share, Size, check_value


@dataclass(slots=True)
class Sampling:
    """What each step draws: how many placements, how far off the mode, how often the mode."""

    samples: Count = 64         # K placements per step and problem
    entropy: float = 0.01       # entropy bonus weight at the start ...
    entropy_end: float | None = None  # ... and at the end of the budget (None: constant)
    greedy_every: Count = 10    # also score the greedy placement every N steps
    guide: float = 0.0          # > 0 (>= 1): groups on the mode's critical path leave it this many times as
    #                             often (rl.guide; frozen network, one atom per group); 0: off
    guide_affinity: NonNegative = 1.0  # with guide: how strongly a leaving group goes where its neighbours are
    min_moves: NonNegative = 0.0  # frozen network: samples leave the mode on at least this many atoms on
    #                             average, the learnt leave-probabilities scaled up to it (0: no floor)
    widen_after: Count | None = None  # frozen network with a floor: after this many steps without a new best,
    #                             double the floor (up to Trainer.WIDEN_MAX times); a new best resets it
    follow: bool = False        # frozen network: the mode moves to a step's best row when that beats the mode
    #                             (its logits trade places with the mode's, FrozenNetTable.adopt)


@dataclass(slots=True)
class Compound:
    """Compound moves along the mode's critical path among the samples (with ``guide``),
    and rows merged from a step's winners. Flat keys: ``compound`` (``count``),
    ``compound_from`` (``start``), ``compound_until``, ``compound_kinds``,
    ``compound_adapt``, ``compound_slack``, ``merge``."""

    count: Size = 0             # this many of the K samples per step are compound moves along the mode's
    #                             critical path (a run of groups to one device, a transfer pulled onto one
    #                             side, a swap; search.critical.CriticalMoves) instead of the policy's draws
    start: Share = 0.0          # draw them only while the spent fraction of the budget is
    until: Share = 1.0          # in [start, until)
    kinds: str = "chain,pull,swap"  # the kinds drawn, comma-separated (search.critical.CriticalMoves.KINDS)
    adapt: bool = False         # draw the kinds as sa does, half uniformly and half by how often each
    #                             improved on the mode lately (search.annealing.KindOdds); False: uniformly
    slack: NonNegative | None = None  # a compound row teaches the table only if its step time is within this
    #                             fraction above the best so far (0: only rows as good as the best; None:
    #                             every row, as the policy's own draws)
    merge: bool = False         # the rows that beat the mode, on disjoint groups, are also scored together,
    #                             one more row a step (a compound move made of the batch's winners; rl's
    #                             default when it fine-tunes a pre-trained gdp policy)

    def kind_names(self) -> tuple[str, ...]:
        """The kinds as a tuple."""
        return tuple(k.strip() for k in str(self.kinds).split(",") if k.strip())


@dataclass(slots=True)
class Update:
    """How a step's rewards change the policy: step sizes, baseline, PPO, penalty."""

    lr: NonNegative = 1e-4      # Adam learning rate of the network weights (0: frozen)
    residual_lr: Positive = 0.05  # learning rate of the per-problem residual logits
    residual_optimizer: str = "adam"  # adam | sgd (plain steps: rarely-sampled entries stay put)
    clip_norm: Positive = 1.0   # global-norm gradient clipping
    baseline: str = "ema"       # ema: moving average of batch means; loo: leave-one-out mean of the other samples
    baseline_decay: Share = 0.9  # EMA decay of the reward baseline
    ppo_epochs: Count = 1       # > 1: PPO-style clipped updates, this many passes over each batch
    ppo_clip: Positive = 0.2    # ratio clip of the PPO objective
    penalty: Positive | None = None  # reward of an infeasible placement is -penalty (None: adaptive)


#: the flat keys that name a field of another name in its group
_RENAMED = {"compound": "count", "compound_from": "start", "compound_until": "until", "compound_kinds": "kinds",
            "compound_adapt": "adapt", "compound_slack": "slack"}


@dataclass(slots=True)
class TrainConfig:
    """Knobs of the REINFORCE trainer (all have working defaults), in groups."""

    sampling: Sampling = field(default_factory=Sampling)
    compound: Compound = field(default_factory=Compound)
    update: Update = field(default_factory=Update)
    tasks_per_step: Count | None = None  # multi-problem training: this many problems per step, in rotation
    checkpoint_every: Count = 50  # steps between checkpoints (with a logdir)

    @staticmethod
    def keys() -> dict[str, tuple[str | None, str]]:
        """``{flat key: (group or None, field)}``, groups in order."""
        out = {}
        for group in ("sampling", "compound", "update"):
            back = {v: k for k, v in _RENAMED.items()} if group == "compound" else {}
            for f in fields(_GROUPS[group]):
                out[back.get(f.name, f.name)] = (group, f.name)
        return {**out, "tasks_per_step": (None, "tasks_per_step"), "checkpoint_every": (None, "checkpoint_every")}

    @classmethod
    def from_options(cls, options: dict) -> "TrainConfig":
        """From flat keys (the command line's ``--option``s, a saved policy's
        ``train_config``), each value checked against the kind its field names."""
        keys = cls.keys()
        bad = sorted(set(options) - set(keys))
        if bad:
            raise UserError(f"rl: unknown option(s) {', '.join(bad)} (known: {', '.join(sorted(keys))})")
        groups = {g: {} for g in _GROUPS}
        top = {}
        for k, (g, name) in keys.items():
            if k in options:
                kind = next(f.type for f in fields(_GROUPS[g] if g else cls) if f.name == name)
                (groups[g] if g else top)[name] = check_value(f"rl: option {k!r}", kind, options[k])
        return cls(**{g: _GROUPS[g](**kw) for g, kw in groups.items()}, **top)

    def options(self) -> dict:
        """The flat keys and their values (what :meth:`from_options` reads)."""
        return {k: getattr(getattr(self, g) if g else self, name) for k, (g, name) in self.keys().items()}

    def __post_init__(self):
        """Checks across fields (:meth:`from_options` also checks each value's kind)."""
        s, c, u = self.sampling, self.compound, self.update
        if u.baseline not in ("ema", "loo"):
            raise UserError(f"rl: baseline must be 'ema' or 'loo', got {u.baseline!r}")
        if u.baseline == "loo" and s.samples < 2:
            raise UserError(f"rl: baseline 'loo' measures each sample against the others of its step, so samples "
                            f"must be at least 2 (got {s.samples}); or give baseline=ema")
        if u.residual_optimizer not in ("adam", "sgd"):
            raise UserError(f"rl: residual_optimizer must be 'adam' or 'sgd', got {u.residual_optimizer!r}")
        if not (s.guide == 0 or s.guide >= 1):
            raise UserError(f"rl: guide must be 0 (off) or >= 1, got {s.guide!r}")
        from placetool.search.critical import CriticalMoves

        kinds = c.kind_names()
        bad = sorted(set(kinds) - set(CriticalMoves.KINDS))
        if bad or not kinds:
            raise UserError(f"rl: compound_kinds {c.kinds!r}: unknown kind(s) "
                            f"{', '.join(bad) or '(none given)'} (known: {', '.join(CriticalMoves.KINDS)})")
        if not c.start <= c.until:
            raise UserError(f"rl: compound_until must be a fraction of the budget in [compound_from, 1], "
                            f"got {c.until!r}")


_GROUPS = {"sampling": Sampling, "compound": Compound, "update": Update}
