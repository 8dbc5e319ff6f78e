"""No module of the project uses a name it never defines or imports.

Python finds such a name only when the line runs, and many lines here run only on a GPU (the
CuTe GEMM's paths, the device checks), which CI does not have: session 27's `persistent_ctas`
call in the FP8 lagged pass was missing its import and failed on the first GPU run. pyflakes reads
every file without running it; this test keeps only its undefined-name findings (unused imports
and the like are style, not failures).
"""
import ast
from pathlib import Path

from pyflakes import checker, messages

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proof", "kernels", "node_client", "miner", "tests")
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


def undefined_names(path: Path) -> list[str]:
    """pyflakes' undefined-name findings in one file, as 'path:line: message'."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = checker.Checker(tree, filename=str(path)).messages
    return [str(m) for m in found if isinstance(m, UNDEFINED)]


def test_the_checker_finds_a_missing_import(tmp_path) -> None:
    bad = tmp_path / "first_wave.py"
    bad.write_text("def first_wave():\n    return persistent_ctas(1)\n")
    assert any("undefined name 'persistent_ctas'" in m for m in undefined_names(bad))


def test_no_module_uses_an_undefined_name() -> None:
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert len(files) > 200
    problems = [m for path in files for m in undefined_names(path)]
    assert not problems, "\n".join(problems)
