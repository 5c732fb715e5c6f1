"""Reading, overriding, validating and writing a run config: ``load_config(path, overrides, check)`` reads the
YAML file with the bounded reader, applies ``key.sub=value`` overrides, validates it as a ``RunConfig`` and
turns every problem into one ``ConfigError``; ``dump_config`` writes a config back as YAML.

This module sits above the schema (``mas.config.schema``), which it validates against.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from mas.config.messages import _UNION_TAGS, ConfigError, CrossFieldErrors, _format_pydantic, issue_lines
from mas.config.safe_yaml import YAMLBoundsError, load_yaml_bytes
from mas.config.schema import AgentConfig, ConfigCheck, PolicyConfig, RunConfig, TopologyConfig


def _switches_kind(item: str) -> bool:
    """True for an override of a section's kind: credit.method, topology.kind, env.name, policies.<p>.kind."""
    key = item.split("=", 1)[0].split(".")
    return (len(key) == 2 and _UNION_TAGS.get(key[0]) == key[1]) or (len(key) == 3 and key[0] == "policies" and key[2] == "kind")


# keys a policy of one kind may not carry (PolicyConfig._consistent): dropped when an override changes the kind
_POLICY_KIND_KEYS = {"lora": (), "full": ("lora",), "frozen": ("lora", "optim")}
_MISSING = object()


def _switch_kind(section: dict, tag: str, value: Any, policy: bool) -> None:
    """An override that changes a section's kind starts the section afresh: the old kind's keys
    would be unknown keys of the new one (credit.method=sharp after dr_mas's invalid_penalty).
    A policy keeps its model, device and the like, and drops only what the new kind forbids."""
    if section.get(tag, _MISSING) == value:
        return
    if policy:
        for key in _POLICY_KIND_KEYS.get(value, ()) if isinstance(value, str) else ():
            section.pop(key, None)
    else:
        section.clear()


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``key.sub=value`` overrides (value parsed as YAML) to a raw config dict.

    Overrides of a section's kind (``credit.method``, ``topology.kind``, ``env.name``,
    ``policies.<name>.kind``) are applied first, whatever their position, and replace the
    old kind's settings instead of merging them in (``_switch_kind``); the other overrides
    then set keys of the new section.
    """
    data = copy.deepcopy(data)
    for item in sorted(overrides, key=lambda it: not _switches_kind(it)):  # stable: kinds first
        if "=" not in item:
            raise ConfigError("overrides", [f"{item!r}: expected key.sub=value"])
        key, raw = item.split("=", 1)
        parts = key.split(".")
        if not all(parts):
            raise ConfigError("overrides", [f"{item!r}: empty key part; expected key.sub=value"])
        _check_policy_name(data, parts, key, overrides)
        cur: Any = data
        for i, p in enumerate(parts[:-1]):
            if isinstance(cur, list):
                cur = cur[_list_index(cur, p, key)]
            elif isinstance(cur, dict):
                cur = cur.setdefault(p, {})
            else:
                raise ConfigError("overrides", [f"{key}: {'.'.join(parts[:i])} is {cur!r}, not a section or list"])
        if not isinstance(cur, (dict, list)):
            raise ConfigError("overrides", [f"{key}: {'.'.join(parts[:-1])} is {cur!r}, not a section or list"])
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError("overrides", [f"{key}: value {raw!r} is not valid YAML ({getattr(e, 'problem', None) or e})"]) from None
        if isinstance(cur, list):
            cur[_list_index(cur, parts[-1], key)] = value
        else:
            if _switches_kind(item):
                _switch_kind(cur, parts[-1], value, policy=parts[0] == "policies")
            cur[parts[-1]] = value
    return data


def _check_policy_name(data: dict, parts: list[str], key: str, overrides: list[str]) -> None:
    """``policies.<name>.x=...`` names a policy of the file, or one the overrides add with its
    ``policies.<name>.model=...``: a misspelt name would otherwise start a new, incomplete policy
    and be reported as its missing model."""
    policies = data.get("policies")
    if parts[0] != "policies" or len(parts) < 3 or not isinstance(policies, dict) or parts[1] in policies:
        return
    if any(it.split("=", 1)[0] in (f"policies.{parts[1]}", f"policies.{parts[1]}.model") for it in overrides):
        return
    names = sorted(str(n) for n in policies)
    close = difflib.get_close_matches(parts[1], names, n=1)
    hint = f" did you mean {close[0]!r}?" if close else ""
    raise ConfigError("overrides", [f"{key}: no policy named {parts[1]!r};{hint} valid: {names} "
                                    f"(to add one, also set policies.{parts[1]}.model=...)"])


def _list_index(items: list, part: str, key: str) -> int:
    """A list element is addressed by its position or, for named entries (agents), by name."""
    if part.isdigit():
        if int(part) >= len(items):
            raise ConfigError("overrides", [f"{key}: index {part} out of range; the list has {len(items)} entries"])
        return int(part)
    for i, it in enumerate(items):
        if isinstance(it, dict) and it.get("name") == part:
            return i
    names = [it["name"] for it in items if isinstance(it, dict) and "name" in it]
    close = difflib.get_close_matches(part, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    valid = f" valid: {names} (or a position 0..{len(items) - 1})" if names else f" valid: a position 0..{len(items) - 1}"
    raise ConfigError("overrides", [f"{key}: no list entry named {part!r}{hint}{valid}"])


def validate_config(data: dict, source: str = "<config>", check: ConfigCheck | None = None) -> RunConfig:
    """``data`` as a ``RunConfig``: the schema and the references between sections, else a
    ``ConfigError`` with every problem.  ``check``: what the config means beyond its schema,
    run once the schema holds (``mas.config.checks.meaning_errors``: the topology's structure, parsers
    that cannot do their agent's job); this module cannot run it itself, since those checks
    need the topology modules, which import the config (docs/architecture.md, "Layering")."""
    if not isinstance(data, dict):
        raise ConfigError(source, [f"<root>: expected a mapping of sections, found {type(data).__name__}"])
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        lines = _format_pydantic(err, data, RunConfig)
        cross = any(isinstance((e.get("ctx") or {}).get("error"), CrossFieldErrors) for e in err.errors(include_url=False))
        if not cross:
            lines += issue_lines(_partial_cross_ref_errors(data))
        raise ConfigError(source, lines) from None
    issues = check(cfg) if check is not None else []
    if issues:
        raise ConfigError(source, issue_lines(issues))
    return cfg


def _partial_cross_ref_errors(data: dict) -> list[tuple[tuple, Any, str]]:
    """Cross-reference errors (RunConfig._cross_refs) of a config that also has field errors.

    pydantic runs the after-validator only when every field is valid, so a config with a
    misspelled key and an agent naming an undefined policy would report only the first.
    Here the references are checked on what can be read of the sections; an entry that does
    not validate takes part with only its name/policy (its own errors are reported already).
    """
    raw_policies, raw_agents = data.get("policies"), data.get("agents")
    if not isinstance(raw_policies, dict) or not isinstance(raw_agents, list):
        return []
    policies: dict[str, Any] = {}
    for name, raw in raw_policies.items():
        try:
            policies[name] = PolicyConfig.model_validate(raw)
        except ValidationError:
            policies[name] = PolicyConfig.model_construct(kind=None)
    agents, named = [], True
    for raw in raw_agents:
        raw = raw if isinstance(raw, dict) else {}
        name, policy = raw.get("name"), raw.get("policy")
        named = named and isinstance(name, str)
        agents.append(AgentConfig.model_construct(name=name if isinstance(name, str) else None,
                                                  policy=policy if isinstance(policy, str) else None))
    topology = None
    if named:  # the topology's agent references need every agent's name
        try:
            topology = TypeAdapter(TopologyConfig).validate_python(data.get("topology"))
        except ValidationError:
            pass  # its own errors are reported already
    partial = RunConfig.model_construct(policies=policies, agents=tuple(agents), topology=topology)
    try:
        partial._cross_refs()
    except CrossFieldErrors as e:  # entries without a name or policy were reported as missing
        return [(p, v, m) for p, v, m in e.errors if not (p[:1] == ("agents",) and v is None)]
    except Exception:  # a check that needs a section that did not validate: best effort only
        return []
    return []


def read_config_data(path: str | Path) -> Any:
    """The YAML file at ``path`` as data, unvalidated (``validate_config`` says what is wrong with
    it); a file that cannot be read or parsed is a ``ConfigError``."""
    path = Path(path)
    try:
        data = load_yaml_bytes(path.read_bytes())  # bounded: size, UTF-8, alias expansion, depth
    except FileNotFoundError:
        raise ConfigError(str(path), ["file not found"]) from None
    except OSError as e:  # a directory, no permission
        raise ConfigError(str(path), [f"cannot read: {getattr(e, 'strerror', None) or e}"]) from None
    except YAMLBoundsError as e:
        raise ConfigError(str(path), [str(e)]) from None
    except yaml.YAMLError as e:  # name the file where PyYAML says "<unicode string>"
        raise ConfigError(str(path), [f"YAML syntax: {str(e).replace('<unicode string>', str(path))}"]) from None
    return data or {}


def load_config(path: str | Path, overrides: list[str] | None = None, check: ConfigCheck | None = None) -> RunConfig:
    """The YAML file at ``path`` with ``overrides`` applied, validated (``validate_config``; ``check``
    as there)."""
    return validate_config(apply_overrides(read_config_data(path), overrides or []), str(path), check)


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False)
