"""Command-line flags derived from a config model: one `--field` per scalar field, with the
field's type, choices and docstring, so a command's flags never drift from its model.

`add_model_flags(parser, Model)` adds `--<field>` for every field (nested models as
`--<field>-<subfield>`; `bool` fields as `--x/--no-x`; lists of scalars comma-separated;
mappings and anything else as JSON), each with default None; `flag_values(args, Model)` returns
the nested mapping of the flags given, to update a config file's values with.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pydantic stays out of `mutualrl --help`, which imports this module
    from pydantic import BaseModel

M = typing.TypeVar("M", bound="BaseModel")

_SCALARS: tuple[type, ...] = (str, int, float, Path)


def _unwrap_optional(annotation: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _comma_list(item: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        return [item(part.strip()) for part in text.split(",") if part.strip()]

    parse.__name__ = f"comma-separated {getattr(item, '__name__', 'value')}s"
    return parse


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None


_json.__name__ = "JSON"


def _argument(annotation: Any) -> dict[str, Any]:
    """argparse keywords for a field of this type (JSON for what has no plainer spelling)."""
    annotation = _unwrap_optional(annotation)
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction, "metavar": None}
    if origin is Literal:
        choices = typing.get_args(annotation)
        return {"type": type(choices[0]), "choices": choices}
    if annotation in _SCALARS:
        return {"type": annotation}
    if origin is list:
        (item,) = typing.get_args(annotation) or (str,)
        item = _unwrap_optional(item)
        if item in _SCALARS:
            return {"type": _comma_list(item), "metavar": "A,B,..."}
    return {"type": _json, "metavar": "JSON"}


def _fields(model: type[BaseModel], prefix: tuple[str, ...] = ()
            ) -> list[tuple[tuple[str, ...], dict[str, Any], str]]:
    """(path, argparse keywords, help) for every field, nested models flattened."""
    from pydantic import BaseModel

    out = []
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        annotation = _unwrap_optional(info.annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.extend(_fields(annotation, path))
            continue
        out.append((path, _argument(info.annotation), (info.description or "").replace("%", "%%")))
    return out


def _dest(path: tuple[str, ...]) -> str:
    return "flag__" + "__".join(path)


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], *,
                    aliases: Mapping[str, Sequence[str]] | None = None,
                    skip: Sequence[str] = ()) -> None:
    """Add a flag for every field of `model` (see the module).

    `aliases` maps a dotted field path ("task.regime") to more option strings for it ("--regime");
    `skip` names dotted paths that get no flag."""
    aliases = aliases or {}
    for path, kwargs, help_text in _fields(model):
        dotted = ".".join(path)
        if dotted in skip:
            continue
        options = [f"--{'-'.join(path).replace('_', '-')}", *aliases.get(dotted, ())]
        if "choices" not in kwargs:  # argparse lists the choices itself
            kwargs.setdefault("metavar", path[-1].upper())
        parser.add_argument(*options, dest=_dest(path), default=None, help=help_text, **kwargs)


def flag_values(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The values of the flags given, nested like the model's fields."""
    out: dict[str, Any] = {}
    for path, _, _ in _fields(model):
        value = getattr(args, _dest(path), None)
        if value is None:
            continue
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


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
