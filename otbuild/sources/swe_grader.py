"""SWE-style verifier, copied verbatim into each `swe-instances` task as tests/swe_grader.py.

Runs inside the task container (stdlib only, any Python >= 3.6) from tests/test.sh:

1. with a test patch: restore the files it touches to `base_commit` (undoing any agent edit
   to them), then `git apply` it; a patch that does not apply scores 0;
2. runs the FAIL_TO_PASS and PASS_TO_PASS tests with the repo's runner (pytest node ids,
   Django's runtests.py, SymPy's bin/test: chosen from the test ids and the repo);
3. parses each test's status from the log (like SWE-bench's log parsers) and writes
   reward 1 if every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0, to
   /logs/verifier/reward.txt; the per-test statuses go to /logs/verifier/swe_report.json.

Usage: python swe_grader.py CONFIG_JSON [REPO_DIR]
"""

import json
import os
import re
import subprocess
import sys

LOGS = "/logs/verifier"
PASS = {"PASSED", "XFAIL", "ok", "OK", "skipped", "expected failure"}
DIFF_TARGET = re.compile(r"^\+\+\+ b/(.+)$", re.MULTILINE)
DIFF_SOURCE = re.compile(r"^--- a/(.+)$", re.MULTILINE)


def runner(config):
    if config.get("repo", "").endswith("django/django") or "/django__django" in config.get("repo", ""):
        return "django"
    if "sympy/sympy" in config.get("repo", "") or "sympy__sympy" in config.get("repo", ""):
        return "sympy"
    return "pytest"


def patch_files(patch):
    return sorted(set(DIFF_TARGET.findall(patch)) | set(DIFF_SOURCE.findall(patch)))


def command(config, kind):
    tests = config["FAIL_TO_PASS"] + config["PASS_TO_PASS"]
    changed = [f for f in patch_files(config.get("test_patch") or "") if f.endswith(".py")]
    if kind == "django":
        labels = []
        for f in changed:
            if f.startswith("tests/"):
                labels.append(f[len("tests/") : -len(".py")].replace("/", "."))
        if not labels:
            labels = sorted({m.group(1) for t in tests for m in [re.search(r"\(([\w.]+)\)", t)] if m})
        return [
            "python",
            "./tests/runtests.py",
            "--verbosity",
            "2",
            "--settings=test_sqlite",
            "--parallel",
            "1",
        ] + labels
    if kind == "sympy":
        return ["bin/test", "-C", "--verbose"] + (changed or ["sympy"])
    files = sorted({t.split("::", 1)[0] for t in tests if "::" in t}) or changed
    return ["python", "-m", "pytest", "-rA", "-p", "no:cacheprovider"] + files


def parse(log, kind):
    """{test id: status} as SWE-bench's parsers read them."""
    status = {}
    lines = log.splitlines()
    if kind == "django":
        for i, line in enumerate(lines):
            m = re.match(
                r"^(.*?) \.\.\. (ok|OK|FAIL|ERROR|skipped.*|expected failure|unexpected success)$",
                line,
            )
            if not m:
                continue
            name, st = m.group(1), m.group(2)
            if not re.search(r"\([\w.]+\)$", name) and i > 0:  # a docstring line: the id is above
                name = lines[i - 1].strip()
            status[name.strip()] = "skipped" if st.startswith("skipped") else st
    elif kind == "sympy":
        for line in lines:
            m = re.match(r"^(test_\w+) (ok|F|E|f|X|s|Skip.*)$", line.strip())
            if m:
                status[m.group(1)] = "ok" if m.group(2) in ("ok", "f") else m.group(2)
    else:
        for line in lines:
            m = re.match(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S.*?)(?: - .*)?$", line)
            if m:
                status[m.group(2).strip()] = m.group(1)
    return status


def grade(config, status):
    def passed(t):
        return status.get(t) in PASS

    f2p = {t: passed(t) for t in config["FAIL_TO_PASS"]}
    p2p = {t: passed(t) for t in config["PASS_TO_PASS"]}
    return (1 if f2p and all(f2p.values()) and all(p2p.values()) else 0), f2p, p2p


def main(argv):
    with open(argv[1]) as fh:
        config = json.load(fh)
    repo = argv[2] if len(argv) > 2 else config.get("repo_dir", "/testbed")
    os.makedirs(LOGS, exist_ok=True)
    os.chdir(repo)
    report = {"instance_id": config.get("instance_id"), "applied": True}
    test_patch = config.get("test_patch") or ""
    if test_patch:
        for f in patch_files(test_patch):
            subprocess.call(["git", "checkout", config["base_commit"], "--", f], stderr=subprocess.DEVNULL)
        with open("/tmp/otbuild_test.patch", "w") as fh:
            fh.write(test_patch if test_patch.endswith("\n") else test_patch + "\n")
        if subprocess.call(["git", "apply", "-v", "/tmp/otbuild_test.patch"]) != 0:
            report["applied"] = False
    kind = runner(config)
    reward = 0
    if report["applied"]:
        cmd = command(config, kind)
        report["command"] = cmd
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        log = proc.stdout.decode("utf-8", "replace")
        with open(os.path.join(LOGS, "test_output.log"), "w") as fh:
            fh.write(log)
        reward, report["FAIL_TO_PASS"], report["PASS_TO_PASS"] = grade(config, parse(log, kind))
    with open(os.path.join(LOGS, "swe_report.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    with open(os.path.join(LOGS, "reward.txt"), "w") as fh:
        fh.write(f"{reward}\n")
    return 0 if reward else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
