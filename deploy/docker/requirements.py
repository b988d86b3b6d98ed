"""Print the third-party requirements of workspace packages, read from their pyproject.toml.

The images install these in a layer of their own, before the packages' sources are copied, so
a change to the sources rebuilds only the small layer that installs the packages themselves.

    python requirements.py proto services/common "services/trainer[sglang]" > requirements.txt

Each argument is a package directory, optionally with extras. A requirement on another package
of the arguments (with its extras) is followed instead of printed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
DIRECTORY = re.compile(r"(.+?)(?:\[([^\]]*)\])?")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def split_extras(extras: str | None) -> set[str]:
    return {normalized(e) for e in (extras or "").split(",") if e.strip()}


def main(args: list[str]) -> int:
    projects: dict[str, dict[str, Any]] = {}
    wanted: list[tuple[str, set[str]]] = []
    for arg in args:
        match = DIRECTORY.fullmatch(arg)
        if match is None:
            raise SystemExit(f"requirements.py: not a package directory: {arg!r}")
        project = tomllib.loads(Path(match[1], "pyproject.toml").read_text("utf-8"))["project"]
        name = normalized(project["name"])
        projects[name] = project
        wanted.append((name, split_extras(match[2])))
    printed: list[str] = []
    seen: set[tuple[str, str]] = set()
    while wanted:
        name, extras = wanted.pop()
        for extra in extras | {""}:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            project = projects[name]
            extras_of = project.get("optional-dependencies", {})
            optional = {normalized(k): v for k, v in extras_of.items()}
            if extra and extra not in optional:
                raise SystemExit(f"requirements.py: {project['name']} has no extra {extra!r}")
            deps: list[str] = optional[extra] if extra else project.get("dependencies", [])
            for dep in deps:
                found = REQUIREMENT.match(dep)
                if found is None:
                    raise SystemExit(f"requirements.py: cannot read requirement {dep!r}")
                dep_name = normalized(found[1])
                if dep_name in projects:
                    wanted.append((dep_name, split_extras(found[2])))
                elif dep not in printed:
                    printed.append(dep)
    print("\n".join(sorted(printed, key=str.lower)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
