"""How a config's problems are written: ``ConfigError`` (one line per problem: the YAML path, the value
found, what is valid) and the lines made from pydantic's errors and from the checks across sections.

This module sits below the schema (``mas.config.schema`` raises ``CrossFieldErrors`` from its validator),
so the functions that walk the schema take its root model, the ``RunConfig``, as an argument.
"""

from __future__ import annotations

import difflib
import functools
import reprlib
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """Every problem in a config, one line each: YAML path, value found, what is valid."""

    def __init__(self, source: str, lines: list[str]):
        self.lines = lines
        super().__init__(f"{source}: {len(lines)} error(s)\n" + "\n".join(f"  - {line}" for line in lines))


class CrossFieldErrors(ValueError):
    """Problems found by the checks across a config's sections (``mas.config.crossrefs``), each ``(YAML path, value
    found, message)``: raised from RunConfig's validator, so pydantic carries them in its ``ValidationError``, and
    ``_format_pydantic`` writes them as they are."""

    def __init__(self, errors: list[tuple[tuple, Any, str]]):
        self.errors = errors
        super().__init__("; ".join(issue_lines(errors)))


_SHOW = reprlib.Repr()
# a string up to 400 characters (a model or data path in a deep folder) is shown whole: an error
# that cuts the path out of its own message does not say which file; longer ones are cut
_SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong, _SHOW.maxlevel = 400, 80, 40, 3
_SHOW.maxlist = _SHOW.maxtuple = _SHOW.maxdict = _SHOW.maxset = 6


def _show(value: Any) -> str:
    """A value found in a config, as a short repr: a 10^5-item list or a 5,000-digit number is cut, not printed."""
    try:
        return _SHOW.repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int too long to convert to text
        return f"<{type(value).__name__}>"


def _path(loc: tuple, data: Any = None) -> str:
    """``agents[0].policy``: list indices in brackets, keys after dots.  With ``data`` (the raw
    config) an int is a list index only where the data holds a list (``{0: x}`` has a key 0)."""
    out, cur = "", data
    for part in loc:
        index = isinstance(part, int) and (data is None or isinstance(cur, list))
        if not index and isinstance(cur, dict) and part in cur:  # the key as written (pydantic reports `false:` as 0)
            part = next((k for k in cur if k == part), part)
        out += f"[{part}]" if index else (f".{part}" if out else str(part))
        if data is not None:
            try:
                cur = cur[part]
            except (KeyError, IndexError, TypeError):
                cur = None
    return out or "<root>"


def issue_lines(issues: list[tuple[tuple, Any, str]]) -> list[str]:
    """``(YAML path, value found, message)`` triples as the lines of a ``ConfigError``."""
    return [f"{_path(p)}: {m} (found {_show(v)})" for p, v, m in issues]


def _format_pydantic(err: ValidationError, data: dict, root: type[BaseModel]) -> list[str]:
    """pydantic's errors of validating ``data`` as ``root`` (the RunConfig), one line each: the YAML path, what is
    wrong, and the valid choices or keys where there is a fixed set."""
    lines = []
    for e in err.errors(include_url=False):
        ctx = e.get("ctx") or {}
        inner = ctx.get("error")
        if isinstance(inner, CrossFieldErrors):
            lines += issue_lines(inner.errors)
            continue
        # drop the union tag pydantic inserts for discriminated unions (e.g. credit.dr_mas.eps)
        loc = _strip_tag(data, tuple(e["loc"]))
        msg = e["msg"]
        found = e.get("input")
        if e["type"] == "extra_forbidden":
            valid = _valid_keys_at(root, data, loc[:-1])
            # a key of another section (trainer.lr) first: a near miss in this one would mislead
            elsewhere = [p for p in _key_paths(root).get(str(loc[-1]), []) if p != _generic_path(root, data, loc)][:3]
            close = elsewhere or difflib.get_close_matches(str(loc[-1]), valid or [], n=1)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            msg = f"unknown key{'; ' + hint + 'valid: ' + str(valid) if valid else ''}"
        elif e["type"] == "value_error":  # our own validators' messages say everything already
            msg = msg.removeprefix("Value error, ")
        elif e["type"] == "literal_error" and "expected" in ctx:
            msg = f"invalid value; valid: {ctx['expected']}"
        elif e["type"] == "union_tag_invalid":  # found: the bad tag, not the whole section
            tag = ctx.get("discriminator", "tag").strip("'")
            msg = f"unknown {tag}; valid: {ctx.get('expected_tags')}"
            loc, found = loc + (tag,), ctx.get("tag", found)
        elif e["type"] == "union_tag_not_found":  # e.g. credit without 'method'
            tag = ctx.get("discriminator", "tag").strip("'")
            tags = _union_tags(root, data, loc, tag)
            lines.append(f"{_path(loc + (tag,))}: missing required field{'; valid: ' + tags if tags else ''}")
            continue
        where = _path(loc, data)
        lines.append(f"{where}: {msg} (found {_show(found)})" if e["type"] != "missing" else f"{where}: missing required field")
    return lines


_UNION_TAGS = {"topology": "kind", "env": "name", "credit": "method"}  # the discriminated-union sections


def _strip_tag(data: dict, loc: tuple) -> tuple:
    """Drop the union tag pydantic inserts after a discriminated section (topology.<kind>.x -> topology.x).

    Only position 1 under those sections can be a tag, so a field that happens to share the
    tag's name (the orchestrator topology's ``orchestrator`` field) is never dropped.
    """
    if len(loc) >= 2 and loc[0] in _UNION_TAGS:
        section = data.get(loc[0]) if isinstance(data, dict) else None
        if isinstance(section, dict) and loc[1] == section.get(_UNION_TAGS[loc[0]]):
            return loc[:1] + loc[2:]
    return loc


def _lookup(data: Any, loc: tuple) -> Any:
    cur = data
    for p in loc:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return None
    return cur


def _annotation_at(root: type[BaseModel], data: dict, loc: tuple) -> Any:
    """The type annotation of the value at YAML path ``loc`` in a ``root`` model, the RunConfig (None if unknown).

    Walks the models field by field; a dict or tuple annotation consumes one path part (a
    policy name, a list index) and goes on with its value type; a discriminated union is
    resolved by the tag found in the data at that point.
    """
    ann: Any = root
    for k, part in enumerate(loc):
        if get_origin(ann) in (dict, tuple, list):
            args = [a for a in get_args(ann) if a is not Ellipsis]
            if not args:
                return None
            ann = args[-1]
            continue
        model = _model_in(ann, _lookup(data, loc[:k]))
        if model is None:
            return None
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        if part not in fields:
            return None
        ann = fields[part].annotation
    return ann


def _container(ann: Any) -> Any:
    """dict, tuple or list where ``ann`` (through Optional and Annotated) is one of them, else None."""
    origin = get_origin(ann)
    if origin in (dict, tuple, list):
        return origin
    if origin is Annotated:
        return _container(get_args(ann)[0])
    if origin is Union or isinstance(ann, types.UnionType):
        return next((c for a in get_args(ann) if a is not type(None) for c in [_container(a)] if c), None)
    return None


def _generic_path(root: type[BaseModel], data: dict, loc: tuple) -> str:
    """``loc`` as ``_key_paths`` writes it: a policy's name as ``<name>``, a list index as ``[<i>]``."""
    out = ""
    for k, part in enumerate(loc):
        kind = _container(_annotation_at(root, data, loc[:k])) if k else None
        out += "[<i>]" if kind in (tuple, list) else (".<name>" if kind is dict else (f".{part}" if out else str(part)))
    return out


def _submodels(ann: Any, suffix: str = "") -> list[tuple[type[BaseModel], str]]:
    """The models ``ann`` holds, each with the path part its container adds (``.<name>``, ``[<i>]``)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [(ann, suffix)]
    origin = get_origin(ann)
    args = [a for a in get_args(ann) if a is not Ellipsis and a is not type(None)]
    if origin is dict and args:
        return _submodels(args[-1], suffix + ".<name>")
    if origin in (tuple, list):
        return [m for a in args for m in _submodels(a, suffix + "[<i>]")]
    return [m for a in args for m in _submodels(a, suffix)]  # unions, Annotated (its metadata holds no model)


@functools.cache
def _key_paths(root: type[BaseModel]) -> dict[str, list[str]]:
    """Every key of the schema (``root``, the RunConfig) -> where it is valid, in schema order: lr -> [policies.<name>.optim.lr,
    trainer.warmup.lr].  An unknown key that is valid elsewhere is told where."""
    paths: dict[str, list[str]] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = field.alias or name
            path = f"{prefix}.{key}" if prefix else key
            if path not in paths.setdefault(key, []):
                paths[key].append(path)
            for sub, suffix in _submodels(field.annotation):
                walk(sub, path + suffix)

    walk(root, "")
    return paths


def _valid_keys_at(root: type[BaseModel], data: dict, loc: tuple) -> list[str]:
    """Field names (YAML keys) of the model that sits at ``loc`` in a ``root`` model (the RunConfig)."""
    model = _model_in(_annotation_at(root, data, loc), _lookup(data, loc))
    if model is None:
        return []
    return sorted((f.alias or n) for n, f in model.model_fields.items())


def _union_tags(root: type[BaseModel], data: dict, loc: tuple, tag: str) -> str:
    """The valid values of discriminator ``tag`` of the union at ``loc``, quoted as pydantic does."""
    out: list[str] = []
    for m in get_args(_annotation_at(root, data, loc)):
        f = getattr(m, "model_fields", {}).get(tag)
        out += [repr(v) for v in get_args(f.annotation)] if f is not None else []
    return ", ".join(out)


def _model_in(ann: Any, parent: Any) -> Any:
    """Resolve an annotation to the BaseModel it holds (unwrapping Optional, tuple, dict, unions)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    args = [a for a in get_args(ann) if a is not type(None)]
    if get_origin(ann) in (dict, tuple, list) and args:
        return _model_in(args[-1] if args[-1] is not Ellipsis else args[0], parent)
    models = [m for a in args for m in [_model_in(a, parent)] if isinstance(m, type) and issubclass(m, BaseModel)]
    if len(models) == 1:
        return models[0]
    if isinstance(parent, dict):  # a discriminated union: choose by the tag found in the data
        for m in models:
            for tag in ("method", "kind", "name"):
                f = m.model_fields.get(tag)
                if f is not None and parent.get(tag) in get_args(f.annotation):
                    return m
    return models[0] if models else None
