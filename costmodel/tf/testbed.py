"""A local TF testbed: N ``tf.distribute.Server`` worker processes, one device each.

Each worker is its own process on a free localhost port, pinned to one core, with
single-threaded op pools (intra- and inter-op = 1), so one worker runs one op at a time,
as the simulator assumes; transfers between workers go over gRPC. With ``device="gpu"``
worker k sees only GPU k (``CUDA_VISIBLE_DEVICES``) and its device is ``GPU:0`` —
the same runner then drives a multi-GPU machine.

Nothing here hangs: a worker that does not listen within ``timeout_s`` is an error that
names it, and every worker this module starts is stopped again (process group, atexit,
SIGTERM/SIGINT handlers, and the workers die with their parent unless detached for
``placetool testbed up``).

>>> # with Testbed.start(2) as tb:  tb.tf_devices -> ['/job:worker/replica:0/task:0/device:CPU:0', ...]
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path

from placetool.costmodel.errors import UserError, atomic_write, read_parsed
from placetool.costmodel.procs import process_alive

MARKER = "placetool-testbed-worker"
DEFAULT_TIMEOUT_S = 60.0


class TestbedError(UserError):
    """A worker did not start, is unreachable, or a state/cluster-spec file is wrong."""

    __test__ = False  # not a pytest class


def default_state_path() -> Path:
    """Where ``placetool testbed up`` records its workers (override: PLACETOOL_TESTBED_STATE)."""
    env = os.environ.get("PLACETOOL_TESTBED_STATE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "placetool" / "testbed.json"


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on localhost (held open together so they differ)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("localhost", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def port_open(address: str, timeout_s: float = 1.0) -> bool:
    """True if something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "localhost", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


@dataclass
class ClusterSpec:
    """Where the workers are and which TF device each placetool device is.

    ``workers``: ``host:port`` of each task of job ``job``; ``tf_devices``: one TF device
    string per placetool device, in cluster order (several may live on one task, e.g.
    ``task:0/device:GPU:0`` and ``task:0/device:GPU:1``); ``kinds``: "cpu"/"gpu" each.
    """

    workers: list[str]
    tf_devices: list[str]
    kinds: list[str]
    job: str = "worker"

    @property
    def target(self) -> str:
        """Session target: worker 0's master, or "" (in-process) for local devices."""
        return f"grpc://{self.workers[0]}" if self.workers else ""

    def cluster_def(self) -> dict:
        return {self.job: list(self.workers)}

    @classmethod
    def for_workers(cls, workers, device="cpu", job="worker") -> "ClusterSpec":
        """One device per task: ``/job:JOB/replica:0/task:K/device:CPU:0`` (or GPU:0)."""
        dev = "GPU" if device == "gpu" else "CPU"
        return cls(
            workers=list(workers),
            tf_devices=[f"/job:{job}/replica:0/task:{k}/device:{dev}:0" for k in range(len(workers))],
            kinds=[device] * len(workers),
            job=job,
        )

    @classmethod
    def load(cls, path) -> "ClusterSpec":
        """A cluster-spec JSON file: ``{"worker": ["host:port", ...]}`` (TF's own form), or
        ``{"job": "worker", "workers": [...], "devices": [{"tf": "/job:...", "kind": "gpu"}, ...]}``.
        """
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise TestbedError(f"{path}: no such cluster-spec file") from None
        except ValueError as e:
            raise TestbedError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise TestbedError(f"{path}: expected a JSON object")
        if "workers" in d:
            job = d.get("job", "worker")
            workers = d["workers"]
            devs = d.get("devices")
        else:
            jobs = [k for k, v in d.items() if isinstance(v, list)]
            if len(d) == 1 and not jobs:
                (job, tasks), = d.items()
                raise TestbedError(f"{path}: job {job!r} must list its tasks, e.g. [\"host:port\", ...]; "
                                   f"got {tasks!r}")
            if len(jobs) != 1:
                raise TestbedError(f"{path}: expected exactly one job (e.g. {{\"worker\": [\"host:port\", ...]}})")
            job, workers, devs = jobs[0], d[jobs[0]], None
        if not workers or not all(isinstance(w, str) and ":" in w for w in workers):
            raise TestbedError(f"{path}: workers must be a non-empty list of 'host:port' strings")
        if devs is None:
            return cls.for_workers(workers, "cpu", job)
        tf_devices, kinds = [], []
        for i, e in enumerate(devs):
            if not isinstance(e, dict) or "tf" not in e:
                raise TestbedError(f"{path}: devices[{i}] needs a 'tf' device string")
            kind = e.get("kind", "gpu" if "GPU" in e["tf"].upper() else "cpu")
            if kind not in ("cpu", "gpu"):
                raise TestbedError(f"{path}: devices[{i}]: kind {kind!r} is not cpu or gpu")
            tf_devices.append(e["tf"])
            kinds.append(kind)
        return cls(list(workers), tf_devices, kinds, job)

    def check_reachable(self, timeout_s: float = 10.0) -> None:
        """TCP-probe every task; TestbedError names the first one that does not answer.

        TF's master waits forever for a missing task, so this runs before any session.
        """
        deadline = time.monotonic() + timeout_s
        pending = list(enumerate(self.workers))
        while pending:
            pending = [(k, a) for k, a in pending if not port_open(a, timeout_s=0.5)]
            if not pending:
                return
            if time.monotonic() >= deadline:
                k, a = pending[0]
                raise TestbedError(
                    f"worker /job:{self.job}/task:{k} at {a} is not reachable after {timeout_s:g} s "
                    "(is the testbed up? `placetool testbed status`)"
                )
            time.sleep(0.1)


# ------------------------------------------------------------------ the testbed
_LIVE: "weakref.WeakSet[Testbed]" = weakref.WeakSet()
_HANDLERS_INSTALLED = False


def _cleanup_all(*_args) -> None:
    for tb in list(_LIVE):
        tb.stop()


def _install_handlers() -> None:
    """Stop every live testbed at exit; SIGTERM unwinds like SIGINT (KeyboardInterrupt):
    the context managers stop the workers, atexit catches the rest."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_cleanup_all)
    try:
        prev = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):
            # unwind like Ctrl-C: sessions close while their workers still run, then the
            # context managers (and atexit) stop the workers
            if callable(prev):
                prev(signum, frame)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: atexit still covers normal exits
        pass


@dataclass(eq=False)
class Testbed:
    """N local worker processes; use as a context manager or :meth:`start`/:meth:`stop`."""

    spec: ClusterSpec
    pids: list[int]
    log_dir: str | None
    detached: bool = False
    _procs: list = field(default_factory=list, repr=False)
    #: the log folder was made for this testbed (a temporary one): removed by :meth:`stop`
    own_log_dir: bool = False
    #: ``host:port`` of each worker's TensorFlow profiler server (started with ``profiler=True``)
    profiler_addresses: list[str] = field(default_factory=list)

    @property
    def n_workers(self) -> int:
        return len(self.pids)

    @property
    def tf_devices(self) -> list[str]:
        return self.spec.tf_devices

    @classmethod
    def start(cls, n_workers: int, device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S,
              detached: bool = False, log_dir=None, cores=None, onednn: bool = False,
              profiler: bool = False) -> "Testbed":
        """Start ``n_workers`` servers and wait until each listens (or raise, stopping all).

        ``detached``: survive this process (for ``testbed up``); otherwise the workers die
        with it. ``cores``: cores to pin to, round-robin (default: this process's affinity).
        ``profiler``: each worker also serves TensorFlow's profiler
        (:attr:`profiler_addresses`; :mod:`placetool.costmodel.tf.host_trace` reads it).
        """
        if n_workers < 1:
            raise TestbedError(f"a testbed needs at least 1 worker, got {n_workers}")
        if device not in ("cpu", "gpu"):
            raise TestbedError(f"testbed device must be cpu or gpu, got {device!r}")
        cores = sorted(cores or os.sched_getaffinity(0))
        own = log_dir is None
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="placetool-testbed-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * n_workers if profiler else n_workers)
        workers = [f"localhost:{p}" for p in ports[:n_workers]]
        spec = ClusterSpec.for_workers(workers, device)
        tb = cls(spec, [], str(log_dir), detached, own_log_dir=own,
                 profiler_addresses=[f"localhost:{p}" for p in ports[n_workers:]])
        _install_handlers()
        _LIVE.add(tb)
        try:
            for k in range(n_workers):
                env = dict(os.environ)
                env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
                # oneDNN rewrites kernels with their own thread pools; off keeps one thread per worker
                env["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
                env["OMP_NUM_THREADS"] = "1"
                if device == "gpu":
                    env["CUDA_VISIBLE_DEVICES"] = str(k)
                else:
                    env["CUDA_VISIBLE_DEVICES"] = ""
                args = [sys.executable, "-m", "placetool.costmodel.tf.testbed", MARKER,
                        "--cluster", json.dumps(spec.cluster_def()), "--task", str(k),
                        "--core", str(cores[k % len(cores)]), "--device", device]
                if not detached:
                    args += ["--parent", str(os.getpid())]
                if profiler:
                    args += ["--profiler-port", tb.profiler_addresses[k].rsplit(":", 1)[1]]
                log = open(log_dir / f"worker{k}.log", "wb")
                p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True, cwd=log_dir)
                log.close()
                tb._procs.append(p)
                tb.pids.append(p.pid)
            tb.wait_ready(timeout_s)
        except BaseException:
            tb.stop()
            raise
        return tb

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until every worker accepts connections; a dead or silent worker is an error."""
        deadline = time.monotonic() + timeout_s
        pending = set(range(self.n_workers))
        while pending:
            for k in sorted(pending):
                if not _alive(self.pids[k], self._procs[k] if self._procs else None):
                    raise TestbedError(f"testbed worker {k} exited while starting: {self._log_tail(k)}")
                if port_open(self.spec.workers[k], 0.2):
                    pending.discard(k)
            if pending and time.monotonic() > deadline:
                k = min(pending)
                raise TestbedError(
                    f"testbed worker {k} ({self.spec.workers[k]}) not ready after {timeout_s:g} s: {self._log_tail(k)}"
                )
            if pending:
                time.sleep(0.1)

    def _log_tail(self, k: int) -> str:
        if not self.log_dir:
            return "(no log)"
        try:
            text = (Path(self.log_dir) / f"worker{k}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-3:]) or "(empty log)"

    def stop(self, grace_s: float = 3.0, keep_logs: bool = False) -> None:
        """Stop every worker: SIGTERM its process group, SIGKILL after ``grace_s``; then
        remove the log folder if this testbed made it (unless ``keep_logs``)."""
        pids = list(self.pids)
        for pid in pids:
            if _is_our_worker(pid):
                _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for i, pid in enumerate(pids):
            proc = self._procs[i] if i < len(self._procs) else None
            while _alive(pid, proc) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid, proc):
                _signal_group(pid, signal.SIGKILL)
            if proc is not None:
                try:
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
        self.pids = []
        self._procs = []
        _LIVE.discard(self)
        if self.own_log_dir and self.log_dir and not keep_logs:
            import shutil

            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.own_log_dir = False

    def status(self) -> list[dict]:
        """Each worker: address, pid, alive (a live process that is still our worker: a
        recycled pid is not), listening."""
        return [
            {"task": k, "address": a, "pid": pid, "alive": _alive(pid) and _is_our_worker(pid),
             "listening": port_open(a, 0.5), "device": self.spec.tf_devices[k]}
            for k, (a, pid) in enumerate(zip(self.spec.workers, self.pids))
        ]

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    # --------------------------------------------------------------- state file
    def save_state(self, path=None) -> Path:
        path = Path(path or default_state_path())
        d = {"format": "placetool.testbed", "version": 1, "pids": self.pids, "log_dir": self.log_dir,
             "own_log_dir": self.own_log_dir, "spec": asdict(self.spec),
             "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write(path, json.dumps(d, indent=1) + "\n")
        return path

    @classmethod
    def from_state(cls, path=None) -> "Testbed":
        path = Path(path or default_state_path())
        d = read_parsed(path, lambda p: json.loads(p.read_text()), TestbedError, "testbed state",
                        "malformed testbed state", (ValueError, UnicodeDecodeError),
                        missing=f"no testbed is up (no state file {path}); start one with `placetool testbed up`",
                        unreadable=" the testbed state")
        if not isinstance(d, dict) or d.get("format") != "placetool.testbed":
            raise TestbedError(f"{path}: not a placetool testbed state file")
        try:
            spec = ClusterSpec(**d["spec"])
            pids = [int(p) for p in d["pids"]]
            if not (len(pids) == len(spec.workers) == len(spec.tf_devices) == len(spec.kinds)):
                raise ValueError("pids, workers and devices differ in number")
        except (KeyError, TypeError, ValueError) as e:
            raise TestbedError(f"{path}: malformed testbed state ({type(e).__name__}: {e})") from None
        log_dir = d.get("log_dir")
        log_dir = log_dir if isinstance(log_dir, str) else None
        own = d.get("own_log_dir", bool(log_dir) and Path(log_dir).name.startswith("placetool-testbed-"))
        return cls(spec, pids, log_dir, detached=True, own_log_dir=bool(own))


def _alive(pid: int, proc=None) -> bool:
    if proc is not None:
        return proc.poll() is None
    return process_alive(pid)
    # a zombie is not alive
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _is_our_worker(pid: int) -> bool:
    """Never signal a pid that was reused by an unrelated process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return MARKER.encode() in f.read()
    except OSError:
        return False


def _signal_group(pid: int, sig) -> None:
    """Signal the worker's own process group (it leads one: start_new_session)."""
    if not _is_our_worker(pid):
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


# ------------------------------------------------------------------ worker main
def _die_with_parent(parent: int) -> None:
    """Exit when the parent goes away: PR_SET_PDEATHSIG plus a polling thread."""
    import threading

    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(0)

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def _worker_main(argv) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="placetool testbed worker")
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--task", type=int, required=True)
    ap.add_argument("--core", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--parent", type=int, default=None)
    ap.add_argument("--profiler-port", type=int, default=None)
    a = ap.parse_args(argv)
    if a.parent:
        _die_with_parent(a.parent)
    # SIGTERM keeps its default action: the main thread sits in server.join() (C++),
    # where a Python handler would never run
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if a.core is not None:
        os.sched_setaffinity(0, {a.core})
    import tensorflow as tf

    if a.device == "gpu" and not tf.config.list_physical_devices("GPU"):
        # without this the server starts anyway and the first session fails deep in TF
        print(f"placetool testbed worker {a.task}: no GPU visible (CUDA_VISIBLE_DEVICES="
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}); TensorFlow lists none", flush=True)
        sys.exit(3)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1,
        inter_op_parallelism_threads=1,
        device_count={"CPU": 1, "GPU": 1 if a.device == "gpu" else 0},
        allow_soft_placement=False,
    )
    if a.device == "gpu":
        config.gpu_options.allow_growth = True
    server = tf.distribute.Server(
        tf.train.ClusterSpec(json.loads(a.cluster)), job_name=next(iter(json.loads(a.cluster))),
        task_index=a.task, config=config, start=True,
    )
    if a.profiler_port:
        tf.profiler.experimental.server.start(a.profiler_port)
    print(f"placetool testbed worker {a.task} listening at {server.target}", flush=True)
    server.join()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == MARKER:
        _worker_main(sys.argv[2:])
    else:
        sys.exit("this module is started by placetool (placetool testbed up)")
