"""scripts/test.sh runs the `vllm`-marked tests in .venv-vllm by collecting only the
``test_vllm*.py`` files (that venv lacks the main env's extras, so the whole tree does not
collect there).  A `vllm` test placed in any other file would silently never run."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent
MARK = re.compile(r"pytest\.mark\.vllm\b")


def test_every_vllm_marked_test_is_in_a_file_the_vllm_tier_collects():
    marked = {p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*.py") if MARK.search(p.read_text())}
    assert marked, "no test is marked vllm: the tier would collect nothing"
    strays = sorted(m for m in marked if not Path(m).name.startswith("test_vllm"))
    assert strays == [], f"vllm-marked tests outside test_vllm*.py never run in the vLLM tier: {strays}"


def test_the_test_script_collects_the_test_vllm_files():
    script = (TESTS.parent / "scripts" / "test.sh").read_text()
    assert "-name 'test_vllm*.py'" in script
