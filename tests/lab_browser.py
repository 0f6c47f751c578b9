"""JupyterLab on 127.0.0.1 and headless Chromium driving its UI, for ``tests/test_browser.py``.

``Lab`` starts ``jupyter lab`` (from the interpreter's own bin folder) on a free port with a random token, in a
fresh settings, workspaces and runtime folder, and stops it with every kernel it started. The page helpers speak
to the real UI: menu clicks by their Lumino command ids, waits on the DOM, no fixed sleeps.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from mimo_kit.dist import free_port

# The page's view of the current notebook, read from the exposed application (``--LabApp.expose_app_in_browser``):
# JupyterLab renders an ``error`` output, like a stream on stderr, as a ``.jp-OutputArea-output`` with
# data-mime-type application/vnd.jupyter.stderr, so no selector tells a traceback from a warning. The error
# outputs are found through the output area's model (type "error") and reported by the text of the DOM node that
# shows them; TRACEBACK_JS is a second, model-free check on the rendered text of every stderr output.
PANEL_JS = """
const app = window.jupyterapp;
const panel = app && app.shell.currentWidget;
if (!panel || !panel.content || !panel.sessionContext || panel.context.path !== arguments[0]) { return null; }
const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
const cells = panel.content.widgets.filter(c => c.model.type === 'code');
const errors = [];
for (const cell of cells) {
  const outputs = cell.outputArea.model;
  for (let j = 0; j < outputs.length; j++) {
    if (outputs.get(j).type === 'error') { errors.push(cell.outputArea.widgets[j].node.innerText); }
  }
}
const indicator = panel.node.querySelector('.jp-Notebook-ExecutionIndicator');
return {
  kernel: kernel ? kernel.status : null,
  connection: kernel ? kernel.connectionStatus : null,
  indicator: indicator ? indicator.getAttribute('data-status') : null,
  prompts: [...panel.node.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.innerText.trim()),
  code_cells: cells.length,
  dirty: panel.context.model.dirty,
  errors: errors,
};
"""

TRACEBACK_JS = """
const panel = window.jupyterapp.shell.currentWidget;
return [...panel.node.querySelectorAll(
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
  .map(e => e.innerText).filter(t => t.includes('Traceback (most recent call last)'));
"""

STDERR_JS = """
const panel = window.jupyterapp.shell.currentWidget;
return [...panel.node.querySelectorAll(
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')].map(e => e.innerText);
"""

PROMPT = re.compile(r"\[\d+\]:")


class Fatal(RuntimeError):
    """Raised by a ``wait_for`` predicate when waiting longer cannot help (the server exited)."""


def wait_for(predicate, *, timeout: float, what: str, interval: float = 0.25):
    """Poll ``predicate`` until it returns something truthy; raise naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Fatal:
            raise
        except Exception as err:  # the page or server not ready yet
            last_error = err
        if time.monotonic() > deadline:
            extra = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"waited {timeout:.0f} s for {what}{extra}")
        time.sleep(interval)


class Lab:
    """One ``jupyter lab`` server on 127.0.0.1 serving ``root``; ``env`` reaches its kernels."""

    def __init__(self, root: Path, *, python: str, env: dict[str, str]):
        self.root = Path(root)
        self.python = python
        self.env = env
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.home = self.root.parent / (self.root.name + "-jupyter")
        self.log_path = self.home / "lab.log"
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str) -> str:
        return f"{self.base}/lab/tree/{notebook}?token={self.token}"

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def _write_settings(self) -> Path:
        """User settings that make the page deterministic: every cell in the DOM, no news or update toasts."""
        settings = self.home / "settings"
        for plugin, values in {
            "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
            "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        }.items():
            path = settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        return settings

    def start(self, timeout: float = 180) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env)
        env.update(
            MPLBACKEND="module://matplotlib_inline.backend_inline",
            JUPYTERLAB_SETTINGS_DIR=str(self._write_settings()),
            JUPYTERLAB_WORKSPACES_DIR=str(self.home / "workspaces"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
        )
        jupyter = Path(self.python).parent / "jupyter"
        cmd = [str(jupyter), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root}", "--LabApp.news_url=None", "--LabApp.expose_app_in_browser=True"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
            cmd.append("--allow-root")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

        def answers():
            if self.proc.poll() is not None:
                raise Fatal(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            return self.api("/api/status")

        try:
            wait_for(answers, timeout=timeout, what=f"jupyter lab on {self.base}/api/status")
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{self.log_tail()}") from None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30) -> None:
        """Shut the server down with its kernels; whatever is left of its process tree is killed."""
        if self.proc is None:
            return
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        if self.proc.poll() is None:
            try:
                for kernel in self.api("/api/kernels"):
                    self.api(f"/api/kernels/{kernel['id']}", method="DELETE")
            except (OSError, urllib.error.URLError, ValueError):
                pass  # the server is not answering: signals below
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        for child in tree:  # kernels run in their own sessions, outside the server's process group
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(tree, timeout=timeout)
        self.proc = None


def system_browser() -> tuple[str, str]:
    """(chromium, chromedriver) from the system, or skip (fail under ``CI``) naming what is missing."""
    import shutil

    import pytest

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or next(
        (p for p in ("/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver") if os.access(p, os.X_OK)), None)
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver)) if not path]
    hints = ["`apt-get install chromium chromium-driver`"] if missing else []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
        hints.append("`pip install -e .[dev]`")
    if missing:
        reason = f"browser test needs {', '.join(missing)}; install with {' and '.join(hints)}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {reason}")
        pytest.skip(reason)
    return chromium, driver


def start_chromium(chromium: str, chromedriver: str, *, profile: Path, offline: bool = False):
    """Headless Chromium through the system chromedriver, both by path: selenium-manager must not run.
    ``offline``: no host name resolves, so a page that needs anything from the network shows it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common import selenium_manager

    def refuse(self, *args, **kwargs):
        raise AssertionError("selenium-manager was asked for a browser or driver; both must come from the system")

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", f"--user-data-dir={profile}", "--no-first-run",
                "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                *(["--host-resolver-rules=MAP * ~NOTFOUND"] if offline else [])):
        options.add_argument(arg)
    service = Service(executable_path=chromedriver)
    original = selenium_manager.SeleniumManager.binary_paths
    selenium_manager.SeleniumManager.binary_paths = refuse
    try:
        driver = webdriver.Chrome(service=service, options=options)
    finally:
        selenium_manager.SeleniumManager.binary_paths = original
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    # a headless page need not have focus (Chromium 150: document.hasFocus() is false), and JupyterLab's
    # shell.currentWidget, which its menu commands act on, follows focus: the page is told it has it
    driver.execute_cdp_cmd("Emulation.setFocusEmulationEnabled", {"enabled": True})
    return driver


def panel_state(driver, notebook: str) -> dict | None:
    return driver.execute_script(PANEL_JS, notebook)


def open_notebook(driver, lab: Lab, notebook: str, *, timeout: float = 180) -> dict:
    """Open ``notebook`` in a workspace of its own and wait until its kernel is connected and idle, on the page
    and on the server (a Run All sent while the kernel still connects is lost)."""
    workspace = re.sub(r"[^A-Za-z0-9_-]", "-", Path(notebook).stem)
    driver.get(f"{lab.base}/lab/workspaces/{workspace}/tree/{notebook}?token={lab.token}")

    def ready():
        state = panel_state(driver, notebook)
        if not state or (state["kernel"], state["connection"], state["indicator"]) != ("idle", "connected", "idle"):
            return None
        sessions = [s for s in lab.api("/api/sessions") if s["path"] == notebook]
        if not any(s["kernel"]["execution_state"] == "idle" and s["kernel"]["connections"] >= 1 for s in sessions):
            return None
        return state

    return wait_for(ready, timeout=timeout, what=f"{notebook} open with an idle, connected kernel")


def menu(driver, top: str, command: str, *, timeout: float = 30) -> None:
    """Click the menu bar's ``top`` menu, then its item for the Lumino command ``command``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    def click_item():
        bar = [e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item") if e.text.strip() == top]
        if not bar:
            return False
        if not driver.find_elements(By.CSS_SELECTOR, f'.lm-Menu-item[data-command="{command}"]'):
            bar[0].click()
        item = WebDriverWait(driver, 5).until(
            ec.element_to_be_clickable((By.CSS_SELECTOR, f'.lm-Menu-item[data-command="{command}"]')))
        item.click()
        return True

    wait_for(click_item, timeout=timeout, what=f"the menu item {top} > {command}")


def run_all_cells(driver) -> None:
    menu(driver, "Run", "runmenu:run-all")


def save_notebook(driver) -> None:
    menu(driver, "File", "docmanager:save")


def wait_until_executed(driver, lab: Lab, notebook: str, *, timeout: float) -> dict:
    """Wait until every code cell shows an execution count and the kernel is idle; return the page's state."""
    seen = {}

    def done():
        state = panel_state(driver, notebook)
        seen["state"] = state
        if not state or state["kernel"] != "idle" or state["indicator"] != "idle":
            return None
        if len(state["prompts"]) != state["code_cells"] or not all(PROMPT.fullmatch(p) for p in state["prompts"]):
            return None
        sessions = [s for s in lab.api("/api/sessions") if s["path"] == notebook]
        return state if all(s["kernel"]["execution_state"] == "idle" for s in sessions) else None

    try:
        return wait_for(done, timeout=timeout, interval=0.5, what=f"every code cell of {notebook} to run")
    except TimeoutError as err:
        raise TimeoutError(f"{err}; last page state: {seen.get('state')}") from None


def traceback_texts(driver) -> list[str]:
    return driver.execute_script(TRACEBACK_JS)


def stderr_texts(driver) -> list[str]:
    return driver.execute_script(STDERR_JS)
