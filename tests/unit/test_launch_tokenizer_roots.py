"""`mutualrl up` lets THL read exactly the tokenizers its trainers register: the
run's output_dir (presets, warm starts) and every policy's model_path / sft_checkpoint."""

from __future__ import annotations

from pathlib import Path

import yaml

from mutualrl.launch.up import make_launch_plan


def test_launch_plan_gives_thl_the_trainers_tokenizer_directories(tmp_path: Path) -> None:
    model = tmp_path / "ckpt" / "my-model"
    sft = tmp_path / "elsewhere" / "sft"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "trainer": {
            "run_id": "roots", "output_dir": str(tmp_path / "out"),
            "policies": [{"name": "a", "model_path": str(model)},
                         {"name": "b", "preset": "llama-char", "sft_checkpoint": str(sft)}]},
        "thl": {"tokenizer_roots": ["/srv/tokenizers"]}}))
    plan, _ = make_launch_plan(cfg, "redis://127.0.0.1:6379/0", None)
    eff = yaml.safe_load(plan.config_path.read_text())
    assert eff["thl"]["tokenizer_roots"] == [
        "/srv/tokenizers", str((tmp_path / "out").resolve()), str(model.resolve()),
        str(sft.resolve())]
    # without roots in the config THL's defaults stay, with the run's directories added
    cfg.write_text(yaml.safe_dump({"trainer": {
        "run_id": "roots", "output_dir": str(tmp_path / "out"),
        "policies": [{"name": "a", "model_path": str(model)}]}}))
    plan, _ = make_launch_plan(cfg, "redis://127.0.0.1:6379/0", None)
    eff = yaml.safe_load(plan.config_path.read_text())
    assert eff["thl"]["tokenizer_roots"] == ["runs", "/data/run",
                                             str((tmp_path / "out").resolve()),
                                             str(model.resolve())]


def test_a_cache_snapshot_adds_the_directory_its_files_link_into(tmp_path: Path) -> None:
    """A Hugging Face cache snapshot holds links into the cache's blobs/: THL must be let read
    them, or it refuses the tokenizer as linking out of its roots."""
    blobs = tmp_path / "hub" / "models--org--m" / "blobs"
    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (blobs / "1234").write_text("{}")
    (snapshot / "tokenizer.json").symlink_to(blobs / "1234")
    (snapshot / "config.json").write_text("{}")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": {
        "run_id": "roots", "output_dir": str(tmp_path / "out"),
        "policies": [{"name": "a", "model_path": str(snapshot)}]}}))
    plan, _ = make_launch_plan(cfg, "redis://127.0.0.1:6379/0", None)
    eff = yaml.safe_load(plan.config_path.read_text())
    assert eff["thl"]["tokenizer_roots"][-2:] == [str(snapshot.resolve()), str(blobs.resolve())]


def test_the_fresh_hint_names_the_users_run_file(tmp_path: Path) -> None:
    """Not the effective run.yaml `up` writes into the run directory (which has no `up:`
    section): `up -c` on that one would start another run."""
    cfg = tmp_path / "my-run.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": {
        "run_id": "hint", "output_dir": str(tmp_path / "out"),
        "policies": [{"name": "a", "preset": "llama-char"}]}}))
    plan, _ = make_launch_plan(cfg, "redis://127.0.0.1:6379/0", None)
    assert plan.config_path != cfg
    assert plan.fresh_command == f"mutualrl up -c {cfg} --fresh"
