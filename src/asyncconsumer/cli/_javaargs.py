"""Command-line parsing that behaves as Kafka's Java tools do (they use argparse4j 0.7.0).

``asyncconsumer verifiable-consumer`` stands in for ``org.apache.kafka.tools.VerifiableConsumer``, so
its flags must be read the way argparse4j reads them, and a bad flag must fail the same way:

- ``--flag value`` and ``--flag=value``; a long flag may be shortened to any unique prefix
  (``--top`` is ``--topic``), an ambiguous one is an error; a repeated flag keeps the last value;
- a value that looks like a flag (``--topic --group-id``) is a missing value, but a negative number
  (``--max-messages -1``) is a value; ``--`` ends the flags;
- integers are Java ``int``s (``Integer.valueOf``: an optional sign, decimal digits, 32 bits);
- required flags are checked after all flags are read, and the *last* missing one is reported;
- errors go to stderr as the usage block plus ``<prog>: error: <message>``, exit status 1;
  ``-h``/``--help`` prints the help to stdout, and the Kafka tools then exit with status 1.

argparse4j wraps its text at 75 columns and *justifies* the lines it breaks (it widens the gaps
between words so that the line is exactly 75 columns wide); :func:`wrap` does the same, so the
usage and error lines match the Java tool's.  Lines are broken where Java's line
``BreakIterator`` allows for the text these tools print: after spaces, and after the hyphens,
dots, colons and commas inside a word (``--group-`` / ``id``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

#: argparse4j's default format width.
WIDTH = 75
#: Where help text starts in the help listing (argparse4j's indent).
_HELP_INDENT = 25
_INT32 = (-(2**31), 2**31 - 1)
_NEGATIVE_NUMBER = re.compile(r"-[0-9]+")


class ArgumentError(Exception):
    """A bad command line: the message argparse4j prints after ``<prog>: error:``.

    ``unknown_flag``: the flag that was not recognized, for the "Did you mean" suggestions.
    """

    def __init__(self, message: str, unknown_flag: str | None = None) -> None:
        super().__init__(message)
        self.unknown_flag = unknown_flag


class HelpRequested(Exception):
    """``-h``/``--help`` was given: print :meth:`ToolParser.help` to stdout."""


@dataclass(frozen=True)
class Option:
    """One flag: ``--name METAVAR`` (or a switch when ``metavar`` is None)."""

    flag: str
    help: str
    metavar: str | None = None
    type: Literal["string", "integer"] = "string"
    #: Shown as "(default: ...)" after the help text when not None, as ``defaultHelp(true)`` does.
    default: str | int | bool | None = None
    required: bool = False
    #: A member of the required "Connection Group" (listed last in the usage, in its own section).
    connection: bool = False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_").replace(".", "_")

    @property
    def switch(self) -> bool:
        return self.metavar is None

    def short_syntax(self) -> str:
        text = self.flag if self.switch else f"{self.flag} {self.metavar}"
        return text if self.required or self.connection else f"[{text}]"

    def title(self) -> str:
        return self.flag if self.switch else f"{self.flag} {self.metavar}"


@dataclass(frozen=True)
class ToolParser:
    """A Java tool's command line: its program name, description and flags in their Java order."""

    prog: str
    description: str
    options: tuple[Option, ...]
    #: The title and description of the section the connection flags are listed in.
    connection_group: tuple[str, str] = ("Connection Group", "Group of arguments for connection to brokers")
    width: int = WIDTH
    _by_flag: dict[str, Option] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_flag", {option.flag: option for option in self.options})

    # -- text -------------------------------------------------------------------------------------

    def usage(self) -> str:
        """The usage block (with its final newline), wrapped as argparse4j wraps it."""
        head = f"usage: {self.prog}"
        if len(head) > 30:
            # the flags go on the next lines; argparse4j then counts the indent twice on the first
            lines, indent, width_now = [head, ""], " " * 6, 12
        else:
            lines, indent, width_now = [head], " " * len(head), len(head)
        items = ["[-h]"] + [o.short_syntax() for o in self.options if not o.connection]
        items += [o.short_syntax() for o in self.options if o.connection]
        if len(lines) == 2:
            lines[1] = indent
        first = True
        for item in items:
            if not first and width_now + len(item) + 1 > self.width:
                lines.append(f"{indent} {item}")
                width_now = len(indent) + 1 + len(item)
            else:
                lines[-1] += f" {item}"
                width_now += 1 + len(item)
                first = False
        return "\n".join(lines) + "\n"

    def help(self) -> str:
        """The full help text (usage, description, every flag with its default), as ``-h`` prints it."""
        out = [self.usage(), "\n", wrap(self.description, self.width), "\n", "\n", "optional arguments:\n"]
        out.append(_help_entry("-h, --help", "show this help message and exit", self.width))
        out += [_help_entry(o.title(), _with_default(o), self.width) for o in self.options if not o.connection]
        connection = [o for o in self.options if o.connection]
        if connection:
            title, description = self.connection_group
            out += ["\n", f"{title}:\n", "  " + wrap(description, self.width, 2, "", "  ") + "\n", "\n"]
            out += [_help_entry(o.title(), _with_default(o), self.width) for o in connection]
        return "".join(out)

    def error_text(self, error: ArgumentError) -> str:
        """What goes to stderr for a bad command line: the usage, the wrapped error line, and for
        an unknown flag the known flags closest to it."""
        text = self.usage() + wrap(f"{self.prog}: error: {error}", self.width) + "\n"
        if error.unknown_flag is not None:
            text += _suggestions(error.unknown_flag, ["--help", *(o.flag for o in self.options)])
        return text

    # -- parsing ----------------------------------------------------------------------------------

    def parse(self, args: Sequence[str]) -> dict[str, str | int | bool | None]:
        """The flags' values by ``Option.dest`` (defaults for those not given).

        Raises :class:`ArgumentError` for a bad command line, :class:`HelpRequested` for ``-h``.
        """
        values: dict[str, str | int | bool | None] = {o.dest: o.default for o in self.options}
        used: set[str] = set()
        index, flags_ended = 0, False
        while index < len(args):
            term = args[index]
            if not flags_ended and term == "--":
                flags_ended = True
                index += 1
                continue
            if flags_ended or not _looks_like_flag(term):
                raise ArgumentError(f"unrecognized arguments: '{' '.join(args[index:])}'")
            name, eq, embedded = term.partition("=")
            option = self._resolve(name)
            index += 1
            if option is None:
                if _short_help(term):  # concatenated short flags: "-hx" runs -h first
                    raise HelpRequested()
                raise ArgumentError(f"unrecognized arguments: '{term}'", unknown_flag=term)
            if option is _HELP:
                if eq:
                    raise ArgumentError(f"argument -h/--help: ignore implicit argument '{embedded}'")
                raise HelpRequested()
            if option.switch:
                if eq:
                    raise ArgumentError(f"argument {option.flag}: ignore implicit argument '{embedded}'")
                values[option.dest] = True
            else:
                if eq:
                    text = embedded
                elif index < len(args) and not _looks_like_flag(args[index]):
                    text = args[index]
                    index += 1
                else:
                    raise ArgumentError(f"argument {option.flag}: expected one argument")
                values[option.dest] = _convert(option, text)
            used.add(option.flag)
        missing = [o.flag for o in self._required_order() if o.flag not in used]
        if missing:
            raise ArgumentError(f"argument {missing[-1]} is required")
        return values

    def _required_order(self) -> Iterator[Option]:
        # argparse4j checks the flags in the order they were added; Kafka's tools add the
        # connection group first, and it reports the last one missing.
        yield from (o for o in self.options if o.connection and o.required)
        yield from (o for o in self.options if not o.connection and o.required)

    def _resolve(self, name: str) -> Option | None:
        """The flag ``name`` stands for (exactly, or as the one flag it is a prefix of)."""
        flags = {**self._by_flag, "-h": _HELP, "--help": _HELP}
        if name in flags:
            return flags[name]
        candidates = sorted(flag for flag in flags if flag.startswith(name))
        if len(candidates) > 1:
            raise ArgumentError(f"ambiguous option: {name} could match {', '.join(candidates)}")
        return flags[candidates[0]] if candidates else None


#: ``-h``/``--help``: argparse4j's own flag.
_HELP = Option("--help", "show this help message and exit")


def _short_help(term: str) -> bool:
    return len(term) > 2 and term.startswith("-h") and not term.startswith("--")


def _looks_like_flag(term: str) -> bool:
    return len(term) > 1 and term.startswith("-") and _NEGATIVE_NUMBER.fullmatch(term) is None


def _convert(option: Option, text: str) -> str | int:
    if option.type == "string":
        return text
    if re.fullmatch(r"[+-]?\d+", text):  # Java takes any Unicode decimal digit, as int() does
        number = int(text)
        if _INT32[0] <= number <= _INT32[1]:
            return number
    raise ArgumentError(
        f"argument {option.flag}: could not convert '{text}' to Integer (For input string: \"{text}\")"
    )


def _with_default(option: Option) -> str:
    if option.default is None:
        return option.help
    shown = str(option.default).lower() if isinstance(option.default, bool) else str(option.default)
    return f"{option.help} (default: {shown})"


def _help_entry(title: str, text: str, width: int) -> str:
    line = "  " + title
    if not text:
        return line + "\n"
    if len(title) <= _HELP_INDENT - 4:
        line += " " * (_HELP_INDENT - len(title) - 2)
    else:
        line += "\n" + " " * _HELP_INDENT
    return line + wrap(text, width, _HELP_INDENT, "", " " * _HELP_INDENT) + "\n"


# -- suggestions ------------------------------------------------------------------------------------

#: argparse4j's edit costs (git's): a swap of neighbours is free, a deletion dear.
_SWAP, _SUBSTITUTION, _ADDITION, _DELETION = 0, 2, 1, 4


def _distance(typed: str, known: str) -> int:
    """argparse4j's weighted Damerau-Levenshtein distance from ``typed`` to ``known``.

    As there, the first column counts each deletion as 1 (only deletions inside count 4)."""
    before: list[int] = []
    previous = list(range(len(known) + 1))
    for i in range(1, len(typed) + 1):
        row = [i] + [0] * len(known)
        for j in range(1, len(known) + 1):
            same = typed[i - 1] == known[j - 1]
            cost = previous[j - 1] + (0 if same else _SUBSTITUTION)
            if i >= 2 and j >= 2 and not same and typed[i - 2] == known[j - 1] and typed[i - 1] == known[j - 2]:
                cost = min(cost, before[j - 2] + _SWAP)
            row[j] = min(cost, previous[j] + _DELETION, row[j - 1] + _ADDITION)
        before, previous = previous, row
    return previous[len(known)]


def _suggestions(term: str, flags: Sequence[str]) -> str:
    """The "Did you mean:" lines argparse4j adds after an unknown flag (or "" for none close)."""
    body = term.lstrip("-")
    if len(body) < 2:
        return ""
    scored = sorted(
        (0 if known.startswith(body) else _distance(body, known), flag)
        for flag in flags
        if len(known := flag.lstrip("-")) > 1
    )
    if not scored or scored[0][0] >= 7:
        return ""
    best = scored[0][0]
    return "\nDid you mean:\n" + "".join(f"\t{flag}\n" for score, flag in scored if score == best)


# -- wrapping ---------------------------------------------------------------------------------------

_INFIX = ".,:;!?%"


def _break_after(text: str, i: int) -> bool:
    """May a line break after ``text[i]`` (not a space)?  Java's rules for the text these tools print."""
    ch, nxt = text[i], text[i + 1] if i + 1 < len(text) else ""
    if not nxt or nxt == " ":
        return False
    if ch == "-":
        if nxt == "-":
            return False
        start = i
        while start > 0 and text[start - 1] == "-":
            start -= 1
        before = text[start - 1] if start > 0 else " "
        return nxt.isalpha() or nxt in "(/" or (nxt.isdigit() and before.isalnum())
    if ch in _INFIX and i > 0 and text[i - 1] != " ":
        if nxt.isalpha() or nxt == "-":
            return True
        if nxt.isdigit():
            return not (ch == "." and text[i - 1].isdigit())
        return ch == "." and nxt == "("
    return False


def _segments(text: str) -> list[str]:
    """Split ``text`` where a line may break (each piece keeps its trailing spaces)."""
    pieces: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if (ch == " " and text[i + 1 : i + 2] != " ") or (ch != " " and _break_after(text, i)):
            pieces.append(text[start : i + 1])
            start = i + 1
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def wrap(text: str, width: int = WIDTH, offset: int = 0, first_indent: str = "", indent: str = "") -> str:
    """Wrap ``text`` at ``width`` columns and justify the lines that were broken, as argparse4j does.

    ``offset`` is the column the text starts at; later lines start with ``indent``.
    """
    result = first_indent
    line = ""
    used = offset + len(first_indent)
    for piece in _segments(text):
        used += len(piece)
        if used > width:
            result += _justify(line, width, used - len(piece)) + "\n" + indent
            line = ""
            used = len(indent) + len(piece)
        line += piece
    return result + line


def _justify(line: str, width: int, used: int) -> str:
    """Strip ``line`` and widen its gaps so that it ends at column ``width``, the middle gaps first."""
    stripped = line.strip(" ")
    used -= len(line) - len(stripped)
    gaps = [m.start() for m in re.finditer(r"(?<! ) ", stripped)]
    if not gaps:
        return stripped
    need = width - used
    each, extra = divmod(need, len(gaps))
    first_extra = (len(gaps) - extra + 1) // 2
    out, last = [], 0
    for number, position in enumerate(gaps):
        add = each + (1 if first_extra <= number < first_extra + extra else 0)
        out.append(stripped[last:position] + " " * add)
        last = position
    out.append(stripped[last:])
    return "".join(out)
