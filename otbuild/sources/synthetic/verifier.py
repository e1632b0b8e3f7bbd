"""The verifier every synthetic task ships (tests/test.sh): a runner of the task's checks, one
per op, that writes the reward (1 when every check passes) and the fraction that passed, and the
check functions an op's checks call (`expect_file`, `expect_lines`, ...), run inside the task's
container with its Python."""

TEST_SH = """#!/bin/sh
# Verifier: checks the end state under /app. reward.txt: 1 when every check passes, else 0;
# reward.json: that reward and partial_credit, the fraction of checks that passed.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
python3 - <<'CHECKS'
{prelude}


CHECKS = [
{checks}]
passed = 0
for check in CHECKS:
    try:
        check()
        passed += 1
    except Exception as e:  # noqa: BLE001 - a check that cannot run has failed
        print("FAIL:", e)
partial = passed / len(CHECKS)
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({{"reward": float(partial == 1), "partial_credit": partial}}, f)
with open("/logs/verifier/reward.txt", "w") as f:
    f.write("1\\n" if partial == 1 else "0\\n")
print(f"{{passed}}/{{len(CHECKS)}} checks passed")
CHECKS
"""

CHECK_PRELUDE = '''import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

APP = "/app"


class CheckFailed(Exception):
    pass


def fail(msg):
    raise CheckFailed(msg)


def read(rel, binary=False):
    path = os.path.join(APP, rel)
    if not os.path.isfile(path):
        fail(f"missing file /app/{rel}")
    with open(path, "rb") as f:
        data = f.read()
    return data if binary else data.decode("utf-8", "replace")


def lines_of(text):
    return [line.rstrip() for line in text.strip().splitlines()]


def expect_file(rel, content):
    if read(rel) != content:
        fail(f"/app/{rel} does not have the expected content")


def expect_absent(rel):
    if os.path.lexists(os.path.join(APP, rel)):
        fail(f"/app/{rel} should not exist")


def expect_exec(rel):
    if not os.stat(os.path.join(APP, rel)).st_mode & 0o111:
        fail(f"/app/{rel} is not executable")


def expect_lines(rel, expected, ordered=True):
    got, want = lines_of(read(rel)), list(expected)
    if not ordered:
        got, want = sorted(got), sorted(want)
    if got != want:
        fail(f"/app/{rel}: expected lines {want!r}, got {got!r}")


def expect_json(rel, expected):
    try:
        got = json.loads(read(rel))
    except ValueError as e:
        fail(f"/app/{rel} is not valid JSON: {e}")
    if got != expected:
        fail(f"/app/{rel}: expected {expected!r}, got {got!r}")


def expect_gzip(rel, content):
    try:
        got = gzip.decompress(read(rel, binary=True)).decode()
    except (OSError, EOFError) as e:
        fail(f"/app/{rel} is not gzip data: {e}")
    if got != content:
        fail(f"/app/{rel} does not decompress to the expected content")


def expect_tar(rel, members, absent=()):
    try:
        with tarfile.open(fileobj=io.BytesIO(read(rel, binary=True)), mode="r:gz") as tar:
            got = {m.name.removeprefix("./"): tar.extractfile(m).read().decode()
                   for m in tar.getmembers() if m.isfile()}
    except (tarfile.TarError, OSError, EOFError) as e:
        fail(f"/app/{rel} is not a gzip tar archive: {e}")
    for name, content in members.items():
        if got.get(name) != content:
            fail(f"/app/{rel}: member {name} missing or different")
    for name in absent:
        if name in got:
            fail(f"/app/{rel}: member {name} should not be there")


def expect_output(script, args, expected, stdin="", files=None, as_json=False):
    """Run `python3 /app/<script> args` on fresh inputs; compare its stdout."""
    read(script)
    tmp = tempfile.mkdtemp()
    for name, text in (files or {}).items():
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    argv = ["python3", os.path.join(APP, script)] + [a.replace("{tmp}", tmp) for a in args]
    try:
        out = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=tmp,
                             timeout=20).stdout
    except subprocess.TimeoutExpired:
        fail(f"{script} timed out")
    if as_json:
        try:
            ok = json.loads(out) == expected
        except ValueError:
            ok = False
    else:
        ok = lines_of(out) == lines_of(expected)
    if not ok:
        fail(f"{script} {args}: expected {expected!r}, got {out!r}")'''
