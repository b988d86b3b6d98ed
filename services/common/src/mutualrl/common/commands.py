"""The registry that every package adds its `mutualrl ...` commands to.

It lives here, below every package, so a service registers its commands without importing the
command line itself (`mutualrl.cli`, in the SDK), which finds them through entry points.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

Handler = Callable[[argparse.Namespace], int]
Arguments = Callable[[argparse.ArgumentParser], None]

GROUP_HELP: dict[tuple[str, ...], str] = {
    ("bench",): "Benchmarks: JSON output, each figure a ratio against an anchor measured in the "
    "same run.",
    ("inspect",): "Look inside a run: SEE records, policies and transfers; MWRA allocations.",
    ("see",): "Shared Experience Exchange (SEE): gRPC + REST over Redis.",
    ("thl",): "Tokenizer Heterogeneity Layer (THL): retokenization and trace alignment.",
    ("mwra",): "Multi-Worker Resource Allocation (MWRA): workers, leases, allocations.",
}


class _Parser(argparse.ArgumentParser):
    """A command's parser that adds its deferred arguments when it parses (their config models
    import more than `mutualrl --help` should load)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deferred: list[Arguments] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        while self.deferred:
            self.deferred.pop(0)(self)
        return super().parse_known_args(args, namespace)


class Commands:
    """Registers `mutualrl A B ...` commands, creating parent groups (`bench`, `inspect`) on use."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._parser = parser
        self._groups: dict[tuple[str, ...], argparse._SubParsersAction] = {}
        self._parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {(): parser}

    def _subparsers(self, path: tuple[str, ...]) -> argparse._SubParsersAction:
        if path not in self._groups:
            parent = self._parsers[path]
            self._groups[path] = parent.add_subparsers(
                dest="_".join(("cmd", *path)), metavar="COMMAND", required=True,
                parser_class=_Parser)
        return self._groups[path]

    def group(self, path: Sequence[str], help: str) -> None:
        """Declare a group (e.g. ("bench",)) with its help text; idempotent."""
        key = tuple(path)
        for depth in range(1, len(key) + 1):
            sub = key[:depth]
            if sub not in self._parsers:
                self._parsers[sub] = self._subparsers(sub[:-1]).add_parser(
                    sub[-1], help=help if sub == key else None,
                    description=help if sub == key else None)

    def add(self, path: Sequence[str], help: str, handler: Handler,
            deferred: Arguments | None = None) -> argparse.ArgumentParser:
        """Add the command `mutualrl *path`; returns its parser for arguments. `deferred` adds
        more arguments when the command itself is parsed (flags derived from a config model)."""
        key = tuple(path)
        if len(key) > 1 and key[:-1] not in self._parsers:
            self.group(key[:-1], help=GROUP_HELP.get(key[:-1], f"{' '.join(key[:-1])} commands"))
        parser = self._subparsers(key[:-1]).add_parser(key[-1], help=help, description=help)
        parser.set_defaults(handler=handler)
        if deferred is not None and isinstance(parser, _Parser):
            parser.deferred.append(deferred)
        self._parsers[key] = parser
        return parser
