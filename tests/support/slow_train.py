"""`python tests/support/slow_train.py SECONDS sft|rl ...`: `python -m otbuild.train sft|rl ...` with each
training step SECONDS longer, so that a test can kill a run between two steps
(tests/train/test_sft.py). The step of the trainer's `Trainer` (otbuild/train/loop.py) is wrapped."""

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's otbuild
from otbuild.train.__main__ import main  # noqa: E402
from otbuild.train.loop import Trainer  # noqa: E402


def slow_steps(kind: str, seconds: float) -> None:
    importlib.import_module(f"otbuild.train.{kind}")
    for cls in Trainer.__subclasses__():

        def step(self, n, _step=cls.step):
            rec = _step(self, n)
            time.sleep(seconds)
            return rec

        cls.step = step


if __name__ == "__main__":
    slow_steps(sys.argv[2], float(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
