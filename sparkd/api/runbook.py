"""``GET /runbook``: the runbook that ships in the package (``sparkd/api/runbook.md``; ``docs/runbook.md`` is a link
to it), rendered as one HTML page with an anchor per section, on the TCP port beside ``/metrics``: read-only and
open to anyone who may scrape, since it holds nothing but the text the package ships.

The markdown is the runbook's own small dialect (headings, paragraphs, bullet lists, fenced code, inline code, bold,
links); a heading's ``id`` is :func:`sparkd.supervisor.runbook.anchor` of its text, the anchor GitHub would give it.
The page is made once, on the first request.
"""

from __future__ import annotations

import functools
import html
import re
from importlib.resources import files

from sparkd import __version__
from sparkd.api.messages import Handler, Request, Response, text
from sparkd.supervisor.runbook import RUNBOOK_PATH, anchor

__all__ = ["headings", "page", "source", "to_html", "with_runbook"]

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*$")
_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s+(.*)$")
_STYLE = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}"
          "pre{background:#f4f4f4;padding:.6rem;overflow-x:auto}code{background:#f4f4f4}"
          "h2,h3{border-top:1px solid #ddd;padding-top:.6rem}nav li{display:inline;margin-right:.8rem}")


def source() -> str:
    return files("sparkd.api").joinpath("runbook.md").read_text(encoding="utf-8")


def _inline(text: str) -> str:
    out = []
    for i, part in enumerate(text.split("`")):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        part = html.escape(part, quote=False)
        part = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", part)
        part = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", lambda m: f'<a href="{html.escape(m.group(2))}">{m.group(1)}</a>',
                      part)
        out.append(part)
    return "".join(out)


def headings(markdown: str) -> list[tuple[int, str, str]]:
    """(level, text, anchor) of every heading outside code, in order; a repeated anchor gets ``-1``, ``-2``."""
    found: list[tuple[int, str, str]] = []
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match:
            text = match.group(2)
            base = anchor(text)
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.append((len(match.group(1)), text, base if n == 0 else f"{base}-{n}"))
    return found


def _blocks(markdown: str) -> list[str]:
    out: list[str] = []
    ids = iter(headings(markdown))
    para: list[str] = []
    items: list[str] = []
    code: list[str] | None = None

    def flush() -> None:
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in markdown.splitlines():
        if code is not None:
            if line.startswith("```"):
                out.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
                code = None
            else:
                code.append(line)
        elif line.startswith("```"):
            flush()
            code = []
        elif _HEADING.match(line):
            flush()
            level, text, ident = next(ids)
            out.append(f'<h{level} id="{ident}">{_inline(text)} <a href="#{ident}" aria-label="link">#</a>'
                       f"</h{level}>")
        elif not line.strip() or line.lstrip().startswith("<!--"):
            flush()
        elif _ITEM.match(line) and not para:
            items.append(_ITEM.match(line).group(1))  # type: ignore[union-attr]
        elif items and line.startswith((" ", "\t")):
            items[-1] += " " + line.strip()
        else:
            para.append(line.strip())
    flush()
    return out


def to_html(markdown: str) -> str:
    """The whole page: a contents line of every section, then the runbook."""
    sections = [(text, ident) for level, text, ident in headings(markdown) if level in (2, 3)]
    nav = "".join(f'<li><a href="#{ident}">{html.escape(text)}</a></li>' for text, ident in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>sparkd {html.escape(__version__)} runbook</title><style>{_STYLE}</style></head><body>"
            f"<nav><ul>{nav}</ul></nav>\n" + "\n".join(_blocks(markdown)) + "\n</body></html>\n")


@functools.cache
def page() -> bytes:
    return to_html(source()).encode("utf-8")


def with_runbook(app: Handler) -> Handler:
    """``app`` with ``GET``/``HEAD`` ``/runbook`` answered before it (so before any gate it has)."""

    async def serve(request: Request) -> Response:
        if request.path != RUNBOOK_PATH:
            return await app(request)
        if request.method not in ("GET", "HEAD"):
            return text("only GET and HEAD\n", 405, {"allow": "GET, HEAD"})
        return text(page(), 200, {"cache-control": "max-age=300"}, content_type="text/html; charset=utf-8")

    return serve
