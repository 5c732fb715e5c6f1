"""Read a YAML config with bounds: size, encoding, alias expansion and nesting depth.

``yaml.safe_load`` builds no objects from tags, but a small file can still cost a lot: an
alias names a node that is shared, not copied, so nine levels of ten aliases each (the
"billion laughs" file, a few hundred bytes) are 10^9 values to every consumer that walks the
data as a tree (pydantic, deep copies, JSON).  A recursive alias never ends.  Nesting a
thousand levels deep overflows the parser's recursion.  Every such file here is refused
before anything walks it, with a message that says why:

* the file is at most ``MAX_BYTES`` and UTF-8 (the position of the first bad byte is named);
* the document, with every alias expanded, has at most ``MAX_NODES`` nodes and no alias
  that contains itself;
* nothing is nested deeper than ``MAX_DEPTH``;
* no mapping has the same key twice (YAML forbids it, and PyYAML would keep the last value
  silently: ``steps: 20`` then ``steps: 200`` further down trains 200 steps).  A key a merge
  (``<<: *base``) brings in may still be overridden, as YAML means it to be.

The depth is counted on the parser's events and the size on the composed node graph (each
distinct node once, with the expanded size of its subtree), so the checks are linear in the
file and run before anything recurses into it.
"""

from __future__ import annotations

import yaml

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "YAMLBoundsError", "load_yaml_bytes"]

MAX_BYTES = 1_000_000
MAX_NODES = 100_000  # the largest shipped config has a few hundred
MAX_DEPTH = 64


class YAMLBoundsError(ValueError):
    """The file cannot be read as a config; the message says what is wrong and where."""


class _Loader(yaml.SafeLoader):
    """SafeLoader whose value errors name the line and column (a date 2024-13-45, a 5,000-digit int)."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except YAMLBoundsError:
            raise
        except (ValueError, OverflowError, TypeError) as e:
            raise YAMLBoundsError(f"{_where(node)}: a value cannot be read ({type(e).__name__}: {e})") from None

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    continue
                if earlier is not key_node:
                    raise YAMLBoundsError(f"{_where(key_node)}: the key {key!r} is given twice in this mapping "
                                          f"(first at {_where(earlier)}); YAML keeps only one of them, so remove the other")
        return super().construct_mapping(node, deep)


def _expanded_size(root: yaml.Node) -> int:
    """Nodes of the document with every alias expanded; raises on a cycle or too deep a nesting."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative post-order: a deep document cannot overflow this check
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if depth[key] > MAX_DEPTH:
                raise YAMLBoundsError(f"{_where(node)}: nested deeper than {MAX_DEPTH} levels")
            if size[key] > MAX_NODES:
                raise YAMLBoundsError(f"{_where(node)}: with its aliases expanded the document has more than "
                                      f"{MAX_NODES:,} values (a 'billion laughs' file?)")
            continue
        if key in size:
            continue
        if key in on_path:
            raise YAMLBoundsError(f"{_where(node)}: an alias refers to a node that contains it (a recursive structure)")
        on_path.add(key)
        stack.append((node, True))
        for kid in _children(node):
            if id(kid) in on_path:
                raise YAMLBoundsError(f"{_where(kid)}: an alias refers to a node that contains it (a recursive structure)")
            if id(kid) not in size:
                stack.append((kid, False))
    return size[id(root)]


def _check_depth(text: str) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` from the parser's event stream (the composer recurses
    once per level; the event parser does not), naming where the limit was crossed."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                raise YAMLBoundsError(f"line {mark.line + 1}, column {mark.column + 1}: nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _where(node: yaml.Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "<document>"


def load_yaml_bytes(raw: bytes) -> object:
    """The YAML document in ``raw`` (None for an empty one); ``YAMLBoundsError`` if it breaks a bound,
    ``yaml.YAMLError`` for a syntax error."""
    if len(raw) > MAX_BYTES:
        raise YAMLBoundsError(f"<root>: the file has {len(raw):,} bytes; a config has at most {MAX_BYTES:,}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise YAMLBoundsError(f"line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    _check_depth(text)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
