"""Every table of a tool-calling run, loaded by Hugging Face `datasets` (the real package): the
trace parquet with tool calls and tool messages, calls.parquet, and the LLaMA-Factory export
(records with and without `tools`). Each loads with its values intact."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from otbuild.settings.train import Sft
from otbuild.stagekit.calls import write_calls
from otbuild.traces.table import write_traces
from otbuild.train.llamafactory import write_handoff
from otbuild.train.toy import TOY_TOOLS, tool_trace_rows, trace_rows


def _load(kind: str, path, tmp_path):
    import datasets

    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))


def test_datasets_loads_a_trace_set_with_tool_calls(tmp_path):
    rows = tool_trace_rows(3) + trace_rows(1, full_prompt=False)  # a terminus-2 trace beside them
    write_traces(tmp_path / "traces.parquet", rows)
    ds = _load("parquet", tmp_path / "traces.parquet", tmp_path)
    assert ds.num_rows == 4 and ds.to_list() == pq.read_table(tmp_path / "traces.parquet").to_pylist()
    first = ds[0]
    assert json.loads(first["tools"]) == TOY_TOOLS and ds[3]["tools"] is None
    call = first["conversations"][1]["tool_calls"][0]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"])["command"]
    assert first["conversations"][2] == {
        "role": "tool",
        "content": first["conversations"][2]["content"],
        "tool_calls": None,
        "tool_call_id": call["id"],
    }


def test_datasets_loads_calls_parquet(tmp_path):
    call = {
        "trial": 0,
        "trial_name": "t-0",
        "scope": "t-0-1",
        "call_idx": 0,
        "path": "/v1/chat/completions",
        "model": "m",
        "stream": False,
        "status": 200,
        "delivered": True,
        "duration_s": 0.5,
        "request": json.dumps({"messages": [{"role": "user", "content": "ls"}], "tools": TOY_TOOLS}),
        "response": "{}",
        "content": None,
        "reasoning": "look",
        "tool_calls": json.dumps([{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]),
        "finish_reason": "tool_calls",
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "logprobs": [-0.5, -0.25],
        "harness_agrees": True,
    }
    write_calls(tmp_path / "calls.parquet", [call, {**call, "call_idx": 1, "prompt_token_ids": None, "logprobs": None}])
    ds = _load("parquet", tmp_path / "calls.parquet", tmp_path)
    assert ds.num_rows == 2 and ds[0] == call and ds[1]["prompt_token_ids"] is None
    assert json.loads(ds[0]["request"])["tools"] == TOY_TOOLS


def test_datasets_loads_the_llamafactory_export_with_tools(tmp_path):
    write_traces(tmp_path / "kept.parquet", tool_trace_rows(2) + trace_rows(1, full_prompt=False))
    out = write_handoff(
        [tmp_path / "kept.parquet"], tmp_path / "lf", Sft(model={"kind": "tiny"}, global_batch_size=8), "m", 8
    )
    assert (out["rows"], out["rows_with_tools"]) == (3, 2)
    ds = _load("json", tmp_path / "lf" / "otbuild_sft.json", tmp_path)
    assert ds.num_rows == 3
    assert [json.loads(t) if t else None for t in ds["tools"]] == [TOY_TOOLS, TOY_TOOLS, None]
    roles = [m["role"] for m in ds[0]["messages"]]
    assert roles[:3] == ["user", "function_call", "observation"] and roles[-1] == "assistant"
