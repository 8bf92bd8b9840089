"""``placetool testbed``, ``placetool calibrate``, ``placetool verify``: real devices.

Devices are given by one of: ``--testbed N`` (start N local worker processes for this
command and stop them after), ``--cluster-spec FILE`` (a running TF cluster: JSON
``{"worker": ["host:port", ...]}``), ``--local`` (this process's own CPU and GPUs), or
nothing (the testbed started by ``placetool testbed up``).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click
import numpy as np

from placetool.costmodel.errors import UserError, atomic_output
from placetool.costmodel.tf.session import require_tf
from placetool.costmodel.workers import WORKER_COSTS

from .common import (PositiveFloat, check_writable, emit_json, fmt_us, json_option, placement_option, profile_option,
                     quiet_option, workers_option)


# ------------------------------------------------------------------ options
def device_options(f):
    f = click.option("--local", is_flag=True, help="Use this process's own CPU (and GPUs) instead of workers.")(f)
    f = click.option("--cluster-spec", "cluster_spec", type=click.Path(dir_okay=False),
                     help='A running TF cluster: JSON {"worker": ["host:port", ...]} '
                          '(optionally {"workers": [...], "devices": [{"tf": "/job:...", "kind": "gpu"}]}).')(f)
    f = click.option("--testbed-device", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True,
                     help="With --testbed: one CPU per worker, or one GPU per worker (CUDA_VISIBLE_DEVICES=k).")(f)
    f = click.option("--testbed", "testbed_n", type=click.IntRange(min=1), default=None,
                     help="Start N local workers for this command and stop them after.")(f)
    f = click.option("--timeout", "timeout_s", type=PositiveFloat(at_least=1), default=120.0, show_default=True,
                     help="Seconds to wait for workers to come up, and for any one step.")(f)
    return f


def source_options(f):
    f = click.option("--zoo-arg", "zoo_args", multiple=True, metavar="KEY=VALUE",
                     help="Option for a zoo builder (e.g. hidden=256); repeatable.")(f)
    f = click.option("--optimizer", default="sgd", show_default=True, help="Optimizer of the training step.")(f)
    f = click.option("--mode", type=click.Choice(["train", "infer"]), default="train", show_default=True)(f)
    f = click.option("--batch", type=click.IntRange(min=1), default=None, help="Batch size (default: the model's).")(f)
    return f


def parse_zoo_args(items) -> dict:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise UserError(f"--zoo-arg {it!r}: expected KEY=VALUE")
        for conv in (int, float):
            try:
                out[k] = conv(v)
                break
            except ValueError:
                continue
        else:
            out[k] = {"true": True, "false": False}.get(v.lower(), v)
    return out


def check_one_source(testbed_n, cluster_spec, local) -> None:
    """At most one of --testbed, --cluster-spec, --local (before anything starts)."""
    chosen = [name for name, x in (("--testbed", testbed_n), ("--cluster-spec", cluster_spec), ("--local", local))
              if x]
    if len(chosen) > 1:
        raise UserError(f"give only one of --testbed N, --cluster-spec FILE, --local (got {' and '.join(chosen)})")


def check_model_source(source) -> None:
    """A graph file (.npz) is data, not a model: these commands never run the source it
    records. Said before TensorFlow loads."""
    if str(source).endswith(".npz"):
        raise UserError(f"--graph {source}: a placetool graph file, not a model; give the model it was imported "
                        "from (zoo name, module:function, SavedModel or .pb)")


def trace_source(source, zoo_args, **kw):
    """Trace a model for calibrate/verify; a builder that refuses a --zoo-arg is a user error."""
    check_model_source(source)
    from placetool.costmodel.tf.importer import trace

    extra = parse_zoo_args(zoo_args)
    try:
        return trace(source, **kw, **extra)
    except UserError:
        raise
    except Exception as e:  # Keras refusing units=-5, TensorFlow unable to allocate a huge model...
        if not extra:
            raise
        msg = " ".join(str(e).split())
        raise UserError(f"{source}: cannot build it with --zoo-arg {' '.join(zoo_args)} "
                        f"({type(e).__name__}: {msg[:300]})") from None


def planned_spec(testbed_n, testbed_device, cluster_spec, local):
    """The devices a command will use, known before anything starts (for early checks)."""
    from placetool.costmodel.tf.testbed import ClusterSpec, Testbed, TestbedError, default_state_path

    check_one_source(testbed_n, cluster_spec, local)
    if testbed_n:
        return ClusterSpec.for_workers(["localhost:0"] * testbed_n, testbed_device)
    if cluster_spec:
        return ClusterSpec.load(cluster_spec)
    if local:
        from placetool.costmodel.tf.runner import local_spec

        return local_spec()
    if default_state_path().exists():
        return Testbed.from_state().spec
    raise TestbedError("no devices: give --testbed N, --cluster-spec FILE or --local, "
                       "or start a testbed with `placetool testbed up --workers N`")


def check_cluster_matches(cl, spec) -> None:
    """The cluster used for predictions must have the measured devices, kind for kind."""
    if cl.n_devices != len(spec.tf_devices):
        raise UserError(f"cluster {cl.name!r} has {cl.n_devices} devices but {len(spec.tf_devices)} "
                        "devices are being measured")
    for i, (k, k2) in enumerate(zip(cl.kinds, spec.kinds)):
        if k != k2:
            raise UserError(f"cluster device {cl.names[i]!r} is a {k} but measured device {i} "
                            f"({spec.tf_devices[i]}) is a {k2}")


@contextlib.contextmanager
def devices(testbed_n, testbed_device, cluster_spec, local, timeout_s, log=None):
    """Yield the ClusterSpec to measure on; a ``--testbed`` one is stopped afterwards."""
    from placetool.costmodel.tf.testbed import Testbed

    if testbed_n:
        if log:
            log(f"starting a {testbed_n}-worker testbed ...")
        with Testbed.start(testbed_n, device=testbed_device, timeout_s=timeout_s) as tb:
            yield tb.spec
        return
    spec = planned_spec(None, testbed_device, cluster_spec, local)
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    yield spec


@contextlib.contextmanager
def naming_lost_workers(spec):
    """A measurement that fails because a worker went away names the worker; TF's
    session-closing thread, which then fails too, does not print a traceback."""
    import logging
    import threading

    from placetool.costmodel.tf.runner import WorkerLost
    from placetool.costmodel.tf.testbed import TestbedError, port_open

    hook = threading.excepthook
    tf_log = logging.getLogger("tensorflow")
    level = tf_log.level
    tf_log.setLevel(logging.CRITICAL)  # "Session failed to close after 30 seconds": said below

    def quiet_close(args):
        if args.thread is not None and args.thread.name == "SessionCloseThread":
            return  # closing a session whose worker is gone: the error below says why
        hook(args)

    threading.excepthook = quiet_close
    try:
        yield
    except WorkerLost:
        raise  # found by the runner while the step ran: it names the worker already
    except Exception as e:
        lost = [f"/job:{spec.job}/task:{k} at {a}" for k, a in enumerate(spec.workers) if not port_open(a, 0.5)]
        if not lost:
            raise
        first = " ".join(str(e).split())
        raise TestbedError(f"worker {', '.join(lost)} stopped answering during the measurement "
                           f"({first[:200]})") from None
    finally:
        threading.excepthook = hook
        tf_log.setLevel(level)


def _log(quiet):
    return (lambda msg: None) if quiet else (lambda msg: click.echo(msg, err=True))


# ------------------------------------------------------------------ testbed
@click.group()
def testbed():
    """Local TF worker testbed: N tf.distribute.Server processes, one device each."""


@testbed.command("up")
@workers_option("Worker processes to start.", default=2)
@click.option("--device", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True)
@click.option("--timeout", "timeout_s", type=PositiveFloat(at_least=1), default=120.0, show_default=True)
@click.option("--state", type=click.Path(dir_okay=False), default=None, help="State file (default: ~/.local/state/placetool/testbed.json).")
@json_option
def testbed_up(workers, device, timeout_s, state, as_json):
    """Start the workers in the background and record them in the state file."""
    require_tf()
    from placetool.costmodel.tf.testbed import Testbed, TestbedError, default_state_path

    path = Path(state or default_state_path())
    if path.exists():
        try:
            old = Testbed.from_state(path)
            if any(s["alive"] for s in old.status()):
                raise TestbedError(f"a testbed is already up ({path}); stop it with `placetool testbed down`")
        except TestbedError as e:
            if "already up" in str(e):
                raise
    tb = Testbed.start(workers, device=device, timeout_s=timeout_s, detached=True)
    try:
        tb.save_state(path)
    except BaseException:
        tb.stop()
        raise
    out = {"state": str(path), "workers": tb.spec.workers, "tf_devices": tb.spec.tf_devices,
           "pids": tb.pids, "log_dir": tb.log_dir}
    if as_json:
        emit_json(out)
    else:
        click.echo(f"testbed up: {workers} {device} worker(s), state in {path}")
        for k, (a, d) in enumerate(zip(tb.spec.workers, tb.spec.tf_devices)):
            click.echo(f"  task {k}: {a}  {d}  pid {tb.pids[k]}")


@testbed.command("down")
@click.option("--state", type=click.Path(dir_okay=False), default=None)
@click.option("--keep-logs", is_flag=True, help="Keep the workers' log folder (it is removed by default).")
@json_option
def testbed_down(state, keep_logs, as_json):
    """Stop the workers recorded in the state file and remove their log folder."""
    from placetool.costmodel.tf.testbed import Testbed, default_state_path

    path = Path(state or default_state_path())
    tb = Testbed.from_state(path)
    n = tb.n_workers
    log_dir = tb.log_dir if tb.own_log_dir and not keep_logs else None
    tb.stop(keep_logs=keep_logs)
    path.unlink(missing_ok=True)
    if as_json:
        emit_json({"stopped": n, "state": str(path), "removed_logs": log_dir})
    else:
        click.echo(f"testbed down: stopped {n} worker(s)" + (f", removed {log_dir}" if log_dir else ""))


@testbed.command("status")
@click.option("--state", type=click.Path(dir_okay=False), default=None)
@json_option
def testbed_status(state, as_json):
    """Show each worker: address, pid, alive, listening. Exit status 1 when a worker is
    down or not listening (degraded), 0 when all are up or no testbed is recorded."""
    from placetool.costmodel.tf.testbed import Testbed, default_state_path

    path = Path(state or default_state_path())
    if not path.exists():
        if as_json:
            emit_json({"up": False, "workers": []})
        else:
            click.echo("no testbed is up")
        return
    tb = Testbed.from_state(path)
    st = tb.status()
    up = all(s["alive"] and s["listening"] for s in st)
    if as_json:
        emit_json({"up": up, "state": str(path), "log_dir": tb.log_dir, "workers": st})
        return 0 if up else 1
    click.echo(f"testbed {'up' if up else 'DEGRADED'} ({path})")
    for s in st:
        click.echo(f"  task {s['task']}: {s['address']}  pid {s['pid']}  "
                   f"{'alive' if s['alive'] else 'dead'}, {'listening' if s['listening'] else 'not listening'}")
    return 0 if up else 1


# ------------------------------------------------------------------ calibrate
@click.command()
@click.option("--graph", "-g", "graphs", multiple=True, required=True,
              help="Model to trace and profile: zoo name, module:function, SavedModel or .pb (repeatable).")
@source_options
@device_options
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Profile JSON to write.")
@click.option("--cluster-out", type=click.Path(dir_okay=False), default=None,
              help="Calibrated cluster TOML to write (default: OUT with .toml).")
@click.option("--trace-steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="FULL_TRACE steps per graph (per-op medians).")
@click.option("--reps", type=click.IntRange(min=3), default=9, show_default=True, help="Repeats per transfer size.")
@click.option("--max-transfer", type=click.IntRange(min=4096), default=64 * 2 ** 20, show_default=True,
              help="Largest transfer timed, bytes (sizes go 1 KB, 4 KB, ... up to it).")
@click.option("--split-steps", type=click.IntRange(min=0), default=3, show_default=True,
              help="Timed steps per round of each designed split placement, to which the transfer costs "
                   "are fitted (0: no split placements; keep the lone-transfer link fit).")
@click.option("--rounds", type=click.IntRange(min=2), default=3, show_default=True,
              help="Interleaved rounds over the split placements (their spread is the noise floor).")
@click.option("--max-noise", "max_noise", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Warn when repeated runs of one placement spread by more than this many %.")
@click.option("--refuse-noisy", is_flag=True,
              help="Write nothing and exit 1 when the noise floor exceeds --max-noise.")
@click.option("--name", default="calibrated", show_default=True, help="Name of the calibrated cluster.")
@click.option("--link-queue", type=click.Choice(["auto", "fifo", "none"]), default="auto", show_default=True,
              help="Do transfers on one link wait for each other (links.queue)? auto: not between TF worker "
                   "processes (gRPC runs them side by side), one at a time on this process's own devices.")
@click.option("--link-send", type=click.Choice(["auto", "eager", "idle", "aside", "workers"]), default="auto",
              show_default=True,
              help="When does a tensor leave its device (links.send)? auto: workers between TF worker "
                   "processes, eager on this process's own devices. workers: as a TF worker's one compute "
                   "thread serves it (its run queue, docs/simulator.md), its costs from --worker-costs; "
                   "idle: a worker serves transfers only with no op of its own ready, its costs fitted to "
                   "whole steps; aside: at once, the send cost paid on the device beside the wire.")
@click.option("--worker-costs", type=click.Choice(WORKER_COSTS), default="steps", show_default=True,
              help="Under links.send workers, where the per-message costs come from: fitted to the designed "
                   "splits' whole steps, or identified from --split-steps traced steps of each "
                   "(docs/hardware.md).")
@quiet_option
@json_option
def calibrate(graphs, batch, mode, optimizer, zoo_args, testbed_n, timeout_s, testbed_device, cluster_spec,
              local, out, cluster_out, trace_steps, reps, max_transfer, split_steps, rounds, max_noise,
              refuse_noisy, name, link_queue, link_send, worker_costs, quiet, as_json):
    """Measure op times and links on real devices; write a profile and a cluster file."""
    require_tf()
    cluster_out = cluster_out or str(Path(out).with_suffix(".toml"))
    check_writable(out, "--out", inputs={"--cluster-spec": cluster_spec})
    check_writable(cluster_out, "--cluster-out", inputs={"--cluster-spec": cluster_spec, "--out": out})
    check_one_source(testbed_n, cluster_spec, local)
    planned_spec(testbed_n, testbed_device, cluster_spec, local) if not testbed_n else None
    from placetool.costmodel.tf.calibrate import DEFAULT_SIZES, cost_names
    from placetool.costmodel.tf.calibrate import calibrate as run_calibration

    log = _log(quiet or as_json)
    parse_zoo_args(zoo_args)  # malformed KEY=VALUE: before any tracing
    for gsrc in graphs:
        check_model_source(gsrc)
    traced = []
    for gsrc in graphs:
        log(f"tracing {gsrc} ...")
        traced.append(trace_source(gsrc, zoo_args, mode=mode, batch=batch, optimizer=optimizer))
    sizes = [s for s in DEFAULT_SIZES if s <= max_transfer]
    with devices(testbed_n, testbed_device, cluster_spec, local, timeout_s, log) as spec:
        profile, cluster = run_calibration(traced, spec, sizes=sizes, trace_steps=trace_steps, reps=reps,
                                           name=name, log=log, timeout_s=timeout_s, split_steps=split_steps,
                                           rounds=rounds, max_noise_pct=max_noise, link_queue=link_queue,
                                           link_send=link_send, worker_costs=worker_costs)
    noisy = profile.meta.get("noisy")
    if noisy and refuse_noisy:
        click.echo(f"placetool: {noisy}; nothing written (--refuse-noisy)", err=True)
        sys.exit(1)
    # both files or neither: a profile without its cluster is a mismatched pair
    with atomic_output(out) as tmp_profile, atomic_output(cluster_out) as tmp_cluster:
        profile.save(tmp_profile)
        cluster.save(tmp_cluster)
    summary = {
        "profile": str(out), "cluster": str(cluster_out), "devices": [d["name"] for d in profile.devices],
        "step_overhead_us": profile.step_overhead_us, "dispatch_us": profile.dispatch_us,
        "graphs": profile.meta["graphs"],
        "links": [{k: l[k] for k in ("src", "dst", "latency_us", "bandwidth_bytes_per_us")} for l in profile.links],
        "fitted_op_types": {k: len(v) for k, v in profile.fits.items()},
        "link_queue": cluster.link_queue,
        "link_send": cluster.link_send,
        "transfer_fit": profile.meta.get("transfer_fit"),
        "worker_fit": profile.meta.get("worker_fit"),
        "noisy": noisy,
    }
    if as_json:
        emit_json(summary)
        if noisy:
            click.echo(f"WARNING: {noisy}", err=True)
        return
    click.echo(f"profile written to {out}; cluster written to {cluster_out}")
    for l in summary["links"]:
        click.echo(f"  link {l['src']} -> {l['dst']}: latency {l['latency_us']:,.1f} µs, "
                   f"bandwidth {l['bandwidth_bytes_per_us'] / 1e3:,.2f} GB/s")
    tf_ = summary["transfer_fit"]
    if tf_:
        p = tf_["params"]
        send, recv = cost_names(summary["link_send"])
        click.echo(f"  device time per transfer: {send} {p['send_us']:,.1f} µs + {p['send_us_per_byte'] * 1e6:,.1f} "
                   f"µs/MB, {recv} {p['recv_us']:,.1f} µs + {p['recv_us_per_byte'] * 1e6:,.1f} µs/MB "
                   f"(links.queue {summary['link_queue']}, links.send {summary['link_send']})")
        f, h = tf_["fit"], tf_["held_out"]
        click.echo(f"  step error: fit median {_pct(f['median_abs_error_pct'])} (max {_pct(f['max_abs_error_pct'])}, "
                   f"{f['n']} placements), held out median {_pct(h['median_abs_error_pct'])} "
                   f"(max {_pct(h['max_abs_error_pct'])}, {h['n']}); noise floor ±{tf_['noise_floor_pct']:.1f}%")
    wf = summary["worker_fit"]
    if wf:
        c = wf["costs"]
        mb = {k: c[k] * 1e6 for k in ("send_us_per_byte", "recv_us_per_byte")}
        click.echo(f"  per message on the compute threads (links.send workers): request {c['request_us']:,.1f} µs, "
                   f"handler {c['handler_us']:,.1f} µs + {mb['send_us_per_byte']:,.0f} µs/MB, "
                   f"arrival {c['arrive_us']:,.1f} µs + {mb['recv_us_per_byte']:,.0f} µs/MB")
        click.echo(f"  traced split steps replayed: median |error| {wf['median_abs_error_pct']:.1f}% (max "
                   f"{wf['max_abs_error_pct']:.1f}%, {wf['n_steps']} steps); designs predicted: median "
                   f"{wf['predicted']['median_abs_error_pct']:.1f}% (max {wf['predicted']['max_abs_error_pct']:.1f}%); "
                   f"noise floor ±{wf['noise_floor_pct']:.1f}%")
    if noisy and quiet:  # otherwise the log said so already
        click.echo(f"WARNING: {noisy}", err=True)


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


# ------------------------------------------------------------------ verify
def step_overhead_us(profile, p) -> float:
    """The profile's fixed per-step cost for per-op placement ``p`` (0 without a profile)."""
    return float(profile.step_overhead(len(np.unique(p)))) if profile is not None else 0.0


def predict(cm, profile, p) -> tuple[float, float]:
    """(simulated µs, per-step overhead µs) of per-op placement ``p``."""
    r = cm.simulate(p)
    if not r.feasible and not np.isfinite(r.step_time_us):
        raise UserError(f"placement is invalid: {r.reason}")
    return float(r.step_time_us), step_overhead_us(profile, p)


@click.command()
@click.option("--graph", "-g", "source", required=True,
              help="Model to trace and run: zoo name, module:function, SavedModel or .pb.")
@source_options
@placement_option(required=True)
@profile_option("Profile from placetool calibrate (predictions use it; its cluster is the default).")
@click.option("--cluster", "-c", default=None, help="Cluster for predictions (default: the profile's).")
@device_options
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True,
              help="Timed steps (median), shared among the rounds.")
@click.option("--rounds", type=click.IntRange(min=0), default=3, show_default=True,
              help="Rounds interleaved with one device and the sentinel step (noise floor, paired ratio); "
                   "0: time the placement alone.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@json_option
@quiet_option
def verify(source, batch, mode, optimizer, zoo_args, placement, profile, cluster, testbed_n, timeout_s,
           testbed_device, cluster_spec, local, steps, rounds, warmup, as_json, quiet):
    """Run a placement for real and compare its measured step time with the prediction."""
    require_tf()
    from placetool.costmodel import CostModel, presets
    from placetool.costmodel.calibration import load_profile

    from .simulate import check_placement_spec, parse_placement

    prof = load_profile(profile) if profile else None
    if cluster:
        cl = presets.load_cluster(cluster)
    elif prof is not None:
        cl = prof.cluster()
    else:
        raise UserError("verify needs --profile (from placetool calibrate) or --cluster for its prediction")
    spec0 = planned_spec(testbed_n, testbed_device, cluster_spec, local)
    check_cluster_matches(cl, spec0)
    check_placement_spec(placement, cl)  # before TensorFlow loads and the model is traced (seconds)
    from placetool.costmodel.tf.runner import check_placement, measure

    t = trace_source(source, zoo_args, mode=mode, batch=batch, optimizer=optimizer)
    cm = CostModel(t.graph, cl, profile=prof)
    p = parse_placement(placement, cm)
    reason = cm.violation(p)
    if reason:
        raise UserError(f"placement refused: {reason}")
    check_placement(t.graph, p, spec0)  # before any worker starts
    sim, over = predict(cm, prof, p)
    predicted = sim + over
    log = _log(as_json or quiet)
    one = cm.single_device(int(np.bincount(p).argmax()))  # the paired reference: one device
    check_placement(t.graph, one, spec0)
    sent = None
    with devices(testbed_n, testbed_device, cluster_spec, local, timeout_s, log) as spec:
        with naming_lost_workers(spec):
            if rounds:
                from placetool.costmodel.tf.sentinel import measure_with_sentinel

                per = max(1, steps // rounds)
                log(f"measuring {t.graph.name} ({t.graph.n_ops} ops) beside one device: {rounds} rounds of "
                    f"{per} steps each, the sentinel step between rounds ...")
                (m, m1), sent = measure_with_sentinel(t, [p, one], spec, rounds=rounds, steps=per,
                                                      warmup=warmup, reference=1, timeout_s=timeout_s, log=log)
            else:
                log(f"measuring {t.graph.name} ({t.graph.n_ops} ops), {warmup} warm-up + {steps} timed steps ...")
                m = measure(t, p, spec, warmup=warmup, steps=steps, timeout_s=timeout_s)
    err = 100.0 * (predicted - m.step_us) / m.step_us
    used = sorted({cl.names[i] for i in np.unique(p)})
    out = {"graph": t.graph.name, "ops": t.graph.n_ops, "cluster": cl.name, "placement": placement,
           "devices_used": used, "measured_us": m.step_us, "predicted_us": predicted,
           "simulated_us": sim, "step_overhead_us": over, "error_pct": err, "steps_us": m.steps_us,
           "profile": profile}
    if sent is not None:
        pred_one = sum(predict(cm, prof, one))
        out.update({"noise_floor_pct": sent["noise_floor_pct"], "flagged_rounds": sent["flagged_rounds"],
                    "redone_rounds": sent["redone"], "one_device_us": m1.step_us,
                    "ratio_to_one_device": sent["paired"][0]["ratio"],
                    "ratios_to_one_device": sent["paired"][0]["ratios"],
                    "predicted_ratio_to_one_device": predicted / pred_one})
    if as_json:
        emit_json(out)
        return
    click.echo(f"{t.graph.name} ({t.graph.n_ops} ops), placement {placement} on {', '.join(used)}")
    click.echo(f"measured    {fmt_us(m.step_us)}   (median of {len(m.steps_us)} steps)")
    if sent is not None:
        click.echo(f"vs 1 device {out['ratio_to_one_device']:.3f}x one device's {fmt_us(m1.step_us)} (paired over "
                   f"{len(sent['paired_rounds'])} rounds{'' if sent['kept_rounds'] else ', every one flagged'}; "
                   f"predicted {out['predicted_ratio_to_one_device']:.3f}x)")
        click.echo(f"noise floor ±{sent['noise_floor_pct']:.1f}% (sentinel step)"
                   + (f"; rounds flagged: {sent['flagged_rounds']}" if sent["flagged_rounds"] else ""))
    click.echo(f"predicted   {fmt_us(predicted)}   (simulated {fmt_us(sim)} + step overhead {fmt_us(over)})")
    click.echo(f"error       {err:+.1f}%")
