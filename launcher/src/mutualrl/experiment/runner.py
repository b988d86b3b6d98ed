"""Runs an experiment: warm starts (once, cached), SEE / THL / MWRA (+ Redis) started once as
supervised processes, then every run of the grid as two single-threaded trainer processes, with
a live progress display; at the end results.json, results.md and curves.png.

Process management is `mutualrl.launch` (Supervisor, ProcessSpec, make_launch_plan for the
services); the statistics are `mutualrl.experiment.analysis`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from mutualrl.client.rest import follow_pages
from mutualrl.experiment.analysis import RunResult, render_markdown, summarize_regime
from mutualrl.experiment.config import ExperimentConfig
from mutualrl.experiment.plan import ExperimentPlan, RunSpec, WarmStart, build_plan, fmt_duration
from mutualrl.launch.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from mutualrl.launch.report import read_rows
from mutualrl.launch.supervisor import ChildFailed, ProcessSpec, StopSignals, Supervisor, tail

CHILD = [sys.executable, "-m", "mutualrl.experiment.child"]


# ---- warm starts -------------------------------------------------------------------------------


def warm_start_report(w: WarmStart, weak_max: float, strong_min: float) -> dict[str, Any]:
    """The warm start's sft_eval.json with flags for weak skills that do not start near 0 and
    strong skills that were not learned."""
    rep = json.loads((w.out_dir / "sft_eval.json").read_text())
    acc = rep["heldout_accuracy"]
    strong = list(rep.get("strong_skills", []))
    flags = []
    for skill, a in acc.items():
        if skill == "mean":
            continue
        if skill in strong and a < strong_min:
            flags.append(f"strong {skill} only {a:.2f} (< {strong_min})")
        if skill not in strong and a > weak_max:
            flags.append(f"weak {skill} starts at {a:.2f} (> {weak_max})")
    return {"seed": w.seed, "path": str(w.out_dir), "heldout_accuracy": acc,
            "strong_skills": strong, "weak_skills": rep.get("weak_skills", []),
            "steps": rep.get("steps"), "train_seconds": rep.get("train_seconds"),
            "flags": flags}


def make_warm_starts(plan: ExperimentPlan, cfg: ExperimentConfig, out: Path, console: Any,
                     stop: StopSignals) -> dict[str, dict[str, Any]]:
    """Train the warm starts that are not cached yet (`parallel` at a time); return every warm
    start's report keyed 'regime/policy/sSEED'."""
    todo = [w for w in plan.warm_starts if not (w.out_dir / "sft_eval.json").exists()]
    cached = len(plan.warm_starts) - len(todo)
    console.print(f"warm starts: {len(plan.warm_starts)} ({cached} cached, {len(todo)} to train)")
    sup = Supervisor(log=lambda m: console.print(f"[yellow]{m}[/]"))
    pending: list[WarmStart] = list(todo)
    running: dict[str, WarmStart] = {}
    t0 = time.monotonic()
    try:
        while pending or running:
            if stop.received is not None:
                raise KeyboardInterrupt
            while pending and len(running) < cfg.warm_start.parallel:
                w = pending.pop(0)
                d = out / "warm_start_configs"
                d.mkdir(parents=True, exist_ok=True)
                cfg_path = d / f"{w.regime}-{w.policy}-s{w.seed}.yaml"
                cfg_path.write_text(yaml.safe_dump({"sft": w.sft}, sort_keys=False))
                name = f"sft-{w.regime}-{w.policy}-s{w.seed}"
                sup.start(ProcessSpec(name=name, argv=[*CHILD, "sft", "-c", str(cfg_path)],
                                      log_path=out / "logs" / f"{name}.log", finishes=True,
                                      # SFT talks to no service: none of the secret.
                                      env={"OMP_NUM_THREADS": "1", "MUTUALRL_AUTH_TOKEN": ""}))
                running[name] = w
                console.print(f"  training warm start {w.key} -> {w.out_dir}")
            for child, code in sup.poll():
                w = running.pop(child.spec.name)
                if code != 0:
                    raise ChildFailed(child.spec.name, code, tail(child.spec.log_path))
                rep = warm_start_report(w, cfg.warm_start.weak_max, cfg.warm_start.strong_min)
                console.print(f"  warm start {w.key} done in "
                              f"{fmt_duration(time.monotonic() - t0)}: {rep['heldout_accuracy']}")
            time.sleep(0.5)
    finally:
        sup.stop_all(cfg.stop_grace)
    reports: dict[str, dict[str, Any]] = {}
    for w in plan.warm_starts:
        rep = warm_start_report(w, cfg.warm_start.weak_max, cfg.warm_start.strong_min)
        reports[w.key] = rep
        for flag in rep["flags"]:
            console.print(f"[yellow]warm start {w.key}: {flag}[/]")
    return reports


# ---- services ------------------------------------------------------------------------------------


@dataclass
class Services:
    endpoints: dict[str, str]
    token: str | None
    sup: Supervisor
    redis_url: str
    names: list[str] = field(default_factory=list)


def start_services(cfg: ExperimentConfig, raw: dict[str, Any], out: Path, runs: list[RunSpec],
                   redis_url: str | None, token: str | None, console: Any) -> Services:
    """Redis (private unless REDIS_URL), SEE, THL and MWRA as supervised processes, through
    `mutualrl.launch.up.make_launch_plan` (free ports, effective YAML, health checks). Redis is
    waited for here; the services start in the background (`wait_services` waits for them), so
    their start-up overlaps the warm starts."""
    from mutualrl.launch.up import make_launch_plan

    svc_dir = out / "services"
    svc_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {k: dict(raw.get(k) or {}) for k in ("see", "thl", "mwra")}
    # THL persists registrations in Redis under its prefix: keep this experiment's apart.
    doc["thl"].setdefault("key_prefix", cfg.run_prefix)
    # One THL serves every run: it may read the tokenizers of all of them (warm starts and run
    # directories under `out`, and every policy's own checkpoint), not only the first run's.
    doc["thl"]["tokenizer_roots"] = experiment_tokenizer_roots(doc["thl"], out, runs)
    doc["trainer"] = {**runs[0].trainer, "run_id": "services", "output_dir": str(svc_dir)}
    yml = svc_dir / "services-input.yaml"
    yml.write_text(yaml.safe_dump(doc, sort_keys=False))
    plan, pre = make_launch_plan(yml, redis_url, token)
    sup = Supervisor(log=lambda m: console.print(f"[yellow]{m}[/]"))
    for spec in pre:
        sup.start(spec)
        sup.wait_healthy(spec.name, cfg.health_timeout)
    services = [s for s in plan.specs if s.stop_group == 1]
    for spec in services:
        sup.start(spec)
    (out / "services.json").write_text(json.dumps(plan.endpoints, indent=2))
    return Services(endpoints=plan.endpoints, token=token, sup=sup,
                    redis_url=plan.endpoints["redis"], names=[s.name for s in services])


def experiment_tokenizer_roots(thl: dict[str, Any], out: Path, runs: list[RunSpec]) -> list[str]:
    """THL's `tokenizer_roots` for an experiment: the configured ones (else THL's default), the
    experiment's output directory, and every run's policy `model_path` and `sft_checkpoint`."""
    from mutualrl.launch.up import tokenizer_roots

    roots: list[str] = [str(out.resolve())]
    configured = thl.get("tokenizer_roots")
    for run in runs:
        roots += tokenizer_roots(configured, {**run.trainer, "output_dir": str(out)})
    return list(dict.fromkeys(roots))


def wait_services(svc: Services, cfg: ExperimentConfig, console: Any) -> None:
    for name in svc.names:
        svc.sup.wait_healthy(name, cfg.health_timeout)
    console.print("services: " + ", ".join(f"{k} {v}" for k, v in svc.endpoints.items()))


def see_run_stats(svc: Services, run_id: str) -> dict[str, Any]:
    """SEE's REST /v1/runs/{run}/stats (published per kind, the transfer matrix), all pages."""
    url = f"{svc.endpoints['see_rest']}/v1/runs/{run_id}/stats"
    headers = {"Authorization": f"Bearer {svc.token}"} if svc.token else {}

    def page(cursor: str | None) -> dict[str, Any]:
        query = f"?{urllib.parse.urlencode({'cursor': cursor})}" if cursor else ""
        with urllib.request.urlopen(urllib.request.Request(url + query, headers=headers),
                                    timeout=10) as r:
            return dict(json.loads(r.read()))

    return follow_pages(page)


def clear_run(svc: Services, run_id: str) -> dict[str, int]:
    """Delete what an earlier attempt of this run id left in SEE, THL and MWRA (their
    DeleteRun), so a re-run starts from nothing like its paired runs did."""
    from mutualrl.client.runs import delete_run

    return delete_run(run_id, see=svc.endpoints["see_grpc"], thl=svc.endpoints["thl_grpc"],
                      mwra=svc.endpoints["mwra_grpc"], token=svc.token)


# ---- runs --------------------------------------------------------------------------------------


@dataclass
class ActiveRun:
    spec: RunSpec
    children: list[str]
    started: float
    keepalive: Any = None
    keepalive_client: Any = None
    """The MWRA client the keepalive beats through (closed with it)."""
    worker_id: str = ""
    exit_codes: dict[str, int] = field(default_factory=dict)
    failed: str | None = None


def _metrics_path(out: Path, run_id: str, policy: str) -> Path:
    return out / "runs" / run_id / policy / "metrics.jsonl"


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def start_run(spec: RunSpec, svc: Services, sup: Supervisor, out: Path,
              cfg: ExperimentConfig) -> ActiveRun:
    from mutualrl.client.mwra import MwraClient
    from mutualrl.launch.up import create_run, declare_policies, trainer_env

    run_dir = out / "runs" / spec.run_id
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh run: metrics files are appended to, never mixed
    run_dir.mkdir(parents=True)
    clear_run(svc, spec.run_id)
    trainer = {**spec.trainer, "services": {
        "local": False, "see": svc.endpoints["see_grpc"], "thl": svc.endpoints["thl_grpc"],
        "mwra": svc.endpoints["mwra_grpc"]}}
    cfg_path = run_dir / "run.yaml"
    cfg_path.write_text(yaml.safe_dump({"trainer": trainer}, sort_keys=False))
    # MWRA's pool for this run: one CPU slot per policy, so each trainer gets one thread.
    slots = cfg.worker_slots or len(spec.policies)
    worker_id = f"{spec.run_id}-cpu"
    with MwraClient(svc.endpoints["mwra_grpc"], token=svc.token) as mwra:
        mwra.register_local_worker(spec.run_id, worker_id, slots=slots)
        declare_policies(mwra, spec.run_id, spec.policies)
    keep_client = MwraClient(svc.endpoints["mwra_grpc"], token=svc.token)
    keepalive = keep_client.keepalive(spec.run_id, worker_id, 2.0)
    if svc.token:  # trainers get policy tokens, which may not create the run
        create_run(svc.endpoints["see_grpc"], trainer)
    names = []
    for pol in spec.policies:
        name = f"{spec.run_id}/{pol}"
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **trainer_env(svc.token, pol)}
        sup.start(ProcessSpec(
            name=name, argv=[*CHILD, "train", "-c", str(cfg_path), "--policy", pol],
            log_path=run_dir / "logs" / f"trainer-{pol}.log", env=env, finishes=True,
            stop_group=2))
        names.append(name)
    return ActiveRun(spec=spec, children=names, started=time.monotonic(), keepalive=keepalive,
                     keepalive_client=keep_client, worker_id=worker_id)


def finish_run(run: ActiveRun, svc: Services, out: Path, status: str) -> dict[str, Any]:
    from mutualrl.client.mwra import MwraClient

    wall = time.monotonic() - run.started
    if run.keepalive is not None:
        run.keepalive.stop()
    if run.keepalive_client is not None:
        run.keepalive_client.close()
    with contextlib.suppress(Exception), MwraClient(svc.endpoints["mwra_grpc"],
                                                    token=svc.token) as mwra:
        mwra.deregister_worker(run.spec.run_id, run.worker_id)
    run_dir = out / "runs" / run.spec.run_id
    see: dict[str, Any] = {}
    try:
        see = see_run_stats(svc, run.spec.run_id)
    except OSError as err:
        see = {"error": str(err)}
    (run_dir / "see_stats.json").write_text(json.dumps(see, indent=2))
    info = {"run_id": run.spec.run_id, "regime": run.spec.regime, "probe": run.spec.probe,
            "seed": run.spec.seed, "status": status, "wall_s": round(wall, 1),
            "ended_unix": round(time.time(), 1), "started_unix": round(time.time() - wall, 1),
            "exit_codes": run.exit_codes,
            "rounds_done": {p: _count_lines(_metrics_path(out, run.spec.run_id, p))
                            for p in run.spec.policies}}
    (run_dir / "run.json").write_text(json.dumps(info, indent=2))
    return info


def _kill_group(sup: Supervisor, name: str) -> None:
    child = sup.children.get(name)
    if child is not None and child.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)


def run_grid(plan: ExperimentPlan, cfg: ExperimentConfig, svc: Services, out: Path,
             console: Any, stop: StopSignals, t_start: float) -> list[dict[str, Any]]:
    """Every run of the plan, `parallel_runs` at a time, under a live rich Progress."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    sup = Supervisor(log=lambda m: console.print(f"[yellow]{m}[/]"))
    infos: list[dict[str, Any]] = []
    pending = list(plan.runs)
    active: dict[str, ActiveRun] = {}
    total_rounds = sum(r.rounds * len(r.policies) for r in plan.runs)
    progress = Progress(TextColumn("{task.description}", justify="left"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                        refresh_per_second=2, transient=False)
    overall = progress.add_task("[bold]all runs", total=total_rounds, info="")
    bars = {r.run_id: progress.add_task(f"{r.regime}/{r.probe}/s{r.seed}", total=r.rounds,
                                        info="waiting", visible=True) for r in plan.runs}
    done_rounds: dict[str, int] = {}
    try:
        with progress:
            while pending or active:
                if stop.received is not None:
                    raise KeyboardInterrupt
                while pending and len(active) < cfg.parallel_runs:
                    if _over_budget(cfg, infos, t_start):
                        for spec in pending:
                            progress.update(bars[spec.run_id], info="skipped (time budget)")
                        console.print(f"[yellow]time budget {cfg.time_budget_s:.0f}s: "
                                      f"{len(pending)} runs not started[/]")
                        pending.clear()
                        break
                    spec = pending.pop(0)
                    active[spec.run_id] = start_run(spec, svc, sup, out, cfg)
                    progress.update(bars[spec.run_id], info="training")
                for child, code in sup.poll():
                    run_id = child.spec.name.split("/", 1)[0]
                    run = active.get(run_id)
                    if run is None:
                        continue
                    run.exit_codes[child.spec.name.split("/", 1)[1]] = code
                    if code != 0 and run.failed is None:
                        run.failed = (f"{child.spec.name} exited with code {code}: "
                                      f"{tail(child.spec.log_path, 5).strip()[-400:]}")
                        for other in run.children:  # its peer cannot finish a paired run
                            _kill_group(sup, other)
                for run_id, run in list(active.items()):
                    counts = [_count_lines(_metrics_path(out, run_id, p))
                              for p in run.spec.policies]
                    done_rounds[run_id] = sum(counts)
                    progress.update(bars[run_id], completed=min(counts))
                    if time.monotonic() - run.started > cfg.run_timeout and run.failed is None:
                        run.failed = f"timeout after {cfg.run_timeout:.0f}s"
                        for name in run.children:
                            _kill_group(sup, name)
                    if len(run.exit_codes) == len(run.children):
                        status = "ok" if run.failed is None else f"failed: {run.failed}"
                        attempt = int(run.spec.extra.get("attempt", 0))
                        if run.failed is not None and attempt < cfg.retries \
                                and "timeout" not in run.failed:
                            console.print(f"[yellow]{run_id} {status[:300]}; starting it again "
                                          f"({attempt + 1}/{cfg.retries})[/]")
                            finish_run(run, svc, out, status)
                            run.spec.extra["attempt"] = attempt + 1
                            pending.insert(0, run.spec)
                            del active[run_id]
                            progress.update(bars[run_id], completed=0, info="retrying")
                            continue
                        info = finish_run(run, svc, out, status)
                        info["attempts"] = attempt + 1
                        infos.append(info)
                        del active[run_id]
                        progress.update(bars[run_id], info="done" if run.failed is None
                                        else "[red]failed[/]")
                        _report_done(console, info, out, plan, infos, t_start)
                progress.update(overall, completed=sum(done_rounds.values()))
                time.sleep(0.5)
    finally:
        sup.stop_all(cfg.stop_grace)
        for run in active.values():
            infos.append(finish_run(run, svc, out, "interrupted"))
    return infos


def _over_budget(cfg: ExperimentConfig, infos: list[dict[str, Any]], t_start: float) -> bool:
    """Would one more run (at the pace so far) end past the time budget?"""
    if cfg.time_budget_s is None or not infos:
        return False
    elapsed = time.monotonic() - t_start
    per_run = max(float(i["wall_s"]) for i in infos)
    return elapsed + per_run > cfg.time_budget_s


def _report_done(console: Any, info: dict[str, Any], out: Path, plan: ExperimentPlan,
                 infos: list[dict[str, Any]], t_start: float) -> None:
    """One plain line per finished run (also readable in a nohup log), with the ETA."""
    finals = []
    for pol, n in info["rounds_done"].items():
        rows = read_rows(_metrics_path(out, info["run_id"], pol))
        ev = [r for r in rows if "heldout/mean" in r]
        if ev:
            finals.append(f"{pol} {ev[-1]['heldout/mean']:.3f}")
        del n
    left = len(plan.runs) - len(infos)
    elapsed = time.monotonic() - t_start
    # Runs overlap `parallel_runs` at a time: the elapsed time per finished run is the rate.
    per_run = elapsed / max(len(infos), 1)
    console.print(f"[{len(infos)}/{len(plan.runs)}] {info['run_id']} {info['status'][:60]} "
                  f"in {info['wall_s']:.0f}s; final held-out {', '.join(finals) or '—'}; "
                  f"elapsed {fmt_duration(elapsed)}, ETA {fmt_duration(left * per_run)}",
                  highlight=False)


# ---- results -----------------------------------------------------------------------------------


def collect(plan: ExperimentPlan, cfg: ExperimentConfig, out: Path,
            warm_reports: dict[str, dict[str, Any]], infos: list[dict[str, Any]],
            wall_s: float, quick: bool) -> dict[str, Any]:
    """results.json's content from what the runs wrote."""
    status = {i["run_id"]: i for i in infos}
    warm_by_regime: dict[str, dict[str, Any]] = {}
    for spec in plan.runs:
        warm_by_regime.setdefault(spec.regime, {})
        for pol, w in spec.warm.items():
            # With per-seed warm starts the table shows seed 0's (or the first seed's).
            warm_by_regime[spec.regime].setdefault(pol, warm_reports[w.key])
    results: dict[str, Any] = {
        "experiment": cfg.name, "quick": quick,
        "meta": {"seeds": cfg.seeds, "probes": cfg.probes,
                 "regime_probes": {r: cfg.regime_probes(r) for r in cfg.active_regimes()},
                 "wall_s": round(wall_s, 1),
                 "wall": fmt_duration(wall_s), "parallel_runs": cfg.parallel_runs,
                 "warm_start": {"per_seed": cfg.warm_start.per_seed,
                                "note": "one warm start per (regime, policy), reused by every "
                                        "seed and probe" if not cfg.warm_start.per_seed else
                                        "one warm start per (regime, policy, seed)"},
                 "created_unix": int(time.time())},
        "warm_starts": warm_by_regime,
        "warm_starts_all": warm_reports,
        "runs": [status.get(r.run_id, {"run_id": r.run_id, "regime": r.regime,
                                       "probe": r.probe, "seed": r.seed,
                                       "status": "not run"}) for r in plan.runs],
        "regimes": {},
    }
    for regime in cfg.active_regimes():
        specs = [r for r in plan.runs if r.regime == regime]
        done: list[RunResult] = []
        for r in specs:
            i = status.get(r.run_id)
            if not i or i["status"] != "ok":
                continue
            rows = {p: read_rows(_metrics_path(out, r.run_id, p)) for p in r.policies}
            see_path = out / "runs" / r.run_id / "see_stats.json"
            see = json.loads(see_path.read_text()) if see_path.exists() else {}
            done.append(RunResult(r.run_id, regime, r.probe, r.seed, rows, i["wall_s"],
                                  "ok", see))
        if not done:
            continue
        policies = specs[0].policies
        warm = {p: {k: float(v) for k, v in warm_by_regime[regime][p]
                    ["heldout_accuracy"].items()} for p in policies
                if p in warm_by_regime[regime]}
        regime_spec = cfg.regimes[regime]
        strong = {pol.name: list(pol.strong_skills) for pol in regime_spec.policies}
        results["regimes"][regime] = summarize_regime(
            done, policies, warm, cfg.regime_probes(regime), strong, cfg.contrasts)
    return results


def write_outputs(results: dict[str, Any], out: Path) -> None:
    from mutualrl.experiment.plot import plot_curves, plot_tradeoff

    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(render_markdown(results))
    if results["regimes"]:
        plot_curves(results, out / "curves.png")
        plot_tradeoff(results, out)


# ---- the command ---------------------------------------------------------------------------------


def report_only(cfg: ExperimentConfig, out: Path, console: Any) -> int:
    """Rebuild results.json / results.md / curves.png from what an earlier (maybe interrupted)
    invocation left under `out` (run.json, metrics.jsonl, see_stats.json, warm starts)."""
    out = out.resolve()
    plan = build_plan(cfg, out)
    warm = {w.key: warm_start_report(w, cfg.warm_start.weak_max, cfg.warm_start.strong_min)
            for w in plan.warm_starts if (w.out_dir / "sft_eval.json").exists()}
    infos = [json.loads((out / "runs" / r.run_id / "run.json").read_text()) for r in plan.runs
             if (out / "runs" / r.run_id / "run.json").exists()]
    # Wall time of the runs: from the first start to the last end (several invocations may have
    # written them, e.g. one regime at a time).
    stamps = [(i["started_unix"], i["ended_unix"]) for i in infos if "started_unix" in i]
    wall = max(e for _, e in stamps) - min(s for s, _ in stamps) if stamps else 0.0
    results = collect(plan, cfg, out, warm, infos, wall, quick=False)
    results["meta"]["report_only"] = True
    results["meta"]["runs_wall_s_sum"] = round(sum(i.get("wall_s", 0.0) for i in infos), 1)
    write_outputs(results, out)
    ok = sum(i["status"] == "ok" for i in infos)
    console.print(f"{ok}/{len(plan.runs)} runs ok -> {out}/results.md")
    return EXIT_OK


def lock_out_dir(out: Path) -> IO[bytes] | None:
    """An exclusive lock on `out` for one invocation (held while the returned file stays open),
    or None while another invocation holds it: two invocations on one --out would start two
    private Redis servers on one data directory, which corrupts its append-only file."""
    f = (out / ".experiment.lock").open("a+b")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def run_experiment(cfg: ExperimentConfig, raw: dict[str, Any], out: Path, console: Any,
                   quick: bool = False, warm_only: bool = False,
                   redis_url: str | None = None, token: str | None = None) -> int:
    """`mutualrl experiment`: warm starts, services, the grid of runs, the results; holding
    `out` for the whole invocation."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    lock = lock_out_dir(out)
    if lock is None:
        console.print(f"[red]another `mutualrl experiment` is running on {out}: give each "
                      "concurrent invocation its own --out (they would share the private "
                      "Redis's data directory); merge finished runs with --report-only[/]")
        return EXIT_CONFIG
    with lock:
        return _run_locked(cfg, raw, out, console, quick, warm_only, redis_url, token)


def _run_locked(cfg: ExperimentConfig, raw: dict[str, Any], out: Path, console: Any,
                quick: bool, warm_only: bool, redis_url: str | None, token: str | None) -> int:
    from mutualrl.launch.local_redis import RedisMissing
    from mutualrl.trainer.config.run import TrainerConfig

    plan = build_plan(cfg, out)
    for spec in plan.runs:  # every run's trainer section must validate before anything starts
        TrainerConfig.model_validate({**spec.trainer, "services": {"local": True}})
    record: dict[str, Any] = {"experiment": cfg.model_dump(mode="json"), "quick": quick,
                              **{k: raw[k] for k in ("see", "thl", "mwra") if k in raw}}
    (out / "experiment.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
    grid = "; ".join(f"{r}: {', '.join(cfg.regime_probes(r))}" for r in cfg.active_regimes())
    console.print(f"[bold]{cfg.name}[/]: {grid} x seeds "
                  f"{cfg.seeds} = {len(plan.runs)} runs, {cfg.parallel_runs} at a time; "
                  f"ETA of the runs {fmt_duration(plan.eta_s)} (+ warm starts, "
                  f"{len(plan.warm_starts)} to check or train) -> {out}", highlight=False)
    (out / "warm_start.json").unlink(missing_ok=True)  # never read an earlier invocation's
    stop = StopSignals()
    t0 = time.monotonic()
    svc: Services | None = None
    infos: list[dict[str, Any]] = []
    code = EXIT_OK
    t_runs = time.monotonic()
    try:
        if not warm_only:
            svc = start_services(cfg, raw, out, plan.runs, redis_url, token, console)
        warm_reports = make_warm_starts(plan, cfg, out, console, stop)
        (out / "warm_start.json").write_text(json.dumps(warm_reports, indent=2))
        if warm_only or svc is None:
            console.print(f"warm starts ready in {fmt_duration(time.monotonic() - t0)}")
            return EXIT_OK
        wait_services(svc, cfg, console)
        t_runs = time.monotonic()
        infos = run_grid(plan, cfg, svc, out, console, stop, t_runs)
    except RedisMissing as err:
        console.print(f"[red]{err}[/]")
        return EXIT_CONFIG
    except ChildFailed as err:
        console.print(f"[red]{err}[/]\n{err.log_tail}")
        if not (out / "warm_start.json").exists():
            return EXIT_FAILED
        code = EXIT_FAILED
    except KeyboardInterrupt:
        if not (out / "warm_start.json").exists():
            return EXIT_INTERRUPTED
        console.print("[yellow]interrupted: writing results of the finished runs[/]")
        code = EXIT_INTERRUPTED
    finally:
        if svc is not None:
            svc.sup.stop_all(cfg.stop_grace)
    warm_reports = json.loads((out / "warm_start.json").read_text())
    wall = time.monotonic() - t0
    results = collect(plan, cfg, out, warm_reports, infos, wall, quick)
    results["meta"]["runs_wall_s"] = round(time.monotonic() - t_runs, 1)
    write_outputs(results, out)
    failed = [i for i in infos if i["status"] != "ok"]
    console.print(f"done in {fmt_duration(wall)} (runs {fmt_duration(time.monotonic() - t_runs)})"
                  f": {len(infos) - len(failed)}/{len(plan.runs)} runs ok -> "
                  f"{out}/results.md, results.json, curves.png")
    if failed and code == EXIT_OK:
        code = EXIT_FAILED
    return code
