"""Placement policies in TensorFlow: ``seq2seq``, ``hierarchical`` and ``gdp``.

Every policy places *atoms* (see :mod:`placetool.rl.features`) on the devices of one cluster and
has the same interface, which the REINFORCE trainer drives:

- ``atoms_for(problem)``: featurise a problem the way this policy wants it;
- ``sample(obs, K, seed)``: K placements drawn from the policy (stateless Gumbel-max
  sampling, so a seed gives the same samples on every run); ``greedy(obs)``: the mode;
- ``assignment(atoms, actions)``: the problem's group assignments (K x groups);
- ``logp_entropy(obs, actions)``: log-probability of each sample and its mean entropy,
  differentiable with respect to ``variables``.

Logits are shaped as in the hierarchical planner: ``C * tanh(raw / C) / temperature``
(C = ``tanh_c``), and devices an atom may not use get -1e9 so they are never sampled.
Weights are initialised from a numpy generator seeded by ``seed`` (repeatable), and saved
as ``policy.json`` + ``weights.npz`` in a folder.
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from placetool.costmodel.errors import atomic_write

from . import gdp_net
from .errors import PolicyError  # also imported from here, as it was defined here before rl.errors
from .features import N_BASE, OP_NUMERIC, TYPE_BUCKETS, AtomGraph, featurize, graph_inputs
from .tfutil import tf as _tf

FORMAT = "placetool.rl-policy"
VERSION = 2
NEG = -1e9


# --------------------------------------------------------------------------- helpers
def _glorot(rng, n_in, n_out):
    lim = np.sqrt(6.0 / (n_in + n_out))
    return rng.uniform(-lim, lim, (n_in, n_out)).astype(np.float32)


class _Params:
    """Creates named tf.Variables in a fixed order (the order weights are saved in)."""

    def __init__(self, seed: int):
        self.tf = _tf()
        self.rng = np.random.default_rng(seed)
        self.vars: list = []

    def dense(self, n_in, n_out, bias=0.0):
        W = self.tf.Variable(_glorot(self.rng, n_in, n_out))
        b = self.tf.Variable(np.full(n_out, bias, np.float32))
        self.vars += [W, b]
        return W, b

    def lstm(self, n_in, n_h):
        W = self.tf.Variable(_glorot(self.rng, n_in + n_h, 4 * n_h))
        b = np.zeros(4 * n_h, np.float32)
        b[n_h:2 * n_h] = 1.0  # forget-gate bias 1: remember by default
        b = self.tf.Variable(b)
        self.vars += [W, b]
        return W, b

    def table(self, n, d):
        E = self.tf.Variable(self.rng.normal(0, 0.1, (n, d)).astype(np.float32))
        self.vars.append(E)
        return E


def _gumbel(tf, shape, seed):
    u = tf.random.stateless_uniform(shape, seed=seed, minval=1e-7, maxval=1.0 - 1e-7)
    return -tf.math.log(-tf.math.log(u))


def _entropy(tf, logits):
    """Entropy of softmax(logits) along the last axis; masked entries contribute 0."""
    logp = tf.nn.log_softmax(logits)
    return -tf.reduce_sum(tf.math.multiply_no_nan(logp, tf.exp(logp)), axis=-1)


# --------------------------------------------------------------------------- base
class Policy:
    """Shared plumbing: config, logits shaping, save/load. Subclasses build the nets."""

    kind = "?"
    #: coarsen problems to at most this many atoms (None: colocation groups as they are)
    default_max_groups: int | None = 256

    def __init__(self, n_devices: int, hidden: int = 64, seed: int = 0, tanh_c: float = 5.0,
                 temperature: float = 1.0, max_groups: int | None = -1, residual: bool = True, **extra):
        if extra:
            raise PolicyError(f"policy {self.kind!r}: unknown option(s) {', '.join(sorted(extra))}")
        self.tf = _tf()
        self.n_devices = int(n_devices)
        self.n_features = N_BASE + self.n_devices
        self.hidden = int(hidden)
        self.seed = int(seed)
        self.tanh_c = float(tanh_c)
        self.temperature = float(temperature)
        self.max_groups = self.default_max_groups if max_groups == -1 else max_groups
        self.residual = bool(residual)
        self.p = _Params(seed)
        self.build()
        self.variables = list(self.p.vars)

    # -- subclasses
    def build(self) -> None:
        raise NotImplementedError

    def extra_config(self) -> dict:
        return {}

    # -- config and problem plumbing
    def config(self) -> dict:
        return {"policy": self.kind, "n_devices": self.n_devices, "hidden": self.hidden, "seed": self.seed,
                "tanh_c": self.tanh_c, "temperature": self.temperature, "max_groups": self.max_groups,
                "residual": self.residual,
                **self.extra_config()}

    def check_problem(self, problem) -> None:
        if problem.n_devices != self.n_devices:
            raise PolicyError(
                f"policy {self.kind!r} was built for {self.n_devices} devices; cluster "
                f"{problem.cluster.name!r} has {problem.n_devices}"
            )

    def atoms_for(self, problem) -> AtomGraph:
        self.check_problem(problem)
        return featurize(problem, self.max_groups)

    def residual_prior(self, atoms: AtomGraph) -> np.ndarray:
        """Initial per-atom logits: log of the compute-time ratio to the atom's fastest
        allowed device, so slow devices (a CPU for GPU work) start unlikely."""
        t = atoms.group_time
        fast = np.min(t, axis=1, keepdims=True)
        return np.where(atoms.allowed, -np.log(np.maximum(t, 1e-9) / np.maximum(fast, 1e-9)), 0.0).astype(np.float32)

    def obs(self, atoms: AtomGraph, residual: list | None = None) -> dict:
        """Tensors the policy reads for ``atoms``.

        With ``residual`` on (the default), ``obs["bias"]`` is a per-problem trainable
        table of logits added to the network's (per atom and device; per atom and group
        for the hierarchical grouper), started at :meth:`residual_prior` (or at a saved
        table). It lets a policy fit one problem's placement quickly; the network weights
        are what transfer across graphs (pre-training turns the table off).
        """
        tf = self.tf
        priors = self.residual_priors(atoms)
        if residual is not None and [np.shape(r) for r in residual] != [p.shape for p in priors]:
            raise PolicyError("saved residual logits do not fit this problem")
        if self.residual:
            biases = [tf.Variable(np.asarray(r, np.float32)) for r in (residual if residual is not None else priors)]
        else:
            biases = [tf.zeros(p.shape) for p in priors]
        return {
            **{k: tf.constant(v) for k, v in graph_inputs(atoms).items()},
            **{f"bias{i or ''}": b for i, b in enumerate(biases)},
            # a static part of every compiled function's cache key: a residual table is a
            # tf.Variable, whose shape a relaxed trace would otherwise take from the first problem
            # (pre-training has no tables: one relaxed trace then serves every graph)
            "shapes": (int(atoms.n), int(atoms.n_devices)) if self.residual else None,
        }

    def residual_priors(self, atoms: AtomGraph) -> list[np.ndarray]:
        """Initial values of the residual tables (one for most policies)."""
        return [self.residual_prior(atoms)]

    def shape_logits(self, raw, mask):
        """C*tanh(raw/C)/T with disallowed devices at -1e9 (mask broadcasts onto raw)."""
        tf = self.tf
        c = self.tanh_c
        logits = c * tf.tanh(raw / c) / self.temperature
        return tf.where(mask, logits, tf.cast(NEG, logits.dtype))

    def assignment(self, atoms: AtomGraph, actions) -> np.ndarray:
        """Group assignments (B x groups) of sampled actions."""
        return atoms.expand(np.asarray(actions[0]))

    def sample(self, obs, K: int, seed) -> tuple:
        return tuple(t.numpy() for t in self._sample(obs, int(K), self.tf.constant(seed, self.tf.int32), False))

    def greedy(self, obs) -> tuple:
        return tuple(t.numpy() for t in self._sample(obs, 1, self.tf.constant([0, 0], self.tf.int32), True))

    def logp_entropy(self, obs, actions):
        return self._logp(obs, *[self.tf.constant(a) for a in actions])

    # -- save / load
    def get_weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.variables]

    def set_weights(self, ws) -> None:
        if len(ws) != len(self.variables) or any(w.shape != tuple(v.shape) for w, v in zip(ws, self.variables)):
            raise PolicyError(f"saved weights do not fit a {self.kind!r} policy with this configuration")
        for v, w in zip(self.variables, ws):
            v.assign(w)

    def save(self, folder, extra: dict | None = None, residual=None) -> None:
        """Write ``folder/policy.json`` and ``folder/weights.npz`` (each atomically).

        ``residual``: optional (table, fingerprint) of the problem the policy was last
        trained on; loading for the same problem restores it (see :func:`fingerprint`).
        """
        folder = Path(folder)
        buf = io.BytesIO()
        arrays = {f"w{i:03d}": w for i, w in enumerate(self.get_weights())}
        meta = {"format": FORMAT, "version": VERSION, "config": self.config(), **(extra or {})}
        if residual is not None:
            for i, r in enumerate(residual[0]):
                arrays[f"residual{i}"] = np.asarray(r, np.float32)
            meta["residual_for"] = residual[1]
        np.savez(buf, **arrays)
        atomic_write(folder / "weights.npz", buf.getvalue())
        atomic_write(folder / "policy.json", json.dumps(meta, indent=1) + "\n")


def saved_kind(folder) -> str:
    """The policy kind saved in ``folder`` (PolicyError if there is none)."""
    mpath = Path(folder) / "policy.json"
    try:
        return str(json.loads(mpath.read_text())["config"]["policy"])
    except (OSError, ValueError, KeyError, TypeError):
        raise PolicyError(f"{folder}: no saved policy (policy.json missing or unreadable)") from None


def load(folder, expect_policy: str | None = None, n_devices: int | None = None) -> tuple["Policy", dict]:
    """A saved policy and its metadata; PolicyError when it does not fit what is asked."""
    kind, cfg, meta, ws = read(folder, expect_policy, n_devices)
    mpath, wpath = Path(folder) / "policy.json", Path(folder) / "weights.npz"
    try:
        pol = make(kind, **cfg)
    except PolicyError as e:
        raise PolicyError(f"{mpath}: {e}") from None
    except (TypeError, ValueError) as e:  # a key or value no policy takes
        raise PolicyError(f"{mpath}: configuration does not fit a {kind!r} policy ({e})") from None
    try:
        pol.set_weights(ws)
    except PolicyError as e:
        raise PolicyError(f"{wpath}: {e}") from None
    return pol, meta


def read(folder, expect_policy: str | None = None,
         n_devices: int | None = None) -> tuple[str, dict, dict, list[np.ndarray]]:
    """What :func:`load` reads, without building the policy (so without TensorFlow):
    (kind, configuration, metadata, weights in saved order). The same checks and errors."""
    folder = Path(folder)
    mpath = folder / "policy.json"
    if not mpath.is_file():
        raise PolicyError(f"{folder}: no saved policy (policy.json missing)")
    try:
        meta = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise PolicyError(f"{mpath}: not a readable policy file ({e})") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise PolicyError(f"{mpath}: format {meta.get('format')!r} version {meta.get('version')!r} "
                          f"is not {FORMAT!r} version {VERSION}")
    try:
        cfg = dict(meta["config"])
        kind = cfg.pop("policy")
    except (KeyError, TypeError, ValueError):
        raise PolicyError(f"{mpath}: no policy configuration ('config' with a 'policy' name)") from None
    if expect_policy is not None and expect_policy != kind:
        raise PolicyError(f"{folder} holds a {kind!r} policy, not {expect_policy!r}")
    if n_devices is not None and kind != "gdp" and cfg["n_devices"] != n_devices:
        raise PolicyError(f"{folder}: policy was trained for {cfg['n_devices']} devices; "
                          f"this cluster has {n_devices}")
    if n_devices is not None and kind == "gdp" and n_devices > cfg.get("max_devices", 0):
        raise PolicyError(f"{folder}: policy places on at most {cfg.get('max_devices')} devices; "
                          f"this cluster has {n_devices}")
    if kind == "gdp" and n_devices is not None:
        cfg["n_devices"] = n_devices  # the device slots are sliced to the cluster at hand
    if kind not in POLICIES:
        raise PolicyError(f"{mpath}: unknown policy {kind!r} (known: {', '.join(POLICIES)})")
    wpath = folder / "weights.npz"
    try:
        with np.load(wpath, allow_pickle=False) as z:
            ws = [z[k] for k in sorted(z.files) if k.startswith("w")]
            res = sorted(k for k in z.files if k.startswith("residual"))
            if res:
                meta["residual"] = [z[k] for k in res]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # missing, cut short, damaged
        raise PolicyError(f"{wpath}: cannot read weights ({type(e).__name__}: {e})") from None
    return kind, cfg, meta, ws


def gdp_weights(folder, cfg: dict, ws) -> gdp_net.Weights:
    """A saved gdp network's weights for :mod:`placetool.rl.gdp_net` (``cfg`` and ``ws`` as
    :func:`read` gives them), without TensorFlow; PolicyError names what does not fit, an
    unknown key as building the policy would."""
    import inspect

    known = {k for f in (GDP.__init__, Policy.__init__) for k, v in inspect.signature(f).parameters.items()
             if k != "self" and v.kind is v.POSITIONAL_OR_KEYWORD}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise PolicyError(f"{folder}/policy.json: policy 'gdp': unknown option(s) {', '.join(unknown)}")
    return gdp_net.checked_weights(folder, cfg, ws)


def fingerprint(problem, atoms: AtomGraph) -> dict:
    """What identifies a problem for a saved residual table."""
    return {"graph": problem.graph.name, "cluster": problem.cluster.name, "ops": problem.graph.n_ops,
            "groups": problem.n_groups, "atoms": atoms.n}


def saved_residual(meta: dict, problem, atoms: AtomGraph):
    """The saved residual table if it was trained on this very problem, else None."""
    r = meta.get("residual")
    if r is not None and meta.get("residual_for") == fingerprint(problem, atoms):
        return r
    return None


# --------------------------------------------------------------------------- seq2seq core
class _Seq2SeqCore:
    """BiLSTM encoder + LSTM decoder with Luong attention, one device per position.

    The decoder reads at step t the encoder output of position t and the embedding of
    the device chosen at t-1 (teacher forcing when scoring samples, its own choice when
    sampling), so the same weights give both passes.
    """

    def __init__(self, p: _Params, e_in: int, H: int, D: int):
        tf = p.tf
        self.tf, self.H, self.D = tf, H, D
        h2 = H // 2
        self.enc_f = p.lstm(e_in, h2)
        self.enc_b = p.lstm(e_in, h2)
        self.dev_emb = p.table(D + 1, H // 2)  # index D: "start"
        self.dec = p.lstm(2 * h2 + H // 2, H)
        self.att = p.table(H, 2 * h2)  # Luong "general" score h^T W enc
        self.comb = p.dense(H + 2 * h2, H)
        self.out = p.dense(H, D)

    def _cell(self, Wb, x, h, c):
        tf = self.tf
        W, b = Wb
        z = tf.matmul(tf.concat([x, h], -1), W) + b
        i, f, g, o = tf.split(z, 4, axis=-1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        return tf.sigmoid(o) * tf.tanh(c), c

    def _run(self, Wb, xs_tm, B, n_h):
        tf = self.tf
        z = tf.zeros([B, n_h])

        def step(carry, x):
            return self._cell(Wb, x, *carry)

        hs, _ = tf.scan(step, xs_tm, initializer=(z, z))
        return hs

    def encode(self, e):
        """e: B x S x E -> encoder states B x S x H."""
        tf = self.tf
        B = tf.shape(e)[0]
        xs = tf.transpose(e, [1, 0, 2])
        hf = self._run(self.enc_f, xs, B, self.H // 2)
        hb = tf.reverse(self._run(self.enc_b, tf.reverse(xs, [0]), B, self.H // 2), [0])
        return tf.transpose(tf.concat([hf, hb], -1), [1, 0, 2])

    def _raw(self, h, enc, keys):
        """Decoder state(s) -> raw device scores, attending over the encoder states."""
        tf = self.tf
        scores = tf.linalg.matmul(h, keys, transpose_b=True)  # B x T x S
        ctx = tf.linalg.matmul(tf.nn.softmax(scores), enc)
        Wc, bc = self.comb
        Wo, bo = self.out
        o = tf.tanh(tf.matmul(tf.concat([h, ctx], -1), Wc) + bc)
        return tf.matmul(o, Wo) + bo

    def decode_sample(self, enc, mask, shape, seed, greedy: bool, bias):
        """Sample (or take the mode of) one device per position. mask: B x S x D;
        bias: S x D logits added to the decoder's."""
        tf = self.tf
        B, S = tf.shape(enc)[0], tf.shape(enc)[1]
        keys = tf.matmul(enc, self.att, transpose_b=True)  # B x S x H
        noise = tf.zeros([S, B, self.D]) if greedy else _gumbel(tf, [S, B, self.D], seed)
        prev = tf.fill([B], self.D)
        z = tf.zeros([B, self.H])

        def step(carry, inp):
            h, c, a_prev = carry
            e_t, m_t, g_t, b_t = inp
            x = tf.concat([e_t, tf.gather(self.dev_emb, a_prev)], -1)
            h, c = self._cell(self.dec, x, h, c)
            raw = self._raw(h[:, None, :], enc, keys)[:, 0, :] + b_t
            a = tf.argmax(shape(raw, m_t) + g_t, axis=-1, output_type=tf.int32)
            return h, c, a

        bias = tf.broadcast_to(bias[:, None, :], [S, B, self.D])
        _, _, acts = tf.scan(step, (tf.transpose(enc, [1, 0, 2]), tf.transpose(mask, [1, 0, 2]), noise, bias),
                             initializer=(z, z, prev))
        return tf.transpose(acts)  # B x S

    def decode_logits(self, enc, actions, mask, shape, bias):
        """Teacher-forced logits (B x S x D) of given actions (B x S)."""
        tf = self.tf
        B = tf.shape(enc)[0]
        prev = tf.concat([tf.fill([B, 1], self.D), actions[:, :-1]], axis=1)
        x = tf.concat([enc, tf.gather(self.dev_emb, prev)], -1)
        h = tf.transpose(self._run(self.dec, tf.transpose(x, [1, 0, 2]), B, self.H), [1, 0, 2])
        keys = tf.matmul(enc, self.att, transpose_b=True)
        return shape(self._raw(h, enc, keys) + bias, mask)


def _logp_of(tf, logits, actions):
    lp = tf.nn.log_softmax(logits)
    return tf.squeeze(tf.gather(lp, actions[..., None], batch_dims=len(actions.shape)), -1)


# --------------------------------------------------------------------------- seq2seq
class Seq2Seq(Policy):
    """ColocRL (Mirhoseini et al. 2017): atom embeddings -> BiLSTM encoder -> attention
    decoder emitting one device per atom, atoms in topological order.

    Atoms are colocation groups coarsened to at most ``max_groups`` (default 256)
    topological chunks (see :func:`placetool.rl.features.coarsen`).
    """

    kind = "seq2seq"

    def build(self):
        H = self.hidden
        self.embed = self.p.dense(self.n_features, H)
        self.core = _Seq2SeqCore(self.p, H, H, self.n_devices)
        tf = self.tf
        self._sample = tf.function(self._sample_impl, reduce_retracing=True)
        self._logp = tf.function(self._logp_impl, reduce_retracing=True)

    def _enc(self, obs, B):
        tf = self.tf
        W, b = self.embed
        e = tf.tanh(tf.matmul(obs["x"], W) + b)[None]
        enc = self.core.encode(e)
        return tf.tile(enc, [B, 1, 1])

    def _sample_impl(self, obs, K, seed, greedy):
        tf = self.tf
        enc = self._enc(obs, K)
        mask = tf.tile(obs["mask"][None], [K, 1, 1])
        return (self.core.decode_sample(enc, mask, self.shape_logits, seed, greedy, obs["bias"]),)

    def _logp_impl(self, obs, actions):
        tf = self.tf
        B = tf.shape(actions)[0]
        enc = self._enc(obs, B)
        logits = self.core.decode_logits(enc, actions, obs["mask"][None], self.shape_logits, obs["bias"][None])
        return tf.reduce_sum(_logp_of(tf, logits, actions), 1), tf.reduce_mean(_entropy(tf, logits), 1)


# --------------------------------------------------------------------------- hierarchical
class Hierarchical(Policy):
    """Hierarchical planner (Mirhoseini et al. 2018) with a fully connected grouper (Liu
    et al. 2019): a feed-forward grouper puts each atom (a colocation group: colocation
    is respected by construction) into one of ``n_groups`` groups, a seq2seq placer puts
    each group on a device; one REINFORCE loss trains both.

    A group may mix atoms with different allowed devices: the placer may pick any device
    some member allows, and members that may not run there go to their fastest allowed
    device. Empty groups' choices do not count in the log-probability.
    """

    kind = "hierarchical"
    default_max_groups = 2048

    def __init__(self, n_devices, n_groups: int = 32, **kw):
        self.n_groups = int(n_groups)
        super().__init__(n_devices, **kw)

    def extra_config(self):
        return {"n_groups": self.n_groups}

    def residual_priors(self, atoms):
        """The grouper's per-atom table starts at zero (no preference among groups); the
        placer's per-group table (groups x devices) at zero too."""
        return [np.zeros((atoms.n, self.n_groups), np.float32), np.zeros((self.n_groups, self.n_devices), np.float32)]

    def build(self):
        H, G = self.hidden, self.n_groups
        self.g1 = self.p.dense(self.n_features, H)
        self.g2 = self.p.dense(H, G)
        self.proj = self.p.dense(self.n_features, H - 1)
        self.core = _Seq2SeqCore(self.p, H, H, self.n_devices)
        tf = self.tf
        self._sample = tf.function(self._sample_impl, reduce_retracing=True)
        self._logp = tf.function(self._logp_impl, reduce_retracing=True)

    def _group_logits(self, obs):
        tf = self.tf
        W1, b1 = self.g1
        W2, b2 = self.g2
        h = tf.nn.relu(tf.matmul(obs["x"], W1) + b1)
        c = self.tanh_c
        return c * tf.tanh((tf.matmul(h, W2) + b2 + obs["bias"]) / c) / self.temperature  # n x G

    def _groups(self, obs, grouping):
        """Placer inputs for groupings (B x n): embeddings B x G x H, device mask, nonempty."""
        tf = self.tf
        G = self.n_groups
        B = tf.shape(grouping)[0]
        n = tf.shape(grouping)[1]
        Wp, bp = self.proj
        pr = tf.tanh(tf.matmul(obs["x"], Wp) + bp)  # n x (H-1)
        ids = tf.reshape(grouping + G * tf.range(B)[:, None], [-1])
        tiled = tf.tile(pr, [B, 1])
        sums = tf.math.unsorted_segment_sum(tiled, ids, B * G)
        cnt = tf.math.unsorted_segment_sum(tf.ones([B * n, 1]), ids, B * G)
        emb = tf.concat([sums / tf.maximum(cnt, 1.0), tf.math.log1p(cnt) / 5.0], -1)
        allow = tf.math.unsorted_segment_max(tf.tile(tf.cast(obs["mask"], tf.float32), [B, 1]), ids, B * G)
        nonempty = cnt > 0
        mask = tf.logical_or(allow > 0.5, tf.logical_not(nonempty))
        return (tf.reshape(emb, [B, G, self.hidden]), tf.reshape(mask, [B, G, self.n_devices]),
                tf.reshape(tf.cast(nonempty, tf.float32), [B, G]))

    def _sample_impl(self, obs, K, seed, greedy):
        tf = self.tf
        gl = self._group_logits(obs)
        n = tf.shape(gl)[0]
        if greedy:
            grouping = tf.tile(tf.argmax(gl, -1, output_type=tf.int32)[None], [K, 1])
        else:
            grouping = tf.argmax(gl[None] + _gumbel(tf, [K, n, self.n_groups], seed), -1, output_type=tf.int32)
        emb, mask, _ = self._groups(obs, grouping)
        enc = self.core.encode(emb)
        place = self.core.decode_sample(enc, mask, self.shape_logits, seed + 1, greedy, obs["bias1"])
        return grouping, place

    def _logp_impl(self, obs, grouping, place):
        tf = self.tf
        gl = self._group_logits(obs)
        lp_g = tf.reduce_sum(_logp_of(tf, tf.broadcast_to(gl[None], tf.concat([tf.shape(grouping), [self.n_groups]], 0)),
                                      grouping), 1)
        emb, mask, nonempty = self._groups(obs, grouping)
        enc = self.core.encode(emb)
        logits = self.core.decode_logits(enc, place, mask, self.shape_logits, obs["bias1"][None])
        lp_p = tf.reduce_sum(_logp_of(tf, logits, place) * nonempty, 1)
        ent = tf.reduce_mean(_entropy(tf, gl)) + tf.reduce_sum(_entropy(tf, logits) * nonempty, 1) / tf.reduce_sum(nonempty, 1)
        return lp_g + lp_p, ent

    def assignment(self, atoms, actions):
        grouping, place = (np.asarray(a) for a in actions)
        dev = np.take_along_axis(place, grouping, axis=1)  # B x n atoms
        ok = atoms.allowed[np.arange(atoms.n)[None, :], dev]
        fallback = np.argmin(atoms.group_time, axis=1)  # fastest allowed device
        dev = np.where(ok, dev, fallback[None, :])
        return atoms.expand(dev)


# --------------------------------------------------------------------------- gdp
class GDP(Policy):
    """GDP-style (Zhou et al. 2019) placer that acts on every colocation group.

    Encoder: GraphSAGE (mean aggregation over predecessors and successors) over the *op*
    graph, each op starting from an embedding of its hashed type and its sizes and
    times; op states are mean-pooled per colocation group, joined with the group's own
    features, and refined by GraphSAGE over the group graph plus a graph-wide context
    (the mean group state). Placer: every group's device logits at once, one forward
    pass linear in ops + edges (no sequence, no all-pairs attention), so gnmt8's 51k ops
    place in one pass on a CPU.

    Devices are output slots (``max_devices`` of them, sliced to the cluster's count), and
    a learnt multiple of the compute-time prior (log time on the device over the
    fastest allowed one) is added to them, so one policy places on clusters of any size
    up to ``max_devices`` and prefers fast devices from the start. The residual table
    (per group and device, per problem) is added *after* the tanh clip, so it can pin a
    placement exactly: :meth:`warm_table` makes the policy's mode any given placement.
    """

    kind = "gdp"
    default_max_groups = None

    def __init__(self, n_devices, layers: int = 2, group_layers: int = 2, max_devices: int = 16, **kw):
        self.layers, self.group_layers, self.max_devices = int(layers), int(group_layers), int(max_devices)
        if kw.get("max_groups", -1) not in (-1, None):
            raise PolicyError("policy 'gdp' places every colocation group; it has no max_groups")
        super().__init__(n_devices, **kw)
        if self.n_devices > self.max_devices:
            raise PolicyError(f"policy 'gdp' with max_devices={self.max_devices} cannot place on {self.n_devices} devices")

    def extra_config(self):
        return {"layers": self.layers, "group_layers": self.group_layers, "max_devices": self.max_devices}

    def check_problem(self, problem) -> None:
        gdp_net.check_devices(problem, self.max_devices)

    def atoms_for(self, problem) -> AtomGraph:
        return gdp_net.atoms(problem, self.max_devices)

    def residual_priors(self, atoms):
        """The residual table starts at zero: the compute-time prior is a network input."""
        return [np.zeros((atoms.n, atoms.n_devices), np.float32)]

    def build(self):
        H, p = self.hidden, self.p
        # created in the order of gdp_net.Weights' fields, which is the order they are saved in
        type_emb = p.table(TYPE_BUCKETS, H)
        op_in = p.dense(OP_NUMERIC, H)
        op_sage = [p.dense(3 * H, H) for _ in range(self.layers)]
        grp_in = p.dense(H + N_BASE, H)
        grp_sage = [p.dense(3 * H, H) for _ in range(self.group_layers)]
        ctx = p.dense(H, H)
        head = p.dense(H, self.max_devices)
        prior_w = self.tf.Variable(np.float32(1.0))
        p.vars.append(prior_w)
        self.weights = gdp_net.Weights(type_emb, op_in, op_sage, grp_in, grp_sage, ctx, head, prior_w)
        tf = self.tf
        self._ops = gdp_net.tf_ops(tf)
        self._sample = tf.function(self._sample_impl, reduce_retracing=True)
        self._logp = tf.function(self._logp_impl, reduce_retracing=True)
        self._net = tf.function(self._net_logits, reduce_retracing=True)

    def obs(self, atoms, residual=None):
        extra = gdp_net.op_inputs(atoms)  # first: it names a missing op graph before any TF work
        o = super().obs(atoms, residual)
        o.update({k: self.tf.constant(v) for k, v in extra.items()})
        return o

    def _net_logits(self, obs):
        """The network's clipped logits (groups x devices), before the residual table."""
        return gdp_net.logits(self._ops, self.weights, obs, self.tanh_c)

    def _logits(self, obs):
        tf = self.tf
        lg = (self._net_logits(obs) + obs["bias"]) / self.temperature
        return tf.where(obs["mask"], lg, tf.cast(NEG, lg.dtype))

    def net_logits(self, obs) -> np.ndarray:
        """Numpy (groups x devices) logits of the network alone (no residual table)."""
        return self._net(obs).numpy()

    def warm_table(self, obs, atoms, device, margin: float) -> np.ndarray:
        """A residual table that makes the policy's logits exactly ``margin`` on ``device``
        (one per atom) and 0 on the other devices: the mode is then ``device`` itself."""
        target = np.zeros((atoms.n, atoms.n_devices), np.float32)
        target[np.arange(atoms.n), device] = np.broadcast_to(np.asarray(margin, np.float32), (atoms.n,))
        return (target * self.temperature - self.net_logits(obs)).astype(np.float32)

    def anchor_table(self, obs, atoms, device, explore: float) -> np.ndarray:
        """A residual table that makes ``device`` (one per atom) the mode and leaves the
        network's logits on the other devices as they are: the mode's logit is set to
        the log-sum-exp of the others plus log(atoms / explore - 1), so a sample moves
        about ``explore`` atoms off it in all, towards the devices the network prefers.
        A pre-trained network so guides the search around a warm start."""
        z = self.net_logits(obs).astype(np.float64) / self.temperature
        rows = np.arange(atoms.n)
        others = np.where(atoms.allowed, z, -np.inf)
        others[rows, device] = -np.inf
        top = np.max(others, axis=1)
        lse = np.zeros(atoms.n)
        some = np.isfinite(top)  # atoms with another device to go to
        lse[some] = top[some] + np.log(np.sum(np.exp(others[some] - top[some, None]), axis=1))
        margin = np.log(max(atoms.n / explore - 1.0, np.e))
        table = np.zeros((atoms.n, atoms.n_devices), np.float32)
        table[rows, device] = ((lse + margin) * self.temperature - z[rows, device] * self.temperature)
        return table

    def _sample_impl(self, obs, K, seed, greedy):
        tf = self.tf
        lg = self._logits(obs)
        if greedy:
            return (tf.tile(tf.argmax(lg, -1, output_type=tf.int32)[None], [K, 1]),)
        n, D = tf.shape(lg)[0], tf.shape(lg)[1]
        return (tf.argmax(lg[None] + _gumbel(tf, [K, n, D], seed), -1, output_type=tf.int32),)

    def _logp_impl(self, obs, actions):
        tf = self.tf
        lg = self._logits(obs)
        lp = tf.reshape(tf.nn.log_softmax(lg), [-1])  # n*D
        n, D = tf.shape(lg)[0], tf.shape(lg)[1]
        picked = tf.gather(lp, actions + tf.range(n)[None, :] * D)  # B x n
        B = tf.shape(actions)[0]
        return tf.reduce_sum(picked, 1), tf.fill([B], tf.reduce_mean(_entropy(tf, lg)))


# --------------------------------------------------------------------------- registry
POLICIES = {"seq2seq": Seq2Seq, "hierarchical": Hierarchical, "gdp": GDP}


def make(kind: str, n_devices: int, **cfg) -> Policy:
    """Build a fresh policy by name; PolicyError names the known ones."""
    if kind not in POLICIES:
        raise PolicyError(f"unknown policy {kind!r} (known: {', '.join(POLICIES)})")
    return POLICIES[kind](n_devices, **cfg)
