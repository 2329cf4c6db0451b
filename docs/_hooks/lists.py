"""MkDocs hook: a list that starts right under a paragraph line renders as a list.

GitHub renders `**Config.**` followed on the next line by `- item` as a paragraph and a list;
Python-Markdown needs a blank line between them and otherwise runs the items into the paragraph as
text. The pages are written for both (they are read on GitHub too), so the site adds that blank line
instead of every page carrying it. Fenced code blocks are left as they are.
"""

from __future__ import annotations

import re

_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
_FENCE = re.compile(r"^\s*(```|~~~)")


def on_page_markdown(markdown: str, **kwargs) -> str:
    out: list[str] = []
    fence = in_list = False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fence = not fence
        elif not fence:
            if not line.strip():
                in_list = False
            elif _ITEM.match(line):
                if out and out[-1].strip() and not in_list and not out[-1].lstrip().startswith("|"):
                    out.append("")
                in_list = True
        out.append(line)
    return "\n".join(out)
