"""Settings: the pydantic models that describe a recipe and that several parts share, at the bottom.

The recipe's shared sections (`recipe.py`, `train.py`), the trial settings the teacher, eval and RL
share (`trials.py`, with the sandbox's `Limits` from `limits.py`), the engines' settings and
launch options (`engines.py`), the job settings several stages share (`stages.py`; a model one
stage alone uses is in its module, otbuild/stages/), and the rule that turns
settings into content ids (`base.py`). Nothing here imports otbuild outside this package
(`tests/test_imports.py`): recipe loading, the plan, engines, harness, sandbox, sources, train
and stages all import their settings from here. `limits.py` is standard library only (Harbor's
environment class imports the sandbox in Harbor's own Python), so this file imports nothing.
"""
