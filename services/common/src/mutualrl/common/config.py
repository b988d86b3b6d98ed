"""Typed configuration: pydantic models loaded from YAML files in `configs/`.

One YAML file describes a whole run; each process reads the section it owns
(`load_section(path, "see", SeeConfig)`), so services never import the trainer's schema.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mutualrl.common import ids, keys
from mutualrl.common.errors import InvalidArgument
from mutualrl.common.event_loop import EventLoopKind

M = TypeVar("M", bound=BaseModel)


def _follows(rule: ids.IdRule) -> AfterValidator:
    def check(value: str) -> str:
        try:
            return rule.check(value, "")
        except InvalidArgument as err:  # pydantic reports ValueErrors with the field's path
            raise ValueError(err.message) from None

    return AfterValidator(check)


RunId = Annotated[str, _follows(ids.RUN_ID)]
"""A config field holding a run id (`mutualrl.common.ids.RUN_ID`)."""
Name = Annotated[str, _follows(ids.NAME)]
"""A config field holding a policy, worker or trainer id (`mutualrl.common.ids.NAME`)."""
TokenizerId = Annotated[str, _follows(ids.TOKENIZER_ID)]
"""A config field holding a THL tokenizer id (`mutualrl.common.ids.TOKENIZER_ID`)."""


class Config(BaseModel):
    """Base of every config model: unknown keys are errors, field docstrings are descriptions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


class ServiceConfig(Config):
    """What every gRPC service needs to listen, authenticate and expose metrics."""

    host: str = "127.0.0.1"
    """Interface the gRPC server binds to (use 0.0.0.0 in containers)."""
    port: int = Field(default=0, ge=0, le=65535)
    """gRPC port; 0 picks a free one (the bound port is logged and returned)."""
    auth_token: str | None = None
    """Bearer token every call must carry (`authorization: Bearer <token>`); None disables auth.
    Defaults to the MUTUALRL_AUTH_TOKEN environment variable when unset."""
    tls_cert: Path | None = None
    """PEM certificate chain; with `tls_key` the server listens with TLS instead of plaintext."""
    tls_key: Path | None = None
    """PEM private key matching `tls_cert`."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the Prometheus /metrics HTTP endpoint; None serves none (0 picks a free one)."""
    event_loop: EventLoopKind = "auto"
    """The asyncio event loop the service runs on: `auto` takes uvloop when it is installed (a
    dependency everywhere but Windows) and asyncio's own loop otherwise; `uvloop` requires it;
    `asyncio` forces the standard library's loop."""
    grace_seconds: float = Field(default=5.0, ge=0)
    """On SIGTERM, in-flight calls get this long to finish before the server stops."""
    max_message_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """Largest gRPC message accepted or sent: the largest request of the methods whose
    requests may be large (SEE's Publish and ReportMetrics, THL's AlignTrace)."""
    max_request_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    """Largest request of every other method (at most `max_message_bytes`): a larger one is
    RESOURCE_EXHAUSTED from its length, before it is parsed."""
    max_inflight_request_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    """Request bytes the calls of one process hold at once: a call takes its method's largest
    request before its body is read (then the body's length) and holds it until its answer is
    sent; one that does not fit waits up to `request_wait_seconds`, then is
    RESOURCE_EXHAUSTED (retry later). One call alone always runs. It bounds what a service
    receives, parses and works on at once, whoever sends what (docs/reliability.md)."""
    request_wait_seconds: float = Field(default=1.0, ge=0, le=60)
    """How long a call waits for room in `max_inflight_request_bytes` before it is refused."""
    key_prefix: str = Field(default=keys.DEFAULT_PREFIX, pattern=keys.PREFIX_PATTERN)
    """First segment of every Redis key the service writes: `<prefix>:<service>:{<run_id>}:...`
    for a run's keys, `<prefix>:<service>:<name>` for indexes (`mutualrl.common.keys`).
    Deployments (or test runs) sharing one Redis keep apart with different prefixes."""

    def resolved_token(self) -> str | None:
        """The configured token, else MUTUALRL_AUTH_TOKEN, else None (auth off)."""
        return self.auth_token or os.environ.get("MUTUALRL_AUTH_TOKEN") or None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a clear error names the file when it is not a mapping."""
    text = Path(path).read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values, mappings merged key by key (a flag or an environment
    variable sets one nested field and keeps its siblings from the file)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


ENV_PREFIX = "MUTUALRL_"
ENV_NESTED_DELIMITER = "__"


def env_values(section: str, model: type[BaseModel],
               environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The values the environment gives a run YAML's `section` (a `model`), read by
    pydantic-settings: `MUTUALRL_<SECTION>__<FIELD>[__<FIELD>...]`, case-insensitive, e.g.
    MUTUALRL_TRAINER__GRPO__ROUNDS=5; lists and mappings are JSON. Unparsed: the caller merges
    them over the file (`deep_merge`) and validates the result, so a bad value is an error
    naming its field."""
    from pydantic import create_model
    from pydantic_settings import BaseSettings, EnvSettingsSource

    env = os.environ if environ is None else environ

    class Source(EnvSettingsSource):
        def _load_env_vars(self) -> Mapping[str, str | None]:
            return {k.lower(): v for k, v in env.items() if v}  # empty: unset

    prefix = f"{ENV_PREFIX}{section.upper()}{ENV_NESTED_DELIMITER}"
    for var in env:
        if var.upper().startswith(prefix) and env[var]:
            name = var[len(prefix):].split(ENV_NESTED_DELIMITER)[0].lower()
            if name not in model.model_fields:  # pydantic-settings would pass over it
                raise ValueError(f"{var}: the `{section}` section has no field {name!r}")
    fields: dict[str, Any] = {name: (info.annotation, None)
                              for name, info in model.model_fields.items()}
    settings = create_model(f"{model.__name__}Env", __base__=BaseSettings, **fields)
    source = Source(settings, case_sensitive=False, env_prefix=prefix,
                    env_nested_delimiter=ENV_NESTED_DELIMITER)
    return {k: v for k, v in source().items() if v is not None}


def load_section(path: str | Path | None, section: str, model: type[M], *,
                 environ: Mapping[str, str] | None = None, **overrides: Any) -> M:
    """Build `model` from one top-level section of a run YAML (missing file or section: defaults).

    The environment's MUTUALRL_<SECTION>__<FIELD>... variables (`env_values`; `environ`, else
    os.environ) win over the file, and keyword overrides that are not None (command-line flags)
    win over both.
    """
    data: dict[str, Any] = {}
    if path is not None:
        raw = load_yaml(path).get(section) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: section '{section}' must be a mapping")
        data.update(raw)
    data = deep_merge(data, env_values(section, model, environ))
    data = deep_merge(data, {k: v for k, v in overrides.items() if v is not None})
    return model.model_validate(data)


def load_model(path: str | Path, model: type[M]) -> M:
    """Build `model` from a whole YAML file."""
    return model.model_validate(load_yaml(path))
