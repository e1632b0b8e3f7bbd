"""Stack Exchange post HTML as readable markdown (stdlib html.parser only).

Handles what SE bodies use: paragraphs, headings, `<pre><code>` blocks (fenced with enough
backticks), inline `<code>`, links (`[text](href)`, bare when text == href), images,
ordered/unordered (nested) lists, blockquotes (`> `), `<br>`, `<hr>`, emphasis, `<kbd>`,
tables (one row per line, cells separated by ` | `) and entities (decoded by the parser).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

BLOCKS = {"p", "div", "pre", "blockquote", "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
          "hr", "table", "tr", "dl", "dt", "dd"}  # fmt: skip
EMPHASIS = {"em": "*", "i": "*", "strong": "**", "b": "**", "strike": "~~", "s": "~~", "del": "~~"}


class _Md(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []  # finished blocks
        self.line: list[str] = []  # inline text of the current block
        self.quote = 0
        self.lists: list[list] = []  # [kind, counter]
        self.pre: list[str] | None = None
        self.links: list[str | None] = []
        self.code = 0
        self.pending_item: str | None = None

    # -- block handling --------------------------------------------------------
    def _prefix(self) -> str:
        return "> " * self.quote

    def flush(self) -> None:
        text = "".join(self.line)
        self.line = []
        text = re.sub(r"[ \t\r\n\xa0]+", " ", text).strip()
        text = re.sub(r" ?\x01 ?", "\n" + self._prefix() + "   " * len(self.lists), text).strip("\n")
        if self.pending_item is not None:
            indent = "   " * (len(self.lists) - 1)
            text = f"{indent}{self.pending_item} {text}".rstrip()
            self.pending_item = None
            self.out.append(self._prefix() + text)
            return
        if text:
            indent = "   " * len(self.lists) if self.lists else ""
            self.out.append(self._prefix() + indent + text)
            self.out.append(self._prefix().rstrip())  # paragraph break

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self.pre is not None:
            if tag == "br":
                self.pre.append("\n")
            return
        if tag in BLOCKS:
            self.flush()
        if tag == "pre":
            self.pre = []
        elif tag == "blockquote":
            self.quote += 1
        elif tag in ("ul", "ol"):
            self.lists.append([tag, 0])
        elif tag == "li":
            if not self.lists:
                self.lists.append(["ul", 0])
            self.lists[-1][1] += 1
            kind, n = self.lists[-1]
            self.pending_item = f"{n}." if kind == "ol" else "-"
        elif tag == "br":
            self.line.append("\x01")  # a line break inside the block
        elif tag == "hr":
            self.out += [self._prefix() + "---", ""]
        elif tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.line.append("#" * int(tag[1]) + " ")
        elif tag == "code" or tag == "kbd":
            self.code += 1
            self.line.append("`")
        elif tag in EMPHASIS:
            self.line.append(EMPHASIS[tag])
        elif tag == "a":
            self.links.append(a.get("href"))
            self.line.append("\x00[")
        elif tag == "img":
            self.line.append(f"![{a.get('alt') or ''}]({a.get('src') or ''})")
        elif tag in ("td", "th"):
            self.line.append(" | ")

    def handle_endtag(self, tag):
        if self.pre is not None:
            if tag == "pre":
                code = "".join(self.pre).strip("\n")
                self.pre = None
                fence = "```"
                while fence in code:
                    fence += "`"
                p = self._prefix()
                indent = "   " * len(self.lists)
                lines = [fence, *code.split("\n"), fence]
                self.out += [p + indent + ln if ln else p.rstrip() for ln in lines]
                self.out.append(p.rstrip())
            return
        if tag in ("code", "kbd") and self.code:
            self.code -= 1
            self.line.append("`")
        elif tag in EMPHASIS:
            self.line.append(EMPHASIS[tag])
        elif tag == "a" and self.links:
            href = self.links.pop()
            text_start = max(i for i, s in enumerate(self.line) if s == "\x00[")
            text = "".join(self.line[text_start + 1 :]).strip()
            del self.line[text_start:]
            if not href or href == text or not text:
                self.line.append(text or href or "")
            else:
                self.line.append(f"[{text}]({href})")
        elif tag in BLOCKS:
            self.flush()
            if tag == "blockquote" and self.quote:
                self.quote -= 1
                self.out.append(self._prefix().rstrip())
            elif tag in ("ul", "ol") and self.lists:
                self.lists.pop()
                if not self.lists:
                    self.out.append(self._prefix().rstrip())

    def handle_data(self, data):
        if self.pre is not None:
            self.pre.append(data)
        elif self.code:
            self.line.append(data.replace("\n", " "))
        else:
            self.line.append(data)

    def result(self) -> str:
        self.close()
        if self.pre is not None:  # unclosed <pre>
            self.handle_endtag("pre")
        self.flush()
        lines = "\n".join(self.out).replace("\x00[", "").split("\n")
        # a bare ">" line only separates quoted paragraphs: drop it at the end of a quote
        lines = [
            ln
            for i, ln in enumerate(lines)
            if not (ln.strip() == ">" and (i + 1 == len(lines) or not lines[i + 1].startswith(">")))
        ]
        text = "\n".join(lines)
        return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def html_to_markdown(html: str) -> str:
    """Readable markdown for a Stack Exchange post body ("" stays "")."""
    if not html or not html.strip():
        return ""
    p = _Md()
    p.feed(html)
    return p.result()
