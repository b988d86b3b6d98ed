"""What a Dockerfile builds, read without a Docker engine (used by validate_policies.py).

`parse(path)` turns a Dockerfile into its stages: where each stage's files come from (COPY from
the build context or from another stage), its working directory and the `pip install` commands
of its RUN instructions, each with the line it starts on. `IgnoreFile` applies a .dockerignore
the way BuildKit does (last matching pattern wins; a pattern matching a directory covers what it
holds; `!` re-admits). The model covers what this project's Dockerfiles use: heredocs, ONBUILD
and shell forms other than POSIX sh are not interpreted.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# pip options that take a value (the value is the next argument unless given with `=`).
PIP_VALUE_OPTIONS = {
    "-c", "--constraint", "-r", "--requirement", "-e", "--editable", "-i", "--index-url",
    "--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix", "--root",
    "--platform", "--python-version", "--implementation", "--abi", "--progress-bar", "--src",
    "--upgrade-strategy", "-C", "--config-settings", "--global-option", "--no-binary",
    "--only-binary", "--trusted-host", "--cache-dir", "--log", "--timeout", "--retries",
    "--proxy", "--cert", "--client-cert", "--exists-action", "--report", "--root-user-action",
    "--python", "--group", "--build-option", "--keyring-provider", "--use-feature",
    "--use-deprecated", "--resume-retries",
}
SHORT_VALUE_OPTIONS = ("-c", "-r", "-e", "-i", "-f")  # also written glued: -cconstraints.txt
SHELL_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
SUBSTITUTION = re.compile(r"\$\((?:[^()]|\([^()]*\))*\)|`[^`]*`")
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::?[-+]([^}]*))?\}|(\w+))")


@dataclass
class PipInstall:
    """One `pip install` of a RUN instruction."""

    line: int
    argv: list[str]
    constraints: list[str] = field(default_factory=list)  # -c values, absolute container paths
    requirement_files: list[str] = field(default_factory=list)  # -r values
    editables: list[str] = field(default_factory=list)  # -e values
    paths: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    """Local directories or files: (as written, absolute container path, extras)."""
    names: list[str] = field(default_factory=list)  # requirement specifiers (from an index)
    urls: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)  # arguments with $(...) or `...`
    index_options: list[str] = field(default_factory=list)  # --index-url, --find-links ...
    no_deps: bool = False


@dataclass
class Copy:
    """One COPY/ADD: (container path, context path, whether the source is a directory) each."""

    line: int
    from_stage: str | None
    sources: list[str]  # as written
    entries: list[tuple[str, str, bool]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # sources not in the build context


@dataclass
class Stage:
    name: str
    index: int
    line: int
    base: str  # image or the name of an earlier stage
    workdir: str = "/"
    copies: list[Copy] = field(default_factory=list)
    pips: list[PipInstall] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)  # exec form words, or the shell line's

    @property
    def label(self) -> str:
        return self.name or f"#{self.index}"


@dataclass
class Dockerfile:
    path: Path
    context: Path
    stages: list[Stage]

    def stage(self, name: str) -> Stage | None:
        for stage in self.stages:
            if stage.name == name or (name.isdigit() and stage.index == int(name)):
                return stage
        return None

    def parent(self, stage: Stage) -> Stage | None:
        """The earlier stage `stage` is built FROM, None for an image."""
        found = self.stage(stage.base)
        return found if found is not None and found.index < stage.index else None

    def targets(self) -> list[Stage]:
        """Stages no other stage builds on or copies from: the images `--target` builds."""
        used: set[int] = set()
        for stage in self.stages:
            parent = self.parent(stage)
            if parent is not None:
                used.add(parent.index)
            for copy in stage.copies:
                source = self.stage(copy.from_stage) if copy.from_stage else None
                if source is not None:
                    used.add(source.index)
        return [s for s in self.stages if s.index not in used]

    def closure(self, target: Stage) -> list[Stage]:
        """`target` and every stage whose files end up in it (FROM chain, COPY --from)."""
        seen: dict[int, Stage] = {}
        todo = [target]
        while todo:
            stage = todo.pop()
            if stage.index in seen:
                continue
            seen[stage.index] = stage
            parent = self.parent(stage)
            if parent is not None:
                todo.append(parent)
            for copy in stage.copies:
                source = self.stage(copy.from_stage) if copy.from_stage else None
                if source is not None:
                    todo.append(source)
        return sorted(seen.values(), key=lambda s: s.index)

    def context_path(self, stage: Stage, container_path: str) -> str | None:
        """The build-context path a container path of `stage` was copied from, None when no COPY
        from the context put it there (in this stage or the stages it is built FROM)."""
        target = posixpath.normpath(container_path)
        current: Stage | None = stage
        while current is not None:
            for copy in reversed(current.copies):
                if copy.from_stage:
                    continue
                # Later sources of one COPY overwrite earlier ones; directories merge.
                for dest, source, is_dir in reversed(copy.entries):
                    if target == dest:
                        return source
                    if is_dir and target.startswith(dest.rstrip("/") + "/"):
                        rest = target[len(dest.rstrip("/")) + 1:]
                        inner = posixpath.normpath(posixpath.join(source, rest))
                        if (self.context / inner).exists():
                            return inner
            current = self.parent(current)
        return None


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, instruction text) with continuations joined and comments dropped."""
    escape = "\\"
    lines = text.splitlines()
    for raw in lines[:20]:  # parser directives sit on top
        match = re.match(r"#\s*escape\s*=\s*(\S)", raw)
        if match:
            escape = match.group(1)
        if not raw.startswith("#"):
            break
    start, parts = 0, list[str]()
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not parts and (not stripped or stripped.startswith("#")):
            continue
        if parts and stripped.startswith("#"):  # a comment inside a continuation
            continue
        if not parts:
            start = number
        if stripped.endswith(escape):
            parts.append(stripped[:-1])
            continue
        parts.append(stripped)
        yield start, " ".join(p for p in parts if p)
        parts = []
    if parts:
        yield start, " ".join(parts)


def substitute(value: str, variables: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if name in variables:
            return variables[name]
        return match.group(2) or ""

    return VARIABLE.sub(one, value)


def split_flags(args: str) -> tuple[dict[str, str], str]:
    """Leading `--name=value` / `--flag` options of an instruction, and the rest."""
    flags: dict[str, str] = {}
    rest = args
    while rest.startswith("--"):
        head, _, tail = rest.partition(" ")
        name, _, value = head[2:].partition("=")
        flags[name] = value
        rest = tail.lstrip()
    return flags, rest


def arguments(rest: str) -> list[str]:
    """Arguments of COPY/ENTRYPOINT: JSON array form or whitespace-separated."""
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
            if isinstance(parsed, list):
                return [str(a) for a in parsed]
        except json.JSONDecodeError:
            pass
    return rest.split()


def shell_commands(script: str) -> Iterator[list[str]]:
    """Simple commands of a POSIX shell line, split at &&, ||, ;, | (no expansion; a command
    substitution `$(...)` or `...` stays one word, as written)."""
    substitutions: list[str] = []

    def hide(match: re.Match[str]) -> str:
        substitutions.append(match.group(0))
        return f"\0{len(substitutions) - 1}\0"

    hidden = SUBSTITUTION.sub(hide, script)

    def shown(word: str) -> str:
        return re.sub("\0(\\d+)\0", lambda m: substitutions[int(m.group(1))], word)

    lexer = shlex.shlex(hidden, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.wordchars += "\0"
    command: list[str] = []
    try:
        for token in lexer:
            if token in SHELL_OPERATORS:
                if command:
                    yield command
                command = []
            else:
                command.append(shown(token))
    except ValueError:  # unbalanced quotes: what was read so far
        pass
    if command:
        yield command


def pip_argv(command: list[str]) -> list[str] | None:
    """The arguments after `install` when `command` runs pip install, else None."""
    words = [w for w in command if not re.fullmatch(r"\w+=.*", w)] if command else []
    while words and words[0] in ("exec", "env", "sudo", "nice", "time", "timeout"):
        words = words[1:]
    if not words:
        return None
    program = posixpath.basename(words[0])
    if re.fullmatch(r"pip3?(\.\d+)?", program):
        rest = words[1:]
    elif re.fullmatch(r"python3?(\.\d+)?", program) and words[1:3] == ["-m", "pip"]:
        rest = words[3:]
    else:
        return None
    while rest and rest[0].startswith("-"):  # pip's own options before the command
        rest = rest[1:]
    if not rest or rest[0] != "install":
        return None
    return rest[1:]


def parse_pip(line: int, argv: list[str], workdir: str) -> PipInstall:
    pip = PipInstall(line=line, argv=argv)

    def absolute(path: str) -> str:
        return posixpath.normpath(posixpath.join(workdir, path))

    k = 0
    while k < len(argv):
        arg = argv[k]
        name, inline, has_value = arg, "", False
        if arg.startswith("--") and "=" in arg:
            name, _, inline = arg.partition("=")
            has_value = True
        elif not arg.startswith("--") and len(arg) > 2 and arg[:2] in SHORT_VALUE_OPTIONS:
            name, inline, has_value = arg[:2], arg[2:], True
        if name in PIP_VALUE_OPTIONS:
            if has_value:
                value = inline
            else:
                k += 1
                value = argv[k] if k < len(argv) else ""
            if name in ("-c", "--constraint"):
                pip.constraints.append(absolute(value))
            elif name in ("-r", "--requirement"):
                pip.requirement_files.append(value)
            elif name in ("-e", "--editable"):
                pip.editables.append(value)
            elif name in ("-i", "--index-url", "--extra-index-url", "-f", "--find-links"):
                pip.index_options.append(f"{name} {value}")
        elif arg == "--no-deps":
            pip.no_deps = True
        elif arg.startswith("-"):
            pass
        elif "$(" in arg or "`" in arg:
            pip.unresolved.append(arg)
        elif "://" in arg or arg.startswith("git+") or " @ " in arg:
            pip.urls.append(arg)
        elif arg.startswith((".", "/")) or arg.endswith((".whl", ".tar.gz", ".zip")):
            match = re.fullmatch(r"(.*?)(?:\[([^\]]*)\])?", arg)
            path, extras = (match.group(1), match.group(2) or "") if match else (arg, "")
            pip.paths.append(
                (arg, absolute(path), tuple(e.strip() for e in extras.split(",") if e.strip()))
            )
        else:
            pip.names.append(arg)
        k += 1
    return pip


def expand_sources(context: Path, sources: list[str]) -> Iterator[tuple[str, str | None]]:
    """(as written, context path or None when missing) of COPY sources, wildcards expanded."""
    for source in sources:
        clean = posixpath.normpath(source.lstrip("/")) if source.strip("/.") else "."
        if any(ch in clean for ch in "*?["):
            matches = sorted(context.glob(clean))
            if not matches:
                yield source, None
            for match in matches:
                yield source, match.relative_to(context).as_posix()
        else:
            yield source, clean if (context / clean).exists() else None


def parse(path: Path, context: Path) -> Dockerfile:
    """The stages of the Dockerfile at `path`, COPY sources resolved against `context`."""
    text = path.read_text(encoding="utf-8")
    global_args: dict[str, str] = {}
    variables: dict[str, str] = {}
    stages: list[Stage] = []
    for line, instruction in logical_lines(text):
        keyword, _, rest = instruction.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        stage = stages[-1] if stages else None
        if keyword == "ARG":
            for item in rest.split():
                name, _, default = item.partition("=")
                (variables if stage else global_args)[name] = default.strip("\"'")
        elif keyword == "FROM":
            _, words = split_flags(rest)
            tokens = words.split()
            base = substitute(tokens[0], global_args) if tokens else ""
            name = tokens[2] if len(tokens) >= 3 and tokens[1].upper() == "AS" else ""
            parent = next((s for s in stages if s.name and s.name == base), None)
            stages.append(Stage(name=name, index=len(stages), line=line, base=base,
                                workdir=parent.workdir if parent else "/",
                                entrypoint=list(parent.entrypoint) if parent else []))
            variables = dict(global_args)
        elif stage is None:
            continue
        elif keyword == "ENV":
            for name, value in re.findall(r"(\w+)=(\"[^\"]*\"|'[^']*'|\S+)", rest):
                variables[name] = value.strip("\"'")
        elif keyword == "WORKDIR":
            stage.workdir = posixpath.normpath(
                posixpath.join(stage.workdir, substitute(rest, variables)))
        elif keyword in ("COPY", "ADD"):
            stage.copies.append(parse_copy(line, rest, stage, variables, context))
        elif keyword == "RUN":
            _, script = split_flags(rest)
            if script.startswith("["):
                script = " ".join(shlex.quote(a) for a in arguments(script))
            for command in shell_commands(script):
                argv = pip_argv([substitute(w, variables) for w in command])
                if argv is not None:
                    stage.pips.append(parse_pip(line, argv, stage.workdir))
        elif keyword == "ENTRYPOINT":
            stage.entrypoint = arguments(rest)
    return Dockerfile(path=path, context=context, stages=stages)


def parse_copy(line: int, rest: str, stage: Stage, variables: dict[str, str],
               context: Path) -> Copy:
    flags, rest = split_flags(rest)
    args = [substitute(a, variables) for a in arguments(rest)]
    sources, dest = args[:-1], args[-1] if args else "."
    copy = Copy(line=line, from_stage=flags.get("from"), sources=sources)
    if copy.from_stage:
        return copy
    as_dir = dest.endswith("/") or len(sources) > 1
    dest = posixpath.normpath(posixpath.join(stage.workdir, dest))
    for written, source in expand_sources(context, sources):
        if source is None:
            copy.missing.append(written)
            continue
        is_dir = (context / source).is_dir()
        if "parents" in flags:
            target = posixpath.join(dest, source)
        elif is_dir:
            target = dest  # a directory's contents, not the directory itself
        else:
            target = posixpath.join(dest, posixpath.basename(source)) if as_dir else dest
        copy.entries.append((posixpath.normpath(target), source, is_dir))
    return copy


# ---- .dockerignore --------------------------------------------------------------------------


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match, plus `**` for any number of directories)."""
    out, k = [], 0
    while k < len(pattern):
        ch = pattern[k]
        if pattern.startswith("**", k):
            k += 2
            if pattern.startswith("/", k):
                k += 1
                out.append("(?:.*/)?")
            else:
                out.append(".*")
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = pattern.find("]", k + 1)
            if end == -1:
                out.append(re.escape(ch))
            else:
                body = pattern[k + 1:end].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
                k = end
        elif ch == "\\" and k + 1 < len(pattern):
            k += 1
            out.append(re.escape(pattern[k]))
        else:
            out.append(re.escape(ch))
        k += 1
    return re.compile("".join(out))


@dataclass
class IgnoreFile:
    path: Path
    rules: list[tuple[bool, str, re.Pattern[str]]]  # (re-admits, pattern, regex)

    @classmethod
    def read(cls, path: Path) -> IgnoreFile:
        rules = []
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            admit = line.startswith("!")
            pattern = posixpath.normpath(line[1:].strip() if admit else line).lstrip("/")
            rules.append((admit, pattern, pattern_regex(pattern)))
        return cls(path=path, rules=rules)

    def admits(self, relative: str) -> bool:
        """Whether the context path `relative` is sent to the builder."""
        parts = relative.split("/")
        candidates = ["/".join(parts[: k + 1]) for k in range(len(parts))]
        admitted = True
        for admit, _, regex in self.rules:
            if any(regex.fullmatch(c) for c in candidates):
                admitted = admit
        return admitted

    def may_admit_below(self, directory: str) -> bool:
        """Whether a `!` rule could re-admit something under an excluded `directory`."""
        for admit, pattern, _ in self.rules:
            literal = re.split(r"[*?\[\\]", pattern, maxsplit=1)[0]
            if admit and (
                literal.startswith(directory + "/")
                or directory.startswith(literal)
                or pattern.startswith("**")
            ):
                return True
        return False

    def admitted_files(self, context: Path) -> Iterator[str]:
        """Every file of `context` this file lets into the build (excluded trees pruned)."""
        stack = [context]
        while stack:
            folder = stack.pop()
            for entry in sorted(folder.iterdir()):
                relative = entry.relative_to(context).as_posix()
                if entry.is_dir() and not entry.is_symlink():
                    if self.admits(relative) or self.may_admit_below(relative):
                        stack.append(entry)
                elif self.admits(relative):
                    yield relative


def ignore_file(dockerfile: Path, context: Path) -> Path | None:
    """The ignore file BuildKit uses: <Dockerfile>.dockerignore beside it, else the context's."""
    for candidate in (dockerfile.with_name(dockerfile.name + ".dockerignore"),
                      context / ".dockerignore"):
        if candidate.is_file():
            return candidate
    return None
