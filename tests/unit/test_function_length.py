"""No function in the launcher (mgpucli/launch) runs past 60 lines: a longer one is split into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

import mgpucli

LIMIT = 60
LAUNCH = Path(mgpucli.__file__).parent / "launch"


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (N lines)`` for every function or method under ``root`` longer than ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_launch_function_is_over_60_lines():
    assert long_functions(LAUNCH, LIMIT) == []


def test_the_check_sees_a_long_function(tmp_path: Path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "long.py").write_text(f"def short():\n    pass\n\n\ndef too_long():\n{body}\n")
    assert long_functions(tmp_path, LIMIT) == [f"{tmp_path.name}/long.py:5 too_long ({LIMIT + 1} lines)"]
