"""The one Dockerfile reader and its one policy (otbuild/tasks/dockerfile.py), on hand-written
edge cases and on the real task Dockerfiles of ../shared/data/dev, and the agreement of its
callers: `runnable_locally`, the sandbox's layout and the base-image reader."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from otbuild.sandbox.layout import LayoutError, plan
from otbuild.sources import nl2bash, read_source, stackexchange
from otbuild.sources.synthetic import generate
from otbuild.tasks.base_image import base_images
from otbuild.tasks.dockerfile import local_problems, parse
from otbuild.tasks.table import Quarantined
from otbuild.tasks.task_toml import runnable_locally
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import REPO, source

DEV_TASKS = REPO.parent / "shared" / "data" / "dev" / "terminal_bench_tasks"
DOCKER_KEYWORDS = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "MAINTAINER",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}
needs_dev = pytest.mark.skipif(not DEV_TASKS.is_dir(), reason=f"no dev task pile at {DEV_TASKS}")


def reasons(text: str) -> list[str]:
    return [str(p) for p in local_problems(text)]


# -- the reader ---------------------------------------------------------------------------
def test_continuations_comments_and_line_numbers():
    text = (
        "# a comment\n\nFROM ubuntu:24.04\nrun apt-get update && \\\n  # dropped inside\n\n"
        "  apt-get install -y jq   \\  \n  curl\nENV A=1 # not a comment\r\nCOPY a \\\nb /app/\n"
    )
    got = [(i.keyword, i.line, i.value) for i in parse(text)]
    assert got == [
        ("FROM", 3, "ubuntu:24.04"),
        ("RUN", 4, "apt-get update &&   apt-get install -y jq     curl"),
        ("ENV", 9, "A=1 # not a comment"),
        ("COPY", 10, "a b /app/"),
    ]


def test_json_and_shell_forms_flags_and_lowercase():
    copy, bad, run, frm = parse(
        'copy --chown=1:1 --link ["a b", "c", "/app/"]\n'
        'COPY ["unterminated /app/\n'
        "Run --mount=type=cache,target=/root/.cache pip install x\n"
        "from --platform=linux/amd64 python:3.12 AS build\n"
    )
    assert (copy.keyword, copy.json_form, copy.args) == ("COPY", True, ["a b", "c", "/app/"])
    assert copy.flags == {"chown": "1:1", "link": None}
    assert not bad.json_form and bad.args == ['["unterminated', "/app/"]  # shell form, as Docker
    assert run.flags == {"mount": "type=cache,target=/root/.cache"} and run.value == "pip install x"
    assert frm.flags == {"platform": "linux/amd64"} and frm.args == ["python:3.12", "AS", "build"]


def test_escape_directive_and_directives_only_at_the_top():
    backtick = parse("# syntax=docker/dockerfile:1\n# escape=`\nFROM x\nRUN a `\n  b\nCOPY c\\ d /e\n")
    assert [(i.keyword, i.value) for i in backtick] == [("FROM", "x"), ("RUN", "a   b"), ("COPY", "c\\ d /e")]
    late = parse("FROM x\n# escape=`\nRUN a `\nCOPY b /c\n")  # a comment here, not a directive
    assert [i.keyword for i in late] == ["FROM", "RUN", "COPY"]


def test_here_documents_belong_to_their_instruction():
    ins = parse(
        "FROM x\nRUN <<EOF\napt-get install -y jq\nEOF\nCOPY <<-'END' /app/f.txt\n\thello\n\tEND\nWORKDIR /app\n"
    )
    assert [i.keyword for i in ins] == ["FROM", "RUN", "COPY", "WORKDIR"]
    assert ins[1].heredocs == ("apt-get install -y jq\n",) and ins[2].heredocs == ("\thello\n",)
    assert ins[3].line == 8


# -- the policy ---------------------------------------------------------------------------
LOCAL = (
    "# c\nFROM python:3.13\nARG X=1\nLABEL x=y\nUSER u\nworkdir /srv\nCOPY --chown=u:u "
    '--chmod=755 a ./\nCOPY ["b c", "/data/"]\nENV A=1 B="two words"\nENV LEGACY a b\n'
)


@pytest.mark.parametrize(
    ("dockerfile", "want"),
    [
        (LOCAL, []),
        (
            'FROM x\nRUN apt-get install -y jq\nCMD ["bash"]\nexpose 80\n',
            ["RUN at line 2", "CMD at line 3", "EXPOSE at line 4"],
        ),
        (
            "FROM x\nADD https://example.org/a.tgz /app/\nADD git@github.com:o/r.git /r\n",
            ["ADD of a URL at line 2", "ADD of a URL at line 3"],
        ),
        ("FROM x\nADD a.txt /app/\n", ["ADD at line 2 (Docker unpacks archives; use COPY)"]),
        (
            "FROM x AS b\nFROM y\nCOPY --from=b /out /app/\n",
            ["a second FROM at line 2 (a multi-stage build)", "COPY --from at line 3"],
        ),
        (
            "FROM x\nCOPY --parents a/b /app/\nCOPY --chmod=u+x s /app/\n",
            ["COPY --parents at line 2", "COPY --chmod=u+x at line 3 (only an octal mode is laid out)"],
        ),
        (
            "FROM x\nWORKDIR /usr/src/app\nCOPY f .\n",
            ["WORKDIR /usr/src/app at line 2 (a system dir)", "COPY into /usr/src/app at line 3 (a system dir)"],
        ),
        (
            "FROM x\nCOPY f /etc/\nCOPY g .\nCOPY <<EOF /app/x\nhi\nEOF\n",
            [
                "COPY into /etc at line 2 (a system dir)",
                "COPY into / at line 3 (the root)",
                "COPY of a here-document at line 4",
            ],
        ),
        (
            "FROM x\nARG D=/app\nWORKDIR $D\nCOPY a ${D}/\nCOPY \\$literal /app/\nENV P=/a:$PATH\n",
            [
                "a variable in WORKDIR at line 3 (Docker substitutes it, a local sandbox cannot)",
                "a variable in COPY at line 4 (Docker substitutes it, a local sandbox cannot)",
            ],
        ),
    ],
)
def test_local_problems(dockerfile, want):
    assert reasons(dockerfile) == want


def test_only_build_and_run_steps_are_skippable():
    problems = local_problems('FROM x\nRUN make\nADD a /b\nSHELL ["sh"]\nCOPY --from=b / /x\n')
    assert {str(p).split(" at ")[0]: p.skippable for p in problems} == {
        "RUN": True,
        "ADD": False,
        "SHELL": True,
        "COPY --from": False,
    }


# -- the callers agree ----------------------------------------------------------------------
def _task(dockerfile: str, files=("a", "b c", "f", "g", "s", "a.txt", "app/x")) -> TaskDir:
    t = TaskDir("t")
    t.add("task.toml", "")
    t.add("environment/Dockerfile", dockerfile)
    for f in files:
        t.add(f"environment/{f}", "x")
    return t


@pytest.mark.parametrize(
    "dockerfile",
    [
        LOCAL,
        "FROM x\nRUN make\nCOPY a /app/\n",
        "FROM x\nADD a.txt /app/\n",
        "FROM x\nCOPY --from=b /o /app/\n",
        "FROM x\nCOPY f /etc/\n",
        "FROM x\nWORKDIR $D\n",
        "FROM x\nCOPY --chmod=644 s /app/s\n",
        "FROM x\nadd app /app/\nRUN x\n",
    ],
)
def test_runnable_locally_and_the_layout_follow_the_one_policy(dockerfile):
    task = _task(dockerfile)
    problems = local_problems(dockerfile)
    assert runnable_locally(task) is (not problems)
    if any(not p.skippable for p in problems):
        first = str(next(p for p in problems if not p.skippable))
        with pytest.raises(LayoutError, match=re.escape(first)):
            plan(task)
    else:
        plan(task)  # RUN and friends are left out; the rest is laid out


def test_layout_honours_an_octal_chmod():
    lay = plan(_task("FROM x\nCOPY --chmod=755 f /app/run\nCOPY --chmod=0644 g /app/data\n"))
    assert lay.files["/app/run"] == (b"x", True) and lay.files["/app/data"] == (b"x", False)


def test_otbuilds_own_task_dockerfiles_run_locally():
    """nl2bash, stackexchange and synthetic tasks say runnable_locally=True without asking."""
    synthetic = next(generate(1, 0)).task.text("environment/Dockerfile")
    for text in (nl2bash.DOCKERFILE_TEXT, stackexchange.DOCKERFILE_TEXT, synthetic):
        assert reasons(text) == []


# -- real Dockerfiles -----------------------------------------------------------------------
def _real_dockerfiles() -> list[Path]:
    return sorted(DEV_TASKS.glob("*/*/*/Dockerfile")) + sorted(DEV_TASKS.glob("*/*/*/environment/Dockerfile"))


@needs_dev
def test_real_dockerfiles_parse_into_docker_keywords_only():
    files = _real_dockerfiles()
    assert len(files) >= 100
    for f in files:
        instructions = parse(f.read_text())
        assert {i.keyword for i in instructions} <= DOCKER_KEYWORDS, f  # no folded-away junk
        assert [i.keyword for i in instructions].count("FROM") == 1, f
        assert len(base_images(f.read_text())) == 1, f


@needs_dev
def test_real_dockerfiles_problems():
    by_collection: dict[str, Counter] = {}
    for f in _real_dockerfiles():
        collection = f.relative_to(DEV_TASKS).parts[1]
        kinds = {str(p).split(" at ")[0] for p in local_problems(f.read_text())}
        by_collection.setdefault(collection, Counter())[" + ".join(sorted(kinds)) or "local"] += 1
    assert by_collection == {
        "evoeval": {"local": 55},
        "aider_polyglot_python": {"RUN": 10},
        "tb2_ot_fewshots": {"RUN": 5, "local": 1},
        "termigen_no_solution": {
            "RUN": 38,
            "COPY into /etc/redis/redis.conf + RUN": 1,
            "COPY into /usr/local/bin/maintenance.sh + RUN": 1,
        },
    }


@needs_dev
def test_real_tasks_runnable_locally_counts():
    """The counts the source adapters give (runnable_locally feeds the task parquets): the same
    as before the one policy (52 of 108)."""
    counts = Counter()
    for fmt, kind in (("harbor_format", "harbor-dir"), ("tb1_format", "tb1-dir")):
        for collection in sorted((DEV_TASKS / fmt).iterdir()):
            for rec in read_source(source(kind, collection)):
                if not isinstance(rec, Quarantined):
                    counts[collection.name, rec.runnable_locally] += 1
    assert counts == {
        ("tb2_ot_fewshots", False): 5,
        ("tb2_ot_fewshots", True): 1,
        ("termigen_no_solution", False): 40,
        ("aider_polyglot_python", False): 10,
        ("evoeval", True): 50,
        ("tb_core_original", False): 1,
        ("tb_core_original", True): 1,
    }
