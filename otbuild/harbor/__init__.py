"""Harbor integration (see docs/harbor.md).

- `otbuild.harbor.environment:OtbuildEnvironment`: otbuild's local sandbox as a Harbor
  environment (imported by Harbor, in Harbor's own Python 3.12 environment).
- `otbuild.harbor.ingest`: Harbor job/trial dirs -> trace rows (`read_job`, `read_trial`,
  `job_scores`).
- `otbuild.harbor.job`: write a Harbor job config, run `harbor run -c`, ingest the job dir
  (`harbor_command`, `run_harbor_job`).

Submodules are imported on demand: the environment must import without pyarrow (Harbor's
environment has only the standard library, Harbor, and otbuild installed with --no-deps).
"""
