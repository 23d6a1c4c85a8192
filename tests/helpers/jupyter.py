"""A real JupyterLab and a real headless Chromium, for the browser tests.

``jupyterlab(root, scratch)`` starts JupyterLab (``app="notebook"``: Notebook 7) on a free
local port with every Jupyter directory in a temporary one; ``browser(scratch)`` opens the
system's headless Chromium with Playwright (nothing is downloaded). ``run_notebook(page, lab,
name)`` opens a notebook, waits for its kernel and runs every cell; ``kernel_run(page, code)``
runs code in that kernel and returns what it printed. Made for tests and benchmarks: nothing
here is part of graphsurgeon.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Flags that keep a headless Chromium quiet on a machine without a network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "out" / "screenshots"  # the repository's out/
# What a browser test needs; `make setup` installs both.
MISSING = (
    "the browser tests need Chromium and graphviz (make setup installs both)"
    if CHROMIUM is None or shutil.which("dot") is None
    else ""
)


def write_notebook(path: Path, cells: list[str]) -> Path:
    """A notebook of code ``cells`` for the python3 kernel, written to ``path``."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(notebook, path)
    return path


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    app: str = "lab"  # "lab" (JupyterLab) or "notebook" (Notebook 7)

    def notebook_url(self, name: str) -> str:
        if self.app == "notebook":
            return f"{self.url}/notebooks/{name}?token={self.token}"
        return f"{self.url}/lab/tree/{name}?reset&token={self.token}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyterlab(root: Path, scratch: Path, app: str = "lab") -> Iterator[Lab]:
    """JupyterLab (or, with ``app="notebook"``, Notebook 7) serving ``root``, its state and
    home in ``scratch``; stopped on exit."""
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    for name, sub in (
        ("HOME", "home"),
        ("IPYTHONDIR", "ipython"),
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("TMPDIR", "tmp"),
    ):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(scratch / sub)
    # The kernel runs in this very Python, where graphsurgeon is installed.
    kernels = scratch / "data" / "kernels" / "python3"
    kernels.mkdir(parents=True, exist_ok=True)
    (kernels / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3",
                "language": "python",
            }
        )
    )
    command = [
        sys.executable,
        "-m",
        "jupyterlab" if app == "lab" else "notebook",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
    ]
    if app == "lab":
        command += [
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
        ]
    settings_app = "LabApp" if app == "lab" else "JupyterNotebookApp"
    command += [
        f"--{settings_app}.expose_app_in_browser=True",
        f"--{settings_app}.user_settings_dir={scratch / 'settings'}",
        f"--{settings_app}.workspaces_dir={scratch / 'workspaces'}",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    # Render every cell (JupyterLab 4 skips the layout of cells out of view by default, and
    # then they have neither size nor text to measure).
    settings = scratch / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    notices = scratch / "settings" / "@jupyterlab" / "apputils-extension"
    notices.mkdir(parents=True, exist_ok=True)  # no "get notified about news?" toast
    (notices / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    log = open(scratch / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise RuntimeError(
                        "JupyterLab did not start:\n" + (scratch / "jupyterlab.log").read_text()
                    ) from None
                time.sleep(0.3)
        yield Lab(url, token, root, app)
    finally:
        with contextlib.suppress(OSError):
            request = urllib.request.Request(
                f"{url}/api/shutdown?token={token}", method="POST", data=b""
            )
            urllib.request.urlopen(request, timeout=5).close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@contextlib.contextmanager
def browser(scratch: Path):
    """A Playwright page in the system's headless Chromium, with a profile of its own."""
    from playwright.sync_api import sync_playwright

    home = scratch / "browser-home"
    home.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            user_data_dir=str(scratch / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            env={
                **os.environ,
                "HOME": str(home),
                "XDG_CONFIG_HOME": str(home),
                "XDG_CACHE_HOME": str(home),
            },
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(120_000)
            yield page
        finally:
            context.close()


def run_notebook(page, lab: Lab, name: str) -> None:
    """Open notebook ``name``, wait for its kernel, run every cell and wait until all ran."""
    page.goto(lab.notebook_url(name))
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget")
    if lab.app == "lab":  # the notebook, full width
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
    # Cells run before the kernel is connected execute nothing: wait for it first.
    page.wait_for_function(
        """async () => {
            const panel = window.jupyterapp.shell.currentWidget;
            if (!panel || !panel.sessionContext) return false;
            await panel.sessionContext.ready;
            const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
            if (!kernel) return false;
            await kernel.info;
            return kernel.status === 'idle';
        }"""
    )
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    # Done when every code cell has an execution count and the kernel is idle again.
    page.wait_for_function(
        """() => {
            const panel = window.jupyterapp.shell.currentWidget;
            const cells = panel.content.widgets.filter(c => c.model.type === 'code');
            const kernel = panel.sessionContext.session.kernel;
            return cells.length > 0 && kernel.status === 'idle' &&
                cells.every(c => c.model.executionCount !== null);
        }""",
        timeout=300_000,
    )


def screenshot(page, name: str, **options) -> Path:
    """Save a screenshot under out/screenshots/ (not committed) and return its path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), **options)
    return path


def kernel_run(page, code: str) -> str:
    """Run ``code`` in the open notebook's kernel (not in a cell) and return what it printed;
    an exception's name and message are returned too, so a test can show them."""
    return page.evaluate(
        """async (code) => {
            const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
            let out = "";
            const future = kernel.requestExecute({code, silent: false, store_history: false});
            future.onIOPub = (msg) => {
                if (msg.header.msg_type === "stream") out += msg.content.text;
                if (msg.header.msg_type === "error") out += msg.content.ename + ": " + msg.content.evalue;
            };
            await future.done;
            return out;
        }""",
        code,
    )
