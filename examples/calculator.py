"""The calculator tool of the framework examples: the kind of plain Python function the AutoGen
and LangGraph docs hand to an agent as a tool.

It reads the expression with Python's ``ast`` parser and walks the tree itself, allowing only
integers, ``+ - *`` and parentheses: the model's text is never evaluated.  A bad expression is a
``ValueError``, which the framework reports to the agent as the tool's error.
"""

from __future__ import annotations

import ast
import operator

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_CHARS = 200  # longer input is refused before it is parsed
MAX_VALUE = 10**12  # no intermediate result may grow past this (a chain of products could)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with +, - and * (e.g. '3+4*2'); returns the value."""
    if len(expression) > MAX_CHARS:
        raise ValueError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return str(_value(tree.body))


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        v = _OPS[type(node.op)](_value(node.left), _value(node.right))
        if abs(v) > MAX_VALUE:
            raise ValueError(f"a result is larger than {MAX_VALUE}")
        return v
    raise ValueError(f"only integers, +, -, * and parentheses are allowed, not {type(node).__name__}")
