"""`placetool testbed status/down` on recorded state, without starting TensorFlow:
stale and recycled pids, degraded exit status, damaged state files, log folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from placetool.cli.main import main
from placetool.costmodel.tf.testbed import free_ports


def call(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def state_file(tmp_path, pids, log_dir=None, **extra):
    ports = free_ports(len(pids))
    d = {"format": "placetool.testbed", "version": 1, "pids": pids,
         "spec": {"workers": [f"localhost:{p}" for p in ports],
                  "tf_devices": [f"/job:worker/replica:0/task:{k}/device:CPU:0" for k in range(len(pids))],
                  "kinds": ["cpu"] * len(pids), "job": "worker"}, **extra}
    if log_dir is not None:
        d["log_dir"] = str(log_dir)
    p = tmp_path / "testbed.json"
    p.write_text(json.dumps(d))
    return p


@pytest.fixture
def unrelated_process():
    """A live process that is not a testbed worker (stands for a recycled pid)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p.pid
    p.kill()
    p.wait()


def test_recycled_pid_is_not_alive_and_status_is_degraded(tmp_path, capsys, unrelated_process):
    st = state_file(tmp_path, [unrelated_process])
    code, out, _ = call(["testbed", "status", "--state", st, "--json"], capsys)
    assert code == 1
    d = json.loads(out)
    assert d["up"] is False and d["workers"][0]["alive"] is False
    code, out, _ = call(["testbed", "status", "--state", st], capsys)
    assert code == 1 and "DEGRADED" in out and "dead" in out
    # down never signals a process that is not its worker
    code, _, _ = call(["testbed", "down", "--state", st], capsys)
    assert code == 0 and not st.exists()
    os.kill(unrelated_process, 0)  # still running


def test_no_testbed_is_not_an_error(tmp_path, capsys):
    code, out, _ = call(["testbed", "status", "--state", tmp_path / "none.json", "--json"], capsys)
    assert code == 0 and json.loads(out)["up"] is False


@pytest.mark.parametrize("content", [
    None,                                                     # a folder at the state path
    "{not json",
    json.dumps({"format": "placetool.testbed"}),              # no spec, no pids
    json.dumps({"format": "placetool.testbed", "pids": ["x"], "spec": {"workers": [], "tf_devices": [],
                                                                        "kinds": []}}),
    json.dumps([1, 2]),
])
@pytest.mark.parametrize("verb", ["status", "down"])
def test_damaged_state_file(tmp_path, capsys, content, verb):
    st = tmp_path / "testbed.json"
    if content is None:
        st.mkdir()
    else:
        st.write_text(content)
    code, out, err = call(["testbed", verb, "--state", st], capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(st) in err


def test_state_without_log_dir(tmp_path, capsys):
    st = state_file(tmp_path, [2 ** 22 + 12345])  # a pid that does not exist
    code, out, _ = call(["testbed", "status", "--state", st, "--json"], capsys)
    assert code == 1 and json.loads(out)["log_dir"] is None
    code, _, err = call(["testbed", "down", "--state", st], capsys)
    assert code == 0, err


@pytest.mark.parametrize("keep", [False, True])
def test_down_removes_the_log_folder_unless_kept(tmp_path, capsys, keep):
    logs = Path(tempfile.mkdtemp(prefix="placetool-testbed-", dir=tmp_path))
    (logs / "worker0.log").write_text("listening\n")
    st = state_file(tmp_path, [2 ** 22 + 12345], log_dir=logs, own_log_dir=True)
    code, out, _ = call(["testbed", "down", "--state", st, "--json"] + (["--keep-logs"] if keep else []), capsys)
    assert code == 0
    assert logs.exists() == keep
    assert json.loads(out)["removed_logs"] == (None if keep else str(logs))


def test_down_keeps_a_log_folder_it_did_not_make(tmp_path, capsys):
    logs = tmp_path / "my-logs"
    logs.mkdir()
    st = state_file(tmp_path, [2 ** 22 + 12345], log_dir=logs, own_log_dir=False)
    assert call(["testbed", "down", "--state", st], capsys)[0] == 0
    assert logs.is_dir()


@pytest.mark.slow
def test_gpu_testbed_without_a_gpu_fails_at_up(tmp_path):
    pytest.importorskip("tensorflow")
    if Path("/dev/nvidia0").exists():
        pytest.skip("this machine has a GPU")
    before = set(Path(tempfile.gettempdir()).glob("placetool-testbed-*"))
    st = tmp_path / "testbed.json"
    r = subprocess.run([sys.executable, "-m", "placetool.cli.main", "testbed", "up", "--workers", "1",
                        "--device", "gpu", "--state", str(st)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "worker 0" in r.stderr and "no GPU visible" in r.stderr
    assert not st.exists()
    new = set(Path(tempfile.gettempdir()).glob("placetool-testbed-*")) - before  # others may start testbeds
    assert not [d for d in new if "no GPU visible" in (d / "worker0.log").read_text(errors="replace")
                if (d / "worker0.log").exists()]  # its log folder is gone


CPU2 = """name = "cpu2"
[[devices]]
name = "cpu:0"
kind = "cpu"
memory_bytes = 8589934592
[[devices]]
name = "cpu:1"
kind = "cpu"
memory_bytes = 8589934592
[links.default]
latency_us = 100.0
bandwidth_bytes_per_us = 1000.0
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("task", [0, 1])
def test_worker_killed_during_verify_is_named_within_the_timeout(tmp_path, task):
    """Task 0 is the session's master: gRPC alone left the client waiting 30-55 s after
    its death; task 1's death failed the step at once but closing the session waited 20 s."""
    pytest.importorskip("tensorflow")
    import signal
    import time

    from placetool.costmodel.tf.testbed import Testbed

    (tmp_path / "cpu2.toml").write_text(CPU2)
    timeout = 20
    with Testbed.start(2, timeout_s=180) as tb:
        (tmp_path / "spec.json").write_text(json.dumps({"worker": tb.spec.workers}))
        p = subprocess.Popen([sys.executable, "-m", "placetool.cli.main", "verify", "-g", "mlp", "--batch", "16",
                              "-p", "round-robin", "-c", "cpu2.toml", "--cluster-spec", "spec.json",
                              "--steps", "1000000", "--warmup", "1", "--timeout", str(timeout)],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err = ""
        for line in p.stderr:  # wait until it measures
            err += line
            if "measuring" in line:
                break
        time.sleep(3)
        os.kill(tb.pids[task], signal.SIGKILL)
        killed = time.monotonic()
        out, rest = p.communicate(timeout=300)
        waited = time.monotonic() - killed
        err += rest
    assert p.returncode == 2, err
    assert waited < timeout + 5, (waited, err)
    assert "Traceback" not in err and "SessionCloseThread" not in err, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"placetool: error: worker /job:worker/task:{task} at localhost:"), err
    assert len([x for x in lines if not x.startswith(("WARNING", "I0000", "E0000", "W0000"))]) == 2, err
