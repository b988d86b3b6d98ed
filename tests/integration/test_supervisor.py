"""The process supervisor behind `mutualrl up`, on real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mutualrl.launch.supervisor import ChildFailed, ProcessSpec, Supervisor

# A child that records the moment it receives SIGTERM, then exits.
ON_TERM = textwrap.dedent("""
    import signal, sys, time
    def bye(*_):
        with open(sys.argv[1], "a") as fh:
            fh.write(f"{sys.argv[2]} {time.monotonic()}\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, bye)
    while True:
        time.sleep(0.05)
""")


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_stop_all_goes_from_highest_group_down(tmp_path: Path) -> None:
    record = tmp_path / "order.txt"
    sup = Supervisor(log=lambda m: None)
    for name, group in (("redis", 0), ("see", 1), ("trainer", 2)):
        sup.start(ProcessSpec(name=name, argv=[sys.executable, "-c", ON_TERM, str(record), name],
                              log_path=tmp_path / f"{name}.log", stop_group=group))
    time.sleep(1.0)  # let the children install their handlers
    codes = sup.stop_all(grace=10)
    assert codes == {"trainer": 0, "see": 0, "redis": 0}
    order = [line.split()[0] for line in record.read_text().splitlines()]
    assert order == ["trainer", "see", "redis"]


def test_a_child_that_ignores_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" \
               "print('ready', flush=True)\ntime.sleep(60)"
    sup = Supervisor(log=lambda m: None)
    log = tmp_path / "s.log"
    sup.start(ProcessSpec(name="s", argv=[sys.executable, "-c", stubborn], log_path=log))
    deadline = time.monotonic() + 20
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    assert sup.stop_all(grace=0.5) == {"s": -signal.SIGKILL}
    assert time.monotonic() - start < 5


def test_wait_healthy_reports_exit_code_and_log_tail(tmp_path: Path) -> None:
    sup = Supervisor(log=lambda m: None)
    argv = [sys.executable, "-c", "print('boom: bad config'); raise SystemExit(3)"]
    sup.start(ProcessSpec(name="see", argv=argv, log_path=tmp_path / "see.log",
                          health=lambda: False))
    with pytest.raises(ChildFailed) as err:
        sup.wait_healthy("see", timeout=20)
    assert err.value.code == 3
    assert "boom: bad config" in err.value.log_tail


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from mutualrl.launch.supervisor import ProcessSpec, Supervisor
        sup = Supervisor()
        log = Path({str(tmp_path)!r}) / "c.log"
        child = sup.start(ProcessSpec(name="c", log_path=log,
                                      argv=[sys.executable, "-c", "import time; time.sleep(60)"]))
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert _gone(child_pid, within=10), "orphaned child survived its supervisor"


# The supervisor's process talks gRPC (health probes, MWRA) while it starts children with a
# preexec_fn, i.e. through fork(). With gRPC's fork support on, the child's restarted poller hit
# the fd that close_fds had closed and aborted before exec (measured: 25 of 300 starts).
FORK_UNDER_GRPC = textwrap.dedent("""
    import os, sys, tempfile, threading
    from pathlib import Path
    from mutualrl.cli import main
    main(["version"])  # the CLI's own start-up, which imports grpc
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from mutualrl.launch.supervisor import ProcessSpec, Supervisor
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel("127.0.0.1:1"))
    stop = threading.Event()
    def pound():
        while not stop.is_set():
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
            except grpc.RpcError:
                pass
    threading.Thread(target=pound, daemon=True).start()
    sup, logs, codes = Supervisor(log=lambda _: None), Path(tempfile.mkdtemp()), []
    for k in range(int(sys.argv[1])):
        child = sup.start(ProcessSpec(name=f"c{k}", argv=["/bin/true"], log_path=logs / "c.log"))
        codes.append(child.proc.wait())
    stop.set()
    print("RESULT", sum(c != 0 for c in codes), (logs / "c.log").read_text()[-300:])
""")


def test_children_started_while_grpc_is_busy_never_abort_before_exec() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", FORK_UNDER_GRPC, "300"], capture_output=True,
                         text=True, timeout=240, env=env, check=True).stdout
    failed, _, log_tail = out.partition("RESULT ")[2].partition(" ")
    assert failed == "0", log_tail


def test_a_trainer_that_refuses_its_config_ends_up_with_2_unrestarted(tmp_path: Path) -> None:
    """A trainer exits 2 (bad input it found before round 0): `up` restarts it no matter its
    restart policy, and ends with 2; the message's bracketed names reach the console as they
    are, and no status table stands after it. A trainer that crashes (1) is restarted."""
    from rich.console import Console
    from rich.live import Live

    from mutualrl.launch.exit_codes import EXIT_CONFIG, EXIT_FAILED
    from mutualrl.launch.supervisor import Restart, StopSignals
    from mutualrl.launch.up import LaunchPlan, UpConfig, _watch

    def plan_with(code: int) -> tuple[list[str], Supervisor, Console, int]:
        plan = LaunchPlan(run_dir=tmp_path, config_path=tmp_path / "run.yaml", up=UpConfig(),
                          run_id="r", policies=["a"], metrics_files={"a": tmp_path / "m.jsonl"},
                          rounds=3)
        sup = Supervisor(log=lambda m: None)
        argv = [sys.executable, "-c", "import sys; print('mutualrl train: policies[a]: "
                f"task.rewards[states_number].fn: cannot import', file=sys.stderr); "
                f"sys.exit({code})"]
        sup.start(ProcessSpec(name="trainer-a", argv=argv, log_path=tmp_path / f"{code}.log",
                              restart=Restart.ON_FAILURE, max_restarts=1, finishes=True))
        console = Console(record=True, width=200, force_terminal=False)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        failures: list[str] = []
        try:
            with Live("table", console=console, transient=True) as live:
                got = _watch(plan, sup, StopSignals(), console, live, 1, set(), failures)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return failures, sup, console, got

    failures, sup, console, got = plan_with(2)
    text = console.export_text()
    assert got == EXIT_CONFIG and sup.children["trainer-a"].restarts == 0
    assert "policies[a]: task.rewards[states_number].fn: cannot import" in text, text
    assert "restarting" not in text and failures == []  # a config error is not a failure
    failures, sup, console, got = plan_with(1)
    assert got == EXIT_FAILED and sup.children["trainer-a"].restarts == 1
    # each exit, the restarted one too, with the last error line of its log
    assert failures == ["trainer-a exited with code 1: mutualrl train: policies[a]: "
                        "task.rewards[states_number].fn: cannot import"] * 2, failures
    assert "restarting trainer-a (1/1)" in console.export_text()


def test_a_gang_restarts_together_when_one_member_dies(tmp_path: Path) -> None:
    """The nodes of one policy: one dies, the other is stopped (SIGTERM) and both start again;
    the stopped one's exit is not reported as a failure of its own."""
    record = tmp_path / "terms.txt"
    sup = Supervisor(log=lambda m: None)
    nodes = [sup.start(ProcessSpec(name=name, argv=[sys.executable, "-c", ON_TERM, str(record),
                                                    name],
                                   log_path=tmp_path / f"{name}.log", gang="trainer-p",
                                   finishes=True))
             for name in ("trainer-p", "trainer-p-node1")]
    alone = sup.start(ProcessSpec(name="trainer-q", argv=[sys.executable, "-c", ON_TERM,
                                                          str(record), "trainer-q"],
                                  log_path=tmp_path / "q.log", finishes=True))
    time.sleep(1.0)  # let the children install their handlers
    os.kill(nodes[1].pid, signal.SIGKILL)
    nodes[1].proc.wait(timeout=10)
    [(dead, code)] = sup.poll()
    assert (dead.spec.name, code) == ("trainer-p-node1", -signal.SIGKILL)
    fresh = sup.restart_gang(dead, grace=10)
    assert [c.spec.name for c in fresh] == ["trainer-p", "trainer-p-node1"]
    assert [line.split()[0] for line in record.read_text().splitlines()] == ["trainer-p"]
    assert nodes[0].proc.returncode == 0  # stopped by the gang, not failed
    assert all(c.restarts == 1 and "--resume" in c.spec.argv for c in fresh)
    assert sup.poll() == []  # the stopped member's exit is the gang's, not a failure
    assert all(sup.children[c.spec.name] is c and c.proc.poll() is None for c in fresh)
    assert sup.children["trainer-q"] is alone and alone.proc.poll() is None
    sup.stop_all(grace=10)
