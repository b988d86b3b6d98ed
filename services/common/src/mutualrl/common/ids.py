"""The one rule for every id that crosses a MutualRL wire (pure: no network code).

Each kind of id has one alphabet and one length limit, decided here and used by every service
(SEE, THL, MWRA), the SDK and the configs that make ids (trainer, launcher, experiment):

- `RUN_ID` (run ids): 1-64 characters of `[A-Za-z0-9._-]`, the first a letter or digit;
- `NAME` (policy, worker, trainer and consumer ids): 1-128 of the same;
- `TOKENIZER_ID` (THL tokenizer ids, a record's `tokenizer_id`): 1-128 of `[A-Za-z0-9._/-]`,
  the first a letter or digit;
- `RECORD_KEY` (SEE record ids and prompt ids): 1-256 characters, no control character, no `|`.

Why these: a run id is the hash tag of every Redis key of the run (`mrl:see:{run}:...`, so no
braces) and a directory name under a trainer's output dir (so no `/`, and no `.`/`..`, hence
the leading letter or digit); names are consumer-group names and hash fields joined with `|`;
tokenizer ids may look like a hub path (`org/model`); record and prompt ids are chosen by
clients (`<policy>/<round>/<prompt>/<sample>`, dataset ids) and are only ever stored and
compared, so they may hold anything but the separators SEE joins fields with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mutualrl.common.errors import InvalidArgument, quote


@dataclass(frozen=True)
class IdRule:
    """One kind of id: what it may contain and how long it may be."""

    kind: str
    """What the id names, for messages ("run id")."""
    chars: str
    """A regular-expression character class of the allowed characters."""
    max_len: int
    """Longest id in characters."""
    alnum_first: bool = True
    """The first character must be an ASCII letter or digit."""
    described: str = ""
    """The rule in words, for messages and docs."""
    _re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        first = "[A-Za-z0-9]" if self.alnum_first else self.chars
        rest = f"{self.chars}{{0,{self.max_len - 1}}}"
        object.__setattr__(self, "_re", re.compile(f"{first}{rest}"))

    @property
    def pattern(self) -> str:
        """The rule as an anchored regular expression (OpenAPI `pattern` of a parameter)."""
        return f"^{self._re.pattern}$"

    def valid(self, value: str) -> bool:
        """True when `value` follows the rule."""
        return self._re.fullmatch(value) is not None

    def check(self, value: str, field: str) -> str:
        """`value` unchanged, or InvalidArgument naming `field` and the rule."""
        if not value:
            raise InvalidArgument(field, f"a {self.kind} is required")
        if not self.valid(value):
            raise InvalidArgument(field, f"{quote(value)} is not a valid {self.kind}: "
                                         f"{self.described}")
        return value

    def sanitize(self, text: str, fill: str = "-") -> str:
        """`text` made valid: disallowed characters become `fill`, cut to the length limit,
        a leading non-alphanumeric character prefixed with "x" (empty text gives "x")."""
        out = re.sub(f"(?!{self.chars}).", fill, text, flags=re.DOTALL)
        if self.alnum_first and not re.match("[A-Za-z0-9]", out):
            out = "x" + out
        return out[:self.max_len]


RUN_ID = IdRule("run id", "[A-Za-z0-9._-]", 64,
                described="1-64 characters of [A-Za-z0-9._-], first a letter or digit")
NAME = IdRule("name", "[A-Za-z0-9._-]", 128,
              described="1-128 characters of [A-Za-z0-9._-], first a letter or digit")
TOKENIZER_ID = IdRule("tokenizer id", "[A-Za-z0-9._/-]", 128,
                      described="1-128 characters of [A-Za-z0-9._/-], first a letter or digit")
RECORD_KEY = IdRule("record key", r"[^\x00-\x1f\x7f|]", 256, alnum_first=False,
                    described="1-256 characters, no control character and no '|'")


def check_run_id(value: str, field: str = "run_id") -> str:
    """`RUN_ID.check`: the run id unchanged, or InvalidArgument naming `field`."""
    return RUN_ID.check(value, field)


def check_name(value: str, field: str) -> str:
    """`NAME.check` for a policy, worker, trainer or consumer id."""
    return NAME.check(value, field)


def check_tokenizer_id(value: str, field: str = "tokenizer_id") -> str:
    """`TOKENIZER_ID.check`."""
    return TOKENIZER_ID.check(value, field)


def check_record_key(value: str, field: str) -> str:
    """`RECORD_KEY.check` for a record id or prompt id."""
    return RECORD_KEY.check(value, field)
