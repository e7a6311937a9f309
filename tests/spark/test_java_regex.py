"""subscribePattern: Java regular expressions, translated and checked against Java's own Pattern."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from asyncconsumer.spark.java_regex import JavaRegexError, translate
from asyncconsumer.spark.options import SourceOptionError, parse_options
from asyncconsumer.testing.kafka import find_java

# Patterns Spark users write, with Java-only syntax among them.
PATTERNS = [
    r"events-.*",
    r"events-\p{Digit}+",
    r"events-\p{Alpha}+\d*",
    r"[\p{Lower}\p{Digit}_.-]+",
    r"\P{Upper}+",
    r"events-\d*+",
    r"events-\d++",
    r"(?:ev|events)?+-?\w+",
    r"e\w{2,}+s",
    r"(?>ab|a)bc.*",
    r"(?i)EVENTS-[a-z]+",
    r"log(?i)S|metrics",
    r"\QEvents.v1\E-\d",
    r"[a-c[x-z]]+",
    r"(?<env>prod|dev)-\k<env>",
    r"\p{L}+\z",
    r"\p{IsAlphabetic}+-\p{javaDigit}+",
    r"orders\Z",
    r"\p{XDigit}{4}",
    r"[\p{Punct}a-z]+",
    r"(?-i)[A-Z]+",
]
TOPICS = [
    "events-1",
    "events-12",
    "events-abc",
    "events-abc12",
    "Events.v1-7",
    "EVENTS-xyz",
    "events",
    "logs",
    "LOGS",
    "logS",
    "metrics",
    "METRICS",
    "abcbc",
    "abc",
    "abbc",
    "prod-prod",
    "prod-dev",
    "abcxyz",
    "abcd",
    "beef",
    "ev-x",
    "-x",
    "eeees",
    "orders",
    "a.b_c-d",
    "ABC",
    "Abc",
]

_JAVA_MATCHER = """
import java.util.regex.Pattern;
public class Matcher {
    public static void main(String[] args) throws Exception {
        String[] lines = new String(System.in.readAllBytes(), "UTF-8").split("\\n");
        int patterns = Integer.parseInt(lines[0]);
        StringBuilder out = new StringBuilder();
        for (int p = 1; p <= patterns; p++) {
            Pattern pattern = Pattern.compile(lines[p]);
            for (int t = patterns + 1; t < lines.length; t++) {
                out.append(pattern.matcher(lines[t]).matches() ? '1' : '0');
            }
            out.append('\\n');
        }
        System.out.print(out);
    }
}
"""


def java_matches(tmp_path: Path, patterns: list[str], topics: list[str]) -> list[str]:
    java, _ = find_java()
    source = tmp_path / "Matcher.java"
    source.write_text(_JAVA_MATCHER)
    given = "\n".join([str(len(patterns)), *patterns, *topics])
    done = subprocess.run([java, str(source)], input=given, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.split()


def test_translation_matches_like_java(tmp_path: Path) -> None:
    expected = java_matches(tmp_path, PATTERNS, TOPICS)
    assert len(expected) == len(PATTERNS)
    for pattern, row in zip(PATTERNS, expected, strict=True):
        regex = translate(pattern)
        got = "".join("1" if re.fullmatch(regex, topic) else "0" for topic in TOPICS)
        assert got == row, (pattern, regex, [t for t, g, e in zip(TOPICS, got, row, strict=True) if g != e])
        # each pattern is tried on a topic it matches (a possessive \w{2,}+ eats the "s" it needs)
        assert ("1" in row) != (pattern == r"e\w{2,}+s"), pattern


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"[a-z&&[^aeiou]]+", "intersection '&&'"),
        (r"[a-z[^x]]", "negated class nested"),
        (r"\Gevents", r"\G"),
        (r"events\X", r"\X"),
        (r"\p{InGreek}+", r"\p{InGreek}"),
        (r"(?<name", "group name"),
    ],
)
def test_untranslatable_constructs_are_named(pattern: str, construct: str) -> None:
    with pytest.raises(JavaRegexError, match=re.escape(construct)):
        translate(pattern)
    with pytest.raises(SourceOptionError, match=re.escape(construct)):
        parse_options({"kafka.bootstrap.servers": "h:9092", "subscribePattern": pattern})


def test_subscribe_pattern_keeps_the_java_text() -> None:
    o = parse_options({"kafka.bootstrap.servers": "h:9092", "subscribePattern": r"events-\p{Digit}+"})
    assert o.subscription.pattern == r"events-\p{Digit}+"
    assert o.subscription.matches("events-42") and not o.subscription.matches("events-x")
    assert json.dumps(o.subscription.describe())
