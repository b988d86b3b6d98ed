"""The images as their Dockerfiles build them: packages, constraints, dependency closure.

Used by validate_policies.py (`context`, `pips`, `closure`, `constraints`, and the import and CLI
checks). An image installs workspace packages (directories with a pyproject.toml) under a
constraints file; its dependency closure is followed from those pyproject.toml files, then
through the metadata of the distributions installed here (markers evaluated for this
interpreter). Every problem names the Dockerfile (relative to the build context) and its line.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from dockerfile import Dockerfile, IgnoreFile, PipInstall, Stage, ignore_file, parse
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# What an image of a Dockerfile must not hold: trainer-only and heavy.
TRAINER_ONLY = ("torch", "matplotlib", "tensorboard")
FORBIDDEN = {"Dockerfile.service": TRAINER_ONLY}
# A venv's own tools; the constraints leave them out (scripts/constraints.py).
ENVIRONMENT = {"pip", "setuptools", "wheel"}
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.!+_-]*)")
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}


@dataclass
class Package:
    """A workspace package: a directory of the build context holding a pyproject.toml."""

    name: str  # canonical distribution name
    directory: str  # relative to the build context
    project: dict[str, Any]

    def requirements(self, extras: set[str]) -> list[Requirement]:
        raw = list(self.project.get("dependencies") or [])
        optional = self.project.get("optional-dependencies") or {}
        for extra in sorted(extras):
            raw += optional.get(extra, [])
        return [Requirement(r) for r in raw]

    def subpackages(self, context: Path) -> list[str]:
        """Top-level `mutualrl.*` packages and modules under its src/mutualrl/."""
        root = context / self.directory / "src" / "mutualrl"
        if not root.is_dir():
            return []
        return sorted(
            f"mutualrl.{p.stem}"
            for p in root.iterdir()
            if (p.is_dir() and not p.name.startswith(("_", "."))) or p.suffix == ".py"
        )

    def needed_files(self, context: Path) -> list[str]:
        """Context paths its build reads: pyproject.toml, its readme, everything under src/
        (modules, stubs, protos, package data such as SEE's dashboard pages)."""
        base = context / self.directory
        files = [f"{self.directory}/pyproject.toml"]
        readme = self.project.get("readme")
        if isinstance(readme, dict):
            readme = readme.get("file")
        if isinstance(readme, str):
            files.append(f"{self.directory}/{readme}")
        if (base / "src").is_dir():
            files += sorted(
                p.relative_to(context).as_posix()
                for p in (base / "src").rglob("*")
                if p.is_file() and p.suffix != ".pyc" and "__pycache__" not in p.parts
            )
        return files


def workspace(context: Path) -> dict[str, Package]:
    """The packages of the build context by canonical name (pyproject.toml up to 3 levels down)."""
    packages: dict[str, Package] = {}
    for pyproject in sorted(context.glob("*/pyproject.toml")) + sorted(
        context.glob("*/*/pyproject.toml")
    ) + sorted(context.glob("*/*/*/pyproject.toml")):
        if SKIP_DIRS & set(pyproject.relative_to(context).parts):
            continue
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project") or {}
        if project.get("name"):
            name = canonicalize_name(project["name"])
            directory = pyproject.parent.relative_to(context).as_posix()
            packages.setdefault(name, Package(name, directory, project))
    return packages


def read_constraints(path: Path, shown: str) -> tuple[dict[str, str], list[str]]:
    """(pins by canonical name, problems) of a constraints file; only `name==version` lines pass."""
    pins: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        where = f"{shown}:{number}: '{line}'"
        match = PIN.fullmatch(line)
        if match:
            name = canonicalize_name(match.group(1))
            if name in pins:
                problems.append(f"{where}: {name} is pinned twice")
            pins[name] = match.group(2)
            continue
        if re.match(r"(-i|--index-url|--extra-index-url)\b", line):
            why = "an index URL (the index is the installer's setting, not the pins')"
        elif re.match(r"(-f|--find-links)\b", line):
            why = "--find-links (a local or remote wheel folder)"
        elif re.match(r"(-e|--editable)\b", line):
            why = "an editable install"
        elif line.startswith(("-", "--")):
            why = "an installer option"
        elif "://" in line or " @ " in line or line.startswith(("file:", "git+")):
            why = "a URL or direct reference"
        elif line.startswith((".", "/", "~")) or line.endswith((".whl", ".tar.gz", ".zip")):
            why = "a local path"
        else:
            why = "not an exact pin"
        problems.append(f"{where}: {why}; constraints hold `name==version` lines only")
    return pins, problems


def shown(path: Path, context: Path) -> str:
    try:
        return path.resolve().relative_to(context.resolve()).as_posix()
    except ValueError:
        return str(path)


@dataclass
class Install:
    """A workspace package an image installs from its directory."""

    package: Package
    extras: set[str]
    pip: PipInstall
    stage: Stage


@dataclass
class Image:
    dockerfile: Dockerfile
    target: Stage
    where: str  # "deploy/docker/Dockerfile.service (target runtime)"
    installs: dict[str, Install] = field(default_factory=dict)
    closure: dict[str, str] = field(default_factory=dict)  # distribution -> how it got in
    pins: dict[str, Pins] = field(default_factory=dict)
    """distribution -> the constraints of the pip install that brought it in"""
    unfollowed: dict[str, str] = field(default_factory=dict)  # distribution -> why not
    errors: list[str] = field(default_factory=list)

    @property
    def workspace_names(self) -> set[str]:
        return set(self.installs)


def at(dockerfile: Dockerfile, line: int) -> str:
    return f"{shown(dockerfile.path, dockerfile.context)}:{line}"


@dataclass(frozen=True)
class Pins:
    """The pins of one pip install's constraints files."""

    pins: dict[str, str]
    files: str  # as written: "-c /src/constraints.txt"
    complete: bool  # every -c resolved to a file of the build context (check_pips says if not)


def constraint_pins(dockerfile: Dockerfile, stage: Stage, pip: PipInstall) -> Pins:
    pins: dict[str, str] = {}
    complete = bool(pip.constraints)
    for container in pip.constraints:
        source = dockerfile.context_path(stage, container)
        if source and (dockerfile.context / source).is_file():
            found, _ = read_constraints(dockerfile.context / source, source)
            pins.update(found)
        else:
            complete = False
    return Pins(pins, " and ".join(f"-c {c}" for c in pip.constraints), complete)


def installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def build_image(dockerfile: Dockerfile, target: Stage, packages: dict[str, Package]) -> Image:
    """The distributions the image `target` of `dockerfile` holds, and how each got in."""
    image = Image(dockerfile, target, f"{shown(dockerfile.path, dockerfile.context)} "
                                      f"(target {target.label})")
    roots: list[tuple[Requirement, str, Pins]] = []  # (requirement, why, pins)
    for stage in dockerfile.closure(target):
        for pip in stage.pips:
            pins = constraint_pins(dockerfile, stage, pip)
            for _, container, extras in pip.paths:
                source = dockerfile.context_path(stage, container)
                package = next((p for p in packages.values() if p.directory == source), None)
                if package is None:
                    continue  # check_pips names it
                install = image.installs.setdefault(
                    package.name, Install(package, set(), pip, stage))
                install.extras |= set(extras)
            for name in pip.names:
                try:
                    roots.append((Requirement(name), f"{at(dockerfile, pip.line)}: {name}", pins))
                except InvalidRequirement:
                    continue
    # A workspace package may ask for another's extras (mutualrl-common[redis]): to a fixpoint.
    changed = True
    while changed:
        changed = False
        for install in list(image.installs.values()):
            for requirement in install.package.requirements(install.extras):
                other = image.installs.get(canonicalize_name(requirement.name))
                if other is not None and not set(requirement.extras) <= other.extras:
                    other.extras |= set(requirement.extras)
                    changed = True
    for install in image.installs.values():
        pins = constraint_pins(dockerfile, install.stage, install.pip)
        chosen = sorted(install.extras)
        why = f"{at(dockerfile, install.pip.line)}: {install.package.name}" + (
            f"[{','.join(chosen)}]" if chosen else "")
        for requirement in install.package.requirements(install.extras):
            if requirement.marker is None or any(
                requirement.marker.evaluate({"extra": e}) for e in ("", *chosen)
            ):
                roots.append((requirement, why, pins))
    follow(image, roots, packages)
    return image


def follow(image: Image, roots: list[tuple[Requirement, str, Pins]],
           packages: dict[str, Package]) -> None:
    """Walk the requirements into image.closure through the installed metadata."""
    stack = list(reversed(roots))
    while stack:
        requirement, why, pins = stack.pop()
        name = canonicalize_name(requirement.name)
        if name in packages:
            if name not in image.installs:
                image.errors.append(
                    f"{why} requires {name}, which no pip install of {image.where} takes from "
                    f"its directory {packages[name].directory}/ (pip would fetch it from an index)"
                )
            continue
        chain = f"{why} -> {name}"
        if name in image.closure or name in image.unfollowed:
            continue
        dist = installed(name)
        pinned = pins.pins.get(name)
        image.closure[name] = chain
        image.pins[name] = pins
        if dist is None:
            image.unfollowed[name] = f"{chain}: not installed here"
            continue
        here = dist.version.split("+", 1)[0]
        if pinned is not None and not same_version(here, pinned):
            image.unfollowed[name] = f"{chain}: pinned {pinned}, installed here {here}"
            continue
        extras = ("", *requirement.extras)
        for raw in dist.requires or []:
            sub = Requirement(raw)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                stack.append((sub, chain, pins))


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def leaf_images(dockerfile: Dockerfile, packages: dict[str, Package]) -> list[Image]:
    return [build_image(dockerfile, target, packages) for target in dockerfile.targets()]


# ---- the checks ---------------------------------------------------------------------------------


def check_context(path: Path, context: Path) -> list[str]:
    """COPY sources exist and are admitted by the ignore file, which admits nothing else."""
    dockerfile = parse(path, context)
    name = shown(path, context)
    errors: list[str] = []
    used: list[str] = []  # context paths the COPY instructions read
    for stage in dockerfile.stages:
        for copy in stage.copies:
            for source in copy.missing:
                errors.append(f"{at(dockerfile, copy.line)}: COPY {source}: no such path in the "
                              f"build context {context}")
            used += [source for _, source, _ in copy.entries]
    ignore_path = ignore_file(path, context)
    if ignore_path is None:
        return [*errors, f"{name}: no {path.name}.dockerignore beside it and no .dockerignore "
                         "in the build context: the whole context (.venv, .env) would be sent"]
    ignore = IgnoreFile.read(ignore_path)
    ignore_name = shown(ignore_path, context)
    packages = workspace(context)
    for source in sorted(set(used)):
        package = next((p for p in packages.values() if p.directory == source), None)
        if package is not None:
            needed = package.needed_files(context)
        elif (context / source).is_dir():
            needed = [p.relative_to(context).as_posix() for p in (context / source).rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts]
        else:
            needed = [source]
        refused = [f for f in needed if (context / f).exists() and not ignore.admits(f)]
        if refused:
            more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
            errors.append(f"{ignore_name}: keeps out {', '.join(refused[:3])}{more}, which "
                          f"{name} COPYs ({source})")
    extra = [f for f in ignore.admitted_files(context)
             if not any(f == u or f.startswith(u.rstrip("/") + "/") for u in used)]
    if extra:
        tops = sorted({"/".join(f.split("/")[:2]) for f in extra})
        errors.append(f"{ignore_name}: admits {', '.join(tops[:6])}"
                      f"{' ...' if len(tops) > 6 else ''}, which no COPY of {name} uses "
                      "(the allow-list admits exactly what the build needs)")
    return errors


def check_pips(path: Path, context: Path) -> list[str]:
    """Each pip install takes workspace packages from COPY'd directories under constraints."""
    dockerfile = parse(path, context)
    packages = workspace(context)
    directories = {p.directory: p for p in packages.values()}
    errors: list[str] = []
    pips = [(stage, pip) for stage in dockerfile.stages for pip in stage.pips]
    if not pips:
        errors.append(f"{shown(path, context)}: no pip install: the image installs no package")
    for stage, pip in pips:
        where = f"{at(dockerfile, pip.line)}: pip install (stage {stage.label})"
        workspace_args: list[str] = []
        for written, container, _ in pip.paths:
            source = dockerfile.context_path(stage, container)
            if source is None:
                errors.append(f"{where}: {written} is {container}, which no COPY from the build "
                              f"context puts into stage {stage.label}")
            elif source not in directories:
                reason = ("is not a package directory (no pyproject.toml with a [project] name)"
                          if (context / source).exists() else "does not exist")
                errors.append(f"{where}: {written} is the build context's {source}, which "
                              f"{reason}")
            else:
                workspace_args.append(written)
        for name in pip.names:
            try:
                requested = canonicalize_name(Requirement(name).name)
            except InvalidRequirement:
                errors.append(f"{where}: '{name}' is not a requirement")
                continue
            if requested in packages:
                errors.append(f"{where}: installs {requested} by name, from an index; install "
                              f"./{packages[requested].directory} from the build context")
        for items, template in (
            (pip.requirement_files, "installs a requirements file (-r {}); install the package "
                                    "directories under -c constraints.txt instead"),
            (pip.editables, "-e {}: an image installs packages, not editable checkouts"),
            (pip.unresolved, "'{}' is computed by the shell; name the package directories so "
                             "this check can follow them"),
            (pip.urls, "installs '{}' from a URL; pin it in the constraints and install it by "
                       "name"),
        ):
            errors += [f"{where}: {template.format(item)}" for item in items]
        if not pip.constraints:
            errors.append(f"{where}: no -c constraints.txt; every version an image installs "
                          "comes from the constraints file")
        for container in pip.constraints:
            source = dockerfile.context_path(stage, container)
            if source is None:
                errors.append(f"{where}: -c {container}: no COPY from the build context puts it "
                              f"into stage {stage.label} (COPY constraints.txt first)")
            elif not (context / source).is_file():
                errors.append(f"{where}: -c {container}: the build context has no file {source}")
        if pip.no_deps and workspace_args:
            errors.append(f"{where}: --no-deps with {', '.join(workspace_args)}: their "
                          "dependencies must come from their pyproject.toml, not a hand-made list")
        if pip.index_options and not pip.no_deps:
            errors.append(f"{where}: {'; '.join(pip.index_options)} without --no-deps: every "
                          "dependency could come from that index too")
    return errors


def check_closure(path: Path, context: Path) -> tuple[list[str], list[str]]:
    """(errors, notes): each image's closure is pinned and holds nothing it must not."""
    dockerfile = parse(path, context)
    packages = workspace(context)
    errors: list[str] = []
    notes: list[str] = []
    forbidden = FORBIDDEN.get(path.name, ())
    for image in leaf_images(dockerfile, packages):
        errors += image.errors
        for name in forbidden:
            if name in image.closure:
                errors.append(f"{image.where}: {name} does not belong in this image; it comes "
                              f"in through {image.closure[name]}")
        for name, chain in sorted(image.closure.items()):
            pins = image.pins[name]
            # An install without (resolvable) constraints is check_pips' finding, not repeated.
            if pins.complete and name not in ENVIRONMENT and name not in pins.pins:
                errors.append(f"{chain}: {name} is not pinned in {pins.files}")
        if "mutualrl" in image.target.entrypoint and not any(
            "mutualrl" in (i.package.project.get("scripts") or {}) for i in image.installs.values()
        ):
            errors.append(f"{image.where}: ENTRYPOINT runs `mutualrl`, but no package of the "
                          "image provides that command (mutualrl-sdk)")
        for _, why in sorted(image.unfollowed.items()):
            notes.append(f"{image.where}: not followed further, {why}")
    return errors, notes
