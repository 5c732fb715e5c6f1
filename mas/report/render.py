"""Jinja2 rendering for the report pages: one environment, autoescape on.

Every value that comes from a run (agent names, roles, model outputs, tool observations,
critic replies, warnings) reaches the page through a template with autoescape on, so it
shows as text.  The templates ship in ``mas/report/templates`` as package data.

The only script on a page is ``templates/toggle.js`` (legend entries hide and show curves).
``csp()`` is the page's Content-Security-Policy: scripts are allowed by that file's SHA-256
hash and nothing else, nothing is loaded from anywhere, and styles are inline.  Another page
(e.g. ``mas study``) can reuse all of this: ``environment("its.package")`` also finds that
package's ``templates/``, and its templates can ``{% extends "page.html.j2" %}``.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from functools import lru_cache
from importlib.resources import files
from typing import Any, Callable

from jinja2 import ChoiceLoader, Environment, PackageLoader, StrictUndefined
from markupsafe import Markup


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return (files("mas.report") / "templates" / name).read_text(encoding="utf-8")


def toggle_script() -> Markup:
    """The legend's toggle script, verbatim (its hash is in ``csp()``)."""
    return Markup(_asset("toggle.js"))


def script_hash(script: str) -> str:
    """A CSP source for an inline script: ``'sha256-<base64 digest of its exact text>'``."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


def csp() -> str:
    """The page's Content-Security-Policy: only the toggle script runs; nothing is fetched."""
    return ("default-src 'none'; script-src " + script_hash(toggle_script()) + "; style-src 'unsafe-inline'; "
            "img-src data:; base-uri 'none'; form-action 'none'")


def number(v: float) -> str:
    """Compact number for ticks and tooltips (no "-0")."""
    if v == 0 or abs(v) < 5e-13:
        return "0"
    a = abs(v)
    if a >= 1e4:
        return f"{v:.2e}"
    if a < 1e-3:
        return f"{v:.3g}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.3f}".rstrip("0").rstrip(".")


def finite(x: Any) -> bool:
    """A real number (not a bool, not NaN or infinite)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def show(v: Any) -> str:
    """A recorded value as text: yes/no, a compact number, — for none, a list joined by commas."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if finite(v):
        return number(float(v))
    if v is None:
        return "—"
    if isinstance(v, list):
        return ", ".join(show(x) for x in v)
    return str(v)


_ATTR_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def data_attrs(attrs: dict[str, Any]) -> Markup:
    """``data-*`` attributes; names must be plain (they are code's, not a run's), values are escaped."""
    out = []
    for k, v in attrs.items():
        if not _ATTR_NAME.match(k):
            raise ValueError(f"not a plain data attribute name: {k!r}")
        out.append(Markup(' data-{}="{}"').format(Markup(k), str(v)))
    return Markup("").join(out)


def slug(x: Any) -> str:
    """A value made safe for an ``id`` and a ``#`` link: letters, digits, ``_`` and ``-`` only."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(x))


@lru_cache(maxsize=None)
def environment(*packages: str) -> Environment:
    """The Jinja2 environment (autoescape on) that finds ``packages``' ``templates/`` first,
    then the report's own."""
    loader = ChoiceLoader([PackageLoader(p, "templates") for p in packages] + [PackageLoader("mas.report", "templates")])
    env = Environment(loader=loader, autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(number=number, show=show, data_attrs=data_attrs, slug=slug)
    env.tests["finite"] = finite
    env.globals.update(toggle_script=toggle_script, csp=csp, asset=lambda name: Markup(_asset(name)))
    return env


class Html(str):
    """Rendered HTML: a plain ``str`` (adding it to a string gives a string, as an f-string or
    ``+`` expects) that templates embed as it is instead of escaping it (``__html__``).  Only
    the functions here make one, from templates with autoescape on."""

    __slots__ = ()

    def __html__(self) -> str:
        return str(self)


def render(template: str, **context: Any) -> Html:
    """Render ``template`` of the report's environment; templates embed the result as it is."""
    return Html(environment().get_template(template).render(**context))


def macro(template: str, name: str) -> Callable[..., Html]:
    """A macro of a report template, callable from Python; its result is ``Html``."""
    fn = getattr(environment().get_template(template).module, name)
    return lambda *args, **kwargs: Html(fn(*args, **kwargs))
