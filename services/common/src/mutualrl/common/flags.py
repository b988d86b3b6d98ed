"""Command-line flags derived from a config model by pydantic-settings' CLI source
(`CliSettingsSource`), so a command's flags never drift from its model.

`add_model_flags(parser, Model)` adds a flag for every field of `Model` to an argparse parser of
the `mutualrl` command tree: `--<field>` in kebab case, nested models as `--<field>.<subfield>`,
`bool` fields as `--x/--no-x`, lists comma-separated (or JSON), mappings as JSON, the field's
docstring and default as help; `flag_values(args, Model)` returns the nested mapping of the flags
given (unvalidated: the caller merges it over the file and the environment, `load_section`, and
validates the whole). A scalar flag's value is checked against its field's type while the
command line is parsed, so `--port abc` is an argparse error naming the flag (exit 2).
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pydantic stays out of `mutualrl --help`, which imports this module
    from pydantic import BaseModel
    from pydantic_settings import BaseSettings, CliSettingsSource

M = typing.TypeVar("M", bound="BaseModel")

_SCALARS: tuple[type, ...] = (str, int, float, Path)


def _settings(model: type[BaseModel]) -> type[BaseSettings]:
    """`model` as the settings class the CLI source reads its fields from (never built)."""
    from pydantic_settings import BaseSettings

    return types.new_class(f"{model.__name__}Flags", (BaseSettings, model))


def _field(model: type[BaseModel], dotted: str) -> Any:
    """The annotation of the field at `dotted` (a CLI dest: `task.heldout_seed`), or None."""
    annotation: Any = model
    for name in dotted.split("."):
        fields = getattr(annotation, "model_fields", None)
        if fields is None or name not in fields:
            return None
        annotation = _unwrap_optional(fields[name].annotation)
    return annotation


def _unwrap_optional(annotation: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _checked(annotation: Any) -> Callable[[str], str]:
    """An argparse `type` that lets a value through unchanged when `annotation` accepts it."""
    from pydantic import TypeAdapter, ValidationError

    adapter = TypeAdapter(annotation)

    def check(text: str) -> str:
        try:
            adapter.validate_python(text)
        except ValidationError as err:
            raise argparse.ArgumentTypeError(err.errors()[0]["msg"]) from None
        return text

    check.__name__ = getattr(annotation, "__name__", "value")
    return check


def _source(model: type[BaseModel], parser: argparse.ArgumentParser,
            aliases: Mapping[str, Sequence[str]] | None = None
            ) -> tuple[CliSettingsSource[Any], set[str]]:
    """The CLI source of `model` over `parser` (its flags added to it), and their dests."""
    from pydantic_settings import CliSettingsSource

    dests: set[str] = set()

    def add_argument(context: Any, *names: str, **kwargs: Any) -> Any:
        dests.add(kwargs.get("dest", ""))
        annotation = _field(model, kwargs.get("dest", ""))
        one_value = kwargs.get("action", "store") == "store" and "nargs" not in kwargs
        if one_value and (annotation in _SCALARS or typing.get_origin(annotation) is Literal):
            kwargs["type"] = _checked(annotation)
        return context.add_argument(*names, **kwargs)

    shortcuts = {path: [name.lstrip("-") for name in names]
                 for path, names in (aliases or {}).items()}
    source: CliSettingsSource[Any] = CliSettingsSource(
        _settings(model), root_parser=parser, cli_kebab_case=True, cli_implicit_flags=True,
        cli_avoid_json=True, cli_hide_none_type=True, cli_shortcuts=shortcuts,
        add_argument_method=add_argument)
    return source, dests


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], *,
                    aliases: Mapping[str, Sequence[str]] | None = None) -> None:
    """Add a flag for every field of `model` (see the module). `aliases` maps a dotted field
    path ("task.regime") to more option strings for it ("--regime")."""
    _source(model, parser, aliases)


def flag_values(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The values of `model`'s flags given in `args`, nested like the model's fields (other
    arguments of the command are left out). A value the source cannot read (a mapping that is
    not JSON) exits 2 naming its field, as argparse does for the others."""
    import sys

    from pydantic_settings import SettingsError

    source, dests = _source(model, argparse.ArgumentParser(add_help=False))
    given = {k: v for k, v in vars(args).items() if k in dests and v is not None}
    try:
        values: dict[str, Any] = source(parsed_args=given)()
    except SettingsError as err:
        print(f"mutualrl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return values


def deferred_flags(module: str, model: str, *,
                   aliases: Mapping[str, Sequence[str]] | None = None
                   ) -> Callable[[argparse.ArgumentParser], None]:
    """`add_model_flags` for the model `module.model`, imported only when the command is parsed
    (`Commands.add(..., deferred=...)`: `mutualrl --help` imports no config model)."""

    def add(parser: argparse.ArgumentParser) -> None:
        import importlib

        add_model_flags(parser, getattr(importlib.import_module(module), model), aliases=aliases)

    return add


def load_flagged(args: argparse.Namespace, section: str, model: type[M]) -> M:
    """The `section` of `args.config` (None: defaults) as `model`: the environment over the
    file, the flags of `add_model_flags` over both (`mutualrl.common.config.load_section`)."""
    from mutualrl.common.config import load_section

    return load_section(args.config, section, model, **flag_values(args, model))


def serve_handler(section: str, module: str, model: str,
                  server: str) -> Callable[[argparse.Namespace], int]:
    """The handler of `mutualrl <section> serve`: the section as `module.model` (file,
    environment, flags), then `server.serve(config)` on the config's event loop (both modules
    imported when the command runs)."""

    def handle(args: argparse.Namespace) -> int:
        import importlib

        from mutualrl.common import event_loop

        cfg = load_flagged(args, section, getattr(importlib.import_module(module), model))
        event_loop.run(importlib.import_module(server).serve(cfg), cfg.event_loop)
        return 0

    return handle
