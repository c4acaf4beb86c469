"""Words for counts in every view: ``plural(1, "row")`` is ``"1 row"``, ``plural(2, "row")`` ``"2 rows"``.

The views say how many of something there are in hundreds of places; this is the one rule
(with the irregular plurals tkx uses), so no view says "1 rows" or "1 barriers".
"""

from __future__ import annotations

#: Irregular plurals of the words tkx counts.
IRREGULAR = {"in-place update": "in-place updates", "pass": "passes", "value/update": "values/updates",
             "output/update": "outputs/updates", "match": "matches", "index": "indices"}


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"<n> <word>"`` with the word in the plural unless ``n`` is 1 (``many`` overrides the
    plural; words ending in s/x/ch/sh take "es": ``plural(2, "pass")`` is ``"2 passes"``)."""
    return f"{n} {word if n == 1 else (many or plural_of(word))}"


def plural_of(word: str) -> str:
    """The plural of ``word`` (``"barrier"`` -> ``"barriers"``, ``"pass"`` -> ``"passes"``)."""
    if word in IRREGULAR:
        return IRREGULAR[word]
    head, _, last = word.rpartition(" ")
    if last.endswith(("s", "x", "ch", "sh")):
        last += "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        last = last[:-1] + "ies"
    else:
        last += "s"
    return f"{head} {last}" if head else last
