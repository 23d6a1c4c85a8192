"""Run the tutorial notebooks and store their fresh outputs, without run-specific metadata.

    python tools/refresh-notebooks.py [notebooks/01-*.ipynb ...]

Strict nbval (make test) compares every stored output with a fresh run, so the committed
notebooks must hold the outputs of the code as it is. Timing metadata and saved widget state are
dropped: they change on every run and say nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def refresh(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": path.parent}}
    )
    client.execute()
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)
    print(f"{path}: {sum(c.cell_type == 'code' for c in notebook.cells)} code cells run")


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    paths = [Path(a) for a in argv] or sorted((root / "notebooks").glob("*.ipynb"))
    with tempfile.TemporaryDirectory() as home:
        # Jupyter and IPython write into the home directory: keep the run hermetic.
        os.environ.update(HOME=home, IPYTHONDIR=f"{home}/ipython", MPLCONFIGDIR=f"{home}/mpl")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        for path in paths:
            refresh(path.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
