"""Issue 44 (2, 8): secrets never leave in the data. What otbuild hands over (publish, the
export handoffs) is redacted (otbuild/tasks/redact.py); a recipe that writes a credential is
refused when it loads (otbuild/recipe/credentials.py); the RL server takes this run's key only."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from otbuild.cli import main
from otbuild.errors import ConfigError
from otbuild.recipe.load import load_recipe
from otbuild.tasks.redact import Redactor
from otbuild.tasks.table import TaskRecord, write_tasks
from otbuild.tasks.taskdir import TaskDir

# made-up secrets of each shape (none is a real credential)
HF = "hf_" + "Ab3" * 12
SK = "sk-proj-" + "x9Y" * 10
GH = "ghp_" + "Q7w" * 14
AWS = "AKIA" + "Z3X9" * 4
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow" + "A" * 64 + "\n-----END RSA PRIVATE KEY-----"
SECRETS = {"hf_token": HF, "api_key_sk": SK, "github_token": GH, "aws_access_key": AWS, "jwt": JWT, "private_key": PEM}


def leaks(text: str) -> list[str]:
    return [name for name, s in SECRETS.items() if s in text or s.split("\n")[-1] in text and name == "private_key"]


def test_every_pattern_is_redacted_and_counted_in_text():
    r = Redactor()
    text = r.text("echo " + " and ".join(SECRETS.values()) + f" again {HF}; tokenizer sk-short ghp_x")
    assert leaks(text) == [] and "[REDACTED:hf_token]" in text and "tokenizer sk-short ghp_x" in text
    assert r.found() == {
        "private_key": 1,
        "jwt": 1,
        "aws_access_key": 1,
        "api_key_sk": 1,
        "hf_token": 2,
        "github_token": 1,
    }


def test_a_trace_batch_is_redacted_in_nested_conversations_and_metadata():
    """The agent echoed the token; the verifier wrote it as a reward.json key (metadata)."""
    table = pa.table(
        {
            "conversations": [
                [{"role": "user", "content": "print $T"}, {"role": "assistant", "content": f"{HF}\n"}],
                None,
                [{"role": "assistant", "content": "nothing"}],
            ],
            "metadata": [json.dumps({"reward_json": {SK: 1.0}}), "{}", None],
            "reward": [1.0, None, 0.0],
        }
    )
    r = Redactor()
    [batch] = table.to_batches()
    out = pa.Table.from_batches([r.batch(batch.slice(0, 3))])
    assert out.schema == table.schema and out.num_rows == 3
    assert leaks(json.dumps(out.to_pylist())) == [] and r.found() == {"api_key_sk": 1, "hf_token": 1}
    assert out.column("conversations")[1].as_py() is None and out.column("reward").to_pylist() == [1.0, None, 0.0]


def test_a_scan_counts_what_redaction_would_take_out_and_changes_nothing(tmp_path):
    """`redact.scan` (the report's Secrets table): per pattern, the counts `Redactor.batch` gives
    for the same table, read batch by batch (a slice's own nested values only), the file untouched."""
    from otbuild.tasks.redact import scan

    table = pa.table(
        {
            "conversations": [
                [{"role": "assistant", "content": f"{HF} {GH}"}],
                None,
                [{"role": "user", "content": SK}, {"role": "assistant", "content": HF}],
            ],
            "metadata": [json.dumps({"reward_json": {AWS: 1.0}}), "{}", None],
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    before = path.read_bytes()
    r = Redactor()
    for batch in table.to_batches():
        r.batch(batch)
    assert scan(path) == {**dict.fromkeys(SECRETS, 0), **r.found()}
    assert r.found() == {"hf_token": 2, "github_token": 1, "api_key_sk": 1, "aws_access_key": 1}
    assert scan(path, batch_rows=1) == scan(path) and path.read_bytes() == before
    counted = Redactor()
    counted.count(table.to_batches()[0].slice(2, 1))  # the last row alone
    assert counted.found() == {"api_key_sk": 1, "hf_token": 1}
    # every pattern in a task's files (task_binary): none passes the look into its tar stream
    leaky, clean = TaskDir("leaky"), TaskDir("clean")
    leaky.add("tests/secrets.txt", "\n".join(SECRETS.values()))
    leaky.add("logo.bin", b"\xff\xfe" + HF.encode())  # not text: left as it is, not counted
    clean.add("instruction.md", "Nothing to see.")
    pq.write_table(pa.table({"task_binary": [clean.pack(), leaky.pack(), None]}), path)
    assert scan(path) == dict.fromkeys(SECRETS, 1)
    from otbuild.tasks.redact import _may_hold_secrets

    assert _may_hold_secrets([clean.pack(), leaky.pack(), None, b"not gzip"], chunk_bytes=1) == [
        False,
        True,
        False,
        True,
    ]


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path


def _leaky_task() -> TaskDir:
    t = TaskDir("leaky")
    t.add("instruction.md", f"Use the key {SK} to call the API.")
    t.add("task.toml", "[verifier]\ntimeout_sec = 60.0\n")
    t.add("tests/test.sh", f"#!/bin/bash\ncurl -H 'Authorization: Bearer {GH}' judge\n", executable=True)
    return t


def test_publish_redacts_the_table_and_counts_it_in_the_manifest_and_card(project):
    from otbuild.plan import plan_recipe
    from otbuild.runner import run_spec

    (project / "data").mkdir()
    write_tasks(project / "data" / "t.parquet", [TaskRecord(_leaky_task(), True)], source="t")
    (project / "recipes" / "r.yaml").write_text(
        "sources:\n  t: {kind: harbor-parquet, rank: 1, path: data/t.parquet}\ntask_filter: {}\n"
    )
    for n in plan_recipe(load_recipe("r", project)).nodes:
        if n.stage in ("source", "task_filter"):
            run_spec(n.spec())
    res = CliRunner().invoke(main, ["publish", "r", "task_filter", "--repo", "o/r", "--dry-run", "--out", "hub"])
    assert res.exit_code == 0, res.output
    # the instruction column, and instruction.md and tests/test.sh in task_binary
    assert "redacted 3 secret(s): api_key_sk 2, github_token 1" in " ".join(res.output.split())
    manifest = json.loads((project / "hub" / "manifest.json").read_text())
    assert manifest["redacted"] == {"api_key_sk": 2, "github_token": 1}
    assert "redacted 3 secret(s)" in (project / "hub" / "README.md").read_text()
    [row] = pq.read_table(next((project / "hub" / "data").glob("*.parquet"))).to_pylist()
    task = TaskDir.unpack(row["path"], row["task_binary"])
    assert leaks(row["instruction"] + task.instruction + task.text("tests/test.sh")) == []
    assert "[REDACTED:github_token]" in task.text("tests/test.sh")


def test_export_tasks_redacts_the_task_dirs(project):
    src = project / "t.parquet"
    write_tasks(src, [TaskRecord(_leaky_task(), True)], source="t")
    res = CliRunner().invoke(main, ["export", "tasks", str(src), "out"])
    assert res.exit_code == 0, res.output
    assert "redacted 2 secret(s)" in " ".join(res.output.split())
    text = "".join(p.read_text() for p in (project / "out").rglob("*") if p.is_file())
    assert leaks(text) == [] and "[REDACTED:api_key_sk]" in text


def test_the_llamafactory_export_redacts_the_conversations(tmp_path):
    from otbuild.train.export import export_llamafactory

    traces = tmp_path / "traces.parquet"
    pq.write_table(
        pa.table(
            {"conversations": [[{"role": "user", "content": "go"}, {"role": "assistant", "content": f"token is {HF}"}]]}
        ),
        traces,
    )
    stats = export_llamafactory([traces], tmp_path / "out", chat_template="qwen3")
    assert stats["redacted"] == {"hf_token": 1} and stats["rows"] == 1
    assert leaks(Path(stats["file"]).read_text()) == []


@pytest.mark.parametrize(
    "section, key",
    [
        (
            "teacher: {engine: vllm, model: m, engine_args: {env: {HF_TOKEN: abc123}}}",
            "teacher.engine_args.env.HF_TOKEN",
        ),
        (
            "teacher: {engine: vllm, model: m, engine_args: {extra_args: ['--api-key', 'abc']}}",
            "teacher.engine_args.extra_args.0",
        ),
        ("teacher: {engine: openai, model: m, base_url: 'https://lab:hunter2@llm.example/v1'}", "teacher.base_url"),
        (
            f"teacher: {{engine: openai, model: m, base_url: 'https://llm.example/v1', api_key_env: {SK}}}",
            "teacher.api_key_env",
        ),
    ],
)
def test_a_credential_written_in_a_recipe_is_refused_naming_its_key(project, section, key):
    (project / "recipes" / "r.yaml").write_text(f"sources:\n  s: {{kind: synthetic, rank: 1, count: 2}}\n{section}\n")
    with pytest.raises(ConfigError, match=rf"r.yaml: {key}: .*\n.*name an environment variable"):
        load_recipe("r", project)
    res = CliRunner().invoke(main, ["validate", "r"])
    assert res.exit_code == 2 and key in res.output


def test_names_of_variables_and_ordinary_flags_are_not_credentials(project):
    (project / "recipes" / "r.yaml").write_text(
        "sources:\n  s: {kind: synthetic, rank: 1, count: 2}\n"
        "teacher: {engine: openai, model: m, base_url: 'https://llm.example/v1', api_key_env: LAB_KEY}\n"
    )
    load_recipe("r", project)
    from otbuild.recipe.credentials import credentials

    assert (
        list(
            credentials(
                {
                    "env": {"TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": ""},
                    "extra_args": ["--max-num-batched-tokens", "8192", "--tokenizer", "t"],
                }
            )
        )
        == []
    )


def test_the_rl_server_takes_this_runs_key_only(tmp_path):
    """vLLM guards its /v1 routes with VLLM_API_KEY (its dev-mode weight endpoints it does not:
    docs/security.md); each run makes its own, in the server's environment (not its
    command line), and its clients send it."""
    from otbuild.engines.process import ServerProcess
    from otbuild.settings.stages import RlSettings
    from otbuild.train.rl.server import PolicyServer

    cfg = RlSettings(steps=1, rollout="vllm")
    a, b = PolicyServer(cfg, tmp_path / "a"), PolicyServer(cfg, tmp_path / "b")
    key = a.llm.launch.env["VLLM_API_KEY"]
    assert len(key) >= 32 and key != b.llm.launch.env["VLLM_API_KEY"]
    assert a.llm.launch.env["VLLM_SERVER_DEV_MODE"] == "1"
    a.base_url = "http://localhost/v1"
    a.server = ServerProcess(["vllm"], name="vllm", log_path=tmp_path / "log", uds=str(tmp_path / "api.sock"))
    client = a.client()  # over the server's socket (tests/engines/test_vllm_live.py runs it)
    assert client._headers == {"Authorization": f"Bearer {key}"} and client._uds == a.server.uds
