"""RL placers: policies learn a brute-forced optimum, REINFORCE moves the right way,
save/load round trips, user mistakes are clear errors, and TF stays out of light imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from placetool.costmodel import CostModel, presets
from placetool.costmodel.errors import UserError
from placetool.costmodel.graph import OpGraph
from placetool.search import Budget, Problem, SearchError, run
from tests.helpers import brute_force

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module", autouse=True)
def _few_threads():
    from placetool.rl.tfutil import tf as configure

    configure(1)


def tiny_problem(cluster="k80x4"):
    """A host input feeding three independent heavy chains that join on the host.

    The best placement puts each chain on its own GPU (brute force over all 5^6
    assignments confirms it): any two chains sharing a device serialise.
    """
    names = ["in", "a1", "a2", "b1", "b2", "c1", "c2", "out"]
    types = ["IteratorGetNext", "MatMul", "MatMul", "Conv2D", "Conv2D", "MatMul", "Relu", "Add"]
    src = [0, 1, 0, 3, 0, 5, 2, 4, 6]
    dst = [1, 2, 3, 4, 5, 6, 7, 7, 7]
    out = [4096] + [1 << 24, 4096] * 3 + [4096]  # splitting a chain moves 16 MB
    flops = [0] + [4e9] * 6 + [1e6]
    allowed = [1] + [3] * 6 + [1]
    g = OpGraph.from_arrays("tiny", names, types, out, src, dst, flops=flops, allowed=allowed)
    return Problem(CostModel(g, presets.load_cluster(cluster)))


@pytest.fixture(scope="module")
def tiny():
    p = tiny_problem()
    return p, brute_force(p)


def frozen_table(p, table):
    """The tests' small gdp network on ``p`` with the residual ``table`` (atoms x devices),
    as the frozen-network search path holds it: (policy, atoms, observation, table)."""
    from types import SimpleNamespace

    from placetool.rl import policies
    from placetool.rl.trainer import _FrozenNetTable

    pol = policies.make("gdp", p.n_devices, seed=5, hidden=16)
    atoms = pol.atoms_for(p)
    obs = pol.obs(atoms, [np.asarray(table(atoms.n) if callable(table) else table, np.float32)])
    return pol, atoms, obs, _FrozenNetTable(pol, SimpleNamespace(obs=obs, residual_vars=[obs["bias"]], atoms=atoms))


def _greedy_step(trainer):
    t = trainer.tasks[0]
    a = trainer.policy.assignment(t.atoms, trainer.policy.greedy(t.obs))[0]
    return t.problem.cost_model.simulate(a).step_time_us


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["seq2seq", "hierarchical", "gdp"])
def test_policy_reaches_brute_force_optimum(tiny, kind):
    from placetool.rl import policies
    from placetool.rl.trainer import Sampling, TrainConfig, Trainer

    p, best = tiny
    assert best < 0.8 * p.cost_model.simulate(p.cost_model.single_device(1)).step_time_us  # parallel pays
    knobs = {"n_groups": 6} if kind == "hierarchical" else {}
    pol = policies.make(kind, p.n_devices, seed=0, hidden=32, **knobs)
    tr = Trainer(pol, [p], TrainConfig(Sampling(samples=32)), seed=0)
    for _ in range(200):
        tr.step()
        if tr.step_no % 5 == 0 and _greedy_step(tr) <= best * (1 + 1e-9):
            break
    assert tr.tasks[0].best == pytest.approx(best, rel=1e-9)
    assert _greedy_step(tr) == pytest.approx(best, rel=1e-9)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_search_method_rl_reaches_optimum_and_counts_evaluations(tiny):
    p, best = tiny
    r = run("rl", p, Budget(evals=64 * 25), seed=3, warm_start=False)  # learn from scratch
    assert r.evaluations == 64 * 25
    assert r.step_time_us == pytest.approx(best, rel=1e-9)
    assert r.metadata["policy"] == "gdp" and r.metadata["coarsened"] is False
    again = run("rl", p, Budget(evals=64 * 3), seed=3)  # same seed, same search
    once_more = run("rl", p, Budget(evals=64 * 3), seed=3)
    assert [(e, b) for e, _, b in again.history] == [(e, b) for e, _, b in once_more.history]
    np.testing.assert_array_equal(again.assignment, once_more.assignment)


@pytest.mark.timeout(60)
def test_warm_start_begins_at_the_best_cheap_placement():
    from placetool.search import seed_methods

    p = Problem(CostModel(presets.load_graph("synthetic-160"), presets.load_cluster("k80x4")))
    r = run("rl", p, Budget(evals=60), seed=0)
    name = r.metadata["warm_start"]
    assert name in seed_methods()
    seed_us = run(name, p, Budget(evals=60), seed=0).step_time_us
    assert r.metadata["warm_start_us"] == seed_us
    # the policy's mode, scored before its first update, *is* the warm start's placement
    assert r.metadata["mode_start_us"] == seed_us
    # ... which the policy would not reach without it (so the test sees a warm start ignored)
    cold = run("rl", p, Budget(evals=1), seed=0, warm_start=False)
    assert cold.metadata["mode_start_us"] != seed_us and cold.metadata["warm_start"] is None


@pytest.mark.timeout(60)
def test_gdp_warm_table_reproduces_any_placement_exactly():
    """A warm start must be the policy's argmax on every group (no coarse projection),
    and samples around it move about ``explore`` groups."""
    from placetool.rl import policies
    from placetool.rl.method import warm_margin

    p = Problem(CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4")))
    pol = policies.make("gdp", p.n_devices, seed=4, hidden=16)
    atoms = pol.atoms_for(p)
    assert atoms.n == p.n_groups  # one atom per colocation group
    seed_a = p.random_assignment(np.random.default_rng(7))
    before = pol.assignment(atoms, pol.greedy(pol.obs(atoms)))[0]
    assert (before != seed_a).sum() > p.n_groups // 2  # the untrained mode is elsewhere
    table = pol.warm_table(pol.obs(atoms), atoms, seed_a, warm_margin(atoms, 4.0))
    obs = pol.obs(atoms, [table])
    np.testing.assert_array_equal(pol.assignment(atoms, pol.greedy(obs))[0], seed_a)
    moved = (pol.assignment(atoms, pol.sample(obs, 64, [1, 2])) != seed_a[None]).sum(axis=1)
    assert 1.0 < moved.mean() < 10.0


@pytest.mark.timeout(60)
def test_gdp_one_policy_places_on_any_cluster_size():
    from placetool.rl import policies

    pol = policies.make("gdp", 5, seed=0, hidden=16)
    for c in ("k80x2", "k80x4", "k40x8"):  # 3, 5 and 9 devices
        p = Problem(CostModel(presets.load_graph("synthetic-200"), presets.load_cluster(c)))
        atoms = pol.atoms_for(p)
        a = pol.assignment(atoms, pol.sample(pol.obs(atoms), 4, [0, 1]))
        assert a.shape == (4, p.n_groups) and all(p.is_valid(x) for x in a)
        assert len(np.unique(a)) > 1
    small = policies.make("gdp", 3, seed=0, hidden=16, max_devices=4)
    with pytest.raises(UserError, match="at most 4 devices; cluster 'k80x4' has 5"):
        small.atoms_for(Problem(CostModel(presets.load_graph("synthetic-200"), presets.load_cluster("k80x4"))))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["seq2seq", "gdp"])
def test_gradient_step_raises_logp_of_better_sample(tiny, kind):
    from placetool.rl import policies
    from placetool.rl.trainer import Sampling, TrainConfig, Trainer, Update

    p, _ = tiny
    pol = policies.make(kind, p.n_devices, seed=1, hidden=32, residual=False)
    # a small step: first order holds
    tr = Trainer(pol, [p], TrainConfig(Sampling(samples=8), update=Update(lr=1e-4)), seed=1)
    task = tr.tasks[0]
    acts = pol.sample(task.obs, 8, [1, 2])
    before = pol.logp_entropy(task.obs, acts)[0].numpy()
    adv = np.full(8, -1.0 / 7, np.float32)
    adv[0] = 1.0  # sample 0 beat the baseline, the others fell short
    tr.update(task, acts, adv)
    after = pol.logp_entropy(task.obs, acts)[0].numpy()
    assert after[0] > before[0]
    assert (after - before)[0] > np.mean((after - before)[1:])


@pytest.mark.timeout(60)
def test_save_load_same_greedy_placement(tiny, tmp_path):
    from placetool.rl import policies
    from placetool.rl.trainer import Sampling, TrainConfig, Trainer

    p, _ = tiny
    for kind in ("seq2seq", "gdp"):
        pol = policies.make(kind, p.n_devices, seed=2, hidden=32)
        tr = Trainer(pol, [p], TrainConfig(Sampling(samples=16)), seed=2)
        for _ in range(2):
            tr.step()
        before = _greedy_step(tr)
        a0 = pol.assignment(tr.tasks[0].atoms, pol.greedy(tr.tasks[0].obs))[0]
        tr.checkpoint(tmp_path / kind)
        pol2, meta = policies.load(tmp_path / kind, n_devices=p.n_devices)
        atoms = pol2.atoms_for(p)
        res = policies.saved_residual(meta, p, atoms)
        assert res is not None
        a1 = pol2.assignment(atoms, pol2.greedy(pol2.obs(atoms, res)))[0]
        np.testing.assert_array_equal(a0, a1)
        assert p.cost_model.simulate(a1).step_time_us == before
        assert [w.tolist() for w in pol.get_weights()] == [w.tolist() for w in pol2.get_weights()]


@pytest.mark.timeout(60)
def test_user_errors(tiny, tmp_path):
    from placetool.rl import policies

    p, _ = tiny
    with pytest.raises(UserError, match="unknown policy 'nope'"):
        run("rl", p, Budget(evals=8), seed=0, policy="nope")
    with pytest.raises(UserError, match="unknown option"):
        run("rl", p, Budget(evals=8), seed=0, bogus=1)
    # one sample a step leaves the leave-one-out baseline (gdp's default) nothing to compare with
    with pytest.raises(UserError, match="baseline 'loo' .* samples must be at least 2 .got 1."):
        run("rl", p, Budget(evals=8), seed=0, samples=1)
    assert run("rl", p, Budget(evals=8), seed=0, samples=1, baseline="ema").evaluations == 8
    # the same checks hold for a configuration built in Python
    from placetool.rl.trainer import Compound, Sampling, TrainConfig, Update

    with pytest.raises(UserError, match="samples must be at least 2"):
        TrainConfig(Sampling(samples=1), update=Update(baseline="loo"))
    with pytest.raises(UserError, match="compound_kinds 'chain,nope': unknown kind.s. nope"):
        TrainConfig(compound=Compound(kinds="chain,nope"))
    with pytest.raises(UserError, match="samples must be at least 2"):  # the flat keys, as --option gives them
        TrainConfig.from_options({"samples": 1, "baseline": "loo"})
    pol = policies.make("gdp", p.n_devices, hidden=16)
    pol.save(tmp_path / "pol")
    policies.make("seq2seq", p.n_devices, hidden=16).save(tmp_path / "s2s")
    p3 = tiny_problem("k80x2")  # 3 devices, not 5
    with pytest.raises(UserError, match="trained for 5 devices; this cluster has 3"):
        run("rl", p3, Budget(evals=8), seed=0, init_from=str(tmp_path / "s2s"))
    with pytest.raises(UserError, match="holds a 'gdp' policy, not 'seq2seq'"):
        run("rl", p, Budget(evals=8), seed=0, init_from=str(tmp_path / "pol"), policy="seq2seq")
    with pytest.raises(UserError, match="no saved policy"):
        run("rl", p, Budget(evals=8), seed=0, init_from=str(tmp_path / "missing"))


def test_train_config_groups_read_the_flat_keys():
    """TrainConfig's groups take every flat key the command line's --option has always
    named, write them back, and read the train_config a saved policy records."""
    from placetool.rl.config import TrainConfig
    from placetool.rl.method import bundled_policy

    flat = ("samples lr residual_lr residual_optimizer clip_norm entropy entropy_end baseline baseline_decay "
            "ppo_epochs ppo_clip penalty greedy_every guide guide_affinity min_moves compound compound_from "
            "compound_until compound_kinds compound_adapt compound_slack widen_after follow merge tasks_per_step "
            "checkpoint_every").split()
    assert sorted(TrainConfig().options()) == sorted(flat)
    given = {"samples": 8, "compound": 4, "compound_from": 0.25, "compound_until": 0.75, "compound_kinds": "chain",
             "compound_adapt": True, "compound_slack": 0.1, "merge": True, "follow": True, "widen_after": 3,
             "residual_optimizer": "sgd", "baseline": "loo", "ppo_clip": 0.3, "tasks_per_step": 2}
    cfg = TrainConfig.from_options(given)
    assert (cfg.compound.count, cfg.compound.start, cfg.compound.until, cfg.compound.kind_names()) == (4, 0.25, 0.75,
                                                                                                       ("chain",))
    assert cfg.compound.merge and cfg.sampling.follow and cfg.update.ppo_clip == 0.3 and cfg.tasks_per_step == 2
    assert {k: cfg.options()[k] for k in given} == given and TrainConfig.from_options(cfg.options()) == cfg
    saved = json.loads((bundled_policy("gdp") / "policy.json").read_text())["train_config"]
    assert {k: v for k, v in TrainConfig.from_options(saved).options().items() if k in saved} == saved
    with pytest.raises(UserError, match=r"rl: option 'compound_until' must be a number from 0 to 1, got 2"):
        TrainConfig.from_options({"compound_until": 2})
    with pytest.raises(UserError, match=r"compound_until must be a fraction of the budget in \[compound_from, 1\]"):
        TrainConfig.from_options({"compound_from": 0.5, "compound_until": 0.25})


@pytest.mark.timeout(60)
def test_damaged_policy_folders_are_named(tiny, tmp_path):
    """A policy folder cut short or edited by hand gives an error naming its file, not a traceback."""
    import json
    import shutil

    from placetool.rl import policies

    p, _ = tiny
    good = tmp_path / "good"
    policies.make("gdp", p.n_devices, hidden=16).save(good)

    def damaged(name, edit):
        folder = tmp_path / name
        shutil.copytree(good, folder)
        edit(folder)
        return str(folder)

    def cut(f):  # a download or copy that stopped half way
        w = f / "weights.npz"
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])

    def flip(f):  # one byte changed inside a stored array: its checksum no longer matches
        w = f / "weights.npz"
        data = bytearray(w.read_bytes())
        data[len(data) // 2] ^= 0xFF
        w.write_bytes(bytes(data))

    def config(f, **change):
        m = json.loads((f / "policy.json").read_text())
        m["config"].update(change)
        (f / "policy.json").write_text(json.dumps(m))

    cases = [
        (cut, r"case0/weights\.npz: cannot read weights \(BadZipFile"),
        (flip, r"weights\.npz: cannot read weights"),
        (lambda f: config(f, hidden=32), r"weights\.npz: saved weights do not fit a 'gdp' policy"),
        (lambda f: config(f, bogus=1), r"policy\.json: policy 'gdp': unknown option\(s\) bogus"),
    ]
    for i, (edit, message) in enumerate(cases):
        folder = damaged(f"case{i}", edit)
        # fine-tuning loads it into TensorFlow; zero-shot reads it into numpy: the same errors
        for evals in (8, 1):
            with pytest.raises(UserError, match=message):
                run("rl", p, Budget(evals=evals), seed=0, init_from=folder)
    assert run("rl", p, Budget(evals=8), seed=0, init_from=str(good)).evaluations == 8
    assert run("rl", p, Budget(evals=1), seed=0, init_from=str(good)).evaluations == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pretrain_cli_then_zero_shot(tmp_path):
    from click.testing import CliRunner

    from placetool.cli.main import cli

    out = tmp_path / "policy"
    res = CliRunner().invoke(cli, ["rl", "pretrain", "--graphs", "synthetic-120,synthetic-160", "--clusters",
                                   "k80x2,k80x4", "--out", str(out), "--steps", "6", "--samples", "8", "--json"])
    assert res.exit_code == 0, res.output  # gdp trains on clusters of 3 and 5 devices at once
    info = json.loads(res.output)
    assert info["steps"] == 6 and sorted(set(info["graphs"])) == ["synthetic-120", "synthetic-160"]
    assert info["recipe"]["clusters"] == ["k80x2", "k80x4"] and len(info["greedy_step_us"]) == 4
    p = Problem(CostModel(presets.load_graph("synthetic-160"), presets.load_cluster("k80x2")))
    r = run("rl", p, Budget(evals=1), seed=0, init_from=str(out))  # zero-shot: the greedy placement
    assert r.evaluations == 1
    assert r.step_time_us == pytest.approx(info["greedy_step_us"]["synthetic-160@k80x2"], rel=1e-12)
    bad = CliRunner().invoke(cli, ["rl", "pretrain", "--graphs", "synthetic-120", "--clusters", "k80x2,k80x4", "--policy", "seq2seq",
                                   "--out", str(tmp_path / "x"), "--steps", "1"])
    assert isinstance(bad.exception, UserError) and "different device counts" in str(bad.exception)


def test_gym_env_episode_reward_is_the_simulated_step():
    from gymnasium.utils.env_checker import check_env

    from placetool.rl.env import PlacementEnv

    p = tiny_problem("k80x2")
    env = PlacementEnv(p)
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    total, done, steps = 0.0, False, 0
    while not done:
        a = int(np.flatnonzero(info["action_mask"])[-1])
        obs, r, done, _, info = env.step(a)
        assert env.observation_space.contains(obs)  # the space's bounds hold every observation
        total += r
        steps += 1
    assert steps == p.n_groups
    expect = np.where(p.allowed[:, -1], p.n_devices - 1, 0)
    st = p.cost_model.simulate(expect).step_time_us
    assert info["step_time_us"] == st
    assert total == pytest.approx(-np.sqrt(st / p.lower_bound_us()))
    env.reset()
    _, r, done, _, info = env.step(1)  # the first group is the host input: a GPU is not allowed
    assert done and info["invalid"] and r == -env.penalty


def test_light_imports_do_not_load_tensorflow():
    code = ("import sys, placetool.rl, placetool.rl.features, placetool.rl.method, placetool.search, placetool.costmodel; "
            "assert 'tensorflow' not in sys.modules, 'TF imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_coarsen_keeps_allowed_devices_and_covers_every_group():
    from placetool.rl.features import coarsen, group_features

    p = Problem(CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4")))
    a = group_features(p)
    c = coarsen(a, 64)
    assert c.n <= 64 + len(np.unique(a.allowed, axis=0))
    assert sorted(np.unique(c.members)) == list(range(c.n))
    # a super-group may use exactly the devices each of its groups may use
    np.testing.assert_array_equal(c.allowed[c.members], p.allowed)
    # every coarse assignment is a valid problem assignment
    rng = np.random.default_rng(0)
    ca = np.argmax(rng.random(c.allowed.shape) * c.allowed, axis=1)
    assert p.is_valid(c.expand(ca))


def _scalar_tags(folder):
    from tensorflow.core.util import event_pb2

    tags = set()
    for f in folder.glob("events.out.tfevents.*"):
        for rec in tf.data.TFRecordDataset(str(f)):
            ev = event_pb2.Event.FromString(rec.numpy())
            tags |= {v.tag for v in ev.summary.value}
    return tags


@pytest.mark.timeout(60)
def test_logdir_gets_a_subfolder_per_run_with_scalars_and_a_checkpoint(tiny, tmp_path):
    from placetool.rl import policies

    p, _ = tiny
    r = run("rl", p, Budget(evals=65 + 64 * 2), seed=0, logdir=str(tmp_path / "log"), warm_start=False,
            samples=64)  # greedy + 64, then 64, 64
    assert r.metadata["steps"] == 3
    run_dir = tmp_path / "log" / next((tmp_path / "log").iterdir()).name
    assert r.metadata["logdir"] == str(run_dir) and run_dir.name.startswith("tiny-k80x4-gdp-s0-")
    assert {"best_step_us", "lower_bound_us", "mean_step_us", "entropy"} <= _scalar_tags(run_dir)
    pol, meta = policies.load(run_dir / "policy", n_devices=p.n_devices)
    assert meta["steps"] == 3 and meta["samples"] == 65 + 64 * 2
    # resuming from the checkpoint starts from its residual table: the same greedy placement
    atoms = pol.atoms_for(p)
    a = pol.assignment(atoms, pol.greedy(pol.obs(atoms, policies.saved_residual(meta, p, atoms))))[0]
    again = run("rl", p, Budget(evals=1), seed=0, init_from=str(run_dir / "policy"), logdir=str(tmp_path / "log"))
    assert again.step_time_us == p.cost_model.simulate(a).step_time_us
    assert len(list((tmp_path / "log").iterdir())) == 2  # a second run, a second folder
    # a warm-started run also logs the warm start it began from
    w = run("rl", p, Budget(evals=40), seed=0, logdir=str(tmp_path / "warm"))
    wdir = Path(w.metadata["logdir"])
    assert "warm_start_us" in _scalar_tags(wdir) and w.metadata["source"].startswith("warm start ")


@pytest.mark.timeout(120)
def test_bundled_policy_places_held_out_graphs_zero_shot():
    """The shipped GDP policy loads without training and places graphs it never saw
    (a held-out zoo graph on 9 devices, and a hand-built graph) with one evaluation."""
    from click.testing import CliRunner

    from placetool.cli.main import cli
    from placetool.rl import policies
    from placetool.rl.method import bundled_policy

    folder = bundled_policy("gdp")
    assert folder is not None
    meta = json.loads((folder / "policy.json").read_text())
    held_out = {"inception_v3", "gnmt8", "transformer"}
    assert held_out.isdisjoint(meta["recipe"]["graphs"])
    res = CliRunner().invoke(cli, ["search", "--method", "rl", "--init-from", "gdp", "--budget-evals", "1",
                                   "-g", "transformer", "-c", "k40x8", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["evaluations"] == 1 and out["feasible"]
    assert out["metadata"]["source"] == "policy's mode (zero-shot)" and out["metadata"]["steps"] == 0
    # the same greedy placement as loading the policy by hand
    p = Problem(CostModel(presets.load_graph("transformer"), presets.load_cluster("k40x8")))
    pol, _ = policies.load(folder, n_devices=p.n_devices)
    atoms = pol.atoms_for(p)
    a = pol.assignment(atoms, pol.greedy(pol.obs(atoms)))[0]
    assert out["step_time_us"] == pytest.approx(p.cost_model.simulate(a).step_time_us, rel=1e-12)
    t = tiny_problem()
    r = run("rl", t, Budget(evals=1), seed=0, init_from="gdp")
    assert r.evaluations == 1 and t.is_valid(r.assignment)


@pytest.mark.parametrize("graph, cluster, hidden", [("synthetic-160", "k80x4", None), ("synthetic-1k", "k80x2", 16)])
def test_gdp_network_in_numpy_equals_tensorflow(graph, cluster, hidden):
    """gdp_net.logits is one definition of the network, run by TensorFlow (training) and by
    numpy (zero-shot): the shipped network and a fresh small one give the same logits and
    the same mode either way."""
    from placetool.rl import gdp_net, policies
    from placetool.rl.method import bundled_policy

    p = Problem(CostModel(presets.load_graph(graph), presets.load_cluster(cluster)))
    if hidden is None:
        pol, _ = policies.load(bundled_policy("gdp"), n_devices=p.n_devices)
    else:
        pol = policies.make("gdp", p.n_devices, hidden=hidden, seed=3)
    atoms = pol.atoms_for(p)
    want = pol.net_logits(pol.obs(atoms))
    w = gdp_net.unflatten(pol.get_weights(), pol.layers, pol.group_layers)
    got = gdp_net.logits(gdp_net.NUMPY, w, gdp_net.inputs(atoms), pol.tanh_c)
    assert got.dtype == np.float32 and got.shape == want.shape == (atoms.n, p.n_devices)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    mode = np.argmax(np.where(atoms.allowed, got, -np.inf), axis=1)
    np.testing.assert_array_equal(mode, np.argmax(np.where(atoms.allowed, want, -np.inf), axis=1))


def test_gdp_net_imports_nothing_of_policies():
    """policies builds on gdp_net, so gdp_net imports none of policies (not even lazily):
    the error both raise lives in rl.errors, and policies still exports it."""
    import ast

    from placetool.rl import errors, gdp_net, policies

    names = set()
    for node in ast.walk(ast.parse(Path(gdp_net.__file__).read_text())):
        if isinstance(node, ast.ImportFrom):
            names |= {node.module or ""} | {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    assert not {n for n in names if n.split(".")[-1] == "policies"}, names
    assert policies.PolicyError is errors.PolicyError


@pytest.mark.timeout(120)
def test_zero_shot_places_without_tensorflow(tmp_path):
    """One evaluation with the shipped gdp network runs its forward pass in numpy, so
    TensorFlow is never imported; the placement is the one the TensorFlow path (taken
    when the run logs to TensorBoard) gives, and so is its metadata."""
    code = ("import json, sys; from placetool.costmodel import CostModel, presets; "
            "from placetool.search import Budget, Problem, run; "
            "p = Problem(CostModel(presets.load_graph('transformer'), presets.load_cluster('k40x8'))); "
            "r = run('rl', p, Budget(evals=1), seed=0, init_from='gdp'); "
            "print(json.dumps({'tf': 'tensorflow' in sys.modules, 'a': r.assignment.tolist(), "
            "'us': r.step_time_us, 'meta': r.metadata}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["tf"] is False
    p = Problem(CostModel(presets.load_graph("transformer"), presets.load_cluster("k40x8")))
    r = run("rl", p, Budget(evals=1), seed=0, init_from="gdp", logdir=str(tmp_path))
    assert got["a"] == r.assignment.tolist() and got["us"] == r.step_time_us
    differ = {k for k in r.metadata if got["meta"].get(k) != r.metadata[k]}
    assert differ == {"logdir", "samples_per_second"}, differ


@pytest.mark.timeout(60)
def test_zero_shot_placement_is_fitted_into_memory_when_asked():
    """A mode that does not fit stays as it is with one evaluation (the result says so);
    with ``zero_shot=True`` and a few more it is fitted into memory as fit_memory does."""
    from placetool.rl import policies
    from placetool.rl.method import bundled_policy
    from placetool.search import Tracker
    from placetool.search.memory import fit_memory

    p = Problem(CostModel(presets.load_graph("synthetic-160"), presets.load_cluster("k80x4")))
    pol, _ = policies.load(bundled_policy("gdp"), n_devices=p.n_devices)
    atoms = pol.atoms_for(p)
    mode = np.asarray(pol.assignment(atoms, pol.greedy(pol.obs(atoms)))[0], np.int32)
    cm = p.cost_model
    peak = cm.simulate(p.placement(mode)).peak_memory_bytes
    d = int(np.argmax(peak))
    cm.capacity = cm.capacity.copy()
    cm.capacity[d] = peak[d] * 2 // 3  # the mode no longer fits on its busiest device

    one = run("rl", p, Budget(evals=1), seed=0, init_from="gdp")
    assert one.evaluations == 1 and not one.feasible and np.array_equal(one.assignment, mode)
    assert "out of memory (with zero_shot=true" in one.metadata["source"]
    fit = run("rl", p, Budget(evals=10), seed=0, init_from="gdp", zero_shot=True)
    want, r = fit_memory(p, mode, Tracker(p, Budget(evals=10)))
    assert fit.feasible and bool(r.feasible[0]) and np.array_equal(fit.assignment, want)
    moved = int(np.count_nonzero(want != mode))
    assert fit.metadata["source"] == f"policy's mode (zero-shot), {moved} groups moved to fit in memory"
    assert 1 < fit.evaluations <= 10 and fit.metadata["warm_start"] is None
    assert fit.metadata["mode_start_us"] == one.step_time_us
    with pytest.raises(SearchError, match="zero_shot places with a pre-trained policy"):
        run("rl", p, Budget(evals=10), seed=0, zero_shot=True)


@pytest.mark.timeout(120)
def test_fine_tuning_merges_a_steps_winners_by_default_and_a_search_from_scratch_does_not():
    """``merge``, compound moves to the end, ``follow`` and adaptive kinds are on by default only where they
    measured better: fine-tuning a pre-trained gdp policy (benchmarks/README.md); an
    explicit option wins either way."""
    p = Problem(CostModel(presets.load_graph("synthetic-160"), presets.load_cluster("k80x4")))
    m = run("rl", p, Budget(evals=600), seed=0, init_from="gdp").metadata
    assert m["merge"] is True and m["merged_samples"] > 0  # merged rows are counted as their own kind,
    assert m["improvements"]["merged"] <= m["merged_samples"]  # and a best one is credited to them
    assert "merged" not in m["source"] or m["improvements"]["merged"] > 0
    off = run("rl", p, Budget(evals=600), seed=0, init_from="gdp", merge=False).metadata
    assert off["merge"] is False and off["merged_samples"] == off["improvements"]["merged"] == 0
    # fine-tuning draws compound moves to the end of the budget, not only in its first half
    half = run("rl", p, Budget(evals=600), seed=0, init_from="gdp", compound_until=0.5).metadata
    assert m["compound_samples"] > half["compound_samples"] > 0
    # and the mode follows the best row that beats it, among compound moves of sa's four guided
    # kinds drawn by their recent odds; a search from scratch keeps its own defaults
    assert m["follow"] is True and m["compound_kinds"] == ["chain", "pull", "swap", "region"]
    assert set(m["kind_odds"]) == set(m["compound_kinds"]) and sum(m["kind_odds"].values()) == pytest.approx(1.0)
    scratch = run("rl", p, Budget(evals=40), seed=0).metadata
    assert scratch["merge"] is False and scratch["follow"] is False and scratch["kind_odds"] is None
    assert run("rl", p, Budget(evals=40), seed=0, merge=True).metadata["merge"] is True


@pytest.mark.timeout(60)
def test_fine_tuning_a_pretrained_policy_starts_at_the_warm_start_and_keeps_its_preferences():
    from placetool.rl import policies
    from placetool.rl.method import bundled_policy

    p = Problem(CostModel(presets.load_graph("synthetic-160"), presets.load_cluster("k80x4")))
    r = run("rl", p, Budget(evals=60), seed=0, init_from="gdp")
    seed_us = run(r.metadata["warm_start"], p, Budget(evals=60), seed=0).step_time_us
    assert r.metadata["warm_start_us"] == r.metadata["mode_start_us"] == seed_us
    # the table lifts the seed's device above the rest and leaves the network's logits
    # on the other devices as they were, with the chance to leave the mode set by explore
    pol, _ = policies.load(bundled_policy("gdp"), n_devices=p.n_devices)
    atoms = pol.atoms_for(p)
    obs = pol.obs(atoms)
    dev = np.arange(atoms.n) % p.n_devices
    table = pol.anchor_table(obs, atoms, dev, explore=4.0)
    net = pol.net_logits(obs) / pol.temperature
    rows = np.arange(atoms.n)
    z = net + table / pol.temperature
    assert np.array_equal(np.argmax(np.where(atoms.allowed, z, -np.inf), axis=1), dev)
    other = atoms.allowed.copy()
    other[rows, dev] = False
    np.testing.assert_array_equal(table[other], 0.0)
    e = np.where(atoms.allowed, np.exp(z - z.max(axis=1, keepdims=True)), 0.0)
    leave = 1.0 - e[rows, dev] / e.sum(axis=1)
    multi = atoms.allowed.sum(axis=1) > 1
    np.testing.assert_allclose(leave[multi], 4.0 / atoms.n, rtol=1e-4)
    # one evaluation stays zero-shot: the network's own mode, no seeds scored
    z0 = run("rl", p, Budget(evals=1), seed=0, init_from="gdp")
    assert z0.evaluations == 1 and z0.metadata["warm_start"] is None


@pytest.mark.timeout(60)
def test_rl_answers_even_when_start_up_outlasts_the_budget():
    # a seconds budget spent before the first evaluation (TensorFlow's import alone takes
    # seconds): the policy's mode is still scored, once, and the result says so
    t = tiny_problem()
    r = run("rl", t, Budget(seconds=1e-6), seed=0, init_from="gdp")
    assert r.evaluations == 1 and t.is_valid(r.assignment)
    assert r.metadata["source"].startswith("policy's mode, scored after the budget")



def test_loo_advantage_of_a_lone_sample_is_zero(tiny):
    """Each sample is measured against the mean of the others in its batch, over the
    batch's spread; a batch of one (the budget cut its step short) has no others: 0."""
    from placetool.rl import policies
    from placetool.rl.trainer import TrainConfig, Trainer, Update

    p, _ = tiny
    tr = Trainer(policies.make("gdp", p.n_devices, seed=0, hidden=16), [p], TrainConfig(update=Update(baseline="loo")))
    t = tr.tasks[0]
    assert tr.advantages(t, np.array([-1.0])).tolist() == [0.0] and t.baseline == -1.0
    # others' means -2.5, -2, -1.5; spread sqrt(2/3)
    np.testing.assert_allclose(tr.advantages(t, np.array([-1.0, -2.0, -3.0])), np.array([1.5, 0, -1.5]) / np.sqrt(2 / 3),
                               rtol=1e-6)
    assert t.baseline == pytest.approx(0.9 * -1.0 + 0.1 * -2.0)
    assert tr.advantages(t, np.array([-5.0])).tolist() == [0.0]
    assert t.baseline == pytest.approx(0.9 * -1.1 + 0.1 * -5.0)


@pytest.mark.timeout(120)
def test_rl_ends_normally_when_the_budget_leaves_its_last_step_one_sample(monkeypatch):
    """Evaluation budgets that cut rl's last step to one sample (60 from scratch, 61
    fine-tuning, here, where the warm start's seeding methods take the first ones) once
    raised a TypeError at the very end and lost the result."""
    from placetool.rl.trainer import Trainer

    p = Problem(CostModel(presets.load_graph("synthetic-160"), presets.load_cluster("k80x4")))
    sizes, real = [], Trainer.advantages
    monkeypatch.setattr(Trainer, "advantages", lambda self, task, r: sizes.append(len(r)) or real(self, task, r))
    for options in ({}, {"init_from": "gdp"}):
        for n in range(58, 64):
            r = run("rl", p, Budget(evals=n), seed=0, **options)
            assert r.evaluations == n and p.is_valid(r.assignment) and np.isfinite(r.step_time_us)
    assert 1 in sizes  # the budgets above did cut a step to a lone sample

@pytest.mark.timeout(60)
def test_frozen_network_table_step_is_the_policy_gradient(tiny):
    """The closed-form numpy step on the residual table (the default search path) equals
    TensorFlow's gradient of mean(A * log pi(a)) with respect to that table."""
    from types import SimpleNamespace

    from placetool.rl import policies
    from placetool.rl.trainer import _FrozenNetTable

    p, _ = tiny
    pol = policies.make("gdp", p.n_devices, seed=5, hidden=16)
    atoms = pol.atoms_for(p)
    rng = np.random.default_rng(0)
    table0 = rng.normal(0, 2, (atoms.n, p.n_devices)).astype(np.float32)
    obs = pol.obs(atoms, [table0])
    acts = pol.sample(obs, 8, [3, 4])[0]
    adv = rng.normal(size=8).astype(np.float32)
    with tf.GradientTape() as tape:
        logp, _ = pol._logp(obs, tf.constant(acts))
        objective = tf.reduce_mean(adv * logp)
    expect = tape.gradient(objective, obs["bias"]).numpy()
    fz = _FrozenNetTable(pol, SimpleNamespace(obs=obs, residual_vars=[obs["bias"]], atoms=atoms))
    np.testing.assert_array_equal(fz.greedy()[0], pol.greedy(obs)[0][0])
    fz.probs()  # kept from here until the table changes
    fz.update(acts, adv, lr=1.0, ent_w=0.0)
    np.testing.assert_allclose(fz.table - table0, np.where(atoms.allowed, expect, 0.0), atol=2e-6)

    # what sampling and the mode read follows the table, and the prior, as they change
    def softmax(lg):
        e = np.exp(lg - lg.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    logits = np.where(atoms.allowed, fz.net + fz.table, -np.inf)
    np.testing.assert_allclose(fz.probs(), softmax(logits / fz.T), rtol=1e-12)
    np.testing.assert_array_equal(fz.greedy()[0], np.argmax(logits, axis=1))
    fz.prior = rng.normal(0, 3, fz.table.shape)
    np.testing.assert_allclose(fz.probs(), softmax(logits / fz.T + fz.prior), rtol=1e-12)
    np.testing.assert_array_equal(fz.greedy()[0], np.argmax(logits, axis=1))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dense", [0.0, np.inf], ids=["uniform-per-atom", "binomial-per-atom"])
def test_frozen_sampler_draws_from_the_policy_with_its_prior(tiny, dense):
    """The two-stage sampler (stay on the likeliest device, else pick among the others)
    draws from softmax(net + table + prior) exactly, whichever way it picks the atoms that
    leave: frequencies within 5 standard errors, never a masked device; the mode ignores
    the prior."""
    p, _ = tiny
    rng = np.random.default_rng(1)
    _, atoms, _, fz = frozen_table(p, lambda n: rng.normal(0, 2, (n, p.n_devices)))
    fz.dense = dense
    mode = fz.greedy()[0]
    K = 40_000
    for prior in (None, rng.normal(0, 3, (atoms.n, p.n_devices))):
        fz.prior = prior
        prob = fz.probs()
        acts = fz.sample(K, [7, prior is None])
        freq = np.stack([(acts == d).mean(axis=0) for d in range(p.n_devices)], axis=1)
        se = np.sqrt(prob * (1 - prob) / K)
        assert np.all(np.abs(freq - prob) <= 5 * se + 1e-12), np.abs(freq - prob).max()
        assert not np.any(freq[~atoms.allowed])
        np.testing.assert_array_equal(fz.greedy()[0], mode)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dense", [0.0, np.inf], ids=["uniform-per-atom", "binomial-per-atom"])
def test_frozen_sampler_floor_scales_the_chance_to_leave(tiny, dense):
    """With an exploration floor above the policy's own expected moves, each atom leaves
    its mode with probability min(floor * q / sum(q), 1/2) (q: its chance to leave) and,
    when it leaves, goes to the other devices in the policy's proportions; a floor below
    the policy's expected moves changes no draw."""
    from types import SimpleNamespace

    from placetool.rl import policies
    from placetool.rl.trainer import _FrozenNetTable

    p, _ = tiny
    pol = policies.make("gdp", p.n_devices, seed=5, hidden=16)
    atoms = pol.atoms_for(p)
    rng = np.random.default_rng(2)
    table = rng.normal(0, 1, (atoms.n, p.n_devices))
    table[np.arange(atoms.n), rng.integers(0, p.n_devices, atoms.n)] += 9.0  # a confident mode
    obs = pol.obs(atoms, [table.astype(np.float32)])
    fz = _FrozenNetTable(pol, SimpleNamespace(obs=obs, residual_vars=[obs["bias"]], atoms=atoms))
    fz.dense = dense
    prob = fz.probs()
    rows = np.arange(atoms.n)
    mode = fz.greedy()[0]
    q = 1.0 - prob[rows, mode]
    assert 0 < q.sum() < 0.5

    fz.floor = 0.5 * q.sum()
    no_floor = _FrozenNetTable(pol, SimpleNamespace(obs=obs, residual_vars=[obs["bias"]], atoms=atoms))
    no_floor.dense = dense
    np.testing.assert_array_equal(fz.sample(100, [9]), no_floor.sample(100, [9]))

    fz.floor = 2.0
    K = 40_000
    acts = fz.sample(K, [8])
    leave = np.minimum(q * 2.0 / q.sum(), 0.5)
    expect = prob / np.maximum(q, 1e-300)[:, None] * leave[:, None]  # atoms with one device never leave
    expect[rows, mode] = 1.0 - leave
    freq = np.stack([(acts == d).mean(axis=0) for d in range(p.n_devices)], axis=1)
    se = np.sqrt(expect * (1 - expect) / K)
    assert np.all(np.abs(freq - expect) <= 5 * se + 1e-12), np.abs(freq - expect).max()
    moved = (acts != mode).sum(axis=1)
    assert abs(moved.mean() - leave.sum()) < 0.05
    # samples are independent: each moves as often, with the spread of a sum of coin flips
    half = K // 2
    se = np.sqrt(2 * np.sum(leave * (1 - leave)) / half)
    assert abs(moved[:half].mean() - moved[half:].mean()) < 5 * se
    assert abs(moved.var() / np.sum(leave * (1 - leave)) - 1) < 0.1
    assert not np.any(freq[~atoms.allowed])


def test_critical_prior_weights_the_critical_path_and_the_neighbours_devices():
    """Known answers for rl.guide: critical groups leave `weight` times as often as the
    others with the mean kept, a leaving group's devices are ranked by log(1 + its
    neighbours there) with the mean over the devices it may leave to kept, and the mode's
    logit is untouched."""
    from placetool.rl.guide import CriticalPrior
    from placetool.search.critical import CriticalPath
    from placetool.search.problem import group_edges

    p = Problem(CostModel(presets.load_graph("synthetic-40"), presets.load_cluster("k80x4")))
    n, D = p.n_groups, p.n_devices
    mode = np.array([np.random.default_rng(k).choice(np.flatnonzero(p.allowed[k])) for k in range(n)])
    rows = np.arange(n)
    movable = p.allowed.sum(axis=1) >= 2
    on = CriticalPath(p.cost_model, mode).on_group & movable
    assert on.any() and (~on & movable).any()
    leave = p.allowed.copy()
    leave[rows, mode] = False

    B = CriticalPrior(p, weight=8.0, affinity=0.0)(mode)
    assert np.all(B[rows, mode] == 0)
    w = np.where(on, 8.0, 1.0)
    np.testing.assert_allclose(B[leave], np.repeat(np.log(w / w[movable].mean()), D)[leave.ravel()])

    B = CriticalPrior(p, weight=1.0, affinity=1.0)(mode)
    cnt = np.zeros((n, D))
    for s, d, _ in zip(*group_edges(p)):
        cnt[s, mode[d]] += 1
        cnt[d, mode[s]] += 1
    for k in np.flatnonzero(leave.sum(axis=1) >= 1):
        devs = np.flatnonzero(leave[k])
        np.testing.assert_allclose(B[k, devs] - B[k, devs[0]], np.log1p(cnt[k, devs]) - np.log1p(cnt[k, devs[0]]))
        np.testing.assert_allclose(np.exp(B[k, devs]).mean(), 1.0)


@pytest.mark.timeout(60)
def test_rl_search_aims_its_samples_at_the_critical_path(tiny):
    p, _ = tiny
    on = run("rl", p, Budget(evals=200), seed=0)
    off = run("rl", p, Budget(evals=200), seed=0, guide=0)
    assert on.metadata["guide_updates"] >= 1 and off.metadata["guide_updates"] == 0
    with pytest.raises(UserError, match="guide"):
        run("rl", p, Budget(evals=10), seed=0, guide=0.5)
    with pytest.raises(UserError, match="option 'min_moves' must be a number >= 0"):
        run("rl", p, Budget(evals=10), seed=0, min_moves=-1)


@pytest.mark.timeout(60)
def test_rl_compound_samples_are_moves_along_the_modes_critical_path():
    """With ``compound`` the first rows of a step's samples are compound moves off the
    mode (valid, different from it, touching its critical path); a new best from such a
    row is reported as theirs, and the result counts new bests by origin."""
    from placetool.rl import policies
    from placetool.rl.trainer import Trainer, TrainConfig
    from placetool.search.critical import CriticalPath

    p = Problem(CostModel(presets.load_graph("synthetic-40"), presets.load_cluster("k80x4")))
    pol = policies.make("gdp", p.n_devices, seed=0, hidden=16)
    tr = Trainer(pol, [p], TrainConfig.from_options(dict(lr=0.0, guide=16.0, compound=6, samples=10)), seed=0)
    task = tr.tasks[0]
    tr._aim(task)
    mode = task.guide_mode
    on = CriticalPath(p.cost_model, mode).on_group
    acts = task.frozen.sample(10, [1])
    drawn = acts.copy()
    replaced = tr._compound(task, acts)
    assert replaced.sum() >= 1 and not replaced[6:].any()
    np.testing.assert_array_equal(acts[~replaced], drawn[~replaced])
    for a in acts[replaced]:
        changed = a != mode
        assert changed.any() and on[changed].any()
        assert p.allowed[np.arange(p.n_groups), a].all()

    A = np.stack([mode, acts[np.flatnonzero(replaced)[0]]])
    steps = p.cost_model.simulate_batch(A).step_time_us
    task.score(A, step_no=3, compound=np.array([False, True]))
    assert task.best_origin == ("compound" if steps[1] < steps[0] else "policy") and task.best_step == 3

    r = run("rl", p, Budget(evals=400), seed=0, compound=16, compound_until=1.0)
    assert sum(r.metadata["improvements"].values()) >= 1
    # at most 16 per step (fewer where the mode's critical path offers no such move)
    assert r.metadata["improvements"]["compound"] <= r.metadata["compound_samples"] <= 16 * r.metadata["steps"]
    assert r.metadata["compound_samples"] >= r.metadata["steps"]
    off = run("rl", p, Budget(evals=400), seed=0, compound=0)
    assert off.metadata["improvements"]["compound"] == off.metadata["compound_samples"] == 0
    assert not off.metadata["source"].startswith("compound")
    with pytest.raises(UserError, match="option 'compound' must be an integer >= 0, got -1"):
        run("rl", p, Budget(evals=10), seed=0, compound=-1)

    # compound_from: none in the first half of the budget (a step scores at most 32 + 1, and
    # the warm starts take a few evaluations, far fewer than a step)
    late = run("rl", p, Budget(evals=400), seed=0, compound=16, compound_from=0.5).metadata  # to the end
    assert 0 < late["compound_samples"] <= 16 * (late["steps"] - 200 // 33)
    assert late["compound_samples"] < r.metadata["compound_samples"]
    assert run("rl", p, Budget(evals=400), seed=0, compound=16, compound_from=1.0).metadata["compound_samples"] == 0
    with pytest.raises(UserError, match="option 'compound_from' must be a number from 0 to 1"):
        run("rl", p, Budget(evals=10), seed=0, compound=16, compound_from=1.5)
    # compound_until: none in the second half
    early = run("rl", p, Budget(evals=400), seed=0, compound=16, compound_until=0.5).metadata
    assert 0 < early["compound_samples"] < r.metadata["compound_samples"]
    assert early["compound_samples"] <= 16 * (200 // 33 + 1)
    with pytest.raises(UserError, match="compound_until must be a fraction"):
        run("rl", p, Budget(evals=10), seed=0, compound=16, compound_from=0.5, compound_until=0.4)
    # the default (gdp): 24 of 32 in the first half only
    default = run("rl", p, Budget(evals=400), seed=0).metadata
    assert 0 < default["compound_samples"] <= 24 * (200 // 33 + 1)
    assert default["compound_samples"] > early["compound_samples"]


@pytest.mark.timeout(60)
def test_rl_compound_slack_leaves_rows_far_from_the_best_out_of_the_update():
    """With ``compound_slack`` a compound row teaches the table (non-zero advantage) only
    when its step time is within that fraction of the best so far; the policy's own draws
    always do, and without a slack every compound row does."""
    from placetool.rl import policies
    from placetool.rl.trainer import Trainer, TrainConfig

    p = Problem(CostModel(presets.load_graph("synthetic-40"), presets.load_cluster("k80x4")))
    seen = {}
    for slack in (None, 0.0, 1e9):
        pol = policies.make("gdp", p.n_devices, seed=0, hidden=16)
        cfg = TrainConfig.from_options(dict(lr=0.0, guide=16.0, compound=8, samples=8, entropy=0.0, baseline="loo",
                                            residual_optimizer="sgd", residual_lr=1.0, compound_slack=slack))
        tr = Trainer(pol, [p], cfg, seed=0)
        task = tr.tasks[0]
        task.best = 1.0  # a best (1 µs) that no placement comes within any sane slack of
        # watch the real calls: which rows were compound moves, and the advantages applied
        compound, update = tr._compound, task.frozen.update
        tr._compound = lambda t, acts: seen.setdefault(slack, {}).setdefault("rows", compound(t, acts))
        task.frozen.update = lambda acts, adv, *a: update(acts, seen[slack].setdefault("adv", np.array(adv)), *a)
        tr.step()
    rows, adv = seen[None]["rows"], seen[None]["adv"]
    assert 0 < rows.sum() < len(rows) and np.all(adv != 0)
    np.testing.assert_array_equal(seen[0.0]["rows"], rows)  # the same draws in every run
    np.testing.assert_array_equal(seen[0.0]["adv"], np.where(rows, 0.0, adv))  # none within 0% of the best
    np.testing.assert_array_equal(seen[1e9]["adv"], adv)  # all within the slack: as without it
    with pytest.raises(UserError, match="option 'compound_slack' must be a number >= 0 or none"):
        run("rl", p, Budget(evals=10), seed=0, compound=8, compound_slack=-0.1)


def test_rl_merge_joins_the_rows_that_beat_the_mode_on_disjoint_groups():
    """Known answer: the winners, best first, each taken only if it touches no group an
    earlier one changed; None unless two went in; infeasible rows never count."""
    from types import SimpleNamespace

    from placetool.rl.trainer import Trainer

    base = np.zeros(5, np.int32)
    task = SimpleNamespace(guide_mode=base, guide=SimpleNamespace(path=SimpleNamespace(step_time_us=100.0)))
    acts = np.zeros((5, 5), np.int32)
    acts[0, 1] = 1              # 90: beats the mode, but shares group 1 with row 2
    acts[1, 2] = 2              # 95: beats it, disjoint from row 2
    acts[2, [1, 3]] = [2, 1]    # 80: the best
    acts[3, 4] = 1              # 120: worse
    step = np.array([90.0, 95.0, 80.0, 120.0, 100.0])
    ok = np.ones(5, bool)
    merged = Trainer._merged(task, acts, step, ok)
    assert merged.tolist() == [0, 2, 2, 1, 0]
    assert base.tolist() == [0] * 5  # the mode is left alone
    assert Trainer._merged(task, acts, step, np.array([True, False, True, True, True])) is None  # row 2 alone
    assert Trainer._merged(task, acts, np.array([90.0, 100.0, 120.0, 120.0, 100.0]), ok) is None  # row 0 alone


@pytest.mark.timeout(120)
def test_rl_floor_widens_while_no_new_best_is_found(tiny):
    """With ``widen_after=2`` the exploration floor doubles after every 2 steps without a
    new best, up to 8 x ``min_moves``, and falls back to ``min_moves`` at a new best; with
    ``merge`` a step also scores its winners together, within the budget."""
    from placetool.rl import policies
    from placetool.rl.trainer import Trainer, TrainConfig

    p, _ = tiny
    pol = policies.make("gdp", p.n_devices, seed=0, hidden=16)
    cfg = TrainConfig.from_options(dict(lr=0.0, guide=16.0, min_moves=0.5, widen_after=2, samples=8, baseline="loo",
                                        residual_optimizer="sgd", residual_lr=20.0, entropy=0.0))
    tr = Trainer(pol, [p], cfg, seed=0)
    task = tr.tasks[0]
    floors, bests = [], []
    for _ in range(25):
        tr.step()
        floors.append(task.frozen.floor)
        bests.append(task.best)
    w, stale, prev = 1.0, 0, np.inf
    for floor, best in zip(floors, bests):
        assert floor == 0.5 * w
        if best < prev:
            w, stale = 1.0, 0
        else:
            stale += 1
            if stale >= 2:
                w, stale = min(2 * w, 8.0), 0
        prev = best
    assert max(floors) == 4.0 and {1.0, 2.0} <= set(floors)

    r = run("rl", p, Budget(evals=300), seed=0, merge=True, widen_after=3)
    assert r.evaluations == 300 and r.feasible


@pytest.mark.timeout(60)
def test_frozen_table_adopt_moves_the_mode_and_keeps_the_odds_around_it(tiny):
    """``adopt(a)`` makes ``a`` the mode by trading the logits of the old and the new
    mode's device on each atom that moves: each atom's probabilities are the same numbers,
    those two swapped; a device an atom may not use is never adopted."""
    p, _ = tiny
    rng = np.random.default_rng(2)
    _, atoms, _, fz = frozen_table(p, lambda n: rng.normal(0, 2, (n, p.n_devices)))
    old, before = fz.greedy()[0].copy(), fz.probs().copy()
    a = old.copy()
    multi = np.flatnonzero(atoms.allowed.sum(axis=1) > 1)
    for g in multi[:3]:
        a[g] = next(d for d in np.flatnonzero(atoms.allowed[g]) if d != old[g])
    single = np.flatnonzero(atoms.allowed.sum(axis=1) == 1)[0]
    a[single] = (old[single] + 1) % p.n_devices  # not allowed there: stays
    assert fz.adopt(a) == 3
    expect = a.copy()
    expect[single] = old[single]
    np.testing.assert_array_equal(fz.greedy()[0], expect)
    after = fz.probs()
    for g in range(atoms.n):
        swapped = before[g].copy()
        swapped[[old[g], expect[g]]] = swapped[[expect[g], old[g]]]
        np.testing.assert_allclose(after[g], swapped, rtol=1e-9, atol=1e-15)
    assert fz.adopt(expect) == 0


def test_rl_follow_moves_the_mode_to_the_best_row_that_beats_it(tiny):
    """Known answer: the step's best feasible row becomes the mode when it beats the
    mode's step time; otherwise the mode stays."""
    from types import SimpleNamespace

    from placetool.rl.trainer import Trainer

    p, _ = tiny
    _, atoms, _, fz = frozen_table(p, lambda n: np.zeros((n, p.n_devices)))
    mode = fz.greedy()[0].copy()
    task = SimpleNamespace(frozen=fz, guide_mode=mode, guide=SimpleNamespace(path=SimpleNamespace(step_time_us=100.0)))
    acts = np.repeat(mode[None], 3, axis=0)
    for k, g in enumerate(np.flatnonzero(atoms.allowed.sum(axis=1) > 1)[:3]):
        acts[k, g] = next(d for d in np.flatnonzero(atoms.allowed[g]) if d != mode[g])
    ok = np.ones(3, bool)
    Trainer._follow(task, acts, np.array([120.0, 101.0, 130.0]), ok, best_before=90.0)
    np.testing.assert_array_equal(fz.greedy()[0], mode)  # none beats the mode
    Trainer._follow(task, acts, np.array([95.0, 80.0, 90.0]), np.array([True, False, True]), best_before=90.0)
    np.testing.assert_array_equal(fz.greedy()[0], acts[2])  # row 1 is infeasible: row 2 is the best


@pytest.mark.timeout(60)
def test_rl_compound_kinds_and_their_odds():
    """``compound_kinds`` picks the kinds of compound move; with ``compound_adapt`` each
    step tells sa's kind odds which kinds it drew and whether its best compound row beat
    the mode; an unknown kind is a clear error."""
    from placetool.rl import policies
    from placetool.rl.trainer import Trainer, TrainConfig

    p = Problem(CostModel(presets.load_graph("synthetic-40"), presets.load_cluster("k80x4")))
    pol = policies.make("gdp", p.n_devices, seed=0, hidden=16)
    cfg = TrainConfig.from_options(dict(lr=0.0, guide=16.0, compound=6, samples=10, compound_kinds="chain, region",
                                        compound_adapt=True))
    tr = Trainer(pol, [p], cfg, seed=0)
    task = tr.tasks[0]
    tr._aim(task)
    acts = task.frozen.sample(10, [1])
    replaced = tr._compound(task, acts)
    kinds = list(task.row_kinds)
    assert [k is not None for k in kinds] == replaced.tolist() and set(kinds) - {None} <= {"chain", "region"}
    rows = np.flatnonzero(replaced)
    t0 = task.guide.path.step_time_us
    step = np.full(10, 2 * t0)
    step[rows[-1]] = 0.5 * t0  # the best compound row beats the mode
    step[~replaced] = 0.1 * t0  # a policy draw does better still: not a compound row, not counted
    tr._record_kinds(task, step, np.ones(10, bool))
    won = {k: task.odds.won[task.odds.index[k]] for k in ("chain", "region")}
    assert won == {"chain": float(kinds[rows[-1]] == "chain"), "region": float(kinds[rows[-1]] == "region")}
    assert task.odds.used.sum() == len(rows) and task.row_kinds is None
    task.row_kinds = kinds
    tr._record_kinds(task, np.full(10, 2 * t0), np.ones(10, bool))  # nothing beats the mode
    assert task.odds.won.sum() == 1 and task.odds.used.sum() == 2 * len(rows)

    m = run("rl", p, Budget(evals=300), seed=0, compound=8, compound_kinds="region", compound_adapt=True).metadata
    assert m["compound_kinds"] == ["region"] and m["kind_odds"] == {"region": 1.0} and m["compound_samples"] > 0
    assert run("rl", p, Budget(evals=100), seed=0).metadata["kind_odds"] is None
    with pytest.raises(UserError, match="compound_kinds 'chain,jump': unknown kind.s. jump"):
        run("rl", p, Budget(evals=10), seed=0, compound_kinds="chain,jump")
