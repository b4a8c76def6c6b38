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
    if len(name) > 100:
        return ""
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
        return ""
    best = max(score for score, _ in scored)
    closest = [repr(candidate) for score, candidate in scored if score == best][:3]
    return f" (did you mean {' or '.join(closest)}?)"


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


def spoken_list(names: Sequence[str]) -> str:
    """``pp, cp and tp``: a few names as a sentence lists them."""
    if len(names) < 2:
        return "".join(names)
    return f"{', '.join(names[:-1])} and {names[-1]}"


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
