"""Tuning on remote devices: a real TVM RPC tracker and servers on 127.0.0.1.

Every process a test starts runs in a process group of its own and is stopped by it, so a
server's forked session workers go too.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from lstm_tvm.targets import host_cpu
from lstm_tvm.tuning import database, remote

pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")

#: The devices' CPU: this machine's, named as a user names a remote one.
TARGET = json.dumps({"kind": "llvm", "mcpu": host_cpu()})
KEY = "lstm-tvm-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Devices:
    """A tracker and its servers, each in its own process group."""

    def __init__(self, tmp_path):
        self.tmp_path, self.port, self.servers = tmp_path, _free_port(), []
        self.tracker = self._start("tracker", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                   "--port", str(self.port), "--port-end", str(self.port + 1))
        self._until(lambda: self._answers(), "the tracker to listen")

    def _start(self, name, module, *args):
        log = open(self.tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return proc

    def _answers(self) -> bool:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        return False

    @staticmethod
    def _until(ready, what, timeout=60.0, interval=0.2):
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {what}")
            time.sleep(interval)

    def add_server(self, key=KEY):
        port = _free_port()
        proc = self._start(f"server{len(self.servers)}", "tvm.exec.rpc_server", "--tracker",
                           f"127.0.0.1:{self.port}", "--key", key, "--host", "127.0.0.1",
                           "--port", str(port), "--port-end", str(port + 1))
        self.servers.append(proc)
        count = len([s for s in self.servers if s.poll() is None])
        if key == KEY:
            self._until(lambda: remote._count_servers(self.tracker_of()) >= count,
                        "the server to register")
        return proc

    def tracker_of(self, key=KEY, wait=30.0):
        return remote.Tracker("127.0.0.1", self.port, key, wait=wait)

    def cli_args(self):
        return ["--rpc-tracker", f"127.0.0.1:{self.port}", "--rpc-key", KEY, "--target", TARGET]

    @staticmethod
    def kill(proc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self):
        for proc in [*self.servers, self.tracker]:
            self.kill(proc)


@pytest.fixture
def devices(tmp_path, monkeypatch):
    monkeypatch.setenv("LSTM_TVM_SCHEDULES_DIR", str(tmp_path / "schedules"))
    monkeypatch.setenv("LSTM_TVM_SHIPPED_SCHEDULES", "0")
    monkeypatch.setenv("LSTM_TVM_CACHE_DIR", str(tmp_path / "cache"))
    found = Devices(tmp_path)
    try:
        yield found
    finally:
        found.stop()


def _tune(args, timeout=600):
    return subprocess.run([sys.executable, "-m", "lstm_tvm", "tune", *args], check=False,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def _records(root):
    from lstm_tvm.targets import resolve_target

    folder = database.database_dir(resolve_target(TARGET), root)
    db = database.open_database(folder)
    return [] if db is None else list(db.get_all_tuning_records())


def test_remote_session_records_real_times_under_the_targets_key(devices, tmp_path):
    devices.add_server()
    devices.add_server()
    # the cell's gate GEMM at B=5, I=8, H=16: two of its schedules, measured by the servers
    done = _tune(["--ops", "LSTMBlockCell", "--shapes", "1x5x8x16", "--trials", "2",
                  "--seed", "0", *devices.cli_args()])
    assert done.returncode == 0, done.stderr + done.stdout
    records = _records(tmp_path / "schedules")
    assert len(records) == 2
    for record in records:
        secs = [float(s) for s in record.run_secs]
        assert secs and all(0 < s < database.FAILED_SECONDS for s in secs), secs
        assert database.records_key(record.target) == f"llvm-{host_cpu()}"
    served = sum((tmp_path / f"server{i}.log").read_text().count("load_module")
                 for i in range(2))
    assert served == 2, "each candidate ran on a server"
    assert "failed" not in done.stdout


def test_unreachable_tracker_is_one_error_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LSTM_TVM_SCHEDULES_DIR", str(tmp_path / "schedules"))
    port = _free_port()  # nothing listens there
    start = time.monotonic()
    done = _tune(["--ops", "LSTMBlockCell", "--shapes", "1x5x8x16", "--trials", "1",
                  "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", KEY, "--target", TARGET],
                 timeout=120)
    assert done.returncode == 1
    assert f"cannot reach the RPC tracker at 127.0.0.1:{port}" in done.stderr
    assert repr(KEY) in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - start < 60
    assert not (tmp_path / "schedules").exists()


def test_no_server_with_the_key_is_one_error_after_a_bounded_wait(devices, tmp_path):
    devices.add_server(key="another-key")
    from lstm_tvm.tuning import tune

    start = time.monotonic()
    with pytest.raises(remote.RemoteError, match=rf"no RPC server registered with key "
                                                 rf"'{KEY}' at tracker 127.0.0.1:{devices.port} "
                                                 rf"within 2 s; start one"):
        tune(["LSTMBlockCell"], ["float32"], [(1, 5, 8, 16)], TARGET, trials=1,
             progress=False, tracker=devices.tracker_of(wait=2.0))
    assert 2 <= time.monotonic() - start < 30
    assert not (tmp_path / "schedules").exists()


def test_a_server_killed_mid_session_fails_its_candidates_and_the_session_goes_on(devices,
                                                                                  tmp_path):
    first = devices.add_server()
    devices.add_server()
    args = ["--ops", "LSTMBlockCell", "--shapes", "8x64x256x256", "--trials", "8", "--seed",
            "0", *devices.cli_args()]
    log = tmp_path / "server0.log"
    with subprocess.Popen([sys.executable, "-m", "lstm_tvm", "tune", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ)) as session:
        # killed as soon as it loads its first candidate, which it then measures for over
        # 100 ms (five repeats of at least 20 ms); a kill while the session opens would only
        # make TVM's client ask the tracker for another server
        Devices._until(lambda: "load_module" in log.read_text(), "a measurement on server 0",
                       timeout=300, interval=0.01)
        devices.kill(first)
        out, err = session.communicate(timeout=600)
    assert session.returncode == 0, err + out
    records = _records(tmp_path / "schedules")  # the database still loads
    assert len(records) == 8
    failed = [r for r in records if database.failed(r)]
    for record in records:
        secs = [float(s) for s in record.run_secs]
        assert all(s >= database.FAILED_SECONDS for s in secs) or all(
            0 < s < database.FAILED_SECONDS for s in secs), secs
    assert 1 <= len(failed) < 8, "the killed server's candidate failed, the other server ran"
    assert f"{len(failed)} measurement" in out and "failed" in out


def test_every_server_gone_fails_measurements_without_waiting(devices, tmp_path):
    from lstm_tvm.tuning import tune

    server = devices.add_server()
    tracker = devices.tracker_of()
    remote.wait_for_servers(tracker)
    devices.kill(server)
    devices._until(lambda: remote._count_servers(tracker) == 0, "the tracker to drop it")
    tracker = devices.tracker_of(wait=0.0)
    with pytest.raises(remote.RemoteError, match="no RPC server registered"):
        tune(["LSTMBlockCell"], ["float32"], [(1, 5, 8, 16)], TARGET, trials=1,
             progress=False, tracker=tracker)
    with pytest.raises(remote.RemoteError, match="no RPC server left"):
        remote._create_session(tracker.config())


def test_rpc_options_are_checked_before_any_work():
    from click.testing import CliRunner

    from lstm_tvm import cli

    runner = CliRunner()
    alone = runner.invoke(cli.main, ["tune", "--rpc-tracker", "127.0.0.1:9190"])
    assert alone.exit_code == 2 and "--rpc-tracker and --rpc-key go together" in alone.output
    bad = runner.invoke(cli.main, ["tune", "--rpc-tracker", "nowhere", "--rpc-key", "k"])
    assert bad.exit_code == 2 and "expected HOST:PORT" in bad.output


def test_a_target_of_another_architecture_is_not_measured_here(tmp_path, monkeypatch):
    monkeypatch.setenv("LSTM_TVM_SCHEDULES_DIR", str(tmp_path / "schedules"))
    from lstm_tvm.tuning import tune

    from lstm_tvm.targets import resolve_target
    from lstm_tvm.schedule.traits import cpu_traits

    host = cpu_traits(resolve_target("llvm")).arch
    other, arch = (({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}, "x86_64")
                   if host == "aarch64" else
                   ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
                    "aarch64"))
    with pytest.raises(ValueError, match=rf"an {arch} target cannot be measured on this {host} "
                                         rf"machine; measure it on its devices"):
        tune(["LSTMBlockCell"], ["float32"], [(1, 5, 8, 16)], other, trials=1, progress=False)
    assert not (tmp_path / "schedules").exists()
