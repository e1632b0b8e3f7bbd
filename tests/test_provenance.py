"""Provenance records: every file of an artifact is covered, edits in place are caught, and
`verify` rehashes instead of trusting the digest cache."""

import json
import os
import shutil

from otbuild import hashing
from otbuild.provenance import check, write_record


def _artifact(tmp_path, stage, files):
    outdir = tmp_path / "artifacts" / stage / ("a" * 16)
    outdir.mkdir(parents=True)
    for name, data in files.items():
        (outdir / name).write_bytes(data)
    write_record(
        {"stage": stage, "id": "a" * 16, "settings": {}, "inputs": [], "outdir": str(outdir)},
        stage,
        "2026-01-01T00:00:00+00:00",
        {},
    )
    return outdir


def _flip_in_place(path, at=3):
    """Change one byte, same inode and size, and put the mtime back."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_a_checkpoints_config_and_tokenizer_are_covered(tmp_path):
    files = {
        "checkpoint.json": b"{}",
        "model.safetensors": b"weights",
        "train_log.jsonl": b"{}\n",
        "config.json": b'{"hidden_size": 64}',
        "tokenizer.json": b'{"model": {"vocab": {}}}',
    }
    outdir = _artifact(tmp_path, "sft", files)
    (outdir / ".sft_settings.json").write_text("{}")  # hidden: not part of the artifact
    assert check(outdir, "sft").status == "ok"
    for name in ("tokenizer.json", "config.json"):
        _flip_in_place(outdir / name)
        c = check(outdir, "sft")
        assert c.status == "drifted" and name in c.detail, c


def test_a_byte_flipped_in_place_with_size_and_mtime_kept_is_caught(tmp_path):
    outdir = _artifact(tmp_path, "report", {"report.html": b"0123456789", "dataset_card.md": b"abcdefghij"})
    assert check(outdir, "report").status == "ok"  # the digests are cached now
    _flip_in_place(outdir / "dataset_card.md")
    assert check(outdir, "report").status == "drifted"
    assert check(outdir, "report", verify=True).status == "drifted"


def test_verify_rehashes_instead_of_trusting_the_cache(tmp_path):
    outdir = _artifact(tmp_path, "report", {"report.html": b"0123456789", "dataset_card.md": b"abcdefghij"})
    path = outdir / "report.html"
    recorded = hashing.file_sha256(path)
    path.write_bytes(b"9876543210")  # a stale cache entry for the new state (a tampered or copied
    cache = hashing._load_cache()  # cache, a filesystem with coarse timestamps)
    for key in [k for k in cache if k.startswith(f"{path.resolve()}|")]:
        del cache[key]
    hashing.file_sha256(path)
    cache.update({k: recorded for k in cache if k.startswith(f"{path.resolve()}|")})
    assert check(outdir, "report").status == "ok"  # what the cache says
    c = check(outdir, "report", verify=True)
    assert c.status == "drifted" and "report.html" in c.detail


def test_code_drift_names_the_changed_module_of_any_depth(tmp_path, monkeypatch):
    """The record hashes every otbuild module a stage imports (here SFT's trainer, two
    imports away from the stage module), and the audit names the one that changed."""
    from otbuild import codehash

    copy = tmp_path / "pkg" / "otbuild"
    shutil.copytree(codehash.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(codehash, "PACKAGE", copy)
    files = codehash.code_files("sft")
    assert {
        "otbuild/stages/sft.py",
        "otbuild/train/sft.py",
        "otbuild/train/chat.py",
        "otbuild/templates/qwen3_chat.j2",
    } <= files.keys()
    assert {"otbuild/harness/trial.py", "otbuild/engines/openai.py"} <= codehash.code_files("rollout").keys()
    assert "otbuild/sources/nl2bash.py" in codehash.code_files("source")

    outdir = _artifact(tmp_path, "sft", {"checkpoint.json": b"{}", "model.safetensors": b"w", "train_log.jsonl": b""})
    assert not check(outdir, "sft").code_drift
    with open(copy / "train" / "sft.py", "a") as f:
        f.write("\n# a later edit\n")
    c = check(outdir, "sft")
    assert c.status == "ok" and c.code_drift and c.code_changed == ("otbuild/train/sft.py",)
    packages = json.loads((outdir / "provenance.json").read_text())["packages"]
    assert {"torch", "transformers", "deepspeed"} <= packages.keys()
