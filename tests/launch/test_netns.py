"""Tests of ``tfcompress launch --bandwidth``: workers in shaped network namespaces.

The tests that create namespaces need root and ``ip``/``tc`` (iproute2), and are
skipped without them; argument checking and the error messages for a missing root or
missing tools are tested everywhere.
"""

import doctest
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.launching import (
    launcher_env,
    process_alive,
    python_worker,
)
from tests.multiworker import default_termination_signals
from tfcompress.cli import main as cli_main
from tfcompress.launch import NetnsError, launch, netns


def _netns_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc") if netns._find_tool(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (Debian package iproute2)"
    return None


requires_netns = pytest.mark.skipif(
    _netns_unavailable_reason() is not None, reason=str(_netns_unavailable_reason())
)


def run_module_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfcompress.launch", *args],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def namespaces() -> list[str]:
    listing = subprocess.run(["ip", "-json", "netns", "list"], capture_output=True, text=True)
    return [entry["name"] for entry in json.loads(listing.stdout or "[]")]


def namespaces_of(pid: int) -> list[str]:
    return [name for name in namespaces() if name.startswith(f"tfc-{pid}-")]


def root_links() -> set[str]:
    listing = subprocess.run(["ip", "-json", "link", "show"], capture_output=True, text=True)
    return {link["ifname"] for link in json.loads(listing.stdout)}


def wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def leaves_nothing_behind():
    """Checks that the test leaves no namespace of this process and no new host link."""
    links_before = root_links()
    yield
    assert namespaces_of(os.getpid()) == []
    assert root_links() == links_before


# Connects to worker 1's TF_CONFIG address, retrying until it listens.
CONNECT_TO_WORKER_1 = """
import json, os, socket, time
tf_config = json.loads(os.environ["TF_CONFIG"])
index = tf_config["task"]["index"]
host, port = tf_config["cluster"]["worker"][1].rsplit(":", 1)
port = int(port)

def connect():
    for _ in range(200):
        try:
            return socket.create_connection((host, port), timeout=10)
        except OSError:
            time.sleep(0.02)
    raise SystemExit("worker 1 never listened")

def listen():
    server = socket.create_server((host, port))
    connection, _ = server.accept()
    return connection
"""


# Without a namespace: parsing, tc arguments, error messages.


def test_docstring_examples():
    failures, _ = doctest.testmod(netns)
    assert failures == 0


@pytest.mark.parametrize(
    "text, bits",
    [
        ("100mbit", 100_000_000),
        ("1gbit", 10**9),
        ("1Gbit", 10**9),
        ("500kbit", 500_000),
        ("2.5 mbit", 2_500_000),
        ("10mbps", 80_000_000),
        ("1mibit", 2**20),
        ("8000bit", 8000),
    ],
)
def test_parse_rate(text, bits):
    assert netns.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["fast", "100", "100mb", "-5mbit", "mbit", "1 gbit/s", "10bit"])
def test_parse_rate_rejects(text):
    with pytest.raises(ValueError, match="--bandwidth"):
        netns.parse_rate(text)


def test_qdisc_commands():
    (tbf,) = netns.qdisc_commands("w0", 10**9)
    # 1 ms of traffic in the bucket, 100 ms in the queue.
    assert (
        tbf
        == "qdisc add dev w0 root handle 10: tbf rate 1000000000bit burst 125000 limit 12500000".split()
    )
    (tbf,) = netns.qdisc_commands("w0", 1_000_000)
    assert tbf[-4:] == ["burst", "15140", "limit", "30280"]  # at least ten full frames
    netem, tbf = netns.qdisc_commands("eth0", 10**9, latency_ms=20)
    assert netem == "qdisc add dev eth0 root handle 1: netem delay 20ms limit 5000".split()
    assert tbf[:9] == "qdisc add dev eth0 parent 1:1 handle 10: tbf".split()


def test_invalid_arguments():
    with pytest.raises(ValueError, match="--bandwidth"):
        launch(["true"], 2, bandwidth="fast", stream=None)
    with pytest.raises(ValueError, match="--latency needs --bandwidth"):
        launch(["true"], 2, latency_ms=5, stream=None)
    with pytest.raises(ValueError, match="--latency"):
        launch(["true"], 2, bandwidth="1gbit", latency_ms=-1, stream=None)
    with pytest.raises(ValueError, match="num_workers"):
        launch(["true"], 255, bandwidth="1gbit", stream=None)


def test_describe_says_what_is_set_up():
    cluster = netns.BandwidthLimitedCluster(3, "12.5mbps", latency_ms=20)
    stem = cluster.switch_namespace.removesuffix("-sw")
    assert cluster.describe() == (
        f"3 workers in network namespaces {stem}-w0..w2, each on a veth link to a bridge in "
        f"{stem}-sw, shaped to 100 Mbit/s each way (tbf), 20 ms one-way delay (netem)"
    )
    cluster.addresses = ["10.213.9.1", "10.213.9.2", "10.213.9.3"]  # as open() sets them
    assert f"{stem}-w0..w2 (10.213.9.1..10.213.9.3), each" in cluster.describe()
    single = netns.BandwidthLimitedCluster(1, "1gbit").describe()
    assert single.startswith("1 worker in network namespace tfc-")
    assert single.endswith("shaped to 1 Gbit/s each way (tbf), no added delay")


def test_not_root_is_reported(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    message = (
        "needs root to create network namespaces "
        "(run as root, or drop --bandwidth for unlimited loopback mode)"
    )
    with pytest.raises(NetnsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        launch(["true"], 2, bandwidth="100mbit", stream=None)
    assert cli_main(["launch", "-n", "2", "--bandwidth", "100mbit", "--", "true"]) == 2
    assert f"tfcompress launch: {message}" in capsys.readouterr().err


def test_missing_tools_are_reported(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns, "_find_tool", lambda name: None if name == "tc" else "/sbin/ip")
    with pytest.raises(NetnsError, match="needs `tc` .* Debian package iproute2") as error:
        launch(["true"], 2, bandwidth="100mbit", stream=None)
    assert "`ip`" not in str(error.value)
    assert "drop --bandwidth for unlimited loopback mode" in str(error.value)
    assert cli_main(["launch", "-n", "2", "--bandwidth", "1gbit", "--", "true"]) == 2
    assert "needs `tc`" in capsys.readouterr().err


def test_cli_usage_errors():
    completed = run_module_cli("-n", "2", "--bandwidth", "fast", "--", "true")
    assert completed.returncode == 2
    assert "argument --bandwidth: must be a rate like 100mbit" in completed.stderr
    completed = run_module_cli("-n", "2", "--latency", "5", "--", "true")
    assert completed.returncode == 2
    assert "--latency needs --bandwidth" in completed.stderr
    completed = run_module_cli("-n", "2", "--bandwidth", "1gbit", "--latency", "-3", "--", "true")
    assert completed.returncode == 2


# With namespaces.


@requires_netns
def test_the_network_is_announced_before_the_workers_start(tmp_path, capsys, leaves_nothing_behind):
    started = tmp_path / "started"
    worker = python_worker(f"import pathlib; pathlib.Path({str(started)!r}).touch()")

    class Messages:
        lines = []

        def write(self, text):
            self.lines.append((text, started.exists()))

        def flush(self):
            pass

    messages = Messages()
    # No --latency: the delay needs sch_netem, which not every kernel has (see below).
    result = launch(worker, 2, timeout=30, bandwidth="100mbit", stream=None, messages=messages)
    assert result.returncode == 0, result.format_logs()
    assert started.exists()
    [(line, worker_started)] = messages.lines
    assert not worker_started
    assert line.startswith("tfcompress launch: bandwidth-limited network: 2 workers in network ")
    assert "-w0..w1 (10.213." in line and "shaped to 100 Mbit/s each way" in line
    assert line.endswith(" each way (tbf), no added delay\n")
    # tfcompress launch prints it on stderr
    assert cli_main(["launch", "-n", "1", "--bandwidth", "1gbit", "--", "true"]) == 0
    err = capsys.readouterr().err
    assert "tfcompress launch: bandwidth-limited network: 1 worker in network namespace " in err
    assert "shaped to 1 Gbit/s each way (tbf), no added delay" in err


@requires_netns
def test_workers_reach_each_other_in_namespaces(leaves_nothing_behind):
    worker = python_worker(
        CONNECT_TO_WORKER_1
        + """
import errno
report = {"pgid_is_pid": os.getpgid(0) == os.getpid(), "netns": os.readlink("/proc/self/ns/net")}
if index == 1:
    connection = listen()
    connection.sendall(connection.recv(100).upper())
else:
    with connect() as connection:
        connection.sendall(b"hello from worker 0")
        report["reply"] = connection.recv(100).decode()
    # Loopback works inside the namespace; nothing outside it is reachable.
    with socket.create_server(("127.0.0.1", 0)) as server:
        socket.create_connection(server.getsockname()).close()
    try:
        socket.create_connection(("192.0.2.1", 80), timeout=2)
    except OSError as error:
        report["outside"] = errno.errorcode.get(error.errno, str(error))
print(json.dumps(report))
"""
    )
    result = launch(worker, 2, timeout=30, bandwidth="100mbit", stream=None)
    assert result.returncode == 0, result.format_logs()
    reports = [json.loads(log) for log in result.logs]
    hosts = [address.rsplit(":", 1)[0] for address in result.worker_addresses]
    assert result.worker_addresses[0].endswith(":20000")
    assert hosts[0].startswith("10.213.") and hosts[0] != hosts[1]
    assert reports[0]["reply"] == "HELLO FROM WORKER 0"
    assert reports[0]["outside"] == "ENETUNREACH"
    # ``ip netns exec`` execs the command: the worker leads its own process group.
    assert all(report["pgid_is_pid"] for report in reports)
    launcher_netns = os.readlink("/proc/self/ns/net")
    assert len({launcher_netns, reports[0]["netns"], reports[1]["netns"]}) == 3


MEASURE_THROUGHPUT = (
    CONNECT_TO_WORKER_1
    + """
size = int(os.environ.get("TFC_TEST_BYTES", "3000000"))
if index == 1:
    connection = listen()
    received, start = 0, None
    while chunk := connection.recv(1 << 16):
        start = start or time.monotonic()
        received += len(chunk)
    elapsed = time.monotonic() - start
    print(json.dumps({"bytes": received, "mbit_per_s": received * 8 / elapsed / 1e6}))
else:
    with connect() as connection:
        connection.sendall(b"x" * size)
"""
)


@requires_netns
def test_throughput_matches_bandwidth(leaves_nothing_behind):
    result = launch(
        python_worker(MEASURE_THROUGHPUT), 2, timeout=30, bandwidth="20mbit", stream=None
    )
    assert result.returncode == 0, result.format_logs()
    measured = json.loads(result.logs[1])
    print(
        f"3 MB from worker 0 to worker 1 at --bandwidth 20mbit: {measured['mbit_per_s']:.2f} Mbit/s"
    )
    assert measured["bytes"] == 3_000_000
    # Goodput: the link carries TCP/IP headers too, about 4% at full-size frames.
    assert 0.6 * 20 <= measured["mbit_per_s"] <= 1.1 * 20


@requires_netns
def test_a_message_smaller_than_10ms_of_traffic_is_not_sent_faster_than_the_rate(
    leaves_nothing_behind, monkeypatch
):
    # 150 KB at 100 Mbit/s: 12 ms at the rate. A token bucket of 10 ms (125 KB)
    # on each side let most of it through at memory speed (about 4 ms): every
    # collective payload under 125 KB crossed a "100 Mbit/s" link for free.
    monkeypatch.setenv("TFC_TEST_BYTES", "150000")
    result = launch(
        python_worker(MEASURE_THROUGHPUT), 2, timeout=30, bandwidth="100mbit", stream=None
    )
    assert result.returncode == 0, result.format_logs()
    measured = json.loads(result.logs[1])
    print(f"150 KB from worker 0 to worker 1 at --bandwidth 100mbit: {measured}")
    assert measured["bytes"] == 150_000
    # Timed from the first chunk received: the bucket's 15 KB (ten frames) and
    # the first recv are not timed, so the rate reads somewhat high; 10 ms of
    # bucket read 5-10x.
    assert measured["mbit_per_s"] <= 2 * 100


@requires_netns
def test_latency_adds_round_trip_delay(leaves_nothing_behind):
    worker = python_worker(
        CONNECT_TO_WORKER_1
        + """
if index == 1:
    connection = listen()
    while data := connection.recv(100):
        connection.sendall(data)
else:
    with connect() as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        round_trips = []
        for _ in range(6):
            start = time.monotonic()
            connection.sendall(b"ping")
            connection.recv(100)
            round_trips.append(time.monotonic() - start)
    print(json.dumps({"rtt_ms": sorted(round_trips)[len(round_trips) // 2] * 1000}))
"""
    )
    try:
        result = launch(worker, 2, timeout=30, bandwidth="100mbit", latency_ms=50, stream=None)
    except NetnsError as error:
        if "netem" not in str(error):
            raise
        assert "drop --latency" in str(error)
        assert namespaces_of(os.getpid()) == []
        pytest.skip(f"the kernel lacks netem (its error, and the cleanup, checked): {error}")
    assert result.returncode == 0, result.format_logs()
    rtt_ms = json.loads(result.logs[0])["rtt_ms"]
    print(f"TCP echo round trip at --latency 50: {rtt_ms:.1f} ms")
    # 50 ms each way.
    assert 95 <= rtt_ms <= 200


@requires_netns
def test_setup_failure_removes_what_was_created(monkeypatch, leaves_nothing_behind):
    qdisc_commands = netns.qdisc_commands
    calls = []

    def fail_on_the_second_worker(device, rate, latency_ms=None):
        calls.append(device)
        if len(calls) == 3:
            return [["qdisc", "add", "dev", device, "root", "no-such-qdisc"]]
        return qdisc_commands(device, rate, latency_ms)

    monkeypatch.setattr(netns, "qdisc_commands", fail_on_the_second_worker)
    with pytest.raises(NetnsError, match="no-such-qdisc"):
        launch(["true"], 3, bandwidth="10mbit", stream=None)


@requires_netns
@pytest.mark.parametrize("outcome", ["failure", "timeout"])
def test_namespaces_removed_when_the_run_fails(outcome, leaves_nothing_behind):
    worker = python_worker(
        """
        import os, sys, time
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "1" and sys.argv[1] == "failure":
            sys.exit(3)
        time.sleep(60)
        """
    )
    result = launch(
        [*worker, outcome], 2, timeout=2, bandwidth="1gbit", stream=None, grace_period=1
    )
    assert result.returncode == (3 if outcome == "failure" else 124)


@requires_netns
def test_a_restarted_group_reuses_the_shaped_network(tmp_path, leaves_nothing_behind):
    """``--max-restarts``: the restarted workers run in the same namespaces, and connect."""
    worker = python_worker(
        CONNECT_TO_WORKER_1
        + """
import pathlib, sys
attempt = len(list(pathlib.Path(sys.argv[1]).glob(f"attempt-{index}-*"))) + 1
(pathlib.Path(sys.argv[1]) / f"attempt-{index}-{attempt}").touch()
report = {"attempt": attempt, "netns": os.readlink("/proc/self/ns/net")}
print(json.dumps(report), flush=True)
if attempt == 1 and index == 0:
    connect().close()  # worker 1 has started and printed its report
    raise SystemExit(5)
if index == 1:
    connection = listen()
    connection.sendall(connection.recv(100).upper())
else:
    with connect() as connection:
        connection.sendall(b"after the restart")
        print(json.dumps({"reply": connection.recv(100).decode()}))
"""
    )
    messages = io.StringIO()
    result = launch(
        [*worker, str(tmp_path)],
        2,
        timeout=30,
        bandwidth="100mbit",
        stream=None,
        messages=messages,
        grace_period=1,
        max_restarts=1,
        restart_backoff=0,
    )
    assert result.returncode == 0, result.format_logs()
    assert len(result.restarts) == 1 and result.restarts[0].worker_returncode == 5
    for index in range(2):
        reports = [
            json.loads(line) for line in result.logs[index].splitlines() if line.startswith("{")
        ]
        first, second = reports[0], reports[1]
        assert (first["attempt"], second["attempt"]) == (1, 2)
        assert first["netns"] == second["netns"]
    assert json.loads(result.logs[0].splitlines()[-1]) == {"reply": "AFTER THE RESTART"}
    assert messages.getvalue().count("bandwidth-limited network:") == 1
    assert "restart 1 of 1: relaunching all 2 workers" in messages.getvalue()


@requires_netns
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_launcher_removes_namespaces(signum):
    worker = python_worker(
        """
        import os, time
        print("pid", os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfcompress.launch",
            "-n",
            "2",
            "--bandwidth",
            "1gbit",
            "--",
            *worker,
        ],
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_termination_signals,
    )
    try:
        pids = []
        while len(pids) < 2:
            line = launcher.stdout.readline()
            assert line, f"launcher ended early: {launcher.stderr.read()}"
            pids.append(int(line.split()[-1]))
        assert len(namespaces_of(launcher.pid)) == 3  # two workers and the switch
        launcher.send_signal(signum)
        launcher.communicate(timeout=15)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + signum
    assert namespaces_of(launcher.pid) == []
    assert not any(process_alive(pid) for pid in pids)


@requires_netns
def test_watchdog_cleans_up_after_a_sigkilled_launcher():
    """SIGKILL gives the launcher no chance to clean up; its watchdog stops the
    workers and deletes the namespaces."""
    worker = python_worker(
        """
        import os, time
        print("pid", os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    crashed = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfcompress.launch",
            "-n",
            "2",
            "--bandwidth",
            "1gbit",
            "--grace-period",
            "1",
            "--",
            *worker,
        ],
        env=launcher_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    orphans = []
    try:
        orphans = [int(crashed.stdout.readline().split()[-1]) for _ in range(2)]
        assert len(namespaces_of(crashed.pid)) == 3
        crashed.kill()
        crashed.wait()
        assert wait_until(lambda: not any(process_alive(pid) for pid in orphans))
        assert wait_until(lambda: namespaces_of(crashed.pid) == [])
    finally:
        for pid in orphans:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        for name in namespaces_of(crashed.pid):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


@requires_netns
def test_next_start_removes_what_a_dead_launcher_left(leaves_nothing_behind):
    """Namespaces named after a launcher pid that no longer runs (launcher and
    watchdog both killed) are removed by the next start; others are left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    stale = [f"tfc-{dead.pid}-0-sw", f"tfc-{dead.pid}-0-w0"]
    live_launchers_namespace = f"tfc-{alive.pid}-0-w0"
    not_ours = "tfc-test-not-a-launcher"
    try:
        for name in (*stale, live_launchers_namespace, not_ours):
            subprocess.run(["ip", "netns", "add", name], check=True)
        result = launch(["true"], 1, timeout=30, bandwidth="1gbit", stream=None)
        assert result.returncode == 0, result.format_logs()
        assert namespaces_of(dead.pid) == []
        assert {live_launchers_namespace, not_ours} <= set(namespaces())
    finally:
        for name in (live_launchers_namespace, not_ours, *namespaces_of(dead.pid)):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        alive.kill()
        alive.wait()


@requires_netns
def test_cluster_left_open_is_removed_at_exit():
    script = textwrap.dedent(
        """
        import subprocess, sys
        from tfcompress.launch import BandwidthLimitedCluster
        cluster = BandwidthLimitedCluster(2, rate="10mbit")
        cluster.open()
        subprocess.run(cluster.command(1, [sys.executable, "-c", "print('inside')"]), check=True)
        sys.exit(0)  # without close(): the exit handler deletes the namespaces
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], env=launcher_env(), stdout=subprocess.PIPE, text=True
    )
    stdout, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert stdout == "inside\n"
    assert namespaces_of(process.pid) == []


@requires_netns
def test_module_cli_end_to_end():
    worker = python_worker(
        CONNECT_TO_WORKER_1
        + """
if index == 1:
    print("got", listen().recv(100).decode())
else:
    with connect() as connection:
        connection.sendall(b"over the bridge")
print("address", tf_config["cluster"]["worker"][index])
"""
    )
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfcompress.launch",
            "-n",
            "2",
            "--bandwidth",
            "50mbit",
            "--",
            *worker,
        ],
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 0, stderr
    lines = stdout.splitlines()
    assert "[worker 1] got over the bridge" in lines
    addresses = [line.split()[-1] for line in lines if " address " in line]
    assert len(addresses) == 2 and all(a.startswith("10.213.") for a in addresses)
    assert namespaces_of(launcher.pid) == []
