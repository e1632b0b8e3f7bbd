"""Source adapter: SWE-bench / SWE-smith instances (JSON or JSONL, a file or a folder).

Each instance (`instance_id`, `repo`, `base_commit`, `problem_statement`, `patch`,
`test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS` as lists or JSON-encoded strings, optional
`image_name`) becomes a Harbor task dir, like Harbor's swebench adapter:

- instruction.md: the problem statement, then one line naming the repo and /testbed;
- environment: the instance image. `image_name` when given (with `image_namespace`
  prefixed when it has no registry/namespace part), else SWE-bench's convention
  `swebench/sweb.eval.x86_64.<instance_id, "__" -> "_1776_", lower-cased>:latest`;
- tests/test.sh runs tests/swe_grader.py (otbuild/sources/swe_grader.py) on
  tests/config.json: applies `test_patch`, runs FAIL_TO_PASS and PASS_TO_PASS, writes 1/0
  to /logs/verifier/reward.txt;
- solution/solve.sh: the gold patch applied with `git apply`, where the instance has one.

**SWE-smith convention.** SWE-smith's `patch` is the diff that *introduces* the bug into a
clean repo. Rule (`patch_introduces_bug: auto`, the default): an instance is SWE-smith when
its `repo` starts with `swesmith/`, or its `image_name` contains `swesmith.`, or its
`instance_id` has SWE-smith's `owner__repo.<8 hex>.<strategy>` form. For those, the
environment's Dockerfile applies the patch to /testbed and commits it (so the agent starts
from the buggy code and `git diff` shows only its own changes), and the oracle is the
reverse patch (`git apply -R`). Because a prebuilt image would skip that step, such tasks
name the image in the Dockerfile's FROM and in metadata `docker_image`, not in task.toml's
`[environment] docker_image` (which Harbor would run as is). `patch_introduces_bug: true`
or `false` forces either reading for every instance.

Every task needs a container image, so none is runnable locally. An instance without an
id, a problem statement or FAIL_TO_PASS tests, or with a field of the wrong type, is
quarantined with that reason; instances without PASS_TO_PASS (e.g. only a count) run the
FAIL_TO_PASS tests alone (metadata `pass_to_pass_missing`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, cast

from otbuild.records import Dedup, as_list, as_text, heredoc, iter_rows, task_name
from otbuild.settings.recipe import SweInstancesSource
from otbuild.sources import PATH_FORMS
from otbuild.tasks.harbor_meta import dump_toml
from otbuild.tasks.table import Quarantined, TaskRecord
from otbuild.tasks.taskdir import DOCKERFILE, INSTRUCTION, SOLUTION, TASK_TOML, TESTS, TaskDir

GRADER = Path(__file__).with_name("swe_grader.py")
SWESMITH_ID = re.compile(r"^[\w.-]+__[\w.-]+\.[0-9a-f]{8}\.\w+")
METADATA_KEYS = ("repo", "base_commit", "version", "created_at", "environment_setup_commit",
                 "difficulty", "upstream_repo", "generation_method", "source_case_id")  # fmt: skip
AGENT_TIMEOUT = 3000.0
VERIFIER_TIMEOUT = 3000.0

TEST_SH = """#!/bin/bash
# otbuild swe-instances verifier: apply the test patch, run FAIL_TO_PASS and PASS_TO_PASS,
# write 1 (all pass) or 0 to /logs/verifier/reward.txt. See tests/swe_grader.py.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
if [ -f /opt/miniconda3/bin/activate ]; then
    source /opt/miniconda3/bin/activate
    conda activate testbed 2>/dev/null || true
fi
PY=$(command -v python || command -v python3)
"$PY" /tests/swe_grader.py /tests/config.json /testbed
"""


def swesmith_image(image: str, namespace: str | None) -> str:
    return f"{namespace.rstrip('/')}/{image}" if namespace and "/" not in image else image


def swebench_image(instance_id: str) -> str:
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


def is_swesmith(row: dict) -> bool:
    repo = str(row.get("repo") or "")
    image = str(row.get("image_name") or "")
    return (
        repo.startswith("swesmith/")
        or "swesmith." in image
        or bool(SWESMITH_ID.match(str(row.get("instance_id") or "")))
    )


def read(cfg: SweInstancesSource) -> Iterator[TaskRecord | Quarantined]:
    """Yield one TaskRecord or Quarantined per instance of `cfg.path` (a .json/.jsonl file or a
    folder of them, sorted). Raises SourceFormatError (a ValueError) for a malformed file."""
    seen = Dedup()
    for row in iter_rows(Path(cfg.path), cast(tuple[str, ...], PATH_FORMS["swe-instances"])):
        if row.data is None:
            yield Quarantined(row.where, row.reason, row.detail)
            continue
        item = convert(row.data, row.where, cfg.patch_introduces_bug, cfg.image_namespace)
        if isinstance(item, TaskRecord) and (first := seen.first(item.task.name, row.where)):
            item = Quarantined(item.task.name, "duplicate id", f"{row.where}: first seen at {first}")
        yield item


def convert(
    row: dict, where: str, patch_introduces_bug: bool | Literal["auto"], image_namespace: str | None
) -> TaskRecord | Quarantined:
    iid = as_text(row.get("instance_id"))
    if iid is None:
        return Quarantined(where, "missing field", "instance_id")
    name = task_name(iid)
    problem = as_text(row.get("problem_statement"))
    if problem is None:
        return Quarantined(name, "empty instruction", f"{where}: problem_statement is missing or blank")
    for key in ("repo", "base_commit", "patch", "test_patch", "image_name"):
        if row.get(key) is not None and not isinstance(row[key], str):
            return Quarantined(name, "bad field", f"{where}: {key} is a {type(row[key]).__name__}, not a string")
    try:
        f2p = [str(t) for t in as_list(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS")]
        p2p = [str(t) for t in as_list(row.get("PASS_TO_PASS"), "PASS_TO_PASS")]
    except ValueError as e:
        return Quarantined(name, "bad field", f"{where}: {e}")
    if not f2p:
        return Quarantined(name, "missing field", f"{where}: FAIL_TO_PASS is missing or empty")
    repo = as_text(row.get("repo")) or ""
    base_commit = as_text(row.get("base_commit"))
    patch = as_text(row.get("patch"))
    test_patch = as_text(row.get("test_patch"))
    if test_patch and not base_commit:
        return Quarantined(name, "missing field", f"{where}: base_commit (needed to apply test_patch)")
    swesmith = is_swesmith(row) if patch_introduces_bug == "auto" else bool(patch_introduces_bug)
    if swesmith and not patch:
        return Quarantined(
            name,
            "missing field",
            f"{where}: patch (the bug-introducing diff of a SWE-smith instance)",
        )
    image = as_text(row.get("image_name"))
    image = swesmith_image(image, image_namespace) if image else swebench_image(iid)

    task = TaskDir(name)
    task.add(INSTRUCTION, instruction(problem, repo))
    env: dict = {"cpus": 2, "memory_mb": 4096, "storage_mb": 10240, "allow_internet": False}
    if swesmith:
        task.add(
            DOCKERFILE,
            (
                f"FROM {image}\nWORKDIR /testbed\n"
                "# SWE-smith: the instance's patch introduces the bug the agent must fix.\n"
                "COPY bug.patch /tmp/bug.patch\n"
                "RUN git apply /tmp/bug.patch && rm /tmp/bug.patch && git add -A && "
                "git -c user.name=otbuild -c user.email=otbuild@localhost commit -qm 'Introduce bug' --no-verify\n"
            ),
        )
        assert patch  # a SWE-smith instance without one is quarantined above
        task.add("environment/bug.patch", patch if patch.endswith("\n") else patch + "\n")
    else:
        env = {"docker_image": image, **env}
        task.add(DOCKERFILE, f"FROM {image}\nWORKDIR /testbed\n")
    meta = {k: row[k] for k in METADATA_KEYS if as_text(row.get(k)) is not None}
    meta |= {
        "instance_id": iid,
        "docker_image": image,
        "dataset": "swe-smith" if swesmith else "swe-bench",
        "patch_introduces_bug": swesmith,
        "n_fail_to_pass": len(f2p),
        "n_pass_to_pass": len(p2p),
    }
    if "PASS_TO_PASS" not in row or row.get("PASS_TO_PASS") is None:
        meta["pass_to_pass_missing"] = True
        if row.get("PASS_TO_PASS_count") is not None:
            meta["pass_to_pass_count"] = row["PASS_TO_PASS_count"]
    task.add(TASK_TOML, dump_toml({
        "": {"version": "1.0"},
        "metadata": {"source": meta["dataset"], "instance_id": iid, "repo": repo, "tags": ["swe", "coding"]},
        "verifier": {"timeout_sec": VERIFIER_TIMEOUT},
        "agent": {"timeout_sec": AGENT_TIMEOUT},
        "environment": env,
    }))  # fmt: skip
    config = {
        "instance_id": iid,
        "repo": repo,
        "base_commit": base_commit,
        "test_patch": test_patch or "",
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "repo_dir": "/testbed",
    }
    task.add("tests/config.json", json.dumps(config, indent=1) + "\n")
    task.add("tests/swe_grader.py", GRADER.read_bytes())
    task.add(TESTS, TEST_SH, executable=True)
    if patch:
        delim, body = heredoc(patch, "OTBUILD_PATCH")
        flag = " -R" if swesmith else ""
        what = "reverts the bug-introducing patch" if swesmith else "applies the gold patch"
        task.add(SOLUTION, (
            f"#!/bin/bash\n# Oracle: {what}.\nset -e\ncd /testbed\n"
            f"cat > /tmp/otbuild_gold.patch <<'{delim}'\n{body}{delim}\n"
            f"git apply{flag} --verbose /tmp/otbuild_gold.patch\n"
        ), executable=True)  # fmt: skip
    meta["has_gold_patch"] = bool(patch)
    return TaskRecord(task, runnable_locally=False, metadata=meta)


def instruction(problem: str, repo: str) -> str:
    where = f"the {repo} repository" if repo else "the repository"
    return (
        f"{problem.strip()}\n\n---\n\nResolve the issue above in {where}, checked out at /testbed. "
        "Change the source code, not the tests; hidden tests check the fix.\n"
    )
