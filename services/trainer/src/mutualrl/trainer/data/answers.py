"""Answer extraction and LaTeX-light normalisation for GSM8K- and MATH-style verification.

Pure string code (no torch). Two answers match when their normalised strings are equal or when
both read as the same rational number, so `\\frac{1}{2}`, `1/2`, `0.5` and `.50` all match, and
`1,000` matches `1000`. What is normalised, and why:

- Dollar/percent signs, `\\left`/`\\right`, thin spaces, `^\\circ`, `\\text{...}` wrappers: they
  change how an answer is typeset, not its value.
- `\\dfrac`/`\\tfrac` -> `\\frac` -> `a/b`: the three spellings of one fraction.
- A leading `x =` and a trailing full stop: common ways of stating a final answer.
- Thousands separators (`1,234,567`) but not other commas, so tuples like `(1,2)` survive.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_WRAPPERS = ("\\text", "\\textbf", "\\mathrm", "\\mathbf", "\\mbox", "\\textrm")
_DROP = (
    "\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "^\\circ", "^{\\circ}",
    "\\$", "\\%", "$", "%",
)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(/[+-]?(\d+(\.\d*)?|\.\d+))?$")
_LEADING_NUMBER = re.compile(r"^[+-]?(\d+(\.\d+)?|\.\d+)(/\d+)?")
_ANY_NUMBER = re.compile(r"[+-]?\d+(,\d{3})*(\.\d+)?(/\d+)?|[+-]?\.\d+")


def _group(text: str, start: int) -> tuple[str, int] | None:
    """The brace group opening at `text[start] == "{"`: (content, index after it)."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None  # unbalanced: no answer rather than a wrong one


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces allowed) or `\\boxed x`; else None."""
    best = -1
    cmd = ""
    for c in _BOX_COMMANDS:
        i = text.rfind(c)
        if i > best:
            best, cmd = i, c
    if best < 0:
        return None
    j = best + len(cmd)
    if j < len(text) and text[j] == "{":
        g = _group(text, j)
        return g[0].strip() if g else None
    # `\boxed 5`: the answer runs to the next space-delimited end or `$`.
    m = re.match(r"\s+([^\s$]+)", text[j:])
    return m.group(1) if m else None


def after_hashes(text: str) -> str | None:
    """GSM8K form: the rest of the line after the last `####`, or None."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    return tail.splitlines()[0].strip() if tail else None


def last_number(text: str) -> str | None:
    """The last number in free text (a fallback when no answer marker was written)."""
    found = [m.group(0) for m in _ANY_NUMBER.finditer(text)]
    return found[-1] if found else None


def _unwrap(text: str, command: str) -> str:
    """Replace every `command{x}` by `x` (nested braces respected)."""
    out, i = [], 0
    while True:
        j = text.find(command + "{", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        g = _group(text, j + len(command))
        if g is None:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        out.append(g[0])
        i = g[1]


def _frac_arg(text: str, i: int) -> tuple[str, int] | None:
    """One argument of `\\frac`: a brace group or a single character (`\\frac12`)."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] == "{":
        return _group(text, i)
    return text[i], i + 1


def _fracs(text: str) -> str:
    """`\\frac{a}{b}` -> `a/b` (parenthesised when a part is not a plain token)."""
    while True:
        j = text.find("\\frac")
        if j < 0:
            return text
        a = _frac_arg(text, j + 5)
        b = _frac_arg(text, a[1]) if a else None
        if a is None or b is None:
            return text
        num, den = (_fracs(x).strip() for x in (a[0], b[0]))

        def wrap(x: str) -> str:
            return x if re.fullmatch(r"[+-]?[\w.]+", x) else f"({x})"

        text = f"{text[:j]}{wrap(num)}/{wrap(den)}{text[b[1]:]}"


def normalize(answer: str) -> str:
    """Canonical string form of an answer (see the module docstring for the rules)."""
    s = answer.strip().replace("\u2212", "-")  # unicode minus
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for w in _WRAPPERS:
        s = _unwrap(s, w)
    for d in _DROP:
        s = s.replace(d, "")
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = _fracs(s)
    s = s.replace(" ", "").replace("\\ ", "")
    s = s.rstrip(".")
    s = re.sub(r"^[a-zA-Z]\w*=", "", s)  # `x=5` -> `5`
    # Thousands separators only: a comma followed by exactly three digits, repeatedly.
    prev = None
    while prev != s:
        prev = s
        s = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", s)
    # `-(1)/(2)` style leftovers of simple fractions.
    s = re.sub(r"\((-?[\d.]+)\)/\((-?[\d.]+)\)", r"\1/\2", s)
    return s


def to_number(s: str) -> Fraction | None:
    """The rational value of a normalised answer (`-3`, `0.5`, `1/2`, `.5`), or None."""
    if not _NUMBER.match(s):
        return None
    try:
        if "/" in s:
            num, den = s.split("/")
            d = Fraction(den)
            return None if d == 0 else Fraction(num) / d
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(pred: str | None, gold: str) -> bool:
    """Whether a predicted answer equals the reference (string or numeric equality).

    A numeric reference also matches a prediction that starts with that number and then has
    trailing words (`72 dollars`, `5 cm`), since units are routinely appended.
    """
    if pred is None:
        return False
    p, g = normalize(pred), normalize(gold)
    if p == g:
        return True
    gv = to_number(g)
    if gv is None:
        return False
    pv = to_number(p)
    if pv is None:
        m = _LEADING_NUMBER.match(p)
        # Only letters may follow (units); `12/5+1` must not read as `12/5`.
        if m is None or not re.fullmatch(r"[a-zA-Z]*", p[m.end():]):
            return False
        pv = to_number(m.group(0))
    return pv is not None and pv == gv
