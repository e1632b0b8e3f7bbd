"""Source adapters for Harbor dirs, HF task parquets and Terminal-Bench 1 dirs, on the dev data."""

from __future__ import annotations

import gzip
import io
import json
import stat
import tarfile
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from otbuild.errors import StageError
from otbuild.sources import harbor_dir, harbor_parquet, tb1_dir
from otbuild.tasks.export import export_tasks
from otbuild.tasks.table import Quarantined, TaskRecord, write_tasks
from otbuild.tasks.task_toml import runnable_locally
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import source

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "dev"
TB = DATA / "terminal_bench_tasks"
HARBOR = TB / "harbor_format"
TB1 = TB / "tb1_format"
FEWSHOTS = HARBOR / "tb2_ot_fewshots"

if not TB.is_dir():
    pytest.skip(f"dev data not found at {TB} (shared/data/dev)", allow_module_level=True)


def task_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir())


def records(items) -> dict[str, TaskRecord]:
    return {r.task.name: r for r in items if isinstance(r, TaskRecord)}


def snapshot(root: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file under root: bytes and owner exec bit."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), bool(p.stat().st_mode & stat.S_IXUSR))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# -- Harbor dirs -----------------------------------------------------------------
@pytest.mark.parametrize("folder", ["tb2_ot_fewshots", "termigen_no_solution"])
def test_harbor_dir_reads_every_task(folder):
    src = HARBOR / folder
    items = list(harbor_dir.read(source("harbor-dir", src)))
    assert [i.task.name for i in items] == [d.name for d in task_dirs(src)]  # sorted, none lost
    for d in task_dirs(src):
        rec = records(items)[d.name]
        assert rec.task.instruction == (d / "instruction.md").read_text()
        config = tomllib.loads((d / "task.toml").read_text())
        assert rec.metadata["agent_timeout_sec"] == config["agent"]["timeout_sec"]
        assert rec.metadata["verifier_timeout_sec"] == config["verifier"]["timeout_sec"]
        assert rec.metadata.get("docker_image") == config.get("environment", {}).get("docker_image")
        assert rec.metadata["difficulty"] == config["metadata"]["difficulty"]
        assert set(rec.task.files) == set(snapshot(d))
    json.dumps([r.metadata for r in items])  # metadata stays JSON-serialisable


def test_harbor_runnable_locally_on_real_tasks():
    recs = records(harbor_dir.read(source("harbor-dir", FEWSHOTS)))
    # hello-world: no docker_image, Dockerfile is FROM + WORKDIR only.
    assert recs["hello-world"].runnable_locally is True
    # build-cython-ext: prebuilt docker_image and RUN apt-get install.
    assert recs["build-cython-ext"].runnable_locally is False


def _write(d: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


GOOD = {
    "instruction.md": "Do the thing.\n",
    "task.toml": '[agent]\ntimeout_sec = 10.0\n[verifier]\ntimeout_sec = 5\n[metadata]\ntags = ["a"]\n',
    "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
}


def test_harbor_dir_quarantines_broken_tasks(tmp_path):
    _write(tmp_path / "a_good", GOOD)
    _write(tmp_path / "b_no_instruction", {k: v for k, v in GOOD.items() if k != "instruction.md"})
    _write(tmp_path / "c_empty", GOOD | {"instruction.md": "  \n\n"})
    _write(tmp_path / "d_bad_toml", GOOD | {"task.toml": "[agent\ntimeout_sec = "})
    _write(tmp_path / "e_bad_type", GOOD | {"task.toml": '[agent]\ntimeout_sec = "soon"\n'})
    _write(tmp_path / "f_no_tests", {k: v for k, v in GOOD.items() if k != "tests/test.sh"})
    (_write(tmp_path / "g_symlink", GOOD) / "link").symlink_to("/etc/passwd")
    (tmp_path / "h_linked_dir").symlink_to(tmp_path / "a_good")
    (tmp_path / "README.md").write_text("not a task\n")

    items = list(harbor_dir.read(source("harbor-dir", tmp_path)))
    reasons = {i.name: i.reason for i in items if isinstance(i, Quarantined)}
    assert reasons == {
        "b_no_instruction": "missing instruction.md",
        "c_empty": "empty instruction",
        "d_bad_toml": "bad task.toml",
        "e_bad_type": "bad task.toml",
        "f_no_tests": "missing tests/test.sh",
        "g_symlink": "symlink",
        "h_linked_dir": "symlink",
    }
    good = records(items)["a_good"]
    assert good.metadata == {"tags": ["a"], "agent_timeout_sec": 10.0, "verifier_timeout_sec": 5}
    assert good.runnable_locally is True
    assert len(items) == 8


def test_missing_source_folder_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        list(harbor_dir.read(source("harbor-dir", tmp_path / "nope")))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="file"):
        list(tb1_dir.read(source("tb1-dir", tmp_path / "file")))


@pytest.mark.parametrize(
    ("dockerfile", "toml", "expected"),
    [
        (None, "", True),
        (
            "# c\nFROM python:3.13\nARG X=1\nWORKDIR /app\nCOPY a /b\nENV A=1\nLABEL x=y\nUSER u\n",
            "",
            True,
        ),
        ("FROM ubuntu\nRUN apt-get install -y curl\n", "", False),
        ("FROM ubuntu\nENV A=1 \\\n  B=2\nrun pip install x\n", "", False),
        ("FROM ubuntu\n", '[environment]\ndocker_image = "ghcr.io/x/y:1"\n', False),
    ],
)
def test_runnable_locally_rule(dockerfile, toml, expected):
    task = TaskDir("t")
    task.add("task.toml", toml)
    if dockerfile is not None:
        task.add("environment/Dockerfile", dockerfile)
    assert runnable_locally(task) is expected


# -- parquet round trip ----------------------------------------------------------------
def test_harbor_dir_parquet_export_round_trip(tmp_path):
    parquet = tmp_path / "tasks.parquet"
    assert write_tasks(parquet, harbor_dir.read(source("harbor-dir", FEWSHOTS)), source="fewshots") == 6
    assert export_tasks(parquet, tmp_path / "out") == 6
    for d in task_dirs(FEWSHOTS):
        assert snapshot(tmp_path / "out" / d.name) == snapshot(d), d.name
    with pytest.raises(ValueError, match="overwrite"):
        export_tasks(parquet, tmp_path / "out")


def test_harbor_parquet_reads_write_tasks_output(tmp_path):
    parquet = tmp_path / "part-0.parquet"
    write_tasks(parquet, harbor_dir.read(source("harbor-dir", FEWSHOTS)), source="fewshots")
    written = pq.read_table(parquet, columns=["path", "task_id"]).to_pylist()
    items = list(harbor_parquet.read(source("harbor-parquet", parquet)))
    assert [(r.task.name, r.task.task_id()) for r in items] == [(row["path"], row["task_id"]) for row in written]
    direct = records(harbor_dir.read(source("harbor-dir", FEWSHOTS)))
    for rec in items:
        assert rec.metadata == direct[rec.task.name].metadata
        assert rec.runnable_locally == direct[rec.task.name].runnable_locally
    # A folder of parquets is read file by file, in name order.
    write_tasks(tmp_path / "part-1.parquet", harbor_dir.read(source("harbor-dir", FEWSHOTS)), source="again")
    assert len(list(harbor_parquet.read(source("harbor-parquet", tmp_path)))) == 2 * len(items)


def _task_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_harbor_parquet_bad_inputs(tmp_path):
    good = TaskDir.from_dir(FEWSHOTS / "hello-world").pack()
    parquet = _task_parquet(
        tmp_path / "t.parquet",
        [
            {"path": "ok", "task_binary": good, "extra": 1},
            {"path": "broken", "task_binary": good[: len(good) // 2], "extra": 2},
            {"path": "junk", "task_binary": b"not a tar", "extra": 3},
        ],
    )
    items = list(harbor_parquet.read(source("harbor-parquet", parquet)))
    assert isinstance(items[0], TaskRecord)
    assert [(i.name, i.reason) for i in items[1:]] == [
        ("broken", "corrupt task_binary"),
        ("junk", "corrupt task_binary"),
    ]
    (tmp_path / "fake.parquet").write_text("hello")
    with pytest.raises(ValueError, match="fake.parquet"):
        list(harbor_parquet.read(source("harbor-parquet", tmp_path / "fake.parquet")))
    with pytest.raises(ValueError, match="task_binary"):
        list(harbor_parquet.read(source("harbor-parquet", _task_parquet(tmp_path / "cols.parquet", [{"path": "x"}]))))


def test_tar_with_top_level_folder_is_accepted(tmp_path):
    src = FEWSHOTS / "hello-world"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(src, arcname="hello-world")  # entries: hello-world/, hello-world/instruction.md, ...
    parquet = _task_parquet(
        tmp_path / "t.parquet",
        [{"path": "hello-world", "task_binary": gzip.compress(raw.getvalue())}],
    )
    (rec,) = harbor_parquet.read(source("harbor-parquet", parquet))
    assert isinstance(rec, TaskRecord)
    assert {k: f.data for k, f in rec.task.files.items()} == {k: v[0] for k, v in snapshot(src).items()}
    assert export_tasks(parquet, tmp_path / "out") == 1
    assert snapshot(tmp_path / "out" / "hello-world") == snapshot(src)


# -- Terminal-Bench 1 -------------------------------------------------------------
@pytest.mark.parametrize(
    ("folder", "n_records"),
    [("evoeval", 50), ("aider_polyglot_python", 10), ("tb_core_original", 2)],
)
def test_tb1_reads_every_task(folder, n_records):
    src = TB1 / folder
    items = list(tb1_dir.read(source("tb1-dir", src)))
    assert [i.task.name if isinstance(i, TaskRecord) else i.name for i in items] == [
        d.name
        for d in task_dirs(src)  # LICENSE at the top of tb_core_original is not a task
    ]
    recs = records(items)
    assert len(recs) == n_records
    # evoeval has five dirs without tests/: kept, with the reason.
    assert {i.reason for i in items if isinstance(i, Quarantined)} <= {"missing tests"}
    for name, rec in recs.items():
        spec = yaml.safe_load((src / name / "task.yaml").read_text())
        assert rec.task.instruction.rstrip("\n") == spec["instruction"].rstrip("\n")
        config = tomllib.loads(rec.task.text("task.toml"))
        assert config["agent"]["timeout_sec"] == spec["max_agent_timeout_sec"]
        assert config["verifier"]["timeout_sec"] == spec["max_test_timeout_sec"]
        assert config["metadata"]["difficulty"] == spec["difficulty"]
        assert config["metadata"]["tags"] == spec.get("tags", [])
        del spec["instruction"]
        assert {k: rec.metadata[k] for k in spec} == spec  # tb1 fields kept
        assert rec.metadata["agent_timeout_sec"] == spec["max_agent_timeout_sec"]


def test_tb1_conversion_content():
    src = TB1 / "aider_polyglot_python" / "polyglot_python_book-store"
    rec = records(tb1_dir.read(source("tb1-dir", src.parent)))[src.name]
    files = rec.task.files
    assert rec.task.instruction == yaml.safe_load((src / "task.yaml").read_text())["instruction"]
    assert files["solution/solve.sh"].data == (src / "solution.sh").read_bytes()
    assert files["solution/solve.sh"].executable
    assert files["tests/run-tests.sh"].data == (src / "run-tests.sh").read_bytes()
    assert files["tests/book_store_test.py"].data == (src / "tests/book_store_test.py").read_bytes()
    test_sh = rec.task.text("tests/test.sh")
    assert files["tests/test.sh"].executable and test_sh.startswith("#!/bin/bash")
    assert "export TEST_DIR=/tests" in test_sh and "bash /tests/run-tests.sh" in test_sh
    assert "/logs/verifier/reward.txt" in test_sh
    dockerfile = rec.task.text("environment/Dockerfile")
    assert dockerfile.startswith((src / "Dockerfile").read_text().rstrip("\n"))
    assert "ENV TEST_DIR=/tests" in dockerfile and "${T_BENCH" not in dockerfile
    # The Dockerfile's `COPY workspace/ ./` context moves under environment/.
    assert files["environment/workspace/book_store.py"].data == (src / "workspace/book_store.py").read_bytes()
    assert not any(k.startswith(("environment/tests", "environment/task.yaml")) for k in files)
    assert rec.runnable_locally is False  # RUN apt-get install ...


def test_tb1_without_dockerfile_or_run_tests():
    recs = records(tb1_dir.read(source("tb1-dir", TB1 / "tb_core_original")))
    hello = recs["hello-world"]
    assert "environment/Dockerfile" not in hello.task.files
    assert "pytest /tests/test_outputs.py" in hello.task.text("tests/run-tests.sh")
    assert hello.task.instruction.startswith("Create a file called /app/hello.txt.")
    assert hello.runnable_locally is True
    # setup.sh provisions the machine (pip install ...): kept, and not runnable locally.
    assert "environment/setup.sh" in recs["hf-model-inference"].task.files
    assert recs["hf-model-inference"].runnable_locally is False


def test_tb1_quarantine_reasons(tmp_path):
    ok = {"task.yaml": "instruction: hi\n", "tests/test_outputs.py": "def test(): pass\n"}
    _write(tmp_path / "a", ok)
    _write(tmp_path / "b", {"solution.sh": "echo\n"})
    _write(tmp_path / "c", ok | {"task.yaml": "instruction: [unclosed\n"})
    _write(tmp_path / "d", ok | {"task.yaml": "instruction: ''\n"})
    _write(tmp_path / "e", ok | {"task.yaml": "instruction: x\nmax_agent_timeout_sec: soon\n"})
    _write(tmp_path / "f", {"task.yaml": "instruction: hi\n"})
    items = list(tb1_dir.read(source("tb1-dir", tmp_path)))
    assert isinstance(items[0], TaskRecord)
    assert items[0].metadata["agent_timeout_sec"] == 360.0  # Harbor's default
    assert [(i.name, i.reason) for i in items[1:]] == [
        ("b", "missing task.yaml"),
        ("c", "bad task.yaml"),
        ("d", "empty instruction"),
        ("e", "bad task.yaml"),
        ("f", "missing tests"),
    ]


def test_a_source_with_no_usable_task_fails_its_stage(tmp_path):
    """A folder of folders that are not tasks (say /etc) built "successfully" with 0 tasks."""
    from otbuild.stages import source
    from otbuild.stages import STAGES

    folder = tmp_path / "etc"
    _write(folder / "apt", {"sources.list": "deb x\n"})
    _write(folder / "ssh", {"ssh_config": "Host *\n"})
    _write(folder / "task", {k: v for k, v in GOOD.items() if k != "tests/test.sh"})
    settings = {"name": "h", "kind": "harbor-dir", "path": str(folder), "allow_empty": False}
    with pytest.raises(StageError) as e:
        source.run(STAGES["source"].config(settings), [], tmp_path / "out")
    assert str(e.value) == (
        f"source 'h': no usable item in {folder}: 3 quarantined (2 missing instruction.md, e.g. apt; "
        "1 missing tests/test.sh, e.g. task); set `allow_empty: true` on it if that is expected"
    )
    stats = source.run(STAGES["source"].config({**settings, "allow_empty": True}), [], tmp_path / "out")
    assert stats["tasks"] == 0 and stats["quarantined_by_reason"] == {
        "missing instruction.md": 2,
        "missing tests/test.sh": 1,
    }
