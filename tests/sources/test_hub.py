"""Datasets named by id: `hf-dataset` (the Hugging Face Hub, read offline from a cache laid out
by huggingface_hub's own code), `harbor-dataset` (a benchmark from Harbor's registry, in
Harbor's download layouts), and a source's seeded stratified `sample`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq
import pytest
from tests.conftest import DATA, REPO, make_task, otbuild

from otbuild.hashing import canonical_json
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.tasks.table import write_tasks

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
SWEB = DATA / "swebench_verified" / "instances.jsonl"
TB2 = DATA / "terminal_bench_tasks" / "harbor_format" / "tb2_ot_fewshots"
HARBOR_PY = REPO / ".venv-harbor" / "bin" / "python"


# -- a Hugging Face cache, written and checked by huggingface_hub itself ------------------
def hf_cache(root: Path, repo: str, commit: str, files: dict[str, bytes], refs=("main",)) -> None:
    """Lay `files` out as `snapshot_download` leaves them: blobs named by their sha256 (LFS
    etag), snapshot links, the tree listing of the commit, refs/NAME -> commit."""
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache
    from huggingface_hub.file_download import (
        _cache_commit_hash_for_specific_revision,
        _create_symlink,
        repo_folder_name,
    )

    storage = root / repo_folder_name(repo_id=repo, repo_type="dataset")
    entries = {}
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        blob, link = storage / "blobs" / sha, storage / "snapshots" / commit / name
        blob.parent.mkdir(parents=True, exist_ok=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        _create_symlink(str(blob), str(link), new_blob=False)
        entries[name] = TreeCacheEntry(
            size=len(data), blob_id=hashlib.sha1(data).hexdigest(), lfs_sha256=sha, lfs_size=len(data)
        )
    write_tree_cache(str(storage), commit, entries)
    for ref in refs:
        _cache_commit_hash_for_specific_revision(str(storage), ref, commit)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """An HF cache dir, offline: for this process (huggingface_hub's constants) and for the
    otbuild processes the tests start (the environment)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def task_parquet(tmp_path: Path, names: list[str]) -> bytes:
    path = tmp_path / f"{'-'.join(names)}.parquet"
    write_tasks(path, [make_task(n, f"task {n}: do the thing") for n in names], source="hub")
    return path.read_bytes()


def source_node(project: Path, recipe: str, yaml: str, label: str = "sources/s"):
    (project / "recipes" / f"{recipe}.yaml").write_text(yaml)
    plan = plan_recipe(load_recipe(recipe, project))
    return next(n for n in plan.nodes if n.label == label)


def run_stage(project: Path, node) -> subprocess.CompletedProcess:
    return otbuild(project, "stage", node.stage, "--spec", canonical_json(node.spec()))


HF_RECIPE = "sources:\n  s: {{kind: hf-dataset, repo: org/tasks{extra}}}\n"


def test_the_test_cache_is_what_huggingface_hub_reads(offline_hub, tmp_path):
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    hf_cache(offline_hub, "org/tasks", COMMIT_A, {"data/train-00000-of-00001.parquet": b"x"})
    got = try_to_load_from_cache("org/tasks", "data/train-00000-of-00001.parquet", revision="main", repo_type="dataset")
    assert got and Path(got).read_bytes() == b"x" and COMMIT_A in got
    assert Path(snapshot_download("org/tasks", repo_type="dataset", local_files_only=True)).name == COMMIT_A


class FakeHub(ThreadingHTTPServer):
    """The Hub's HTTP API on 127.0.0.1, as much as `snapshot_download` uses: a revision's commit,
    a commit's file tree (LFS sha256 included) and file downloads (HEAD with X-Repo-Commit and
    the etag, then GET); an unknown repo, revision or file is a 404, as on the Hub. `repos`:
    {repo: {"refs": {name: commit}, "commits": {commit: {path: bytes}}}}, changeable while it runs."""

    def __init__(self, repos: dict):
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.repos = repos
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HubHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._answer(head=True)

    def do_GET(self):
        self._answer(head=False)

    def _answer(self, head: bool):
        path = unquote(urlsplit(self.path).path)
        if m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/revision/(.+)", path):
            commit, files = self._commit(m[1], m[2])
            body = {"id": m[1], "sha": commit, "siblings": [{"rfilename": f} for f in files or {}]}
            return self._send(200 if commit else 404, json.dumps(body).encode(), head)
        if m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/tree/([^/]+)", path):
            commit, files = self._commit(m[1], m[2])
            tree = [
                {
                    "type": "file",
                    "path": f,
                    "size": len(d),
                    "oid": hashlib.sha1(d).hexdigest(),
                    "lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 130},
                }
                for f, d in sorted((files or {}).items())
            ]
            return self._send(200 if commit else 404, json.dumps(tree).encode(), head)
        if m := re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            commit, files = self._commit(m[1], m[2])
            if commit and m[3] in files:
                data, etag = files[m[3]], f'"{hashlib.sha256(files[m[3]]).hexdigest()}"'
                return self._send(
                    200,
                    data,
                    head,
                    {"X-Repo-Commit": commit, "ETag": etag, "X-Linked-Etag": etag, "X-Linked-Size": str(len(data))},
                )
        self._send(404, b"{}", head, {"X-Error-Code": "EntryNotFound"})

    def _commit(self, repo: str, revision: str):
        r = self.server.repos.get(repo, {"refs": {}, "commits": {}})
        commit = r["refs"].get(revision, revision)
        return (commit, r["commits"][commit]) if commit in r["commits"] else (None, None)

    def _send(self, code: int, body: bytes, head: bool, headers: dict | None = None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


def planned_hub(project: Path, recipe: str, env: dict) -> dict:
    """A source node's identity as another process plans it (huggingface_hub reads its
    endpoint and offline switch from the environment when imported)."""
    code = (
        "import json, sys; from pathlib import Path; from otbuild.plan import plan_recipe; "
        "from otbuild.recipe.load import load_recipe; "
        "n = next(n for n in plan_recipe(load_recipe(sys.argv[1], Path('.'))).nodes if n.label == 'sources/s'); "
        "print(json.dumps({'id': n.id, 'hub': n.identity['hub'], 'missing': [m.what for m in n.missing]}))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, recipe],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_online_the_revision_is_resolved_and_fetched_then_read_offline(project, tmp_path):
    """Online, a plan resolves main to its commit and huggingface_hub fetches the files into
    its cache; main moves: a new id. Then offline (the Hub gone): the cache the library wrote
    gives the same ids, main's and the pinned commit's."""
    cache, data_a, data_b = tmp_path / "hf-cache", task_parquet(tmp_path, ["t0"]), task_parquet(tmp_path, ["t0", "t1"])
    hub = FakeHub(
        {
            "org/tasks": {
                "refs": {"main": COMMIT_A},
                "commits": {COMMIT_A: {"data/train-0.parquet": data_a, "README.md": b"# card"}},
            }
        }
    )
    online = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1"}
    (project / "recipes" / "hf.yaml").write_text(HF_RECIPE.format(extra=""))
    (project / "recipes" / "pinned.yaml").write_text(HF_RECIPE.format(extra=f", revision: {COMMIT_A}"))
    at_a = planned_hub(project, "hf", online)
    assert at_a["hub"] == {
        "repo": "org/tasks",
        "commit": COMMIT_A,
        "files": {"data/train-0.parquet": hashlib.sha256(data_a).hexdigest()},
    }
    hub.repos["org/tasks"]["commits"][COMMIT_B] = {"data/train-0.parquet": data_b}
    hub.repos["org/tasks"]["refs"]["main"] = COMMIT_B
    at_b = planned_hub(project, "hf", online)
    assert at_b["hub"]["commit"] == COMMIT_B and at_b["id"] != at_a["id"]
    hub.shutdown()
    hub.server_close()
    offline = {**online, "HF_HUB_OFFLINE": "1"}
    assert planned_hub(project, "hf", offline) == at_b  # main as the cache's refs/main recorded it
    assert planned_hub(project, "pinned", offline)["id"] == at_a["id"]
    from huggingface_hub import try_to_load_from_cache

    assert COMMIT_B in try_to_load_from_cache("org/tasks", "data/train-0.parquet", cache_dir=cache, repo_type="dataset")


def test_hf_dataset_source_reads_the_cache_offline_and_records_commit_and_sha256(
    project, offline_hub, tmp_path, monkeypatch
):
    data = task_parquet(tmp_path, ["t0", "t1", "t2"])
    hf_cache(
        offline_hub,
        "org/tasks",
        COMMIT_A,
        {
            "data/train-00000-of-00001.parquet": data,
            "data/test-00000-of-00001.parquet": task_parquet(tmp_path, ["x"]),
            "README.md": b"# card",
        },
    )
    monkeypatch.chdir(project)
    node = source_node(project, "hf", HF_RECIPE.format(extra=", split: train"))
    sha = hashlib.sha256(data).hexdigest()
    assert node.identity["hub"] == {
        "repo": "org/tasks",
        "commit": COMMIT_A,
        "files": {"data/train-00000-of-00001.parquet": sha},
    }
    assert not node.missing
    res = run_stage(project, node)
    assert res.returncode == 0, res.stderr
    rows = pq.read_table(node.dir / "tasks.parquet").to_pylist()
    assert [r["path"] for r in rows] == ["t0", "t1", "t2"]
    prov = json.loads((node.dir / "provenance.json").read_text())
    assert prov["settings"]["hub"]["commit"] == COMMIT_A
    assert prov["stats"]["hub"] == node.identity["hub"]
    # no split: every parquet of the repo, in path order
    node = source_node(project, "hf_all", HF_RECIPE.format(extra=""))
    assert list(node.identity["hub"]["files"]) == [
        "data/test-00000-of-00001.parquet",
        "data/train-00000-of-00001.parquet",
    ]


def test_a_moving_main_is_recorded_not_trusted(project, offline_hub, tmp_path, monkeypatch):
    """main's commit is in the id: a new commit on main gives a new id; the commit itself,
    pinned as the revision, gives the id main had at that commit."""
    monkeypatch.chdir(project)
    hf_cache(offline_hub, "org/tasks", COMMIT_A, {"train.parquet": task_parquet(tmp_path, ["t0"])})
    at_a = source_node(project, "hf", HF_RECIPE.format(extra="")).id
    hf_cache(offline_hub, "org/tasks", COMMIT_B, {"train.parquet": task_parquet(tmp_path, ["t0", "t1"])})
    at_b = source_node(project, "hf", HF_RECIPE.format(extra="")).id
    pinned = source_node(project, "hf", HF_RECIPE.format(extra=f", revision: {COMMIT_A}")).id
    assert at_b != at_a and pinned == at_a


def test_files_that_changed_in_the_cache_since_the_plan_fail_the_build(project, offline_hub, tmp_path, monkeypatch):
    monkeypatch.chdir(project)
    hf_cache(offline_hub, "org/tasks", COMMIT_A, {"train.parquet": task_parquet(tmp_path, ["t0"])})
    node = source_node(project, "hf", HF_RECIPE.format(extra=""))
    blob = next((offline_hub / "datasets--org--tasks" / "blobs").iterdir())
    blob.write_bytes(task_parquet(tmp_path, ["t0", "evil"]))
    res = run_stage(project, node)
    assert res.returncode == 1 and "differ from those planned" in flat(res.stderr + res.stdout)
    assert not (node.dir / "provenance.json").exists()


def test_an_hf_dataset_not_in_the_cache_offline_names_repo_and_revision(project, offline_hub, monkeypatch):
    monkeypatch.chdir(project)
    (project / "recipes" / "hf.yaml").write_text(HF_RECIPE.format(extra=", revision: v2"))
    res = otbuild(project, "validate", "hf")
    assert res.returncode == 0, res.stderr
    assert "hf://datasets/org/tasks@v2" in flat(res.stderr) and "sources.s: not there yet" in flat(res.stderr)
    node = source_node(project, "hf", HF_RECIPE.format(extra=", revision: v2"))
    res = run_stage(project, node)
    assert res.returncode == 1
    assert "hf://datasets/org/tasks@v2: not in the Hugging Face cache" in flat(res.stderr + res.stdout)
    assert not (node.dir / "provenance.json").exists()


def test_hf_dataset_trace_import_reads_its_format_offline(project, offline_hub, monkeypatch):
    chats = [
        {
            "instance_id": f"i{k}",
            "messages": [{"role": "user", "content": f"fix bug {k}"}, {"role": "assistant", "content": "done"}],
        }
        for k in range(3)
    ]
    hf_cache(
        offline_hub, "org/traces", COMMIT_A, {"data/train.jsonl": "".join(json.dumps(c) + "\n" for c in chats).encode()}
    )
    monkeypatch.chdir(project)
    node = source_node(
        project, "tr", "trace_imports:\n  t: {kind: hf-dataset, repo: org/traces, model: m}\n", label="trace_imports/t"
    )
    assert node.identity["hub"]["commit"] == COMMIT_A and list(node.identity["hub"]["files"]) == ["data/train.jsonl"]
    res = run_stage(project, node)
    assert res.returncode == 0, res.stderr
    rows = pq.read_table(node.dir / "traces.parquet").to_pylist()
    assert sorted(r["task"] for r in rows) == ["i0", "i1", "i2"] and {r["model"] for r in rows} == {"m"}


# -- harbor-dataset ------------------------------------------------------------------------
GIT = "https://github.com/laude-institute/harbor-datasets.git"


def registry(path: Path, names: list[str], versions=("1.0", "2.0")) -> Path:
    path.write_text(
        json.dumps(
            [
                {
                    "name": "terminal-bench",
                    "version": v,
                    "description": "",
                    "metrics": [],
                    "tasks": [
                        {"name": n, "git_url": GIT, "git_commit_id": f"c{v}", "path": f"tasks/{n}"} for n in names
                    ],
                }
                for v in versions
            ]
        )
    )
    return path


def harbor_local_path(git_url: str, commit: str, path: str) -> Path:
    """Where Harbor itself puts a git task in its cache (its own code, in .venv-harbor)."""
    code = (
        "import sys; from pathlib import Path; from harbor.models.task.id import GitTaskId; "
        "print(GitTaskId(git_url=sys.argv[1], git_commit_id=sys.argv[2], path=Path(sys.argv[3])).get_local_path())"
    )
    return Path(
        subprocess.run(
            [str(HARBOR_PY), "-c", code, git_url, commit, path], capture_output=True, text=True, check=True
        ).stdout.strip()
    )


@pytest.mark.skipif(not TB2.is_dir(), reason="dev data (shared/data/dev) not found")
def test_harbor_dataset_reads_harbors_cache_layout(project, tmp_path, monkeypatch):
    from otbuild.sources.harbor_dataset import harbor_cache_key

    names = sorted(p.name for p in TB2.iterdir() if p.is_dir())
    cache = tmp_path / "harbor-tasks"
    for n in names:
        key = harbor_cache_key(GIT, "c2.0", f"tasks/{n}")
        if HARBOR_PY.exists():  # the same folder Harbor's own code computes
            assert harbor_local_path(GIT, "c2.0", f"tasks/{n}").parent.name == key
        shutil.copytree(TB2 / n, cache / key / n)
    registry(project / "registry.json", names)
    monkeypatch.chdir(project)
    yaml = (
        "sources:\n  s: {{kind: harbor-dataset, dataset: terminal-bench{at}, registry: registry.json, "
        f"path: {cache}}}}}\n"
    )
    node = source_node(project, "tb", yaml.format(at=""))  # no version: Harbor's choice, the highest
    assert node.settings["dataset"] == node.identity["dataset"] == "terminal-bench@2.0" and not node.missing
    assert node_id_pinned(project, yaml.format(at="@2.0")) == node.id
    res = run_stage(project, node)
    assert res.returncode == 0, res.stderr
    assert sorted(pq.read_table(node.dir / "tasks.parquet").column("path").to_pylist()) == names
    # the id follows the tasks' content, not where they lie: the export layout gives the same id
    export = tmp_path / "out" / "terminal-bench"
    for n in names:
        shutil.copytree(TB2 / n, export / n)
    assert node_id_pinned(project, yaml.format(at="@2.0").replace(str(cache), str(export))) == node.id
    (export / names[0] / "instruction.md").write_text("changed")
    changed = source_node(project, "tb_other", yaml.format(at="@2.0").replace(str(cache), str(export)))
    assert changed.id != node.id
    (export / names[0] / "instruction.md").write_text("changed again")  # after the plan: the build refuses
    res = run_stage(project, changed)
    assert res.returncode == 1 and "changed since the plan" in flat(res.stderr + res.stdout)


def node_id_pinned(project: Path, yaml: str) -> str:
    return source_node(project, "tb_other", yaml).id


def test_harbor_dataset_not_downloaded_says_what_is_missing(project, tmp_path, monkeypatch):
    registry(project / "registry.json", ["a", "b"])
    monkeypatch.chdir(project)
    yaml = f"sources:\n  s: {{kind: harbor-dataset, dataset: terminal-bench@1.0, registry: registry.json, path: {tmp_path}}}\n"
    (project / "recipes" / "tb.yaml").write_text(yaml)
    res = otbuild(project, "validate", "tb")
    assert res.returncode == 0 and "terminal-bench@1.0: 2 of 2 tasks (e.g. a)" in flat(res.stderr)
    assert "harbor datasets download terminal-bench@1.0" in flat(res.stderr)
    res = run_stage(project, source_node(project, "tb", yaml))
    assert res.returncode == 1 and "not downloaded: terminal-bench@1.0: 2 of 2 tasks" in flat(res.stderr + res.stdout)
    (project / "recipes" / "tb.yaml").write_text(yaml.replace("registry.json", "."))  # its folder, as Harbor takes it
    res = otbuild(project, "validate", "tb")
    assert res.returncode == 0 and "terminal-bench@1.0: 2 of 2 tasks" in flat(res.stderr)
    (project / "recipes" / "tb.yaml").write_text(yaml.replace("registry.json", "recipes"))
    res = otbuild(project, "validate", "tb")
    assert res.returncode == 2 and "sources.s.registry: expected Harbor's registry.json" in flat(res.stderr)
    (project / "recipes" / "tb.yaml").write_text(yaml.replace("@1.0", "@9"))
    res = otbuild(project, "validate", "tb")
    assert res.returncode == 2 and "sources.s" in res.stderr
    assert "has no version '9' (it has 1.0, 2.0)" in flat(res.stderr)


def flat(text: str) -> str:
    return " ".join(text.split())


# -- a source's seeded stratified sample ----------------------------------------------------
def sampled(project: Path, n: int, seed: int, stratify: str | None = "repo", extra: str = "", ok: bool = True):
    extra = (f", stratify: {stratify}" if stratify else "") + extra
    node = source_node(
        project,
        f"swe{n}_{seed}_{stratify}",
        f"sources:\n  s: {{kind: swe-instances, path: {SWEB}, sample: {{n: {n}, seed: {seed}{extra}}}}}\n",
    )
    res = run_stage(project, node)
    if not ok:
        return res
    assert res.returncode == 0, res.stderr
    rows = pq.read_table(node.dir / "tasks.parquet").to_pylist()
    stats = json.loads((node.dir / "provenance.json").read_text())["stats"]
    return node, rows, stats


@pytest.mark.skipif(not SWEB.exists(), reason="dev data (shared/data/dev) not found")
def test_stratified_sample_is_proportional_per_repo_and_fixed_by_its_seed(project, monkeypatch):
    monkeypatch.chdir(project)
    sizes = Counter(json.loads(line)["repo"] for line in SWEB.read_text().splitlines() if line.strip())
    total, n = sum(sizes.values()), 20
    node, rows, stats = sampled(project, n, 0)
    got = Counter(json.loads(r["metadata"])["repo"] for r in rows)
    assert len(rows) == n == stats["tasks"] == stats["sample"]["kept"] and stats["sample"]["read"] == total
    for repo, size in sizes.items():  # each stratum: its share of n, rounded down or up
        assert n * size // total <= got[repo] <= -(-n * size // total), repo
        assert stats["sample"]["strata"][repo] == [size, got[repo]]
    assert len({r["path"] for r in rows}) == n
    _, again, _ = sampled(project, n, 0, "repo")
    assert [r["path"] for r in again] == [r["path"] for r in rows]  # the seed fixes the sample
    _, other, _ = sampled(project, n, 1)
    assert {r["path"] for r in other} != {r["path"] for r in rows}
    assert Counter(json.loads(r["metadata"])["repo"] for r in other) == got  # same shares, other tasks
    _, everything, stats = sampled(project, 1000, 0)  # more than there is: all of it
    assert len(everything) == total == stats["sample"]["kept"]


@pytest.mark.skipif(not SWEB.exists(), reason="dev data (shared/data/dev) not found")
def test_strata_from_a_pattern_over_the_task_name_and_none_found_is_an_error(project, monkeypatch):
    """Harbor's SWE-bench tasks name their repo only in the task name (owner__repo-NUMBER)."""
    monkeypatch.chdir(project)
    _, by_repo, _ = sampled(project, 20, 0)
    _, rows, stats = sampled(project, 20, 0, "path", extra=r", pattern: '^(.+)-\d+$'")
    assert "django__django" in stats["sample"]["strata"] and len(stats["sample"]["strata"]) == 10
    by_name = Counter(r["path"].rsplit("-", 1)[0] for r in rows)
    assert by_name == Counter(json.loads(r["metadata"])["repo"].replace("/", "__") for r in by_repo)
    res = sampled(project, 20, 0, "nokey", ok=False)
    assert res.returncode == 1 and "source 's': sample.stratify: no task has a value for nokey" in flat(res.stderr)


@pytest.mark.skipif(not SWEB.exists(), reason="dev data (shared/data/dev) not found")
def test_sample_changes_the_id_and_no_sample_keeps_it(project, monkeypatch):
    monkeypatch.chdir(project)
    plain = source_node(project, "p", f"sources:\n  s: {{kind: swe-instances, path: {SWEB}}}\n")
    assert "sample" not in plain.identity
    with_sample = source_node(project, "q", f"sources:\n  s: {{kind: swe-instances, path: {SWEB}, sample: {{n: 5}}}}\n")
    assert with_sample.id != plain.id


@pytest.mark.parametrize(
    "sample,where",
    [
        ("{n: 5, stratify: 'a b'}", "sources.s.sample.stratify"),
        ("{n: 5, stratify: path, pattern: '(?=x)'}", "sources.s.sample.pattern"),
        ("{n: 5, pattern: 'x'}", "sources.s.sample"),
    ],
)
def test_sample_settings_are_checked(project, sample, where):
    (project / "recipes" / "bad.yaml").write_text(
        f"sources:\n  s: {{kind: harbor-parquet, path: x.parquet, sample: {sample}}}\n"
    )
    res = otbuild(project, "validate", "bad")
    assert res.returncode == 2 and where in res.stderr, res.stderr


@pytest.mark.slow
def test_a_recipe_of_hub_and_harbor_datasets_builds_offline_with_snakemake(project, offline_hub, tmp_path):
    """The real workflow, offline: an hf-dataset source sampled, mixed; a harbor-dataset in
    Harbor's export layout beside it."""
    from tests.conftest import snakemake

    hf_cache(
        offline_hub,
        "org/tasks",
        COMMIT_A,
        {"data/train-00000-of-00001.parquet": task_parquet(tmp_path, [f"t{k}" for k in range(10)])},
    )
    export = tmp_path / "out" / "terminal-bench"
    for n in ("a", "b"):
        make_task(n, f"task {n}").task.write(export / n)
    registry(project / "registry.json", ["a", "b"])
    (project / "recipes" / "hub.yaml").write_text(
        "sources:\n"
        "  hub: {kind: hf-dataset, repo: org/tasks, split: train, rank: 1, sample: {n: 4, seed: 3}}\n"
        f"  tb: {{kind: harbor-dataset, dataset: terminal-bench@2.0, registry: registry.json, path: {export}, rank: 2}}\n"
        "mix: {n: 2, total: 6}\n"
    )
    ran, log = snakemake(project, "hub")
    assert ran["source"] == 2 and ran["mix"] == 1, log
    rows = pq.read_table(project / "results" / "hub" / "mix" / "tasks.parquet").to_pylist()
    assert Counter(r["source"] for r in rows) == {"hub": 3, "tb": 3}
    assert {r["path"] for r in rows if r["source"] == "tb"} == {"a", "b"}


LAYOUTS = [
    ["train.jsonl", "test.jsonl"],
    ["data/train.parquet", "data/validation.parquet"],
    ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "data/test-00000-of-00001.parquet"],
    ["train/a.parquet", "train/b.parquet", "test/c.parquet"],
    ["my_train.0.parquet", "my-test_1.parquet", "notes.parquet"],
    ["training/x.parquet", "dev/y.parquet"],
    ["all.parquet"],
]


@pytest.mark.parametrize("files", LAYOUTS, ids=lambda f: f[0])
def test_split_files_are_found_as_datasets_finds_them(tmp_path, files):
    """otbuild.hub.select picks the files `datasets` resolves for each split of a repo layout."""
    data_files = pytest.importorskip("datasets.data_files")
    from otbuild.hub import select

    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    theirs = data_files.DataFilesDict.from_patterns(
        data_files.get_data_patterns(str(tmp_path)), base_path=str(tmp_path)
    )
    for split in ("train", "validation", "test"):
        want = sorted(Path(p).relative_to(tmp_path).as_posix() for p in theirs.get(split, []))
        assert select(sorted(files), split, None, (".parquet", ".jsonl"), None) == want, split


def test_the_cards_configs_take_precedence():
    from otbuild.hub import select

    present = [
        "README.md",
        "data/train.parquet",
        "extra/more_tasks.parquet",
        "extra/heldout.parquet",
        "old/train-0.parquet",
    ]
    card = (
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: [extra/more_*.parquet, "
        "data/*.parquet]\n  - split: test\n    path: extra/heldout.parquet\n---\n# card\n"
    )
    assert select(present, "train", None, (".parquet",), card) == ["data/train.parquet", "extra/more_tasks.parquet"]
    assert select(present, "test", None, (".parquet",), card) == ["extra/heldout.parquet"]
    plain = "---\nconfigs:\n- config_name: default\n  data_files: old/*.parquet\n---\n"
    assert select(present, "train", None, (".parquet",), plain) == ["old/train-0.parquet"]
    assert select(present, "train", None, (".parquet",), "---\nlicense: mit\n---\n") == [
        "data/train.parquet",
        "old/train-0.parquet",
    ]
