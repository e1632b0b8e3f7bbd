"""Source adapter: natural-language -> bash command pairs (NL2Bash) as Harbor tasks.

Inputs (`path`): a folder holding line-aligned `all.nl` + `all.cm` (or the path of either
file; id = 0-based line number), or JSON/JSONL/CSV/parquet rows with `nl` (or `invocation`,
`description`, `instruction`) and `cmd` (or `command`, `cm`, `bash`) and optional `id`.

Every task has the same small fixture tree (`FIXTURE`, copied to /app/work by the
Dockerfile) and asks the agent to write a one-line bash command doing the described thing to
/app/command.sh; solution/solve.sh writes the reference command there.

**Verifier rule.** A task gets tests/test.sh only when the reference command is judged safe
and deterministic by `check_command` (otbuild/sources/shell_safety.py: no expansions, only
read-only allowlisted programs with their write/exec/random options refused, paths only inside
the fixture) and it prints something in the fixture; else `has_tests` is False and metadata
`verifier_skipped` says why. A reference that prints nothing would be matched by a trivial
command (`true`, or `false` when the reference fails): `silent_references` finds those by
running the safe references in the local sandbox (never on the host itself: bwrap, else
unshare), all of a batch in one sandbox.
At verification time test.sh copies the fixture (tests/fixture/) to a fresh
/tmp/nl2bash_root/work, runs the reference there (LC_ALL=C, 20 s timeout), does the same for
/app/command.sh, and writes 1 when stdout matches (exactly, or as sorted lines when the
reference lists files with `find` and does not sort), both succeed or both fail, and the
reference printed something (so an empty command never passes, whatever the image's tools).
"""

from __future__ import annotations

import itertools
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from otbuild.records import (
    Dedup,
    Row,
    SourceFormatError,
    as_text,
    first_text,
    heredoc,
    iter_rows,
    task_name,
)
from otbuild.settings.recipe import Nl2BashSource
from otbuild.sources.shell_safety import check_command
from otbuild.tasks.harbor_meta import dump_toml
from otbuild.tasks.table import Quarantined, TaskRecord
from otbuild.tasks.taskdir import DOCKERFILE, INSTRUCTION, SOLUTION, TASK_TOML, TESTS, TaskDir

NL_KEYS = ("nl", "invocation", "description", "instruction")
CMD_KEYS = ("cmd", "command", "cm", "bash")

# -- the fixture ------------------------------------------------------------------------
FIXTURE: dict[str, tuple[str, bool]] = {
    "README.md": (
        "# demo project\n\nA small tree for shell exercises.\nSee docs/guide.txt.\n",
        False,
    ),
    "notes.txt": ("buy milk\ncall bob\nTODO: fix the build\nbuy bread\ncall alice\n", False),
    "my file.txt": ("a file name with a space\n", False),
    ".hidden": ("secret=42\n", False),
    "data.csv": ("id,name,score\n3,carol,71\n1,alice,93\n2,bob,85\n4,dave,85\n", False),
    "numbers.txt": ("10\n2\n33\n2\n7\n10\n", False),
    "words.txt": ("apple\nbanana\nApple\ncherry\nbanana\ndate\n", False),
    "core": ("not really a core dump\n", False),
    "log/app.log": (
        "2024-01-01 INFO start\n2024-01-01 ERROR disk full\n2024-01-02 INFO stop\n",
        False,
    ),
    "log/error.log": ("ERROR one\nERROR two\nWARN three\n", False),
    "log/old/app.1.log": ("2023-12-31 INFO old run\n", False),
    "src/main.py": (
        "#!/usr/bin/env python3\nimport util\n\n# TODO: add args\nprint(util.greet('world'))\n",
        True,
    ),
    "src/util.py": ("def greet(name):\n    return f'hello {name}'\n", False),
    "src/lib/helpers.sh": ('#!/bin/sh\n# helper functions\nlog() { echo "$*"; }\n', True),
    "src/lib/README": ("library code\n", False),
    "docs/guide.txt": ("Step 1: read README.md\nStep 2: run src/main.py\n", False),
    "docs/empty.txt": ("", False),
    "docs/my.txt": ("my notes\n", False),
    "build/output.o": ("\x7fELF fake object\n", False),
    "build/app.tmp": ("temporary\n", False),
}
DOCKERFILE_TEXT = "FROM python:3.12-slim\nWORKDIR /app\nCOPY work/ /app/work/\n"


# -- rows --------------------------------------------------------------------------------
def _pairs(path: Path) -> Iterator[Row]:
    path = Path(path)
    if path.is_dir() and (path / "all.nl").exists():
        nl_file, cm_file = path / "all.nl", path / "all.cm"
    elif path.suffix in (".nl", ".cm"):
        nl_file, cm_file = path.with_suffix(".nl"), path.with_suffix(".cm")
    else:
        yield from iter_rows(path)
        return
    for f in (nl_file, cm_file):
        if not f.exists():
            raise SourceFormatError(f"{f}: missing (nl2bash needs line-aligned .nl and .cm files)")
    nl_lines = nl_file.read_bytes().split(b"\n")
    cm_lines = cm_file.read_bytes().split(b"\n")
    for lines in (nl_lines, cm_lines):
        if lines and lines[-1] == b"":
            lines.pop()
    if len(nl_lines) != len(cm_lines):
        raise SourceFormatError(
            f"{nl_file} has {len(nl_lines)} lines but {cm_file} has {len(cm_lines)}: not line-aligned "
            f"(first line past the shorter file: {min(len(nl_lines), len(cm_lines)) + 1})"
        )
    for i, (a, b) in enumerate(zip(nl_lines, cm_lines)):
        where = f"{nl_file.name}+{cm_file.name}:{i + 1}"
        try:
            yield Row(where, {"id": i, "nl": a.decode("utf-8"), "cmd": b.decode("utf-8")})
        except UnicodeDecodeError as e:
            yield Row(where, None, "bad encoding", f"line {i + 1}: not UTF-8 ({e})")


def read(cfg: Nl2BashSource) -> Iterator[TaskRecord | Quarantined]:
    """Yield one TaskRecord or Quarantined per pair of `cfg.path`. `verifier: false` never adds
    tests. Safe references are probed in the local sandbox, PROBE_BATCH at a time."""
    seen, verifier = Dedup(), cfg.verifier
    rows = enumerate(_pairs(Path(cfg.path)))
    while batch := list(itertools.islice(rows, PROBE_BATCH)):
        safe = {
            c
            for _, r in batch
            if verifier and r.data and (c := first_text(r.data, CMD_KEYS)) and check_command(c.strip()) is None
        }
        silent = silent_references(sorted(c.strip() for c in safe)) if safe else set()
        for n, row in batch:
            if row.data is None:
                yield Quarantined(row.where, row.reason, row.detail)
                continue
            item = convert(row.data, row.where, n, verifier, silent)
            if isinstance(item, TaskRecord) and (first := seen.first(item.task.name, row.where)):
                item = Quarantined(item.task.name, "duplicate id", f"{row.where}: first seen at {first}")
            yield item


def silent_references(commands: list[str]) -> set[str]:
    """The commands that print nothing in a fresh copy of the fixture (as test.sh runs them):
    an empty /app/command.sh would match them. Run in the local sandbox (never on the host
    itself), all in one go. Raises SandboxUnavailable when no sandbox works here."""
    from otbuild.sandbox import Limits, open_sandbox

    probe = TaskDir("nl2bash-probe")
    probe.add(DOCKERFILE, DOCKERFILE_TEXT + "COPY probe/ /app/probe/\n")
    for rel, (text, exe) in FIXTURE.items():
        probe.add(f"environment/work/{rel}", text, executable=exe)
    for i, cmd in enumerate(commands):
        probe.add(f"environment/probe/{i}.sh", cmd + "\n")
    with (
        tempfile.TemporaryDirectory(prefix="nl2bash-probe-") as tmp,
        open_sandbox(probe, Path(tmp), limits=Limits(wall_seconds=60 + 20 * len(commands)), cleanup=True) as box,
    ):
        res = box.run(PROBE_SH.replace("@N@", str(len(commands))), timeout=60 + 20 * len(commands))
    printed = dict(line.split() for line in res.output.splitlines() if re.fullmatch(r"\d+ [01]", line))
    if res.exit_code != 0 or len(printed) != len(commands):
        raise RuntimeError(f"nl2bash: probing the references failed (exit {res.exit_code}): {res.output[-2000:]}")
    return {cmd for i, cmd in enumerate(commands) if printed[str(i)] == "0"}


def convert(d: dict, where: str, n: int, verifier: bool, silent: set[str]) -> TaskRecord | Quarantined:
    rid = as_text(d.get("id"))
    name = task_name("nl2bash", rid if rid is not None else n)
    nl, cmd = first_text(d, NL_KEYS), first_text(d, CMD_KEYS)
    if nl is None:
        return Quarantined(name, "empty instruction", f"{where}: no natural-language description")
    if cmd is None:
        return Quarantined(name, "missing field", f"{where}: no command")
    nl, cmd = nl.strip(), cmd.strip()
    reason = check_command(cmd) if verifier else "verifier disabled"
    if reason is None and cmd in silent:
        reason = "the reference prints nothing in the fixture: a trivial command would pass"
    task = TaskDir(name)
    task.add(INSTRUCTION, (
        "The directory /app/work holds a small file tree. Write a one-line bash command that does "
        "the following, and save it to /app/command.sh:\n\n"
        f"> {nl}\n\n"
        "Your command will be run with bash from inside a fresh copy of /app/work"
        + (" and its output compared with that of a reference command" if reason is None else "")
        + ". You may try it out in /app/work first.\n"
    ))  # fmt: skip
    task.add(TASK_TOML, dump_toml({
        "": {"version": "1.0"},
        "metadata": {"source": "nl2bash", "id": rid if rid is not None else str(n), "tags": ["bash", "nl2bash"]},
        "verifier": {"timeout_sec": 120.0},
        "agent": {"timeout_sec": 600.0},
        "environment": {"cpus": 1, "memory_mb": 1024, "allow_internet": False},
    }))  # fmt: skip
    task.add(DOCKERFILE, DOCKERFILE_TEXT)
    for rel, (text, exe) in FIXTURE.items():
        task.add(f"environment/work/{rel}", text, executable=exe)
    delim, body = heredoc(cmd, "OTBUILD_CMD")
    script = f"#!/bin/bash\n# Reference command from NL2Bash.\ncat > /app/command.sh <<'{delim}'\n{body}{delim}\n"
    task.add(SOLUTION, script, executable=True)
    if reason is None:
        for rel, (text, exe) in FIXTURE.items():
            task.add(f"tests/fixture/{rel}", text, executable=exe)
        task.add("tests/reference.sh", body)
        unordered = bool(re.match(r"\s*find\b", cmd)) and not re.search(r"\bsort\b", cmd)
        task.add(TESTS, TEST_SH.replace("@UNORDERED@", "1" if unordered else "0"), executable=True)
    meta = {"id": rid if rid is not None else str(n), "nl": nl, "reference_command": cmd, "where": where,
            "verifier": "compare output in fixture" if reason is None else None}  # fmt: skip
    if reason is not None:
        meta["verifier_skipped"] = reason
    return TaskRecord(task, runnable_locally=True, metadata=meta)


PROBE_BATCH = 256
# Each reference in the fixture where test.sh runs it, printing "INDEX 1" if it prints, four
# at a time. One copy serves all: the safety check lets through only commands that write nothing.
PROBE_SH = r"""export LC_ALL=C
W=/tmp/nl2bash_root/work
mkdir -p "$W" && cp -a /app/work/. "$W"/ && touch -d @0 "$W" /tmp/nl2bash_root && cd "$W" || exit 1
probe() {  # every 4th reference from $1
    for ((i = $1; i < @N@; i += 4)); do
        (ulimit -f 1; exec timeout 20 bash "/app/probe/$i.sh" </dev/null >"/tmp/out.$1" 2>/dev/null)
        [ -s "/tmp/out.$1" ] && echo "$i 1" || echo "$i 0"
    done
}
for k in 0 1 2 3; do probe $k >"/tmp/probe.$k" & done
wait && cat /tmp/probe.[0-3]
"""

TEST_SH = r"""#!/bin/bash
# otbuild nl2bash verifier: run the reference and /app/command.sh, each in a fresh copy of
# the fixture, and compare their output (reward 1 = same output and same success).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
export LC_ALL=C
W=/tmp/nl2bash_root/work
run() {  # run SCRIPT OUT: stdout to OUT, exit status to OUT.rc
    rm -rf "$W" && mkdir -p "$W" && cp -a /tests/fixture/. "$W"/
    touch -d @0 "$W" /tmp/nl2bash_root  # `ls -la` shows . and ..: same times in both runs
    (cd "$W" && timeout 20 bash "$1" </dev/null >"$2" 2>/dev/null; echo $? >"$2.rc")
}
if [ ! -s /app/command.sh ]; then
    echo "no command in /app/command.sh"; exit 0
fi
run /tests/reference.sh /tmp/nl2bash_ref.out
run /app/command.sh /tmp/nl2bash_agent.out
ok_ref=$([ "$(cat /tmp/nl2bash_ref.out.rc)" = 0 ] && echo 1 || echo 0)
ok_agent=$([ "$(cat /tmp/nl2bash_agent.out.rc)" = 0 ] && echo 1 || echo 0)
same=0
if cmp -s /tmp/nl2bash_ref.out /tmp/nl2bash_agent.out; then
    same=1
elif [ @UNORDERED@ = 1 ] && cmp -s <(sort /tmp/nl2bash_ref.out) <(sort /tmp/nl2bash_agent.out); then
    same=1
fi
if [ ! -s /tmp/nl2bash_ref.out ]; then  # nothing to compare: a trivial command would pass
    echo "the reference printed nothing"
elif [ $same = 1 ] && [ $ok_ref = $ok_agent ]; then
    echo 1 > /logs/verifier/reward.txt
fi
diff /tmp/nl2bash_ref.out /tmp/nl2bash_agent.out | head -50
"""
