"""The code reads one way (../shared/CONVENTIONS.md): ruff's lint rules and formatter, configured in
pyproject.toml, hold over the package, the benchmarks and the tests. Run here so that drift fails CI
instead of landing (five long lines and one unformatted module had landed before this test)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert exe is not None, "ruff is a test dependency (pyproject.toml [test])"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_ruff_check_passes():
    result = _ruff("check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is():
    result = _ruff("format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_a_long_line_and_an_unformatted_file_are_caught(tmp_path):
    """The checks can fail: the repository's settings on a 111-character line, and on `x=1`."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "long.py").write_text('x = "' + "a" * 105 + '"\n')
    checked = _ruff("check", "--no-cache", ".", cwd=tmp_path)
    assert checked.returncode == 1 and "E501" in checked.stdout, checked.stdout
    (tmp_path / "long.py").write_text('x = "a"\n')
    assert _ruff("check", "--no-cache", ".", cwd=tmp_path).returncode == 0
    (tmp_path / "cramped.py").write_text("x=1\n")
    formatted = _ruff("format", "--check", "--no-cache", ".", cwd=tmp_path)
    assert formatted.returncode == 1 and "cramped.py" in formatted.stdout + formatted.stderr, formatted.stdout
