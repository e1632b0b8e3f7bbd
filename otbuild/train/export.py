"""Export a trace parquet as a LLaMA-Factory dataset (sharegpt format, role/content messages,
and its tool format where the traces have tools).

    python -m otbuild.train export-llamafactory kept.parquet --outdir out_dir [--name otbuild_sft]
        [--chat-template qwen3_thinking|qwen3]

writes out_dir/NAME.json (a JSON list of {"messages": [{"role", "content"}, ...]}, plus
"tools" where the trace was offered tools) and out_dir/dataset_info.json, so LLaMA-Factory's
`dataset_dir: out_dir`, `dataset: NAME` takes it as is, with the template
`llamafactory_template(chat_template)` names.

Tool-calling traces in LLaMA-Factory's own tool format: the trace's `tools` column as the
record's `tools` (a JSON string; the column declared in dataset_info.json only when a record
has one); an assistant turn with tool calls as a `function_call` turn, its text before
`<tool_call>[{"name", "arguments"}, ...]</tool_call>` (LLaMA-Factory's qwen formatter writes
each call's block after that text, as Qwen3's template does); tool results as `observation`
turns, consecutive ones as one, laid out as Qwen3 lays them out in one user turn.
LLaMA-Factory parses each call's arguments and writes them with json.dumps, as otbuild's SFT
and vLLM do (otbuild/train/chat.py `clean`); arguments that are not a JSON object drop their
conversation (`tool_arguments_not_json`), as otbuild's SFT drops it.

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
- `dropped`: conversations with no assistant turn, or starting with one (or with two answers
  in a row of which one calls tools: no one LLaMA-Factory turn holds both).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from otbuild.fsio import atomic_path, write_json
from otbuild.settings.recipe import PROMPTS
from otbuild.tasks.redact import Redactor
from otbuild.train.chat import bad_tool_calls, for_template, parse_tools, split_reasoning

ROLE_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
ANSWERS = ("assistant", "function_call")  # LLaMA-Factory's answer turns; every other role prompts
# consecutive tool results in one observation turn: LLaMA-Factory wraps the turn's content in
# one <tool_response> block, so the blocks between are in the content, as Qwen3 renders them
BETWEEN_RESULTS = "\n</tool_response>\n<tool_response>\n"
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
    stats = {
        "rows": 0,
        "merged_turns": 0,
        "trailing_turns_dropped": 0,
        "dropped": 0,
        "turns_without_reasoning": 0,
        "rows_with_tools": 0,
        "tools_without_system": 0,
        "tool_arguments_not_json": 0,
    }
    redactor = Redactor()
    with atomic_path(outdir / f"{name}.json") as tmp, open(tmp, "w") as out:
        out.write("[")
        for conv, tools in iter_conversations_with_tools(inputs, prompt=prompt):
            if bad_tool_calls(conv):
                stats["tool_arguments_not_json"] += 1
                msgs = None
            else:
                msgs = alternating(llamafactory_turns(for_template(conv, source)), stats)
            if msgs is None:
                stats["dropped"] += 1
                continue
            if source == "qwen3_thinking":
                stats["turns_without_reasoning"] += sum(
                    m["role"] in ANSWERS and "</think>" not in m["content"] for m in msgs
                )
            record: dict = {"messages": [{**m, "content": redactor.text(m["content"])} for m in msgs]}
            if tools:
                record["tools"] = json.dumps(tools, ensure_ascii=False)
                stats["rows_with_tools"] += 1
                stats["tools_without_system"] += msgs[0]["role"] != "system"
            out.write((", " if stats["rows"] else "") + json.dumps(record, ensure_ascii=False))
            stats["rows"] += 1
        out.write("]")
    columns = {"messages": "messages", **({"tools": "tools"} if stats["rows_with_tools"] else {})}
    info = {
        name: {
            "file_name": f"{name}.json",
            "formatting": "sharegpt",
            "columns": columns,
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
        if turns and (turns[-1]["role"] in ANSWERS) == (role in ANSWERS):
            if "function_call" in (role, turns[-1]["role"]):
                return None  # two answers in a row, one calling tools: not one LLaMA-Factory turn
            content = m["content"]
            if turns[-1]["role"] != role:  # a user turn and a tool result: one user turn
                turns[-1] = {"role": "user", "content": _as_user(turns[-1]["role"], turns[-1]["content"])}
                content = _as_user(role, content)
            turns[-1]["content"] += JOIN + content
            stats["merged_turns"] += 1
        else:
            turns.append({"role": role, "content": m["content"]})
    last = max((i for i, m in enumerate(turns) if m["role"] in ANSWERS), default=0)
    if not last or turns[0]["role"] in ANSWERS:  # no answer, or an answer first
        return None
    stats["trailing_turns_dropped"] += len(turns) - 1 - last
    return head + turns[: last + 1]


def _as_user(role: str, content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>" if role == "observation" else content


def llamafactory_turns(msgs: list[dict]) -> list[dict]:
    """Template messages as LLaMA-Factory's roles: an assistant turn with tool calls as a
    `function_call` turn, tool results as `observation` turns (consecutive ones as one)."""
    out: list[dict] = []
    for m in msgs:
        if m["role"] == "tool":
            if out and out[-1]["role"] == "observation":
                out[-1]["content"] += BETWEEN_RESULTS + m["content"]
            else:
                out.append({"role": "observation", "content": m["content"]})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            out.append({"role": "function_call", "content": function_call_content(m)})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def function_call_content(message: dict) -> str:
    """An assistant turn with tool calls (arguments as objects: `clean`) as LLaMA-Factory's
    function_call content: its text, then the calls as one JSON list inside
    <tool_call></tool_call> (its qwen formatter writes the text, then each call's block,
    newline-separated, as Qwen3's template does)."""
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
    content = message["content"]
    newline = "\n" if split_reasoning(content)[1] else ""
    return f"{content}{newline}<tool_call>{json.dumps(calls, ensure_ascii=False)}</tool_call>"


def iter_conversations_with_tools(
    paths, batch_rows: int = 64, prompt: str = PROMPTS[0]
) -> Iterator[tuple[list[dict], list[dict] | None]]:
    """(conversation, offered tools) of the non-empty conversations of trace parquets, in order,
    in the prompt style `prompt`."""
    from otbuild.harness.protocol import conversations_of, trace_batches

    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        for batch in trace_batches(path, batch_rows):
            tools = batch.column("tools").to_pylist() if "tools" in batch.schema.names else None
            for i, conv in conversations_of(batch, prompt):
                if conv:
                    yield conv, parse_tools(tools[i]) if tools else None
