"""Prompt templates (jinja2) shipped in otbuild/templates/."""

from __future__ import annotations

from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).parent / "templates"
_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
)


def render(template: str, **ctx) -> str:
    return _env.get_template(template).render(**ctx)
