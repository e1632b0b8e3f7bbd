"""Row-based task adapters (swe-instances, stackexchange, nl2bash, table) on the dev data."""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otbuild.recipe.load import load_recipe
from otbuild.sources import nl2bash, read_source, stackexchange, swe_grader, swe_instances, table
from otbuild.sources._html import html_to_markdown
from otbuild.records import SourceFormatError
from otbuild.sources.shell_safety import check_command
from otbuild.stages import STAGES
from otbuild.tasks.table import Quarantined, TaskRecord, write_tasks
from tests.conftest import source

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "dev"
if not DATA.is_dir():
    pytest.skip(f"dev data not found at {DATA} (shared/data/dev)", allow_module_level=True)

SWEB = DATA / "swebench_verified" / "instances.jsonl"
SMITH = DATA / "swesmith"
SE = DATA / "stackexchange"
NL = DATA / "nl2bash" / "nl2bash_pairs.jsonl"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split(items) -> tuple[dict[str, TaskRecord], list[Quarantined]]:
    items = list(items)
    recs = {i.task.name: i for i in items if isinstance(i, TaskRecord)}
    assert len(recs) + sum(isinstance(i, Quarantined) for i in items) == len(items)
    return recs, [i for i in items if isinstance(i, Quarantined)]


def write_lines(path: Path, lines: list) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else (x if isinstance(x, str) else json.dumps(x)).encode())
                              + b"\n" for x in lines))  # fmt: skip
    return path


# -- swe-instances -------------------------------------------------------------------
def test_swebench_instances_become_tasks():
    src = jsonl(SWEB)
    recs, bad = split(swe_instances.read(source("swe-instances", SWEB)))
    assert len(recs) == len(src) == 62 and not bad
    for inst in src:
        rec = recs[inst["instance_id"]]
        t = rec.task
        assert inst["problem_statement"].strip() in t.instruction
        config = json.loads(t.text("tests/config.json"))
        assert config["FAIL_TO_PASS"] == json.loads(inst["FAIL_TO_PASS"])
        assert config["PASS_TO_PASS"] == json.loads(inst["PASS_TO_PASS"])
        assert config["test_patch"] == inst["test_patch"] and config["base_commit"] == inst["base_commit"]
        solve = t.text("solution/solve.sh")
        assert inst["patch"] in solve and "git apply --verbose" in solve and " -R" not in solve
        image = "swebench/sweb.eval.x86_64." + inst["instance_id"].replace("__", "_1776_").lower() + ":latest"
        assert tomllib.loads(t.text("task.toml"))["environment"]["docker_image"] == image
        assert t.text("environment/Dockerfile").startswith(f"FROM {image}\n")
        row = rec.row("swe")
        assert row["has_solution"] and row["has_tests"] and not row["runnable_locally"]
        assert (
            t.files["tests/test.sh"].executable
            and t.text("tests/swe_grader.py") == Path(swe_grader.__file__).read_text()
        )
    assert recs["astropy__astropy-7166"].metadata["docker_image"] == (
        "swebench/sweb.eval.x86_64.astropy_1776_astropy-7166:latest"
    )


def test_swesmith_patch_is_bug_introducing():
    src = {r["instance_id"]: r for f in sorted(SMITH.glob("*.jsonl")) for r in jsonl(f)}
    recs, bad = split(swe_instances.read(source("swe-instances", SMITH)))
    assert len(recs) == len(src) == 11 and not bad
    for iid, inst in src.items():
        t = recs[iid].task
        assert recs[iid].metadata["patch_introduces_bug"] is True
        assert t.text("environment/bug.patch").rstrip("\n") == inst["patch"].rstrip("\n")
        assert "git apply /tmp/bug.patch" in t.text("environment/Dockerfile")
        assert t.text("environment/Dockerfile").startswith(f"FROM {inst['image_name']}\n")
        assert "docker_image" not in tomllib.loads(t.text("task.toml"))["environment"]  # must build the bug in
        solve = t.text("solution/solve.sh")
        assert "git apply -R" in solve and inst["patch"] in solve
        assert json.loads(t.text("tests/config.json"))["FAIL_TO_PASS"] == list(inst["FAIL_TO_PASS"])
    packet = recs["pylint-dev__astroid.b114f6b5.pr_2570"].metadata
    assert packet["pass_to_pass_missing"] and packet["pass_to_pass_count"] == 1592
    # forced off: the patch is then a fix, applied forward
    forced, _ = split(swe_instances.read(source("swe-instances", SMITH, patch_introduces_bug=False)))
    assert " -R" not in forced["pylint-dev__astroid.b114f6b5.pr_2570"].task.text("solution/solve.sh")
    named, _ = split(swe_instances.read(source("swe-instances", SMITH, image_namespace="swebench")))
    assert named["pylint-dev__astroid.b114f6b5.pr_2570"].metadata["docker_image"].startswith("swebench/swesmith.")


def test_swe_quarantine_reasons(tmp_path):
    good = jsonl(SWEB)[0]
    f = write_lines(tmp_path / "x.jsonl", [
        good,
        {**good, "instance_id": None},
        {**good, "instance_id": "a__b-1", "problem_statement": "  \n"},
        {**good, "instance_id": "a__b-2", "FAIL_TO_PASS": "not a list ["},
        {**good, "instance_id": "a__b-3", "FAIL_TO_PASS": "[]"},
        [1, 2],
        b'{"instance_id": "a__b-4", "problem_statement": "caf\xe9"}',
        good,
        {**good, "instance_id": "a__b-5", "patch": 7},
    ])  # fmt: skip
    recs, bad = split(swe_instances.read(source("swe-instances", f)))
    assert list(recs) == [good["instance_id"]]
    assert [q.reason for q in bad] == ["missing field", "empty instruction", "bad field", "missing field",
                                       "not an object", "bad encoding", "duplicate id", "bad field"]  # fmt: skip
    assert "x.jsonl:7" in bad[5].detail or "line 7" in bad[5].detail


def test_swe_malformed_files_name_file_and_position(tmp_path):
    good = json.dumps(jsonl(SWEB)[0])
    f = tmp_path / "t.jsonl"
    f.write_text(good + "\n" + good + "\n" + good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"t\.jsonl: line 3 .*truncated"):
        list(swe_instances.read(source("swe-instances", f)))
    g = tmp_path / "t.json"
    g.write_text('[\n {"instance_id": "x",\n  oops}\n]')
    with pytest.raises(SourceFormatError, match=r"t\.json: line 3 column 3"):
        list(swe_instances.read(source("swe-instances", g)))


def test_swe_grader_parsers():
    pytest_log = "PASSED a/t.py::test_x\nFAILED a/t.py::test_y - AssertionError\nERROR a/t.py::test_z\n"
    assert swe_grader.parse(pytest_log, "pytest") == {"a/t.py::test_x": "PASSED", "a/t.py::test_y": "FAILED",
                                                     "a/t.py::test_z": "ERROR"}  # fmt: skip
    django_log = "test_a (m.T) ... ok\ntest_b (m.T)\nDoc line. ... FAIL\ntest_c (m.T) ... skipped 'x'\n"
    assert swe_grader.parse(django_log, "django") == {"test_a (m.T)": "ok", "test_b (m.T)": "FAIL",
                                                     "test_c (m.T)": "skipped"}  # fmt: skip
    assert swe_grader.parse("test_one ok\ntest_two F\n", "sympy") == {
        "test_one": "ok",
        "test_two": "F",
    }
    cfg = {"FAIL_TO_PASS": ["a/t.py::test_x"], "PASS_TO_PASS": ["a/t.py::test_y"]}
    assert swe_grader.grade(cfg, swe_grader.parse(pytest_log, "pytest"))[0] == 0
    assert swe_grader.grade(cfg, {"a/t.py::test_x": "PASSED", "a/t.py::test_y": "PASSED"})[0] == 1
    inst = jsonl(SWEB)[0]
    cmd = swe_grader.command({**inst, "FAIL_TO_PASS": json.loads(inst["FAIL_TO_PASS"]), "PASS_TO_PASS": []}, "pytest")
    assert cmd[-1] == "astropy/utils/tests/test_misc.py"
    django = next(r for r in jsonl(SWEB) if r["repo"] == "django/django")
    assert swe_grader.runner(django) == "django"


# -- stackexchange -------------------------------------------------------------------------
def test_stackexchange_exports():
    src = {f"{r['site']}-{r['question_id']}": r for f in sorted(SE.glob("*.jsonl")) for r in jsonl(f)}
    recs, bad = split(stackexchange.read(source("stackexchange", SE)))
    assert len(recs) == len(src) == 600 and not bad
    assert Counter(r.metadata["site"] for r in recs.values()) == {
        "superuser": 300,
        "unixlinux": 300,
    }
    for name, r in src.items():
        rec = recs[name]
        assert rec.task.instruction == f"# {r['title']}\n"
        assert rec.metadata["tags"] == r["tags"] and rec.metadata["link"] == r["link"]
        ref = rec.task.text("solution/reference_answer.md")
        assert ref and rec.metadata["reference_answer"] == ref and "<p>" not in ref and "<code>" not in ref
        row = rec.row("se")
        assert not row["has_tests"] and not row["has_solution"] and row["runnable_locally"]
    ref = recs["superuser-46139"].task.text("solution/reference_answer.md")
    assert ref.startswith("[`source`](http://ss64.com/bash/source.html) is a bash shell built-in")
    assert "> ```\n> . filename [arguments]\n>\n> source filename [arguments]\n> ```" in ref
    forced, _ = split(
        stackexchange.read(source("stackexchange", SE / "superuser_bash_accepted.jsonl", site="super user"))
    )
    assert "super-user-46139" in forced


def test_html_to_markdown():
    md = html_to_markdown(
        '<p>Use <code>a &amp;&amp; b</code> or <a href="http://x.org/y">docs</a>&nbsp;now.</p>'
        "<ol><li>one<ul><li>inner</li></ul></li><li>two</li></ol>"
        '<pre><code>for f in *; do\n  echo "$f" &lt;in\ndone\n</code></pre><p>x<br>y</p><hr>'
    )
    assert "Use `a && b` or [docs](http://x.org/y)" in md
    assert "1. one\n   - inner\n2. two" in md
    assert '```\nfor f in *; do\n  echo "$f" <in\ndone\n```' in md
    assert "x\ny" in md and "---" in md
    assert html_to_markdown("<pre><code>has ``` inside</code></pre>").startswith("````\n")


POSTS = """<?xml version="1.0" encoding="utf-8"?>
<posts>
  <row Id="1" PostTypeId="1" AcceptedAnswerId="3" Score="5" Title="Delete lines with sed"
       Body="&lt;p&gt;How do I delete lines matching &lt;code&gt;foo&lt;/code&gt;?&lt;/p&gt;" Tags="&lt;bash&gt;&lt;sed&gt;" />
  <row Id="2" PostTypeId="1" Score="1" Title="No accepted answer" Body="&lt;p&gt;Anyone?&lt;/p&gt;" Tags="&lt;bash&gt;" />
  <row Id="3" PostTypeId="2" ParentId="1" Score="9" Body="&lt;pre&gt;&lt;code&gt;sed '/foo/d' file&lt;/code&gt;&lt;/pre&gt;" />
  <row Id="4" PostTypeId="2" ParentId="2" Score="0" Body="&lt;p&gt;not accepted&lt;/p&gt;" />
  <row Id="5" PostTypeId="1" Title="" Body="" Tags="" />
  <row Id="6" PostTypeId="5" Body="tag wiki" />
</posts>
"""


def test_stackexchange_posts_xml(tmp_path):
    d = tmp_path / "unix.stackexchange.com"
    d.mkdir()
    (d / "Posts.xml").write_text(POSTS)
    recs, bad = split(stackexchange.read(source("stackexchange", d / "Posts.xml")))
    assert sorted(recs) == ["unix.stackexchange.com-1", "unix.stackexchange.com-2"]
    assert [(q.name, q.reason) for q in bad] == [("unix.stackexchange.com-5", "empty instruction")]
    one = recs["unix.stackexchange.com-1"]
    assert one.task.instruction == "# Delete lines with sed\n\nHow do I delete lines matching `foo`?\n"
    assert one.task.text("solution/reference_answer.md") == "```\nsed '/foo/d' file\n```\n"
    assert one.metadata["tags"] == ["bash", "sed"] and one.metadata["answer_score"] == 9
    assert "solution/reference_answer.md" not in recs["unix.stackexchange.com-2"].task.files
    (d / "Posts.xml").write_text(POSTS.replace('Score="1"', 'Score="1'))
    with pytest.raises(SourceFormatError, match=r"Posts\.xml: line \d+ column \d+"):
        list(stackexchange.read(source("stackexchange", d)))


def test_stackexchange_csv_with_body_and_bad_rows(tmp_path):
    f = tmp_path / "se.csv"
    f.write_bytes(
        b"Id,Title,Body,Tags,AcceptedAnswerBody\n"
        b'7,Count files,"<p>How many <em>files</em>?</p>",<bash><find>,"<p>Use <code>find . -type f | wc -l</code></p>"\n'
        b"8,,,,\n"
        b"9,Bad \xff bytes,body,,\n"
    )
    recs, bad = split(stackexchange.read(source("stackexchange", f, site="askubuntu")))
    assert list(recs) == ["askubuntu-7"]
    assert recs["askubuntu-7"].task.instruction == "# Count files\n\nHow many *files*?\n"
    assert recs["askubuntu-7"].metadata["tags"] == ["bash", "find"]
    assert [q.reason for q in bad] == ["empty instruction", "bad encoding"]


# -- nl2bash -----------------------------------------------------------------------------------
def test_nl2bash_pairs():
    src = jsonl(NL)
    recs, bad = split(nl2bash.read(source("nl2bash", NL)))
    assert len(recs) == len(src) == 2000 and not bad
    verified = [r for r in recs.values() if "tests/test.sh" in r.task.files]
    assert 100 < len(verified) < 1000  # the rule keeps a real, conservative share
    for r in src:
        rec = recs[f"nl2bash-{r['id']}"]
        assert r["nl"].strip() in rec.task.instruction
        assert r["cmd"].strip() in rec.task.text("solution/solve.sh")
        has_tests = "tests/test.sh" in rec.task.files
        silent = "prints nothing" in rec.metadata.get("verifier_skipped", "")
        assert has_tests == (check_command(r["cmd"]) is None and not silent)
        if has_tests:
            assert rec.task.text("tests/reference.sh").strip() == r["cmd"].strip()
            assert rec.task.text("tests/fixture/notes.txt") == rec.task.text("environment/work/notes.txt")
        else:
            assert rec.metadata["verifier_skipped"]
        assert rec.runnable_locally
    unsafe = [r["cmd"] for r in src if r["cmd"].split()[0] in ("sudo", "rm", "chmod", "ssh", "top", "date")]
    assert unsafe and all(check_command(c) for c in unsafe)


def _verify(task, command: str, tmp_path) -> float:
    """tests/test.sh of `task` in the real sandbox, with `command` in /app/command.sh."""
    from otbuild.sandbox import open_sandbox, read_reward

    with open_sandbox(task, tmp_path, cleanup=False) as box:
        (box.root / "app" / "command.sh").write_text(command + "\n")
        box.run("bash /tests/test.sh", timeout=60, with_tests=True)
        return read_reward(box.root)


def test_nl2bash_verifiers_fail_a_trivial_command(tmp_path):
    """A reference that prints nothing in the fixture (here: succeeds or fails silently) would
    give `true` or `false` a pass: such pairs get no verifier; the others fail both."""
    rows = [
        {
            "id": "silent",
            "nl": "list js files except under proc",
            "cmd": "find . -type d -name proc -prune -o -name '*.js'",
        },
        {"id": "fails", "nl": "diff two files", "cmd": "diff -u file1 file2"},
        {"id": "todo", "nl": "count TODO lines", "cmd": "grep -r -c TODO src"},
    ]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = {r.metadata["id"]: r for r in nl2bash.read(source("nl2bash", tmp_path / "pairs.jsonl"))}
    for quiet in ("silent", "fails"):
        assert "tests/test.sh" not in recs[quiet].task.files
        assert "prints nothing in the fixture" in recs[quiet].metadata["verifier_skipped"]
    todo = recs["todo"].task
    assert [_verify(todo, c, tmp_path) for c in ("true", "false", "grep -r -c TODO src")] == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("cmd", [
    "find . -name '*.txt'", "find . -type f -print0 | xargs -0 grep -l TODO", "ls -la 2>/dev/null",
    "awk -F, '{print $2}' data.csv | sort", "find . -name '*.log' -exec wc -l {} \\;", "grep -c ERROR log/*.log",
])  # fmt: skip
def test_nl2bash_safe_commands(cmd):
    assert check_command(cmd) is None


@pytest.mark.parametrize("cmd,why", [
    ("find . -name '*.o' -exec rm {} \\;", "rm"), ("cat notes.txt > out.txt", "redirection"),
    ("echo $HOME", "expansion"), ('grep "$x" f', "expansion"), ("sed -i 's/a/b/' f", "sed -i"),
    ("sed -n 'w out' f", "sed script"), ("sort -o out f", "sort -o"), ("find / -name core", "absolute"),
    ("cat ../secret", "outside"), ("find . -mtime -1", "-mtime"), ("ls `pwd`", "expansion"),
    ("awk '{system(\"rm x\")}' f", "awk"), ("find . | xargs -P4 grep x", "xargs -P"), ("sleep 1 &", "operator"),
    ("cat ~/.bashrc", "home"), ("curl http://x", "allowlist"), ("uniq in out", "uniq"), ("echo 'x", "quote"),
])  # fmt: skip
def test_nl2bash_unsafe_commands(cmd, why):
    reason = check_command(cmd)
    assert reason is not None and why in reason


def test_nl2bash_nl_cm_files_and_errors(tmp_path):
    src = jsonl(NL)[:30]
    (tmp_path / "all.nl").write_text("".join(r["nl"] + "\n" for r in src))
    (tmp_path / "all.cm").write_text("".join(r["cmd"] + "\n" for r in src))
    recs, bad = split(nl2bash.read(source("nl2bash", tmp_path)))
    assert not bad and [r.metadata["nl"] for r in recs.values()] == [r["nl"].strip() for r in src]
    assert next(iter(recs)) == "nl2bash-0"  # id = 0-based line number
    (tmp_path / "all.cm").write_bytes(b"ls\n\xff\xfe\n" + b"".join(r["cmd"].encode() + b"\n" for r in src[2:]))
    recs, bad = split(nl2bash.read(source("nl2bash", tmp_path / "all.nl")))
    assert [q.reason for q in bad] == ["bad encoding"] and len(recs) == 29
    (tmp_path / "all.cm").write_text("ls\n")
    with pytest.raises(SourceFormatError, match=r"all\.nl has 30 lines but .*all\.cm has 1"):
        list(nl2bash.read(source("nl2bash", tmp_path)))
    f = write_lines(
        tmp_path / "p.jsonl",
        [{"id": 1, "nl": "", "cmd": "ls"}, {"id": 2, "nl": "list", "cmd": " "}],
    )
    assert [q.reason for q in split(nl2bash.read(source("nl2bash", f)))[1]] == ["empty instruction", "missing field"]
    off, _ = split(nl2bash.read(source("nl2bash", NL, verifier=False)))
    assert not any("tests/test.sh" in r.task.files for r in off.values())


# -- table ---------------------------------------------------------------------------------------
def test_table_on_real_jsonl_and_formats(tmp_path):
    cols = {"instruction": "nl", "id": "id", "solution": "cmd", "metadata": ["cmd"]}
    recs, bad = split(table.read(source("table", NL, columns=cols)))
    src = jsonl(NL)
    assert len(recs) == 2000 and not bad
    first = recs[str(src[0]["id"])]
    assert first.task.instruction == src[0]["nl"] + "\n" and first.task.text("solution/solve.sh") == src[0]["cmd"]
    assert first.metadata["cmd"] == src[0]["cmd"] and not first.row("t")["has_tests"]
    rows = [
        {
            "q": "Print hello",
            "sh": "echo hello",
            "t": "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
            "k": i,
        }
        for i in range(5)
    ]
    rows[3]["q"] = " "
    del rows[4]["q"]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet", row_group_size=2)
    recs, bad = split(table.read(source("table", tmp_path / "t.parquet", columns={"instruction": "q", "solution": "sh", "tests": "t"},
                                 docker_image="img:1")))  # fmt: skip
    assert sorted(recs) == ["t-0", "t-1", "t-2"] and [q.reason for q in bad] == [
        "empty instruction",
        "empty instruction",
    ]  # parquet: null
    row = recs["t-0"].row("t")
    assert row["has_tests"] and row["has_solution"] and not row["runnable_locally"]
    assert tomllib.loads(recs["t-0"].task.text("task.toml"))["environment"]["docker_image"] == "img:1"
    (tmp_path / "c.csv").write_text("q,sh\nList files,ls\n,ls\n")
    recs, bad = split(table.read(source("table", tmp_path / "c.csv", columns={"instruction": "q"})))
    assert list(recs) == ["c-0"] and [q.reason for q in bad] == ["empty instruction"]
    data = (tmp_path / "t.parquet").read_bytes()
    (tmp_path / "t.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceFormatError, match=r"t\.parquet: not a readable parquet file \(footer at byte offset"):
        list(table.read(source("table", tmp_path / "t.parquet", columns={"instruction": "q"})))


def test_generated_scripts_are_valid_shell(tmp_path):
    import subprocess

    nl = next(
        r for r in nl2bash.read(source("nl2bash", NL)) if isinstance(r, TaskRecord) and "tests/test.sh" in r.task.files
    )
    swe = next(iter(split(swe_instances.read(source("swe-instances", SMITH)))[0].values()))
    for t in (nl.task, swe.task):
        for rel in ("tests/test.sh", "solution/solve.sh"):
            (tmp_path / "s.sh").write_text(t.text(rel))
            assert subprocess.run(["bash", "-n", str(tmp_path / "s.sh")], check=False).returncode == 0, (t.name, rel)


# -- dispatch and recipes -------------------------------------------------------------------------------
def test_dispatch_passes_options_and_tasks_write(tmp_path):
    items = list(
        read_source(
            STAGES["source"].config(
                {"kind": "stackexchange", "name": "se", "site": "ul", "path": str(SE / "unixlinux_bash_accepted.jsonl")}
            )
        )
    )
    assert len(items) == 300 and items[0].task.name.startswith("ul-")
    n = write_tasks(
        tmp_path / "t.parquet",
        (i for i in swe_instances.read(source("swe-instances", SMITH)) if isinstance(i, TaskRecord)),
        "smith",
    )
    assert n == 11 and pq.read_table(tmp_path / "t.parquet").column("has_solution").to_pylist() == [True] * 11


def test_recipe_accepts_new_kinds_and_reports_precise_errors(tmp_path):
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "ok.yaml").write_text(
        "sources:\n"
        "  swe: {kind: swe-instances, rank: 1, path: a.jsonl, patch_introduces_bug: auto}\n"
        "  se: {kind: stackexchange, rank: 2, path: b, site: superuser}\n"
        "  nl: {kind: nl2bash, rank: 3, path: c, verifier: false}\n"
        "  tb: {kind: table, rank: 4, path: d.csv, columns: {instruction: q, metadata: [x]}}\n"
    )
    r = load_recipe("ok", tmp_path).recipe
    assert r.sources["tb"].columns.instruction == "q" and r.sources["nl"].verifier is False
    (d / "bad.yaml").write_text(
        "sources:\n"
        "  se: {kind: stackexchange, rank: 1, path: b, sight: x}\n"
        "  tb: {kind: table, rank: 2, path: d.csv, columns: {instrucion: q}}\n"
        "  swe: {kind: swe-instances, rank: 3, path: a, patch_introduces_bug: maybe}\n"
    )
    from otbuild.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_recipe("bad", tmp_path)
    msg = str(e.value)
    assert "sources.se.sight: unknown key; did you mean 'site'?" in msg
    assert "sources.tb.columns.instrucion: unknown key" in msg and "sources.tb.columns.instruction" in msg
    assert "sources.swe.patch_introduces_bug" in msg
