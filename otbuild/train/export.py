"""Export a trace parquet as a LLaMA-Factory dataset (sharegpt format, role/content messages).

    python -m otbuild.train export-llamafactory kept.parquet --outdir out_dir [--name otbuild_sft]
        [--chat-template qwen3_thinking|qwen3]

writes out_dir/NAME.json (a JSON list of {"messages": [{"role", "content"}, ...]}) and
out_dir/dataset_info.json, so LLaMA-Factory's `dataset_dir: out_dir`, `dataset: NAME` takes it
as is, with the template `llamafactory_template(chat_template)` names.

The messages are those otbuild's own SFT renders (otbuild/train/chat.py `for_template`):
reasoning laid out as Qwen3 writes it (`qwen3_thinking`) or removed (`qwen3`), and in the
recipe's prompt style. LLaMA-Factory's sharegpt converter takes a leading system message as
the system prompt and drops any conversation whose other turns do not alternate user /
assistant, ending with an assistant turn; so the export makes them alternate, counting what
it changed (the returned stats):
- `merged_turns`: a turn joined to the one before it, of the same role, with a blank line
  (Harbor writes a system step then a user step after context summarization; its ingest
  makes both user turns). A system message after the first turn counts as a user turn.
- `trailing_turns_dropped`: turns after the last assistant turn (no loss in otbuild's SFT).
- `dropped`: conversations with no assistant turn, or starting with one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from otbuild.fsio import atomic_path, write_json
from otbuild.settings.recipe import PROMPTS
from otbuild.tasks.redact import Redactor
from otbuild.train.chat import for_template

ROLE_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "tool",
    "system_tag": "system",
}
# otbuild's chat_template -> LLaMA-Factory's template (llamafactory/data/template.py) rendering
# the exported messages as otbuild's own template renders them: `qwen3` (reasoning, the 32B)
# keeps each turn's <think> block; `qwen3_nothink` (the 8B) renders the answers alone, where
# LLaMA-Factory's `qwen3` would train an empty <think> block before every one of them.
LLAMAFACTORY_TEMPLATES = {"qwen3_thinking": "qwen3", "qwen3": "qwen3_nothink"}
JOIN = "\n\n"  # between the contents of merged same-role turns


def export_template(chat_template: str) -> str:
    """The layout the export writes for `sft.model.chat_template`: `auto` is otbuild's
    qwen3_thinking one (what `auto` falls back to; a Qwen3 model's own template keeps the last
    turn's reasoning too)."""
    return "qwen3_thinking" if chat_template == "auto" else chat_template


def llamafactory_template(chat_template: str) -> str:
    return LLAMAFACTORY_TEMPLATES[export_template(chat_template)]


def export_llamafactory(
    inputs: list[Path],
    outdir: Path,
    name: str = "otbuild_sft",
    *,
    chat_template: str = "qwen3_thinking",
    prompt: str = PROMPTS[0],
) -> dict:
    """Streamed: one batch of conversations in memory at a time, whatever the row count."""
    outdir = Path(outdir)
    source = export_template(chat_template)
    stats = {"rows": 0, "merged_turns": 0, "trailing_turns_dropped": 0, "dropped": 0, "turns_without_reasoning": 0}
    redactor = Redactor()
    with atomic_path(outdir / f"{name}.json") as tmp, open(tmp, "w") as out:
        out.write("[")
        for conv in iter_conversations(inputs, prompt=prompt):
            msgs = alternating(for_template(conv, source), stats)
            if msgs is None:
                stats["dropped"] += 1
                continue
            if source == "qwen3_thinking":
                stats["turns_without_reasoning"] += sum(
                    m["role"] == "assistant" and "</think>" not in m["content"] for m in msgs
                )
            msgs = [{**m, "content": redactor.text(m["content"])} for m in msgs]
            out.write((", " if stats["rows"] else "") + json.dumps({"messages": msgs}, ensure_ascii=False))
            stats["rows"] += 1
        out.write("]")
    info = {
        name: {
            "file_name": f"{name}.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages"},
            "tags": ROLE_TAGS,
        }
    }
    write_json(outdir / "dataset_info.json", info)
    return {**stats, "file": str(outdir / f"{name}.json"), "redacted": redactor.found()}


def alternating(msgs: list[dict], stats: dict) -> list[dict] | None:
    """`msgs` as LLaMA-Factory's sharegpt converter takes them: an optional leading system
    message, then prompt turns (user, tool) and assistant turns alternating, the last an
    assistant's. Consecutive prompt turns of different roles become one user turn, a tool
    result wrapped as otbuild's template renders it. None when no assistant turn is left, or
    the first turn is one."""
    head = msgs[:1] if msgs and msgs[0]["role"] == "system" else []
    turns: list[dict] = []
    for m in msgs[len(head) :]:
        role = "user" if m["role"] == "system" else m["role"]
        if turns and (turns[-1]["role"] == "assistant") == (role == "assistant"):
            content = m["content"]
            if turns[-1]["role"] != role:  # a user turn and a tool result: one user turn
                turns[-1] = {"role": "user", "content": _as_user(turns[-1]["role"], turns[-1]["content"])}
                content = _as_user(role, content)
            turns[-1]["content"] += JOIN + content
            stats["merged_turns"] += 1
        else:
            turns.append({"role": role, "content": m["content"]})
    last = max((i for i, m in enumerate(turns) if m["role"] == "assistant"), default=0)
    if not last or turns[0]["role"] == "assistant":  # no answer, or an answer first
        return None
    stats["trailing_turns_dropped"] += len(turns) - 1 - last
    return head + turns[: last + 1]


def _as_user(role: str, content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>" if role == "tool" else content


def iter_conversations(paths, batch_rows: int = 64, prompt: str = PROMPTS[0]) -> Iterator[list[dict]]:
    """The non-empty conversations of trace parquets, in order, in the prompt style `prompt`."""
    from otbuild.harness.protocol import iter_conversations as batches

    for batch in batches(paths, batch_rows, prompt):
        yield from (c for c in batch if c)
