"""Wording shared by error messages: a "did you mean" hint, short lists of names, and the
command that installs an extra."""

from __future__ import annotations

import difflib
import json
import shlex
from collections.abc import Sequence
from importlib import metadata
from urllib.parse import unquote, urlparse

#: A hint compares the name with at most this many candidates of a similar length, so that
#: thousands of unknown names against thousands of known ones stay fast.
MAX_HINT_CANDIDATES = 200
#: How alike a name and a hint must be (difflib's ratio). Typos of a letter or two score
#: 0.8 or more; 0.6 would offer 'order' for 'model', three letters in common by chance.
HINT_CUTOFF = 0.65
#: A list of names in a message shows at most this many.
MAX_LISTED = 20


def did_you_mean(name: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or every one equally close
    (`` (did you mean 'pp' or 'cp'?)`` for ``cpp``), or an empty string."""
    return hint(nearest(name, candidates))


def hint(names: Sequence[str]) -> str:
    """`` (did you mean 'a' or 'b'?)`` for the first three of ``names``; none, an empty string."""
    if not names:
        return ""
    return f" (did you mean {' or '.join(repr(name) for name in names[:3])}?)"


def nearest(name: str, candidates: Sequence[str]) -> list[str]:
    """The candidates closest to ``name``, all equally close; none when none is close. The
    candidates that begin with a name of two characters or more are the closest (``h100``
    for ``h100-sxm``)."""
    if len(name) > 100:
        return []
    # A name cut short is nearer than one with a letter changed ('h200' for 'h100'), though
    # difflib rates that higher.
    begun = [c for c in dict.fromkeys(candidates) if c.startswith(name)] if len(name) >= 2 else []
    if begun:
        return begun
    # difflib's ratio is 2 * matches / (len(a) + len(b)); a candidate less than 3/7 or more
    # than 7/3 times as long as the name can never reach 0.6, let alone the cutoff.
    low, high = len(name) * 3 // 7, len(name) * 7 // 3 + 1
    near = [c for c in candidates if low <= len(c) <= high][:MAX_HINT_CANDIDATES]
    scored = []
    for candidate in dict.fromkeys(near):
        matcher = difflib.SequenceMatcher(None, name, candidate)
        if matcher.real_quick_ratio() >= HINT_CUTOFF and matcher.ratio() >= HINT_CUTOFF:
            scored.append((matcher.ratio(), candidate))
    if not scored:
        return []
    best = max(score for score, _ in scored)
    return [candidate for score, candidate in scored if score == best]


def not_one_of(value: str, names: Sequence[str]) -> str:
    """``expected one of a, b or c, got 'x' (did you mean 'b'?)``: the message for a value that
    is none of ``names`` (in lower case), whose hint reads the value in lower case too."""
    listed = name_list(names) if len(names) > MAX_LISTED else spoken_list(names, "or")
    return f"expected one of {listed}, got {shorten(value)!r}{did_you_mean(value.lower(), names)}"


def name_list(names: Sequence[str]) -> str:
    """``a, b, c``; past :data:`MAX_LISTED` names, the first ones and how many more."""
    if len(names) <= MAX_LISTED:
        return ", ".join(names)
    return f"{', '.join(names[:MAX_LISTED])} and {len(names) - MAX_LISTED} more"


def shorten(text: str, limit: int = 40) -> str:
    """A text as quoted in a message: a long one is cut, so that the message stays one line."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_line(error: BaseException) -> str:
    """An error's first line, or its type's name when it says nothing: a dependency's error
    quoted inside one line of meshconf's."""
    try:
        text = str(error).strip()
    except Exception:  # an error of user code whose message itself fails
        text = ""
    return text.splitlines()[0] if text else type(error).__name__


def spoken_list(names: Sequence[str], conjunction: str = "and") -> str:
    """``pp, cp and tp`` (or ``pp, cp or tp``): a few names as a sentence lists them."""
    if len(names) < 2:
        return "".join(names)
    return f"{', '.join(names[:-1])} {conjunction} {names[-1]}"


def either(values: Sequence[int]) -> str:
    """``1, 2, 4 or 8``: the values a message offers, one of which would do; a run of four
    or more consecutive values is written ``1 to 61``, and past :data:`MAX_LISTED` items the
    rest are counted."""
    items: list[str] = []
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and values[end + 1] == values[end] + 1:
            end += 1
        if end - start >= 3:
            items.append(f"{values[start]} to {values[end]}")
        else:
            items += [str(value) for value in values[start : end + 1]]
        start = end + 1
    if len(items) > MAX_LISTED:
        return f"{', '.join(items[:MAX_LISTED])} or {len(items) - MAX_LISTED} more"
    return spoken_list(items, "or")


def install_command(extra: str) -> str:
    """The command that adds ``extra`` (``torch``, ``hydra``, ``png``) to this installation:
    from the clone or wheel meshconf was installed from, where pip recorded one (its
    ``direct_url.json``), else from the package index."""
    try:
        recorded = metadata.distribution("meshconf").read_text("direct_url.json")
        url = json.loads(recorded or "{}").get("url", "")
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        url = ""
    if isinstance(url, str) and url.startswith("file://"):
        return f"pip install {shlex.quote(f'{unquote(urlparse(url).path)}[{extra}]')}"
    return f"pip install {shlex.quote(f'meshconf[{extra}]')}"
