"""REINFORCE for placement policies, with the compiled simulator as the reward.

Each step draws K placements per problem (``samples``), scores them in one
``simulate_batch`` call (through the search Tracker when there is one, so evaluations are
counted against the budget), and takes one Adam step (global-norm gradient clipping) on

    loss = -mean_k(A_k * log pi(a_k)) - entropy * H(pi)

with reward ``r = -sqrt(step_time / lower_bound)`` (so 1.0 is a perfect placement, and
the scale is the same on every graph), advantage ``A = (r - b) / s`` where ``b`` is an
exponential moving average of the batch mean reward and ``s`` one of its standard
deviation. Invalid or out-of-memory placements get reward ``-penalty``; with
``penalty=None`` the penalty adapts to twice the worst feasible reward seen, so an
infeasible placement always scores below every feasible one.

The greedy (mode) placement is scored at the first step and every ``greedy_every`` steps
too, so a pretrained policy's zero-shot placement is the first evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placetool.costmodel.jitclock import work_clock
from placetool.search import BudgetExhausted

from .config import Compound, Sampling, TrainConfig, Update  # noqa: F401 (the trainer's knobs, imported from here too)
from .frozen import _FrozenNetTable, frozen_mode  # noqa: F401 (re-exported)
from .tfutil import tf as _tf


def _compiled_apply(opt, variables):
    """``opt.apply_gradients`` on ``variables`` as one compiled call (eager Keras
    optimiser steps cost ~0.2 s each, more than the rest of a training step)."""
    tf = _tf()
    opt.build(variables)

    def apply(grads):
        opt.apply_gradients(zip(grads, variables))

    return tf.function(apply, reduce_retracing=True)


class _Task:
    """One problem the policy trains on: its features, reward scale and baseline."""

    def __init__(self, policy, problem, tracker=None, residual=None, lr=0.05, clip=1.0, optimizer="adam"):
        self.problem = problem
        self.tracker = tracker
        self.atoms = policy.atoms_for(problem)
        self.obs = policy.obs(self.atoms, residual)
        self.residual_vars = [v for k, v in sorted(self.obs.items())
                              if k.startswith("bias") and isinstance(v, _tf().Variable)]
        if self.residual_vars:
            import keras

            size = sum(int(np.prod(v.shape)) for v in self.residual_vars)
            if optimizer == "sgd":
                self.opt = keras.optimizers.SGD(float(lr))
            else:
                self.opt = keras.optimizers.Adam(lr, global_clipnorm=float(clip * np.sqrt(size)))
            self.apply = _compiled_apply(self.opt, self.residual_vars)
        self.scale = max(problem.lower_bound_us(), 1e-9)
        self.baseline: float | None = None
        self.spread: float | None = None
        self.worst = 1.0
        self.best = np.inf
        self.best_assignment = None
        #: trainer step at which ``best`` was sampled (None: not yet), and by what: "policy"
        #: (its draws or its mode) or "compound" (a compound move off the mode)
        self.best_step = None
        self.best_origin = None
        #: new bests (of this run's own samples) found by each origin
        self.improvements = {"policy": 0, "compound": 0, "merged": 0}
        #: the step time the task started from (a warm start's), if the caller sets it
        self.start_us: float | None = None
        #: step time of the policy's mode (greedy placement) when it was scored before any update
        self.mode_start_us: float | None = None
        #: the exploration prior's maker (rl.guide), the mode it was made for, and how often
        self.guide = None
        self.guide_mode = None
        self.guide_updates = 0
        #: the compound-move proposer (with ``compound`` and a guide), and how many of its
        #: moves were drawn (the last batch may be cut short by the budget)
        self.moves = None
        self.compound_samples = 0
        #: how the compound kinds are drawn (``compound_adapt``: search.annealing.KindOdds),
        #: and the kind of each row of the step being scored (None: not a compound move)
        self.odds = None
        self.row_kinds: list | None = None
        #: rows made of a step's winners (``merge``)
        self.merged_samples = 0
        #: the floor's widening factor and the steps since the last new best (``widen_after``)
        self.widen = 1.0
        self.stale = 0

    def score(self, A, step_no=0, compound=None, origin=None):
        """(step times, feasible) of a batch; through the tracker when there is one.
        ``compound`` marks the rows that are compound moves, ``origin`` names that of every
        row (for the best's origin: "policy", "compound" or "merged")."""
        if self.tracker is not None:
            r = self.tracker.evaluate(A)
            n = len(r.assignments)
            step, feas = r.step_time_us, r.feasible
        else:
            r = self.problem.cost_model.simulate_batch(A)
            n, step, feas = len(A), r.step_time_us, r.feasible
        ok = feas & np.isfinite(step)
        if ok.any():
            i = int(np.argmin(np.where(ok, step, np.inf)))
            if step[i] < self.best:
                self.best, self.best_assignment, self.best_step = float(step[i]), A[i].copy(), step_no
                self.best_origin = origin or ("compound" if compound is not None and compound[i] else "policy")
                self.improvements[self.best_origin] += 1
        return n, step, ok


@dataclass
class _Batch:
    """One task's rows in one step: as drawn, then (once scored) the samples' results, the
    mode's row (``with_greedy``) set apart in ``greedy_step``."""

    with_greedy: bool
    rows: np.ndarray | None = None    # the assignments to score (the mode first, with_greedy)
    cflags: np.ndarray | None = None  # which rows are compound moves
    acts: tuple = ()                  # the samples as the policy takes them (one array per output)
    n: int = 0                        # samples scored (the budget may cut the batch short)
    step: np.ndarray | None = None    # their step times and feasibility
    ok: np.ndarray | None = None
    best_before: float = np.inf       # the task's best before this step
    greedy_step: float | None = None


class Trainer:
    """REINFORCE on one or more problems (several: the GDP multi-graph pre-training)."""

    def __init__(self, policy, problems, config: TrainConfig | None = None, seed: int = 0,
                 trackers=None, logdir=None, progress=None, residuals=None):
        self.tf = _tf()
        self.policy = policy
        self.cfg = config or TrainConfig()
        self.seed = int(seed) & 0x7FFFFFFF
        trackers = trackers or [None] * len(problems)
        residuals = residuals or [None] * len(problems)
        u = self.cfg.update
        self.tasks = [_Task(policy, p, t, r, u.residual_lr, u.clip_norm, u.residual_optimizer)
                      for p, t, r in zip(problems, trackers, residuals)]
        frozen = u.lr == 0 and hasattr(policy, "net_logits") and u.ppo_epochs == 1
        for ti, t in enumerate(self.tasks):
            t.frozen = _FrozenNetTable(policy, t) if frozen and len(t.residual_vars) == 1 else None
            if t.frozen is not None:
                t.frozen.floor = float(self.cfg.sampling.min_moves)
                self._set_guide(t, ti)
        import keras

        self.opt = keras.optimizers.Adam(float(u.lr), global_clipnorm=u.clip_norm)
        self._apply = _compiled_apply(self.opt, self.policy.variables)
        self.step_no = 0
        self.logdir = Path(logdir) if logdir else None
        self.writer = self.tf.summary.create_file_writer(str(self.logdir)) if self.logdir else None
        self.progress = progress
        self.samples_seen = 0
        self.t0 = work_clock()
        self._train_t0 = self.t0
        self._limits = (None, None)
        self._grad = self.tf.function(self._grad_impl, reduce_retracing=True)

    def _set_guide(self, t: _Task, ti: int) -> None:
        """With ``guide``, on a frozen table of one atom per group: the critical-path
        prior, and with ``compound`` the compound-move proposer (and its kind odds)."""
        s, c = self.cfg.sampling, self.cfg.compound
        if not (s.guide and np.array_equal(t.atoms.members, np.arange(t.problem.n_groups))):
            return
        from .guide import CriticalPrior

        t.guide = CriticalPrior(t.problem, s.guide, s.guide_affinity)
        if c.count:
            from placetool.search.critical import CriticalMoves

            t.moves = CriticalMoves(t.problem, np.random.default_rng([self.seed, 7919, ti]))
            if c.adapt:
                from placetool.search.annealing import KindOdds

                t.odds = KindOdds(c.kind_names())

    # ------------------------------------------------------------------ pieces
    def _grad_impl(self, obs, actions, adv, old_logp, ent_w, extra_vars):
        tf = self.tf
        with tf.GradientTape() as tape:
            logp, ent = self.policy._logp(obs, *actions)
            if old_logp is None:
                pg = adv * logp
            else:  # PPO: the clipped surrogate keeps later passes near the sampling policy
                ratio = tf.exp(tf.clip_by_value(logp - old_logp, -20.0, 20.0))
                c = self.cfg.update.ppo_clip
                pg = tf.minimum(ratio * adv, tf.clip_by_value(ratio, 1.0 - c, 1.0 + c) * adv)
            loss = -tf.reduce_mean(pg) - ent_w * tf.reduce_mean(ent)
        grads = tape.gradient(loss, self.policy.variables + extra_vars)
        return loss, tf.reduce_mean(ent), grads

    def entropy_weight(self) -> float:
        """The entropy bonus now: linear from ``entropy`` to ``entropy_end`` over the budget."""
        s = self.cfg.sampling
        if s.entropy_end is None:
            return s.entropy
        f = min(max(self.fraction(), 0.0), 1.0)
        return (1 - f) * s.entropy + f * s.entropy_end

    def fraction(self) -> float:
        """How much of the budget is spent (0..1), from the first tracker or train()'s limits."""
        t = self.tasks[0].tracker
        b = t.budget if t is not None else None
        parts = []
        if b is not None and b.evals:
            parts.append(t.evaluations / b.evals)
        if b is not None and b.seconds:
            parts.append(t.seconds / b.seconds)
        if self._limits[0]:
            parts.append(self.step_no / self._limits[0])
        if self._limits[1]:
            parts.append((work_clock() - self._train_t0) / self._limits[1])
        return max(parts, default=0.0)

    def gradients(self, task: _Task, actions, adv, old_logp=None):
        """Policy-gradient of the network weights for sampled ``actions`` with advantages
        ``adv`` (PPO's clipped surrogate when ``old_logp`` is given); the task's residual
        table (if any) takes its own optimiser step here."""
        tf = self.tf
        loss, ent, grads = self._grad(task.obs, tuple(tf.constant(a) for a in actions),
                                      tf.constant(np.asarray(adv, np.float32)),
                                      None if old_logp is None else tf.constant(old_logp),
                                      tf.constant(self.entropy_weight(), tf.float32), task.residual_vars)
        nv = len(self.policy.variables)
        if task.residual_vars:
            task.apply(list(grads[nv:]))
        grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
                 for g, v in zip(grads[:nv], self.policy.variables)]
        return loss, ent, grads

    def update(self, task: _Task, actions, adv) -> None:
        """One optimiser step on one task's samples (what :meth:`step` does per problem)."""
        _, _, grads = self.gradients(task, actions, adv)
        self._apply(grads)

    def rewards(self, task: _Task, step, ok) -> np.ndarray:
        r = -np.sqrt(np.where(ok, step, task.scale) / task.scale)
        if ok.any():
            task.worst = max(task.worst, float(-r[ok].min()))
        pen = self.cfg.update.penalty if self.cfg.update.penalty is not None else 2.0 * task.worst
        return np.where(ok, r, -pen)

    def advantages(self, task: _Task, r: np.ndarray) -> np.ndarray:
        """Centred, scaled rewards: against an EMA baseline, or (``baseline="loo"``) each
        sample against the mean of the other samples of its batch (unbiased, and it
        cancels the batch's common part exactly), scaled by the batch's spread (a lone sample: 0)."""
        d = self.cfg.update.baseline_decay
        m, s = float(r.mean()), float(r.std())
        if self.cfg.update.baseline == "loo":
            task.baseline = m if task.baseline is None else d * task.baseline + (1 - d) * m
            if len(r) < 2:  # a lone sample (the budget cut its step short) has no others to be measured by
                return np.zeros(len(r), np.float32)
            others = (r.sum() - r) / (len(r) - 1)
            return ((r - others) / max(s, 1e-6)).astype(np.float32)
        if task.baseline is None:
            task.baseline, task.spread = m, max(s, 1e-3)
        adv = (r - task.baseline) / max(task.spread, 1e-3)
        task.baseline = d * task.baseline + (1 - d) * m
        task.spread = d * task.spread + (1 - d) * max(s, 1e-3)
        return adv.astype(np.float32)

    # ------------------------------------------------------------------ steps
    def step(self) -> dict:
        """One REINFORCE step over every problem; returns scalars for logging."""
        grads_sum, stats = None, []
        for ti in self._chosen():
            task = self.tasks[ti]
            b = self._draw(task, ti)
            self._score(task, b)
            if b.n <= 0:
                continue
            if task.odds is not None and task.row_kinds is not None:
                self._record_kinds(task, b.step, b.ok)
            if self.cfg.compound.merge and task.guide is not None and task.frozen:
                self._merge(task, b)
            if task.frozen and self.cfg.sampling.widen_after:
                self._widen(task, b.best_before)
            adv = self._batch_advantages(task, b)
            if task.frozen:
                loss, ent = self._update_table(task, b, adv)
            else:
                loss, ent, grads = self._update_network(task, b.acts, adv)
                if grads is not None:
                    grads_sum = grads if grads_sum is None else [x + y for x, y in zip(grads_sum, grads)]
            stats.append(self._stats(task, b, loss, ent))
        if grads_sum is not None:
            self._apply(grads_sum)
        self.step_no += 1
        keys = stats[0] if stats else {}
        out = {k: float(np.mean([s[k] for s in stats])) for k in keys if all(k in s for s in stats)}
        self.log(out)
        return out

    def _chosen(self):
        """The tasks of this step: all, or a rotating window of ``tasks_per_step`` (every problem as often)."""
        m = self.cfg.tasks_per_step
        if m is not None and m < len(self.tasks):
            return [(self.step_no * m + j) % len(self.tasks) for j in range(m)]
        return range(len(self.tasks))

    def _draw(self, task: _Task, ti: int) -> _Batch:
        """The task's rows for this step: the mode every ``greedy_every`` steps, then K
        draws (of the frozen table, aimed by the guide, or of the policy), the first of
        them compound moves while the budget's window for those is open."""
        s, fz = self.cfg.sampling, task.frozen
        if task.guide is not None:
            self._aim(task)
        if fz and s.widen_after:
            fz.floor = float(s.min_moves) * task.widen
        b = _Batch(self.step_no % max(s.greedy_every, 1) == 0)
        parts, flags = [], []
        if b.with_greedy:
            if task.guide is not None:  # _aim has just computed it
                mode = (task.guide_mode[None],)
            else:
                mode = (fz.greedy(),) if fz else self.policy.greedy(task.obs)
            parts.append(self.policy.assignment(task.atoms, mode))
            flags.append(np.zeros(1, bool))
        # a zero-shot call (one evaluation left) scores the mode only: no samples drawn
        if not (b.with_greedy and task.tracker is not None and task.tracker.remaining_evals() <= 1):
            K, seed = s.samples, [self.seed, self.step_no * 1009 + ti]
            b.acts = (fz.sample(K, seed),) if fz else self.policy.sample(task.obs, K, seed)
            c = self.cfg.compound
            none_now = task.moves is None or not (c.start <= self.fraction() < c.until)
            flags.append(np.zeros(K, bool) if none_now else self._compound(task, b.acts[0]))
            parts.append(self.policy.assignment(task.atoms, b.acts))
        b.rows, b.cflags = np.concatenate(parts), np.concatenate(flags)
        return b

    def _score(self, task: _Task, b: _Batch) -> None:
        """Score the rows; the mode's step time goes to ``b.greedy_step``, the samples' to ``b``."""
        b.best_before = task.best
        n, step, ok = task.score(b.rows, self.step_no, b.cflags)
        self.samples_seen += n
        cflags = b.cflags
        if b.with_greedy:
            b.greedy_step = float(step[0]) if ok[0] else np.inf
            if self.step_no == 0 and task.mode_start_us is None:
                task.mode_start_us = float(step[0])
            n, step, ok, cflags = n - 1, step[1:], ok[1:], cflags[1:]
        b.n = n
        if n > 0:  # the budget may have cut the batch short
            b.step, b.ok, b.cflags = step[:n], ok[:n], cflags[:n]
            b.acts = tuple(a[:n] for a in b.acts)

    def _merge(self, task: _Task, b: _Batch) -> None:
        """Score the step's winners merged into one row (``merge``), and add it to the batch."""
        merged = self._merged(task, b.acts[0], b.step, b.ok)
        if merged is None:
            return
        m_n, m_step, m_ok = task.score(self.policy.assignment(task.atoms, (merged[None],)), self.step_no,
                                       origin="merged")
        self.samples_seen += m_n
        task.merged_samples += 1
        b.acts = (np.concatenate([b.acts[0], merged[None]]),)
        b.step, b.ok = np.concatenate([b.step, m_step]), np.concatenate([b.ok, m_ok])
        b.cflags = np.concatenate([b.cflags, [True]])
        b.n += 1

    def _widen(self, task: _Task, best_before: float) -> None:
        """Double the floor after ``widen_after`` steps without a new best; a new best resets it."""
        if task.best < best_before:
            task.widen, task.stale = 1.0, 0
        else:
            task.stale += 1
            if task.stale >= self.cfg.sampling.widen_after:
                task.widen = min(task.widen * 2, self.WIDEN_MAX)
                task.stale = 0

    def _batch_advantages(self, task: _Task, b: _Batch) -> np.ndarray:
        """The samples' advantages; with ``compound_slack``, 0 for compound rows far from the best."""
        adv = self.advantages(task, self.rewards(task, b.step, b.ok))
        slack = self.cfg.compound.slack
        if slack is not None:
            # a compound row far from the best only sharpens the table around the mode (at 24
            # of 32 rows such rows stalled nmt); near the best, it lets the mode move uphill,
            # as sa's accepted moves do (gnmt4 needs that)
            far = ~(b.ok & (b.step <= b.best_before * (1 + slack)))
            adv = np.where(b.cflags & far, np.float32(0), adv)
        return adv

    def _update_table(self, task: _Task, b: _Batch, adv) -> tuple[float, float]:
        """The frozen network's step: closed form on the residual table, then ``follow``;
        returns (loss: nan, entropy)."""
        ent = task.frozen.update(b.acts[0], adv, self.cfg.update.residual_lr, self.entropy_weight())
        if self.cfg.sampling.follow:
            self._follow(task, b.acts[0], b.step, b.ok, b.best_before)
        return float("nan"), ent

    def _update_network(self, task: _Task, acts, adv):
        """(loss, entropy, gradients) of the network: plain REINFORCE's gradients are
        returned to be summed over the step's tasks; PPO's passes (``ppo_epochs`` > 1) are
        applied here, one task at a time, and return no gradients."""
        if self.cfg.update.ppo_epochs <= 1:
            return self.gradients(task, acts, adv)
        old = self.policy.logp_entropy(task.obs, acts)[0].numpy()
        for _ in range(self.cfg.update.ppo_epochs):
            loss, ent, grads = self.gradients(task, acts, adv, old)
            self._apply(grads)
        return loss, ent, None

    @staticmethod
    def _stats(task: _Task, b: _Batch, loss, ent) -> dict:
        """One task's scalars for the step's log."""
        feas = b.step[b.ok]
        return {"mean_step_us": float(feas.mean()) if feas.size else np.inf,
                "best_step_us": min(task.best, task.start_us if task.start_us is not None else np.inf),
                "policy_best_us": task.best, "entropy": float(ent), "baseline": float(task.baseline),
                "feasible": float(b.ok.mean()), "loss": float(loss), "lower_bound_us": task.scale,
                **({"warm_start_us": task.start_us} if task.start_us is not None else {}),
                **({"greedy_step_us": b.greedy_step} if b.with_greedy else {})}

    #: the most the floor widens (``widen_after``): 8 x ``min_moves`` groups leave the mode per sample
    WIDEN_MAX = 8.0

    def _compound(self, task: _Task, acts: np.ndarray) -> np.ndarray:
        """Overwrite the first ``compound`` rows of ``acts`` (one atom per group) with
        compound moves off the mode along its critical path (a row stays the policy's
        draw where the path offers no such move); returns which rows were replaced, and
        keeps each row's kind in ``task.row_kinds`` for the kind odds.

        The table then learns from these rows as from its own draws (no importance
        weights, as with the exploration floor): a winning compound move moves the mode."""
        kinds, rng = self.cfg.compound.kind_names(), task.moves.rng
        replaced = np.zeros(len(acts), bool)
        task.row_kinds = [None] * len(acts)
        for j in range(min(self.cfg.compound.count, len(acts))):
            kind = task.odds.draw(rng) if task.odds is not None else kinds[rng.integers(len(kinds))]
            a = task.moves.propose(task.guide_mode, task.guide.path, kind)
            if a is not None:
                acts[j] = a
                replaced[j] = True
                task.row_kinds[j] = kind
        task.compound_samples += int(replaced.sum())
        return replaced

    @staticmethod
    def _record_kinds(task: _Task, step: np.ndarray, ok: np.ndarray) -> None:
        """Tell the kind odds which kinds this step drew and whether its best compound
        row beat the mode (as sa records a batch of its moves)."""
        kinds, task.row_kinds = task.row_kinds[:len(step)], None
        rows = [j for j, k in enumerate(kinds) if k is not None]
        if not rows:
            return
        b = min(rows, key=lambda j: step[j] if ok[j] else np.inf)
        improved = bool(ok[b] and step[b] < task.guide.path.step_time_us)
        task.odds.record([kinds[j] for j in rows], kinds[b], improved)

    @staticmethod
    def _merged(task: _Task, acts: np.ndarray, step: np.ndarray, ok: np.ndarray):
        """The mode with the changes of every row that beat it, best first, as long as
        they touch disjoint groups; None unless at least two rows went in."""
        base, t0 = task.guide_mode, task.guide.path.step_time_us
        better = np.flatnonzero(ok & (step < t0))
        if len(better) < 2:
            return None
        merged = np.array(base, copy=True)
        used = np.zeros(len(base), bool)
        k = 0
        for i in better[np.argsort(step[better], kind="stable")]:
            ch = np.flatnonzero(acts[i] != base)
            if ch.size == 0 or used[ch].any():
                continue
            merged[ch] = acts[i][ch]
            used[ch] = True
            k += 1
        return merged if k >= 2 else None

    @staticmethod
    def _follow(task: _Task, acts: np.ndarray, step: np.ndarray, ok: np.ndarray, best_before: float) -> None:
        """Move the mode to the step's best row if it beats the mode (``follow``)."""
        if not ok.any():
            return
        i = int(np.argmin(np.where(ok, step, np.inf)))
        t0 = task.guide.path.step_time_us if task.guide is not None and task.guide_mode is not None else best_before
        if step[i] < t0:
            task.frozen.adopt(acts[i])

    def _aim(self, task: _Task) -> None:
        """Point the task's exploration prior at its mode's critical path (again, if the mode moved)."""
        mode = task.frozen.greedy()[0]
        if task.guide_mode is None or not np.array_equal(mode, task.guide_mode):
            task.frozen.prior = task.guide(mode)
            task.guide_mode = mode
            task.guide_updates += 1

    def log(self, scalars: dict) -> None:
        """TensorBoard scalars at the current step (with a logdir), and a checkpoint every
        ``checkpoint_every`` steps."""
        if self.writer is not None and scalars:
            with self.writer.as_default(step=self.step_no):
                for k, v in scalars.items():
                    if np.isfinite(v):
                        self._scalar(k, v)
        if self.logdir and self.step_no % max(self.cfg.checkpoint_every, 1) == 0:
            self.checkpoint()

    def _scalar(self, name: str, value: float) -> None:
        """A TensorBoard scalar written with TF's own summary op (the ``tensorboard``
        package, which ``tf.summary.scalar`` needs, is not a dependency)."""
        from tensorflow.core.framework import summary_pb2

        meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
        self.tf.summary.write(name, self.tf.constant(value, self.tf.float32), step=self.step_no, metadata=meta)

    def checkpoint(self, folder=None) -> None:
        """Save the policy (and the first problem's residual table) to ``folder`` or the logdir."""
        folder = folder or (self.logdir / "policy" if self.logdir else None)
        if folder is None:
            return
        from .policies import fingerprint

        t = self.tasks[0]
        if t.frozen:
            t.frozen.sync()
        res = ([v.numpy() for v in t.residual_vars], fingerprint(t.problem, t.atoms)) if t.residual_vars else None
        self.policy.save(folder, extra=self.summary(), residual=res)

    def summary(self) -> dict:
        return {"steps": self.step_no, "samples": self.samples_seen,
                "seconds": round(work_clock() - self.t0, 3),
                "graphs": [t.problem.graph.name for t in self.tasks],
                "clusters": sorted({t.problem.cluster.name for t in self.tasks}),
                "best_step_us": {t.problem.graph.name: t.best for t in self.tasks},
                "train_config": self.cfg.options()}

    def train(self, steps: int | None = None, seconds: float | None = None, done=None) -> dict:
        """Step until ``steps`` or ``seconds`` or ``done()`` or the tracker's budget ends."""
        t0 = work_clock()
        self._train_t0, self._limits = t0, (steps, seconds)
        try:
            while True:
                if steps is not None and self.step_no >= steps:
                    break
                if seconds is not None and work_clock() - t0 >= seconds:
                    break
                if done is not None and done():
                    break
                out = self.step()
                if self.progress is not None:
                    self.progress(self.step_no, out)
        except BudgetExhausted:
            pass
        finally:
            for t in self.tasks:
                if t.frozen:
                    t.frozen.sync()
            if self.writer is not None:
                self.writer.flush()
            if self.logdir:
                self.checkpoint()
        return self.summary()
