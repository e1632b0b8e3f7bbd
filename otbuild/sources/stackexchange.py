"""Source adapter: Stack Exchange questions (official Posts.xml dumps, or CSV/JSONL/JSON/
parquet exports) as Harbor tasks whose instruction is the question.

Inputs (`path`: a file or a folder of them):
- **Posts.xml** (any `.xml`): `<row>` elements; PostTypeId 1 = question (Id, Title, Body,
  Tags `<bash><sed>`, AcceptedAnswerId, Score, ...), 2 = answer (Id, ParentId, Body). Read in
  two streaming passes (accepted answers first, then questions); other post types (tag
  wikis, ...) are not tasks and are skipped.
- **exports**: one question per row, columns (first present wins) title: `title`/`Title`;
  body: `body`, `question_body`, `body_html`, `Body`; tags: `tags`/`Tags` (a list, `<a><b>`,
  or `a|b`/`a,b`/`a b`); accepted answer: `accepted_answer_html`, `accepted_answer`,
  `accepted_answer_body`, `answer`, `AcceptedAnswerBody`; id: `question_id`, `id`, `Id`;
  plus `site`, `link`, `question_score`/`score`. A body is optional (the Tellina exports
  have only a title and the accepted answer).

HTML becomes markdown (`_html.html_to_markdown`). instruction.md is `# <title>` then the body.
The accepted answer, when there is one, is kept as `solution/reference_answer.md` and in
metadata `reference_answer` (markdown); there is no solve.sh and **no tests/test.sh**: an
answer to a free-form question cannot be checked by a script, so `has_tests` is honestly
False and a later LLM-judge stage can grade against the reference answer. The environment is
a plain shell image (`FROM python:3.12-slim`), so tasks are runnable locally.

The site is the `site` option, else the row's `site`, else (Posts.xml) the name of the
folder holding the dump (e.g. `superuser.com`), else "stackexchange". Rows without a title
and body are quarantined ("empty instruction"); without an id ("missing field").
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import cast

from otbuild.records import (
    Dedup,
    SourceFormatError,
    as_text,
    iter_file,
    record_files,
    task_name,
)
from otbuild.settings.recipe import StackExchangeSource
from otbuild.sources import PATH_FORMS
from otbuild.sources._html import html_to_markdown
from otbuild.tasks.harbor_meta import dump_toml
from otbuild.tasks.table import Quarantined, TaskRecord
from otbuild.tasks.taskdir import DOCKERFILE, INSTRUCTION, TASK_TOML, TaskDir

REFERENCE = "solution/reference_answer.md"
DOCKERFILE_TEXT = "FROM python:3.12-slim\nWORKDIR /app\n"
COLUMNS = {
    "title": ("title", "Title"),
    "body": ("body", "question_body", "body_html", "Body", "question"),
    "tags": ("tags", "Tags"),
    "answer": (
        "accepted_answer_html",
        "accepted_answer",
        "accepted_answer_body",
        "answer",
        "AcceptedAnswerBody",
    ),
    "id": ("question_id", "id", "Id", "QuestionId"),
    "site": ("site", "Site"),
    "link": ("link", "url", "Link"),
    "score": ("question_score", "score", "Score"),
    "answer_score": ("answer_score", "accepted_answer_score"),
}
HTML_HINT = re.compile(r"<(p|pre|code|a|br|ul|ol|li|blockquote|strong|em|h\d|div|img)\b", re.IGNORECASE)


def read(cfg: StackExchangeSource) -> Iterator[TaskRecord | Quarantined]:
    """Yield one TaskRecord or Quarantined per question in `cfg.path`. Raises SourceFormatError
    (a ValueError) for a malformed file, naming it and the line/position."""
    seen, site = Dedup(), cfg.site
    for f in record_files(Path(cfg.path), cast(tuple[str, ...], PATH_FORMS["stackexchange"])):
        items = _posts_xml(f, site) if f.suffix.lower() == ".xml" else _export(f, site)
        for item in items:
            if isinstance(item, TaskRecord) and (first := seen.first(item.task.name, item.metadata["where"])):
                item = Quarantined(
                    item.task.name,
                    "duplicate id",
                    f"{item.metadata['where']}: first seen at {first}",
                )
            yield item


# -- exports -------------------------------------------------------------------------
def _pick(row: dict, field: str):
    for key in COLUMNS[field]:
        if key in row and as_text(row[key]) is not None or (key in row and isinstance(row[key], list)):
            return row[key]
    return None


def _export(f: Path, site: str | None) -> Iterator[TaskRecord | Quarantined]:
    for row in iter_file(f):
        if row.data is None:
            yield Quarantined(row.where, row.reason, row.detail)
            continue
        d = row.data
        yield question(
            where=row.where, qid=_pick(d, "id"), title=_pick(d, "title"), body=_pick(d, "body"),
            tags=_pick(d, "tags"), answer=_pick(d, "answer"), site=site or as_text(_pick(d, "site")),
            extra={"link": _pick(d, "link"), "question_score": _pick(d, "score"),
                   "answer_score": _pick(d, "answer_score")},
        )  # fmt: skip


# -- Posts.xml -------------------------------------------------------------------------
def _iter_xml_rows(f: Path) -> Iterator[tuple[int, dict]]:
    try:
        for n, (_event, elem) in enumerate(ET.iterparse(f, events=("end",))):
            if elem.tag == "row":
                yield n, dict(elem.attrib)
            elem.clear()
    except ET.ParseError as e:
        line, col = e.position
        raise SourceFormatError(f"{f}: line {line} column {col}: not valid XML: {e}") from None


def _posts_xml(f: Path, site: str | None) -> Iterator[TaskRecord | Quarantined]:
    site = site or (f.parent.name if "." in f.parent.name else None)
    accepted: dict[str, dict] = {}
    wanted: set[str] = set()
    for _n, a in _iter_xml_rows(f):  # pass 1: accepted answers (questions precede answers)
        if a.get("PostTypeId") == "1" and a.get("AcceptedAnswerId"):
            wanted.add(a["AcceptedAnswerId"])
        elif a.get("PostTypeId") == "2" and a.get("Id") in wanted:
            accepted[a["Id"]] = a
    for n, a in _iter_xml_rows(f):  # pass 2: questions, in file order
        if a.get("PostTypeId") != "1":
            continue
        ans = accepted.get(a.get("AcceptedAnswerId") or "")
        where = f"{f.name}:row {n}"
        if a.get("AcceptedAnswerId") and ans is None:
            where += f" (accepted answer {a['AcceptedAnswerId']} not in the dump)"
        yield question(
            where=where, qid=a.get("Id"), title=a.get("Title"), body=a.get("Body"), tags=a.get("Tags"),
            answer=ans.get("Body") if ans else None, site=site,
            extra={"question_score": _int(a.get("Score")), "answer_score": _int(ans.get("Score")) if ans else None,
                   "accepted_answer_id": a.get("AcceptedAnswerId"), "creation_date": a.get("CreationDate"),
                   "view_count": _int(a.get("ViewCount"))},
        )  # fmt: skip


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


# -- one question -> one task ----------------------------------------------------------------
def parse_tags(tags) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, (list, tuple)) or hasattr(tags, "tolist"):
        return [str(t) for t in (tags.tolist() if hasattr(tags, "tolist") else tags)]
    s = str(tags).strip()
    if s.startswith("<"):
        return re.findall(r"<([^<>]+)>", s)
    if s.startswith("["):
        from otbuild.records import as_list

        try:
            return [str(t) for t in as_list(s, "tags")]
        except ValueError:
            pass
    return [t for t in re.split(r"[|,\s]+", s) if t]


def to_markdown(text: str | None) -> str:
    if not text:
        return ""
    return html_to_markdown(text) if HTML_HINT.search(text) else text.strip() + "\n"


def question(*, where, qid, title, body, tags, answer, site, extra) -> TaskRecord | Quarantined:
    site = site or "stackexchange"
    qid = as_text(qid)
    if qid is None:
        return Quarantined(where, "missing field", f"{where}: question id")
    name = task_name(site, qid)
    title_text = " ".join(to_markdown(as_text(title) or "").split())
    body_md = to_markdown(as_text(body))
    if not title_text and not body_md.strip():
        return Quarantined(name, "empty instruction", f"{where}: no title and no body")
    parts = [f"# {title_text}"] if title_text else []
    if body_md.strip():
        parts.append(body_md.strip())
    instruction = "\n\n".join(parts) + "\n"
    answer_md = to_markdown(as_text(answer))
    tag_list = parse_tags(tags)

    task = TaskDir(name)
    task.add(INSTRUCTION, instruction)
    task.add(TASK_TOML, dump_toml({
        "": {"version": "1.0"},
        "metadata": {"source": "stackexchange", "site": site, "question_id": qid, "tags": tag_list},
        "agent": {"timeout_sec": 900.0},
        "environment": {"cpus": 1, "memory_mb": 2048, "allow_internet": False},
    }))  # fmt: skip
    task.add(DOCKERFILE, DOCKERFILE_TEXT)
    if answer_md.strip():
        task.add(REFERENCE, answer_md)
    meta = {"site": site, "question_id": qid, "title": title_text, "tags": tag_list,
            "has_body": bool(body_md.strip()), "has_reference_answer": bool(answer_md.strip()),
            "reference_answer": answer_md or None, "verifier": "none (LLM judge against reference_answer)",
            "where": where}  # fmt: skip
    meta |= {k: v for k, v in extra.items() if v is not None and (not isinstance(v, float) or not math.isnan(v))}
    return TaskRecord(task, runnable_locally=True, metadata=meta)
