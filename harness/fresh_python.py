"""Code run in a fresh Python interpreter, for what only a new process shows: the modules an
import or a load brings in."""
import subprocess
import sys


def last_line(script: str, timeout: float = 300) -> str:
    """The last line the script prints, run with this interpreter; AssertionError with its
    stderr when it fails."""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]
