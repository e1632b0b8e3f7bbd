"""Read a recipe's YAML and its `extends:` chain into one document, remembering which file set
each key (`origin`: key path -> file) so that an error can name it."""

from __future__ import annotations

from pathlib import Path

import yaml

from otbuild.errors import ConfigError
from otbuild.recipe.messages import suggest

# A recipe is a few hundred values; aliases may not expand it beyond this (a YAML "billion
# laughs" would otherwise take gigabytes once hashed or written out), nor nest deeper than
# MAX_YAML_DEPTH (the parser recurses per level).
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 100


class RecipeLoader(yaml.SafeLoader):
    """safe_load that refuses a duplicate key (YAML keeps the last one silently), nesting
    deeper than MAX_YAML_DEPTH and aliases that are recursive or expand beyond MAX_YAML_VALUES."""

    depth = 0

    def compose_node(self, parent, index):
        if self.depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", self.peek_event().start_mark
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_document(self, node):
        _expanded_size(node, {}, set())
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        first: dict = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key, line = self.construct_scalar(key_node), key_node.start_mark.line + 1
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}, first set on line {first[key]}", key_node.start_mark
                    )
                first[key] = line
        return super().construct_mapping(node, deep)


def _expanded_size(node: yaml.Node, sizes: dict, open_: set) -> int:
    """How many values `node` holds with every alias expanded."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_:
        raise yaml.constructor.ConstructorError(None, None, "an alias refers to itself", node.start_mark)
    open_.add(id(node))
    kids = (
        [x for kv in node.value for x in kv]
        if isinstance(node, yaml.MappingNode)
        else (node.value if isinstance(node, yaml.SequenceNode) else [])
    )
    n = 1 + sum(_expanded_size(k, sizes, open_) for k in kids)
    open_.discard(id(node))
    if n > MAX_YAML_VALUES:
        raise yaml.constructor.ConstructorError(
            None, None, f"aliases expand to more than {MAX_YAML_VALUES} values", node.start_mark
        )
    sizes[id(node)] = n
    return n


def _read_yaml(path: Path) -> dict:
    try:
        doc = yaml.load(path.read_bytes(), Loader=RecipeLoader)
    except yaml.reader.ReaderError as e:  # bytes that are not UTF-8 (or UTF-16) text
        raise ConfigError(f"{path}: byte {e.position}: not valid YAML (not UTF-8 text: {e.reason})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(e, 'problem', e)})") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top, found {type(doc).__name__}")
    return doc


def read_chain(path: Path, seen: list[Path]) -> tuple[dict, dict]:
    """The recipe at `path` merged over those it extends (`seen`: the files below it, for
    cycles), and its origin: key path -> the file that set it."""
    if path.resolve() in seen:
        chain = " -> ".join(str(p) for p in [*seen, path.resolve()])
        raise ConfigError(f"{path}: extends: cycle ({chain})")
    doc = _read_yaml(path)
    parent_name = doc.pop("extends", None)
    if parent_name is None:
        base: dict = {}
        origin: dict = {}
    else:
        if not isinstance(parent_name, str):
            raise ConfigError(f"{path}: extends: expected a recipe name, found {parent_name!r}")
        parent = path.parent / f"{parent_name}.yaml"
        if not parent.is_file():
            known = sorted(q.stem for q in path.parent.glob("*.yaml"))
            raise ConfigError(f"{path}: extends: no recipe {parent_name!r}" + suggest(parent_name, known, "recipes"))
        base, origin = read_chain(parent, [*seen, path.resolve()])
    return merge(base, doc, origin, path, ()), origin


def merge(base: dict, over: dict, origin: dict, path: Path, prefix: tuple) -> dict:
    """Deep merge: mappings merge key by key, anything else replaces; `null` deletes a key."""
    out = dict(base)
    for key, value in over.items():
        loc = (*prefix, key)
        if value is None:
            out.pop(key, None)
            origin[loc] = path
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value, origin, path, loc)
        else:
            out[key] = value
            for k in [k for k in origin if k[: len(loc)] == loc]:
                del origin[k]
            origin[loc] = path
    return out
