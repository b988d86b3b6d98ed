"""Command-line flags derived from a config model: one `--field` per scalar field, with the
field's type, choices and docstring, so a command's flags never drift from its model.

`add_model_flags(parser, Model)` adds `--<field>` for every field (nested models as
`--<field>-<subfield>`; `bool` fields as `--x/--no-x`; lists of scalars comma-separated), each
with default None; `flag_values(args, Model)` returns the nested mapping of the flags given,
to update a config file's values with. Mappings are left to the config file.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

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


def _argument(annotation: Any) -> dict[str, Any] | None:
    """argparse keywords for a field of this type; None when no flag can express it."""
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
    return None


def _fields(model: type[BaseModel], prefix: tuple[str, ...] = ()
            ) -> list[tuple[tuple[str, ...], dict[str, Any], str]]:
    """(path, argparse keywords, help) for every field a flag can set, nested models flattened."""
    out = []
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        annotation = _unwrap_optional(info.annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.extend(_fields(annotation, path))
            continue
        kwargs = _argument(info.annotation)
        if kwargs is not None:
            out.append((path, kwargs, (info.description or "").replace("%", "%%")))
    return out


def _dest(path: tuple[str, ...]) -> str:
    return "flag__" + "__".join(path)


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], *,
                    aliases: Mapping[str, Sequence[str]] | None = None,
                    skip: Sequence[str] = ()) -> None:
    """Add a flag for every field of `model` that a flag can express (see the module).

    `aliases` maps a dotted field path ("task.regime") to more option strings for it ("--regime");
    `skip` names dotted paths that get no flag."""
    aliases = aliases or {}
    for path, kwargs, help_text in _fields(model):
        dotted = ".".join(path)
        if dotted in skip:
            continue
        options = [f"--{'-'.join(path).replace('_', '-')}", *aliases.get(dotted, ())]
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
