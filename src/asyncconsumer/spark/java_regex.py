"""Java regular expressions (``java.util.regex.Pattern``) translated to Python's ``re`` syntax.

Spark's ``subscribePattern`` is a Java regular expression that must match a whole topic name
(``Pattern.matcher(topic).matches()``).  Most of Java's syntax means the same in Python (3.11 has
possessive quantifiers and atomic groups); :func:`translate` rewrites the rest and rejects, by
name, what has no Python equivalent.

Kafka topic names are ASCII letters, digits, ``.``, ``_`` and ``-``, so Java's Unicode classes
(``\\p{L}``, ``\\p{IsAlphabetic}``, ...) are translated to the ASCII characters they match.  The
translation is tested against Java's own ``Pattern`` on topic names.
"""

from __future__ import annotations

import re

__all__ = ["JavaRegexError", "translate"]


class JavaRegexError(ValueError):
    """A Java regular expression that is malformed, or uses a construct Python's ``re`` lacks."""


_PUNCT = re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_LOWER, _UPPER, _DIGIT = "a-z", "A-Z", "0-9"
_ALPHA = _LOWER + _UPPER
_ALNUM = _ALPHA + _DIGIT
_SPACE = " \\t\\n\\x0b\\f\\r"

# \p{Name}: the body of a character class ("[...]" without the brackets).  POSIX classes (ASCII in
# Java), java.lang.Character classes and Unicode categories/properties (ASCII on topic names).
_CLASSES: dict[str, str] = {
    "Lower": _LOWER,
    "Upper": _UPPER,
    "ASCII": "\\x00-\\x7f",
    "Alpha": _ALPHA,
    "Digit": _DIGIT,
    "Alnum": _ALNUM,
    "Punct": _PUNCT,
    "Graph": _ALNUM + _PUNCT,
    "Print": _ALNUM + _PUNCT + " ",
    "Blank": " \\t",
    "Cntrl": "\\x00-\\x1f\\x7f",
    "XDigit": "0-9a-fA-F",
    "Space": _SPACE,
    "javaLowerCase": _LOWER,
    "javaUpperCase": _UPPER,
    "javaWhitespace": _SPACE + "\\x1c-\\x1f",
    "javaMirrored": "()<>\\[\\]{}",
    "javaLetter": _ALPHA,
    "javaDigit": _DIGIT,
    "javaLetterOrDigit": _ALNUM,
    "javaAlphabetic": _ALPHA,
    "L": _ALPHA,
    "IsL": _ALPHA,
    "Lu": _UPPER,
    "IsLu": _UPPER,
    "Ll": _LOWER,
    "IsLl": _LOWER,
    "N": _DIGIT,
    "IsN": _DIGIT,
    "Nd": _DIGIT,
    "IsNd": _DIGIT,
    "IsAlphabetic": _ALPHA,
    "IsLetter": _ALPHA,
    "IsDigit": _DIGIT,
    "IsLowercase": _LOWER,
    "IsUppercase": _UPPER,
    "IsWhite_Space": _SPACE + "\\x85",
    "IsWhiteSpace": _SPACE + "\\x85",
    "IsPunctuation": re.escape("!\"#%&'()*,-./:;?@[\\]_{}"),
    "IsHex_Digit": "0-9a-fA-F",
    "IsHexDigit": "0-9a-fA-F",
    "IsLatin": _ALPHA,
    "InBasicLatin": "\\x00-\\x7f",
    "IsASCII": "\\x00-\\x7f",
}
_CLASSES_FOLDED = {name.lower(): body for name, body in _CLASSES.items()}

# Backslash escapes that mean the same in both (outside and inside classes), besides digits.
_SAME = set("dDsSwWbBAtnrfa") | set("\\.^$|?*+()[]{}-&/#\"' !%,:;<=>@_`~")
# Java's \h, \H, \v, \V, \R and \e.
_HORIZONTAL = " \\t\\xa0\\u1680\\u180e\\u2000-\\u200a\\u202f\\u205f\\u3000"
_VERTICAL = "\\n\\x0b\\f\\r\\x85\\u2028\\u2029"
# Flags Java has and Python lacks, which change nothing on (ASCII, one-line) topic names.
_NEUTRAL_FLAGS = set("duUc")
_PYTHON_FLAGS = set("imsx")


def translate(pattern: str) -> str:
    """``pattern`` (Java syntax) in Python ``re`` syntax, for :func:`re.fullmatch`.

    Raises :class:`JavaRegexError` naming the construct that Python cannot express (class
    intersections ``&&``, negated nested classes, ``\\G``, ``\\X``, ``\\b{g}``, an unknown
    ``\\p{...}``) or that is malformed.
    """
    out = _Translator(pattern).run()
    try:
        re.compile(out)
    except re.error as exc:
        raise JavaRegexError(f"{pattern!r} is not a valid regular expression here: {exc}") from None
    return out


class _Translator:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0
        # One entry per open group: the flags opened inside it with "(?i)" (each closes with it).
        self.scoped: list[list[str]] = [[]]

    def fail(self, what: str) -> JavaRegexError:
        return JavaRegexError(f"{self.p!r}: {what} (at position {self.i})")

    def run(self) -> str:
        out: list[str] = []
        p = self.p
        while self.i < len(p):
            c = p[self.i]
            if c == "\\":
                out.append(self.escape(in_class=False))
            elif c == "[":
                out.append("[" + self.char_class() + "]")
            elif c == "(":
                out.append(self.group_open())
            elif c == ")":
                out.append(")" * len(self.scoped.pop()) + ")")
                if not self.scoped:
                    raise self.fail("unbalanced ')'")
                self.i += 1
            elif c == "|":
                opened = self.scoped[-1]
                out.append(")" * len(opened) + "|" + "".join(f"(?{flags}:" for flags in opened))
                self.i += 1
            else:
                out.append(c)
                self.i += 1
        if len(self.scoped) != 1:
            raise self.fail("unclosed group")
        out.append(")" * len(self.scoped[0]))
        return "".join(out)

    def group_open(self) -> str:
        p, i = self.p, self.i
        if p.startswith("(?<", i) and i + 3 < len(p) and p[i + 3] not in "=!":
            end = p.find(">", i)
            if end < 0:
                raise self.fail("unclosed group name")
            self.i = end + 1
            self.scoped.append([])
            return f"(?P<{p[i + 3 : end]}>"
        flags = re.match(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])", p[i:])
        if flags is not None and (flags.group(1) or flags.group(2) is not None):
            on, off, closer = flags.group(1), flags.group(2) or "", flags.group(3)
            unknown = sorted(set(on + off) - _NEUTRAL_FLAGS - _PYTHON_FLAGS)
            if unknown:
                raise self.fail(f"unknown flag(s) {''.join(unknown)!r}")
            on = "".join(f for f in on if f in _PYTHON_FLAGS)
            off = "".join(f for f in off if f in _PYTHON_FLAGS)
            spec = on + (f"-{off}" if off else "")
            self.i += flags.end()
            if closer == ":":
                self.scoped.append([])
                return f"(?{spec}:" if spec else "(?:"
            if not spec:
                return ""
            # "(?i)" applies to the rest of the enclosing group, alternatives included: a scoped
            # group that closes with it (and is reopened after each '|').
            self.scoped[-1].append(spec)
            return f"(?{spec}:"
        self.scoped.append([])
        self.i += 1
        return "("

    def char_class(self) -> str:
        """The body of the class starting at ``[`` (Java's nested unions flattened)."""
        p = self.p
        self.i += 1
        body: list[str] = []
        if self.i < len(p) and p[self.i] == "^":
            body.append("^")
            self.i += 1
        first = True
        while True:
            if self.i >= len(p):
                raise self.fail("unclosed character class")
            c = p[self.i]
            if c == "]" and not first:
                self.i += 1
                return "".join(body)
            if c == "]":  # Java: ']' right after '[' or '[^' is an error too
                raise self.fail("empty character class")
            first = False
            if c == "\\":
                body.append(self.escape(in_class=True))
            elif c == "&" and p.startswith("&&", self.i):
                raise self.fail("character class intersection '&&' has no Python equivalent")
            elif c == "[":
                if p.startswith("[^", self.i):
                    raise self.fail("a negated class nested in a class ('[...[^...]]') has no Python equivalent")
                inner = self.char_class()
                body.append(inner)
            else:
                body.append(c)
                self.i += 1

    def escape(self, *, in_class: bool) -> str:
        p = self.p
        if self.i + 1 >= len(p):
            raise self.fail("a trailing backslash")
        c = p[self.i + 1]
        self.i += 2
        if c in "pP":
            body = self.property_class(c)
            if in_class:
                if c == "P":
                    raise self.fail("\\P{...} inside a character class has no Python equivalent")
                return body
            return f"[{'^' if c == 'P' else ''}{body}]"
        if c == "Q":
            end = p.find("\\E", self.i)
            literal = p[self.i :] if end < 0 else p[self.i : end]
            self.i = len(p) if end < 0 else end + 2
            escaped = re.escape(literal)
            return escaped.replace("]", "\\]").replace("-", "\\-") if in_class else escaped
        if c == "E":
            return ""  # a stray \E is ignored by Java too
        if c == "z":
            return "\\Z"
        if c == "Z":
            if in_class:
                raise self.fail("\\Z inside a character class")
            return "(?=\\n?\\Z)"
        if c in "hH":
            return _HORIZONTAL if in_class and c == "h" else f"[{'^' if c == 'H' else ''}{_HORIZONTAL}]"
        if c in "vV":
            return _VERTICAL if in_class and c == "v" else f"[{'^' if c == 'V' else ''}{_VERTICAL}]"
        if c == "R" and not in_class:
            return f"(?:\\r\\n|[{_VERTICAL}])"
        if c == "e":
            return "\\x1b"
        if c == "c":
            if self.i >= len(p):
                raise self.fail("\\c needs a control character letter")
            self.i += 1
            return f"\\x{ord(p[self.i - 1]) ^ 64:02x}"
        if c == "0":
            digits = re.match(r"[0-7]{1,3}", p[self.i :])
            if digits is None:
                raise self.fail("\\0 needs octal digits")
            value = int(digits.group(0), 8)
            if value > 0o377:
                value, digits = int(digits.group(0)[:2], 8), re.match(r"[0-7]{2}", p[self.i :])
            assert digits is not None
            self.i += digits.end()
            return f"\\x{value:02x}"
        if c == "x" and self.i < len(p) and p[self.i] == "{":
            end = p.find("}", self.i)
            if end < 0:
                raise self.fail("unclosed \\x{...}")
            value = int(p[self.i + 1 : end], 16)
            self.i = end + 1
            return f"\\U{value:08x}"
        if c in "xuN" or (c.isdigit() and not in_class):
            return "\\" + c  # \xhh, \uhhhh, \N{name} and back references: the same
        if c == "k" and not in_class:
            name = re.match(r"<(\w+)>", p[self.i :])
            if name is None:
                raise self.fail("\\k needs a group name in <...>")
            self.i += name.end()
            return f"(?P={name.group(1)})"
        if c in "GXb" and (c != "b" or p.startswith("{", self.i)):
            raise self.fail(f"\\{c}{'{...}' if c == 'b' else ''} has no Python equivalent")
        if c in _SAME:
            return "\\" + c
        if c.isalpha() or c.isdigit():
            raise self.fail(f"unknown escape \\{c}")
        return re.escape(c)

    def property_class(self, c: str) -> str:
        p = self.p
        if self.i < len(p) and p[self.i] == "{":
            end = p.find("}", self.i)
            if end < 0:
                raise self.fail(f"unclosed \\{c}{{...}}")
            name = p[self.i + 1 : end]
            self.i = end + 1
        elif self.i < len(p):
            name = p[self.i]
            self.i += 1
        else:
            raise self.fail(f"\\{c} needs a class name")
        body = _CLASSES.get(name) or _CLASSES.get(name.removeprefix("Is")) or _CLASSES_FOLDED.get(name.lower())
        if body is None:
            raise self.fail(f"\\{c}{{{name}}} is not a class this source can translate")
        return body
