"""Check: what the launch runs is there, where it will run.

- The launch target (the executable or the user's launch script) exists and is executable where vLLM runs
  (inside the container for the Docker runtimes, which must run the configured image: ``missing_target``). A
  missing target fails with the path named: the "ExecStart points at a ghost file" failure, caught before a
  day of exit-127 restarts.
- A model given as a local (absolute) path exists where vLLM runs, with its ``config.json`` and its weight
  shards; with a ``*.index.json``, every shard it lists; with ``-0000k-of-0000n`` names, all n of them.

Both fail with class ``config_error``: retrying cannot help. A dry run does not create or start the place vLLM
runs to look (``pending_preparation``): it reports what the launch would do there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
INDEX_MARK = "@@sparkd-index "
# Exit status: 3 missing, 4 not a directory, 5 not readable. Prints the names, then the index file if any.
LIST_SCRIPT = (
    'd=$1\n'
    '[ -e "$d" ] || exit 3\n'
    '[ -d "$d" ] || exit 4\n'
    'cd -- "$d" 2>/dev/null || exit 5\n'
    'ls -1A || exit 5\n'
    'for f in ' + " ".join(INDEX_FILES) + '; do\n'
    '  if [ -f "$f" ]; then echo "' + INDEX_MARK + '$f"; cat -- "$f"; exit 0; fi\n'
    'done\n'
)
_SHARD = re.compile(r"^(?P<stem>.*)-(?P<k>\d+)-of-(?P<n>\d+)(?P<ext>\.[A-Za-z0-9.]+)$")


# ---- pure parts -----------------------------------------------------------------------------------------


def local_model(model: str) -> str | None:
    """The model's path when it is a local one (absolute); a hub id (``org/name``) is vLLM's to download."""
    return model if model.startswith("/") else None


@dataclass(frozen=True)
class Listing:
    status: int  # LIST_SCRIPT's exit status
    names: tuple[str, ...] = ()
    index_name: str | None = None
    index_text: str | None = None


def parse_listing(status: int, output: str) -> Listing:
    head, sep, tail = output.partition(INDEX_MARK)
    names = tuple(line for line in head.splitlines() if line)
    if not sep:
        return Listing(status, names)
    index_name, _, text = tail.partition("\n")
    return Listing(status, names, index_name.strip(), text)


def missing_shards(names: Sequence[str]) -> list[str]:
    """Shards named ``x-0000k-of-0000n.ext`` whose siblings are missing."""
    groups: dict[tuple[str, str, str, int], set[int]] = {}
    width: dict[tuple[str, str, str, int], int] = {}
    for name in names:
        m = _SHARD.match(name)
        if m and m.group("ext").endswith(WEIGHT_SUFFIXES):
            key = (m.group("stem"), m.group("n"), m.group("ext"), len(m.group("k")))
            groups.setdefault(key, set()).add(int(m.group("k")))
            width[key] = len(m.group("k"))
    missing = []
    for (stem, n, ext, _), have in groups.items():
        w = width[(stem, n, ext, _)]
        missing += [f"{stem}-{k:0{w}d}-of-{n}{ext}" for k in range(1, int(n) + 1) if k not in have]
    return sorted(missing)


def model_problem(path: str, listing: Listing, where: str) -> tuple[str | None, str]:
    """Pure: (why the model at ``path`` cannot load, or None; what was found)."""
    if listing.status == 3:
        return f"the model path {path} does not exist {where}", ""
    if listing.status == 4:
        if path.endswith(".gguf"):
            return None, f"model file {path}"
        return f"the model path {path} is not a directory {where}", ""
    if listing.status != 0:
        return f"the model path {path} cannot be read {where} (listing exited with {listing.status})", ""
    names = set(listing.names)
    if "config.json" not in names:
        return f"the model path {path} has no config.json {where}", ""
    weights = sorted(n for n in names if n.endswith(WEIGHT_SUFFIXES))
    if listing.index_name is not None:
        try:
            weight_map = json.loads(listing.index_text or "").get("weight_map", {})
            listed = sorted(set(map(str, weight_map.values())))
        except (ValueError, AttributeError):
            return f"the model path {path} has an unreadable {listing.index_name} {where}", ""
        absent = [n for n in listed if n not in names]
        if absent:
            shown = ", ".join(absent[:5]) + (" ..." if len(absent) > 5 else "")
            return (f"the model path {path} is missing {len(absent)} of {len(listed)} weight shards listed in "
                    f"{listing.index_name} {where}: {shown}"), ""
        return None, f"model {path}: config.json and all {len(listed)} shards of {listing.index_name}"
    if not weights:
        return (f"the model path {path} has no weight shards ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}) "
                f"{where}"), ""
    absent = missing_shards(weights)
    if absent:
        shown = ", ".join(absent[:5]) + (" ..." if len(absent) > 5 else "")
        return f"the model path {path} is missing {len(absent)} weight shard(s) {where}: {shown}", ""
    return None, f"model {path}: config.json and {len(weights)} weight file(s)"
