"""The podman backend: a trial in a long-lived container of the task's own image.

Its parts: `cli` (whether podman can run here, one call of it), `images` (the task's image,
built, cached, pulled or loaded), `network` (the podman network of each phase, from task.toml's
policy), `container` (the trial's container, the sandbox its commands run in).
"""
