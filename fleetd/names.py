"""What a name that people read may hold: a token's (events name it `token:<name>`), a job's and an
instance's (lists, the UI, `fleetd job show NAME`). One rule for all of them, so that no name passes
for another one or hides what follows it:

- no control, format (zero-width, bidi marks, embeddings, overrides and isolates, the soft hyphen,
  the byte order mark), private-use, surrogate, unassigned, line or paragraph separator character,
  no space but the ASCII one, and none of the few letters and marks that draw nothing (Hangul
  fillers, variation selectors, the combining grapheme joiner, the braille blank);
- the name is in NFKC form: full-width (`ａｄｍｉｎ`), mathematical (`𝐚𝐝𝐦𝐢𝐧`), circled, ligature
  and other compatibility spellings of plainer characters, and decomposed accents, are refused;
- its letters (and non-ASCII digits) come from one script: `аdmin` (a Cyrillic `а`) is refused, as
  is a Bengali `৪` beside Latin letters; Han goes with Hiragana and Katakana, with Hangul or with
  Bopomofo, and Latin with those (as UTS #39's "highly restrictive" level allows). Digits,
  punctuation, symbols and combining marks go with any script.

A name entirely in one other script (all-Cyrillic `сорѕ`) is not caught: that needs the Unicode
confusables table, which fleetd does not ship.
"""

import unicodedata

# Characters of otherwise allowed categories that show nothing.
_INVISIBLE = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x2800, 0x3164, 0xFFA0]
    + list(range(0xFE00, 0xFE10))
    + list(range(0xE0100, 0xE01F0))
)
_REFUSED_CATEGORIES = frozenset(["Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"])
# Scripts that go together in one name (besides a single script alone).
_HAN = "CJK"
_MIXES = (
    frozenset(["LATIN", _HAN, "HIRAGANA", "KATAKANA"]),
    frozenset(["LATIN", _HAN, "HANGUL"]),
    frozenset(["LATIN", _HAN, "BOPOMOFO"]),
)
# First words of character names that are no script of their own.
_COMMON_WORDS = frozenset(["MODIFIER", "KATAKANA-HIRAGANA", "COMBINING"])
_SCRIPT_WORDS = {"IDEOGRAPHIC": _HAN, "CJK": _HAN, "HALFWIDTH": "KATAKANA"}


def _character_problem(char):
    category = unicodedata.category(char)
    if (
        category in _REFUSED_CATEGORIES
        or (category == "Zs" and char != " ")
        or ord(char) in _INVISIBLE
    ):
        return (
            f"U+{ord(char):04X} ({unicodedata.name(char, category)}) is invisible, a control or a "
            f"separator"
        )
    return None


def _script(char):
    """The script a letter or a non-ASCII digit is written in (by its Unicode name), or None when it
    goes with any."""
    category = unicodedata.category(char)
    if not (category.startswith("L") or (category == "Nd" and not char.isascii())):
        return None
    word = unicodedata.name(char, "").split(" ", 1)[0]
    if not word or word in _COMMON_WORDS:
        return None
    return _SCRIPT_WORDS.get(word, word)


def name_problem(name):
    """Why `name` could pass for another name or hide text, or None when it may name a token, a job
    or an instance."""
    for char in name:
        problem = _character_problem(char)
        if problem:
            return f"a name holds no invisible, control, format or separator character: {problem}"
    if unicodedata.normalize("NFKC", name) != name:
        plain = unicodedata.normalize("NFKC", name)
        return (
            f"a name is written in plain characters (Unicode NFKC form): {name[:64]!r} would be "
            f"{plain[:64]!r}"
        )
    scripts = {script for script in map(_script, name) if script is not None}
    if len(scripts) > 1 and not any(scripts <= mix for mix in _MIXES):
        return (
            f"a name's letters come from one script (mixed scripts pass one name off as another): "
            f"{name[:64]!r} mixes {', '.join(sorted(s.title() for s in scripts))}"
        )
    return None


# A project's key: lower-case, a letter first, 2 to 32 characters (it appears in paths and CLIs).
PROJECT_KEY = r"^[a-z][a-z0-9-]{1,31}$"
# A user's login: a POSIX user name's shape, so that NSS can resolve it on the nodes.
LOGIN = r"^[a-z_][a-z0-9_.-]{0,63}$"
