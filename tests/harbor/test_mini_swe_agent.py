"""A third-party agent as a teacher: Harbor's mini-swe-agent in otbuild's environment, its
install otbuild's (scripts/agents-env.sh), its model reached through the shard's capture proxy
only, its trace built from that trial's captured calls.

The model is a scripted OpenAI-compatible endpoint (tests/support/standin.py), not the tiny
random Qwen3 on vLLM: mini-swe-agent acts only on a valid `bash` tool call and ends on one that
runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, which a random model never writes, so a trial
would only loop on format errors until its time ran out. The endpoint answers as a model would:
a tool call that solves the task, one that runs the attacks below, then the submit call.

The attacks, from inside the sandbox, as the agent's own command: the lab's key is in no
environment variable, no file and no process the task can read; the proxy gives nothing but
model calls (the provider's other endpoints are refused) and never the key; no other address is
reachable (the endpoint's own port, another host).

Needs .venv-harbor (scripts/harbor-env.sh) and .venv-agents/mini-swe-agent (scripts/agents-env.sh).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from otbuild.harbor.job import AGENTS_DIR, DEFAULT_HARBOR, installed_version
from otbuild.sandbox import backend_problem
from otbuild.sources.synthetic import generate
from otbuild.tasks.taskdir import SOLUTION
from tests.conftest import REPO, snakemake

HARBOR = Path(os.environ.get("OTBUILD_HARBOR") or DEFAULT_HARBOR)
MINI = Path(os.environ.get("OTBUILD_AGENTS") or AGENTS_DIR) / "mini-swe-agent"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HARBOR.is_file(), reason=f"Harbor is not installed at {HARBOR}: scripts/harbor-env.sh"),
    pytest.mark.skipif(
        not (MINI / "sandbox-bin" / "mini-swe-agent").is_file(),
        reason=f"mini-swe-agent is not installed at {MINI}: scripts/agents-env.sh",
    ),
    pytest.mark.skipif(bool(backend_problem("bwrap")), reason=f"no bwrap here: {backend_problem('bwrap')}"),
]
KEY = "sk-lab-0123456789abcdef"  # the lab's key: the endpoint needs it, the sandbox never sees it
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
PROBE = """python3 - <<'PY'
import json, os, socket
key = %(reversed)r[::-1]
found = {"env": [k for k, v in os.environ.items() if key in v], "files": [], "proxy": {}, "egress": {}}
def look(path):
    try:
        with open(path, "rb") as f:
            if key.encode() in f.read(4 << 20):
                found["files"].append(path)
    except OSError:
        pass
for top in ("/root", "/tmp", "/app", "/logs", "/run", "/etc", "/opt/otbuild-agent/sandbox-bin"):
    for d, _, names in os.walk(top):
        for n in names:
            look(os.path.join(d, n))
for pid in filter(str.isdigit, os.listdir("/proc")):
    for part in ("environ", "cmdline"):
        look(f"/proc/{pid}/{part}")
look("/opt/otbuild-agent/pyvenv.cfg")
planted, found["files"] = found["files"], []  # the search finds the key where it is: a control
with open("/tmp/planted", "w") as f:
    f.write(key)
look("/tmp/planted")
os.remove("/tmp/planted")
found["files"], found["control"] = planted, found["files"]
def ask(method, path, body=b""):
    s = socket.create_connection(("127.0.0.1", %(port)d), timeout=10)
    head = (f"{method} {path} HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer show-me\\r\\n"
            f"X-Otbuild-Scope: someone-else\\r\\nContent-Length: {len(body)}\\r\\nConnection: close\\r\\n\\r\\n")
    s.sendall(head.encode() + body)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data
for method, path in (("GET", "/v1/models"), ("POST", "/v1/files"), ("POST", "/v1/fine_tuning/jobs"), ("GET", "/")):
    answer = ask(method, path, b"{}" if method == "POST" else b"")
    found["proxy"][f"{method} {path}"] = [answer.split(b" ", 2)[1].decode(), key.encode() in answer]
for host, port in (("127.0.0.1", %(upstream)d), ("10.255.255.1", 80), ("1.1.1.1", 443)):
    try:
        socket.create_connection((host, port), timeout=3).close()
        found["egress"][f"{host}:{port}"] = "connected"
    except OSError as e:
        found["egress"][f"{host}:{port}"] = type(e).__name__
print("PROBE " + json.dumps(found, sort_keys=True))
PY"""


def tool_call(n: int, command: str) -> dict:
    return {
        "id": f"call_{n}",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }


def endpoint(solution: str, upstream_port: int):
    """The model: by the number of answers so far, a tool call that solves the task, one that
    probes, then the submit call; the start's probe ("Reply with the single word OK.") gets OK."""
    from otbuild.capture.control import SANDBOX_MODEL_PORT

    probe = PROBE % {"reversed": KEY[::-1], "port": SANDBOX_MODEL_PORT, "upstream": upstream_port}
    answers = [
        ("I will run the task's steps.", tool_call(0, solution)),
        ("Now I check what this sandbox can see.", tool_call(1, probe)),
        ("", tool_call(2, SUBMIT)),
    ]

    def reply(body):
        if "messages" not in body:
            return 200, {"object": "list", "data": []}
        turn = sum(m.get("role") == "assistant" for m in body["messages"])
        if not body.get("tools"):  # otbuild's own first request to the endpoint
            message, finish = {"role": "assistant", "content": "OK"}, "stop"
        else:
            text, call = answers[min(turn, len(answers) - 1)]
            message, finish = {"role": "assistant", "content": text, "tool_calls": [call]}, "tool_calls"
        return 200, {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 90, "completion_tokens": 12, "total_tokens": 102},
        }

    return reply


def test_mini_swe_agent_trace_is_its_captured_calls_and_its_sandbox_reaches_nothing_else(project, scripted):
    """A real snakemake build of a recipe whose teacher is Harbor's mini-swe-agent in otbuild's
    environment; what the trial's sandbox could do is its agent's second command's output."""
    record = next(iter(generate(1, seed=3)))  # the recipe's one synthetic task
    srv = scripted([], api_key=KEY)  # 401 without the lab's key
    srv.script = endpoint(record.task.text(SOLUTION) or "", srv.server_address[1])
    (project / "recipes" / "mini.yaml").write_text(
        "sources:\n  synth: {kind: synthetic, count: 1, seed: 3}\n"
        f"teacher: {{engine: openai, base_url: '{srv.base_url}', model: m, api_key_env: LAB_LLM_KEY,\n"
        "          sandbox: harbor, agent_timeout_sec: 60,\n"
        "          harbor: {agent: mini-swe-agent, environment: otbuild}}\n"
    )
    # PYTHONPATH: Harbor imports this checkout's environment class
    ran, _ = snakemake(project, "mini", env={"LAB_LLM_KEY": KEY, "PYTHONPATH": str(REPO)})
    assert ran["rollout"] == 1 and ran["rollout_merge"] == 1
    out = project / "results" / "mini" / "teacher"
    [row] = pq.read_table(out / "traces.parquet").to_pylist()
    calls = pq.read_table(out / "calls.parquet").to_pylist()
    meta = json.loads(row["metadata"])
    assert row["exception"] is None and row["reward"] == 1.0, (row["result"], meta.get("exception_message"))
    assert row["agent"] == "mini-swe-agent" and meta["trace_from"] == "capture"
    assert meta["agent_version"] == installed_version(MINI, "mini-swe-agent")  # otbuild's install
    # the proxy scoped the calls to the trial (its Harbor trial name), whatever the agent sent
    assert [c["call_idx"] for c in calls] == [0, 1, 2] and {c["scope"] for c in calls} == {row["trial_name"]}
    assert {c["trial"] for c in calls} == {0} and all(c["status"] == 200 for c in calls)
    # the trace: the last call's request messages, then its answer; its tools
    last = json.loads(calls[-1]["request"])
    conv = row["conversations"]
    assert [m["role"] for m in conv] == [m["role"] for m in last["messages"]] + ["assistant"]
    assert [m["content"] for m in conv[:-1]] == [m["content"] for m in last["messages"]]
    assert json.loads(row["tools"]) == last["tools"] and last["tools"][0]["function"]["name"] == "bash"
    # every assistant turn is the captured answer, byte for byte, tool calls included
    turns = [m for m in conv if m["role"] == "assistant"]
    assert len(turns) == len(calls) == row["n_turns"] == 3
    for turn, call in zip(turns, calls, strict=True):
        assert turn["content"] == (call["content"] or "")
        said = json.loads(call["tool_calls"])
        assert [(t["id"], t["function"]["name"], t["function"]["arguments"]) for t in turn["tool_calls"]] == [
            (t["id"], t["function"]["name"], t["function"]["arguments"]) for t in said
        ]
    assert json.loads(turns[-1]["tool_calls"][0]["function"]["arguments"]) == {"command": SUBMIT}
    tool_results = [m for m in conv if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_results] == ["call_0", "call_1"]
    # the agent's own log agrees with the capture, call by call
    assert [c["harness_agrees"] for c in calls] == [True, True, True] and meta["harness_disagrees"] == 0
    stats = json.loads((out / "provenance.json").read_text())["stats"]
    assert stats["capture"] == {"calls": 3, "errors": 0, "harness_disagrees": 0, "with_token_ids": 0}

    # the attacks, as the agent's command ran them inside the sandbox
    output = json.loads(tool_results[1]["content"])["output"]  # mini-swe-agent's observation: JSON
    probe = json.loads(output.split("PROBE ", 1)[1].split("\n", 1)[0])
    assert probe["control"] == ["/tmp/planted"] and probe["env"] == [] and probe["files"] == [], probe
    assert probe["proxy"]["POST /v1/files"][0] == probe["proxy"]["POST /v1/fine_tuning/jobs"][0] == "403"
    assert probe["proxy"]["GET /"][0] == "403"
    assert not any(leaked for _, leaked in probe["proxy"].values()), probe["proxy"]
    assert set(probe["egress"].values()) <= {"ConnectionRefusedError", "OSError", "TimeoutError"}, probe["egress"]
    assert "connected" not in probe["egress"].values()
    # upstream, every request carried the lab's key (the proxy's), and the endpoint saw nothing
    # but model calls and the model list (the scope header the agent forged went nowhere)
    assert all(r["headers"].get("Authorization") == f"Bearer {KEY}" for r in srv.requests)
    assert {r["path"] for r in srv.requests} <= {"/v1/chat/completions", "/v1/models"}
    assert not any(k.lower() == "x-otbuild-scope" for r in srv.requests for k in r["headers"])
    # no file of the run holds the key: Harbor's job config and logs, the traces, the calls
    leaks = [p for p in project.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaks, leaks
