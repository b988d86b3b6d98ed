"""`mutualrl up -c run.yaml`: Redis, SEE (gRPC + REST), THL, MWRA and one trainer per policy as
supervised local processes, with a live status table and a results table and plot at the end.

Before anything starts, the run file is checked as the trainers will check it before round 0
(`mutualrl.trainer.runtime.preflight`: dataset, columns, reward functions, chat templates, context
lengths), and a run directory with state is resumed (`mutualrl.launch.resume`).

Exit codes: 0 every trainer finished; 1 a process failed; 2 bad config (found here, or by a
trainer before round 0, which exits 2), a run that cannot be resumed as configured, or missing
Redis; 130 stopped by SIGINT/SIGTERM (cleanly: trainers checkpoint first). Names in messages
are printed as they are (a rich console would take `policies[a]` for markup)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.markup import escape

from mutualrl.common.config import load_yaml
from mutualrl.launch.config import UpConfig
from mutualrl.launch.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from mutualrl.launch.local_redis import RedisMissing, local_redis_spec
from mutualrl.launch.plan import LaunchPlan
from mutualrl.launch.probes import free_port, grpc_serving, http_ok
from mutualrl.launch.report import final_report, status_table
from mutualrl.launch.resume import (
    PriorRun,
    ResumeRefused,
    check_resumable,
    missing_rounds,
    prior_run,
    running_up,
    wipe,
)
from mutualrl.launch.supervisor import (
    ChildFailed,
    ProcessSpec,
    Restart,
    StopSignals,
    Supervisor,
    tail,
)

if TYPE_CHECKING:
    from mutualrl.client.mwra import MwraClient
    from mutualrl.trainer.runtime.preflight import PromptBudget

CLI = [sys.executable, "-m", "mutualrl.cli"]


def _service(name: str, plan_dir: Path, health: Any, restart: Restart, max_restarts: int,
             config: Path) -> ProcessSpec:
    return ProcessSpec(name=name, argv=[*CLI, name, "serve", "--config", str(config)],
                       log_path=plan_dir / "logs" / f"{name}.log", health=health,
                       restart=restart, max_restarts=max_restarts, stop_group=1)


def tokenizer_roots(configured: list[str] | None, trainer: dict[str, Any]) -> list[str]:
    """THL's `tokenizer_roots` for a launched run: what the config lists (else THL's default),
    plus the directories the trainers register tokenizers from: the run's `output_dir`
    (presets, warm starts) and every policy's `model_path` and `sft_checkpoint`, with the
    directories its files link into (a Hugging Face cache snapshot's files are links into the
    cache's `blobs/`; THL refuses a file that resolves outside its roots)."""
    from mutualrl.thl.config import ThlConfig

    roots = [str(r) for r in (configured if configured is not None
                              else ThlConfig().tokenizer_roots)]
    roots.append(str(Path(trainer["output_dir"]).resolve()))
    for policy in trainer["policies"]:
        for key in ("model_path", "sft_checkpoint"):
            if policy.get(key):
                roots += _with_link_targets(Path(policy[key]))
    return list(dict.fromkeys(roots))


def _with_link_targets(directory: Path) -> list[str]:
    """`directory` resolved, then the directories its entries that are links resolve into."""
    out = [str(directory.resolve())]
    if directory.is_dir():
        targets = {str(Path(os.path.realpath(e)).parent) for e in directory.iterdir()
                   if e.is_symlink()}
        out += sorted(targets - set(out))
    return out


def make_launch_plan(config: Path, redis_url: str | None,
              token: str | None) -> tuple[LaunchPlan, list[ProcessSpec]]:
    """Read the run YAML, choose ports, write the effective YAML, list the processes."""
    from mutualrl.trainer.config.run import TrainerConfig

    raw = load_yaml(config)
    up = UpConfig.model_validate(raw.get("up") or {})
    trainer = TrainerConfig.model_validate(raw.get("trainer") or {})
    run_dir = (trainer.output_dir / trainer.run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    restart = Restart(up.restart)
    pre: list[ProcessSpec] = []
    if redis_url is None:
        redis_spec, redis_url = local_redis_spec(run_dir)
        pre.append(redis_spec)

    eff = copy.deepcopy(raw)
    eff.pop("up", None)
    ports = {name: free_port() for name in ("see", "see_rest", "thl", "thl_metrics", "mwra",
                                            "mwra_metrics")}
    see = eff.setdefault("see", {}) or {}
    see.update(host="127.0.0.1", port=ports["see"], rest_port=ports["see_rest"],
               redis_url=redis_url, thl_address=f"127.0.0.1:{ports['thl']}")
    thl = eff.setdefault("thl", {}) or {}
    thl.update(host="127.0.0.1", port=ports["thl"], metrics_port=ports["thl_metrics"],
               redis_url=redis_url)
    mwra = eff.setdefault("mwra", {}) or {}
    mwra.update(host="127.0.0.1", port=ports["mwra"], metrics_port=ports["mwra_metrics"],
                redis_url=redis_url)
    eff["see"], eff["thl"], eff["mwra"] = see, thl, mwra
    # A secret written in the services' sections would reach every trainer through the
    # effective YAML: it goes to the services' environment instead.
    written = {str(v) for v in (sec.pop("auth_token", None) for sec in (see, thl, mwra)) if v}
    if len(written) > 1:
        raise ValueError("see, thl and mwra: auth_token differs between them (one secret a run)")
    secret = next(iter(written), None) or token
    tr = eff["trainer"]
    services = tr.setdefault("services", {}) or {}
    services.update(local=False, see=f"127.0.0.1:{ports['see']}",
                    thl=f"127.0.0.1:{ports['thl']}", mwra=f"127.0.0.1:{ports['mwra']}")
    tr["services"] = services
    tr["output_dir"] = str(trainer.output_dir.resolve())
    metrics = tr.setdefault("metrics", {}) or {}
    metrics.setdefault("progress", False)  # the status table replaces per-trainer lines
    tr["metrics"] = metrics

    warm: list[ProcessSpec] = []
    for policy in tr["policies"]:
        sft = up.warm_start.get(policy["name"])
        if sft is None:
            continue
        out = Path(sft.get("out_dir") or run_dir / "warm_start" / policy["name"]).resolve()
        policy["sft_checkpoint"] = str(out)
        if (out / "sft_eval.json").exists():
            continue  # made by an earlier run: reuse it
        sft_yaml = run_dir / "warm_start" / f"{policy['name']}.yaml"
        sft_yaml.parent.mkdir(parents=True, exist_ok=True)
        # The warm start sees its prompts rendered as the policy's RL prompts will be.
        rendering = {k: policy[k] for k in ("prompt_format", "chat_template",
                                            "chat_template_kwargs") if policy.get(k) is not None}
        sft_cfg = {"progress": False, "cache_dir": str(trainer.output_dir.resolve() / "presets"),
                   **rendering, **sft, "out_dir": str(out)}
        sft_yaml.write_text(yaml.safe_dump({"sft": sft_cfg}, sort_keys=False))
        warm.append(ProcessSpec(name=f"sft-{policy['name']}",
                                argv=[*CLI, "sft", "-c", str(sft_yaml)],
                                log_path=run_dir / "logs" / f"sft-{policy['name']}.log",
                                finishes=True, stop_group=2))

    thl["tokenizer_roots"] = tokenizer_roots(thl.get("tokenizer_roots"), tr)
    if secret:  # each trainer gets its policy's token below, never a shared one in the file
        services.pop("token", None)
    eff_path = run_dir / "run.yaml"
    eff_path.write_text(yaml.safe_dump(eff, sort_keys=False))
    env = {"MUTUALRL_AUTH_TOKEN": secret} if secret else {}
    plan = LaunchPlan(run_dir=run_dir, config_path=eff_path, up=up, run_id=trainer.run_id,
                policies=[p.name for p in trainer.policies],
                metrics_files={p.name: trainer.run_dir(p.name).resolve() / "metrics.jsonl"
                               for p in trainer.policies},
                rounds=trainer.grpo.rounds, secret=secret, warm_start=warm,
                source_path=config)
    plan.endpoints = {
        "see_grpc": f"127.0.0.1:{ports['see']}",
        "see_rest": f"http://127.0.0.1:{ports['see_rest']}",
        "dashboard": f"http://127.0.0.1:{ports['see_rest']}/ui/runs/{trainer.run_id}/curves",
        "thl_grpc": f"127.0.0.1:{ports['thl']}",
        "mwra_grpc": f"127.0.0.1:{ports['mwra']}",
        "thl_metrics": f"http://127.0.0.1:{ports['thl_metrics']}/metrics",
        "mwra_metrics": f"http://127.0.0.1:{ports['mwra_metrics']}/metrics",
        "redis": redis_url,
    }
    checks = {
        "see": http_ok(f"http://127.0.0.1:{ports['see_rest']}/healthz"),
        "thl": grpc_serving(plan.endpoints["thl_grpc"]),
        "mwra": grpc_serving(plan.endpoints["mwra_grpc"]),
    }
    service_restarts = up.max_restarts if up.service_restarts is None else up.service_restarts
    for name, check in checks.items():
        spec = _service(name, run_dir, check, restart, service_restarts, eff_path)
        spec.env.update(env)
        plan.specs.append(spec)
    for policy in trainer.policies:
        plan.specs += trainer_specs(policy.name, policy.nnodes, eff_path, run_dir,
                                    trainer_env(secret, policy.name), restart, up.max_restarts)
    for spec in warm:
        spec.env.update(trainer_env(secret, None))
    return plan, pre


def trainer_specs(policy: str, nnodes: int, config: Path, run_dir: Path, env: dict[str, str],
                  restart: Restart, max_restarts: int) -> list[ProcessSpec]:
    """The trainer of `policy`: one process, or (`nnodes` > 1) one launcher per node on this
    machine, node 0 serving their rendezvous on a free loopback port, as one gang (a node that
    fails takes the others down, and all restart from the latest checkpoint)."""
    name = f"trainer-{policy}"
    spec = ProcessSpec(name=name, argv=[*CLI, "train", "-c", str(config), "--policy", policy],
                       log_path=run_dir / "logs" / f"{name}.log", env=env, restart=restart,
                       max_restarts=max_restarts, stop_group=2, finishes=True)
    if nnodes == 1:
        return [spec]
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [f"{name}-node{k}" if k else name for k in range(nnodes)]
    return [dataclasses.replace(
        spec, name=node, log_path=run_dir / "logs" / f"{node}.log", gang=name,
        argv=[*spec.argv, "--node-rank", str(k), "--rdzv-endpoint", endpoint])
        for k, node in enumerate(nodes)]


def trainer_env(secret: str | None, policy: str | None) -> dict[str, str]:
    """The token a trainer of `policy` runs with: its policy's token only (publish, fetch,
    ack and report as that policy, register its own tokenizer), never the run's secret, which
    children otherwise inherit from this process. `policy` None: a child that talks to no
    service (a warm start) gets no token."""
    from mutualrl.common.auth import POLICY_SCOPE, derive_token

    if not secret:
        return {}
    return {"MUTUALRL_AUTH_TOKEN": derive_token(secret, POLICY_SCOPE + policy) if policy else ""}


def prior_state(config: Path, fresh: bool, console: Any) -> tuple[PriorRun | None, bool]:
    """What an earlier `up` left of the run: (its state to resume, None for a new run;
    whether every policy has trained all its rounds already). `fresh` deletes it first."""
    from mutualrl.trainer.config.run import TrainerConfig

    raw = load_yaml(config)
    cfg = TrainerConfig.model_validate(raw.get("trainer") or {})
    warm = UpConfig.model_validate(raw.get("up") or {}).warm_start
    run_dir = (cfg.output_dir / cfg.run_id).resolve()
    pid = running_up(run_dir)
    if pid is not None:
        raise ResumeRefused(f"run {cfg.run_id} in {run_dir} is running (process {pid}, "
                            "started by another `mutualrl up`); stop that one first")
    if fresh:
        removed = wipe(run_dir)
        if removed:
            console.print(f"--fresh: deleted {', '.join(removed)} of run {cfg.run_id} in "
                          f"{run_dir}", markup=False)
        return None, False
    prior = prior_run(cfg, run_dir)
    if not prior.resumes:
        return None, False
    check_resumable(run_dir / "run.yaml", cfg, config, warm_started=set(warm))
    finished = all(prior.rounds[p.name] >= cfg.for_policy(p.name).grpo.rounds
                   for p in cfg.policies)
    return prior, finished


def check_run_inputs(config: Path) -> list[PromptBudget]:
    """The trainers' checks before round 0, made before anything starts
    (`mutualrl.trainer.runtime.preflight`): the task's table, columns and reward functions, each
    policy's chat template and context length. Raises a ValueError naming the field."""
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.preflight import check_inputs

    return check_inputs(TrainerConfig.model_validate(load_yaml(config).get("trainer") or {}))


def run_up(config: Path, console: Any, fresh: bool = False) -> int:
    token = os.environ.get("MUTUALRL_AUTH_TOKEN") or None
    try:
        prior, finished = prior_state(config, fresh, console)
        if finished:
            assert prior is not None
            console.print(
                f"every policy of {config} has trained its rounds already "
                f"({prior.describe()}): raise trainer.grpo.rounds to train on, or start "
                f"again from round 0 with `mutualrl up -c {config} --fresh`", markup=False)
            return EXIT_OK
        for budget in check_run_inputs(config):
            console.print(f"inputs {budget.describe()}", markup=False, highlight=False)
        plan, pre = make_launch_plan(config, os.environ.get("REDIS_URL") or None, token)
    except RedisMissing as err:
        console.print(f"[red]{escape(str(err))}[/]")
        return EXIT_CONFIG
    except ResumeRefused as err:
        console.print(f"[red]{escape(str(err))}[/]")
        return EXIT_CONFIG
    except (ValueError, OSError) as err:  # the input errors are ValueErrors naming the field
        console.print(f"[red]config {escape(str(config))}: {escape(str(err))}[/]")
        return EXIT_CONFIG
    plan.prior = prior
    if prior is not None:
        for spec in plan.specs:
            if spec.finishes and "--resume" not in spec.argv:
                spec.argv.append("--resume")
    plan.fresh = fresh
    signals = StopSignals()
    sup = Supervisor(log=lambda m: console.print(f"[yellow]{escape(m)}[/]"))
    console.print(f"run [bold]{escape(plan.run_id)}[/] in {escape(str(plan.run_dir))}  "
                  f"(logs: {escape(str(plan.run_dir))}/logs)")
    if prior is not None:
        console.print(f"resuming run {plan.run_id}: {prior.describe()} (to round "
                      f"{plan.rounds}); `--fresh` starts it again from round 0", markup=False)
    try:
        code = _supervise(plan, pre, sup, signals, console)
    finally:
        codes = sup.stop_all(plan.up.stop_grace)
        _write_state(plan, sup, stopped=True)
        if codes:
            console.print("stopped: " + ", ".join(f"{n} ({c})" for n, c in codes.items()))
    return code


def _write_state(plan: LaunchPlan, sup: Supervisor, stopped: bool = False) -> None:
    """run_dir/up.json: endpoints and pids, for people, tests and `mutualrl inspect`."""
    state = {"run_id": plan.run_id, "endpoints": plan.endpoints, "stopped": stopped,
             "pids": {name: c.pid for name, c in sup.children.items()},
             "config": str(plan.config_path)}
    tmp = plan.run_dir / "up.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(plan.run_dir / "up.json")


def _supervise(plan: LaunchPlan, pre: list[ProcessSpec], sup: Supervisor, signals: StopSignals,
               console: Any) -> int:
    try:
        for spec in pre:
            sup.start(spec)
            sup.wait_healthy(spec.name, plan.up.health_timeout)
        if plan.warm_start:
            console.print("warm start: " + ", ".join(s.name for s in plan.warm_start)
                          + " (SFT, once; reused by later runs)")
            for spec in plan.warm_start:
                sup.start(spec)
            if not _wait_finished(sup, [s.name for s in plan.warm_start], signals, console):
                return EXIT_INTERRUPTED
        services = [s for s in plan.specs if s.stop_group == 1]
        for spec in services:
            sup.start(spec)
        for spec in services:
            sup.wait_healthy(spec.name, plan.up.health_timeout)
    except ChildFailed as err:
        console.print(f"[red]{escape(str(err))}[/]")
        console.print(err.log_tail, markup=False, highlight=False)
        return EXIT_FAILED
    import grpc

    try:
        if plan.fresh:
            from mutualrl.client.runs import delete_run

            delete_run(plan.run_id, see=plan.endpoints["see_grpc"],
                       thl=plan.endpoints["thl_grpc"], mwra=plan.endpoints["mwra_grpc"],
                       token=plan.secret)
        if plan.secret:  # trainers get policy tokens, which may not create the run
            create_run(plan.endpoints["see_grpc"], load_yaml(plan.config_path)["trainer"],
                       plan.secret)
    except grpc.RpcError as err:
        console.print(f"[red]preparing run {escape(plan.run_id)} in the services failed: "
                      f"{err.code().name}: {escape(err.details() or '')}[/]")
        return EXIT_FAILED
    if plan.prior is not None and _deterministic(plan):
        missing = missing_rounds(plan.endpoints["see_rest"], plan.run_id, plan.prior,
                                 plan.secret)
        if missing:
            console.print(
                f"[red]cannot resume run {escape(plan.run_id)}: SEE holds no records of "
                f"{escape(', '.join(missing))} (its Redis was reset, or retention trimmed "
                "them); in the deterministic exchange the resumed trainers would wait for "
                "peer rounds that are never published again. Start it again from round 0 "
                f"with `{escape(plan.fresh_command)}`[/]")
            return EXIT_CONFIG
    with _local_worker(plan):
        return _train(plan, sup, signals, console)


def _deterministic(plan: LaunchPlan) -> bool:
    """The run exchanges in the deterministic mode (its trainers wait for peer rounds)."""
    from mutualrl.trainer.config.run import TrainerConfig

    trainer = TrainerConfig.model_validate(load_yaml(plan.config_path)["trainer"])
    return trainer.exchange.mode == "deterministic"


def create_run(see: str, trainer: dict[str, Any], secret: str | None = None) -> None:
    """Create the run of a `trainer:` section in SEE at `see` with the run's secret
    (`secret`, else MUTUALRL_AUTH_TOKEN; idempotent: a resumed run finds it), as the trainers
    would have: their policy tokens may not create runs (`mutualrl.see.grpc.access`)."""
    from mutualrl.client.see import SeeClient
    from mutualrl.common.channel import ClientOptions
    from mutualrl.trainer.config.run import TrainerConfig

    cfg = TrainerConfig.model_validate(trainer)
    client = SeeClient(ClientOptions(address=see, token=secret))
    try:
        client.create_run(cfg.run_id, [p.name for p in cfg.policies], cfg.probe.tau,
                          exist_ok=True)
    finally:
        client.close()


def declare_policies(client: MwraClient, run_id: str, policies: Sequence[str]) -> None:
    """Register the run's policies with MWRA before any trainer starts, so that its first plan
    shares the pool among all of them. Otherwise the first trainer to ask for round 0 is alone
    in the plan and gets the whole pool (three threads where one each was meant), and a run's
    numbers depend on which trainer started first: a round trained on another thread count
    rounds differently, and the run diverges from there. Each trainer registers again, with its
    own id and rollout budget, when it starts."""
    for policy in policies:
        client.register_policy(run_id, policy)


@contextlib.contextmanager
def _local_worker(plan: LaunchPlan) -> Iterator[None]:
    """Offer this machine's CPU threads to MWRA as the run's worker for as long as it trains."""
    from mutualrl.client.mwra import MwraClient

    client = MwraClient(plan.endpoints["mwra_grpc"], token=plan.secret)
    try:
        worker_id, lease = client.register_local_worker(plan.run_id, slots=plan.up.worker_slots)
        declare_policies(client, plan.run_id, plan.policies)
        keepalive = client.keepalive(plan.run_id, worker_id, max(0.2, lease.lease_seconds / 3))
        try:
            yield
        finally:
            keepalive.stop()
    finally:
        client.close()


def _train(plan: LaunchPlan, sup: Supervisor, signals: StopSignals, console: Any) -> int:
    from rich.live import Live

    _write_state(plan, sup)
    auth = " (asks for MUTUALRL_AUTH_TOKEN)" if os.environ.get("MUTUALRL_AUTH_TOKEN") else ""
    console.print(f"dashboard [bold link={plan.endpoints['dashboard']}]"
                  f"{plan.endpoints['dashboard']}[/]{auth}")
    console.print(f"SEE REST  {plan.endpoints['see_rest']}/v1/runs/{plan.run_id}/stats "
                  f"(docs {plan.endpoints['see_rest']}/docs)")
    console.print(f"metrics   {plan.endpoints['see_rest']}/metrics, {plan.endpoints['thl_metrics']}"
                  f", {plan.endpoints['mwra_metrics']}; per-round JSONL under {plan.run_dir}")
    trainers = [s for s in plan.specs if s.finishes]
    for spec in trainers:
        sup.start(spec)
    _write_state(plan, sup)
    done: set[str] = set()
    failures: list[str] = []
    # Transient: the table gives way to what ended the run (an error, the results), instead
    # of standing after it with stale states.
    with Live(status_table(plan, done), console=console, refresh_per_second=2,
              transient=True) as live:
        code = _watch(plan, sup, signals, console, live, len(trainers), done, failures)
    if code == EXIT_INTERRUPTED:
        console.print(status_table(plan, done))
        console.print(f"[yellow]{signal.Signals(signals.received or 2).name}: stopping "
                      "(trainers checkpoint first)[/]")
    if code == EXIT_FAILED and failures:  # what it did by then, and why it stopped
        console.print(status_table(plan, done))
        final_report(plan, console, failure=failures[-1])
        console.print(f"[red]the run failed: {escape(failures[-1])}[/]")
    if code != EXIT_OK:
        return code
    console.print(status_table(plan, done))
    summary = final_report(plan, console)
    if summary["failure"]:  # asked to share, shared nothing: a failed run, not a warning
        console.print(f"[red]the run failed: {escape(summary['failure'])}[/]")
        return EXIT_FAILED
    if plan.up.serve_after:
        console.print("trainers finished; services stay up until Ctrl-C")
        while signals.received is None:
            time.sleep(0.5)
    return EXIT_OK


def _watch(plan: LaunchPlan, sup: Supervisor, signals: StopSignals, console: Any, live: Any,
           trainers: int, done: set[str], failures: list[str]) -> int:
    """Refresh the status table until every trainer finished (EXIT_OK), a signal came
    (EXIT_INTERRUPTED), or a process failed past its restarts (EXIT_FAILED; a trainer that
    exits 2 found its config wrong: EXIT_CONFIG, never restarted). Each failure's cause (the
    last error line of its log) is appended to `failures`."""
    while len(done) < trainers:
        if signals.received is not None:
            return EXIT_INTERRUPTED
        for child, code in sup.poll():
            name = child.spec.name
            if sup.children.get(name) is not child:  # its gang restarted it already
                continue
            if child.spec.finishes and code == 0:
                done.add(name)
                continue
            if child.spec.finishes and code == EXIT_CONFIG:
                live.stop()
                console.print(f"[red]{escape(name)} refused its configuration (exit "
                              f"{code}); last log lines:[/]")
                console.print(tail(child.spec.log_path), markup=False, highlight=False)
                return EXIT_CONFIG
            console.print(f"[red]{escape(name)} exited with code {code}[/]; last log lines:")
            console.print(tail(child.spec.log_path), markup=False, highlight=False)
            failures.append(f"{name} exited with code {code}: {_cause(child.spec.log_path)}")
            if child.spec.restart is Restart.ON_FAILURE and \
                    child.restarts < child.spec.max_restarts:
                console.print(f"[yellow]restarting {escape(child.spec.gang or name)} "
                              f"({child.restarts + 1}/{child.spec.max_restarts})[/]")
                if child.spec.gang is None:
                    sup.restart(child)
                else:  # every node of the policy, from its latest checkpoint
                    sup.restart_gang(child, plan.up.stop_grace)
                _write_state(plan, sup)
                continue
            live.stop()
            return EXIT_FAILED
        live.update(status_table(plan, done))
        time.sleep(plan.up.status_every)
    return EXIT_OK


def _cause(log_path: Path) -> str:
    """The last line of a log that names an error (a traceback's last line), or its last line."""
    lines = [x.strip() for x in tail(log_path, 80).splitlines() if x.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Timeout")) and " " not in head:
            return line
    return lines[-1] if lines else "no log lines"


def _last_step(log_path: Path) -> str:
    """'step 300/1200' from the newest `sft step` line of a warm-start log, or 'starting'."""
    for line in reversed(tail(log_path, 40).splitlines()):
        if line.startswith("sft step "):
            return line.split(" loss ")[0].removeprefix("sft ")
    return "starting"


def _wait_finished(sup: Supervisor, names: list[str], signals: StopSignals, console: Any) -> bool:
    """Wait for one-shot children (warm starts) with a live line; False when interrupted."""
    pending = set(names)
    start = time.monotonic()
    with console.status("") as status:
        while pending:
            if signals.received is not None:
                return False
            for child, code in sup.poll():
                if code != 0:
                    raise ChildFailed(child.spec.name, code, tail(child.spec.log_path))
                pending.discard(child.spec.name)
                console.print(f"{child.spec.name} done in {time.monotonic() - start:.0f}s")
            status.update("warm start: " + "; ".join(
                f"{name} {_last_step(sup.children[name].spec.log_path)}"
                for name in sorted(pending)) + f" ({time.monotonic() - start:.0f}s)")
            time.sleep(0.5)
    return True
