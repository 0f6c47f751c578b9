"""Progress bars are drawn where someone watches and left out of headless notebook runs."""

import types

import pytest

from mimo_kit import live as progress


def _kernel(monkeypatch, allow_stdin):
    import IPython

    shell = types.SimpleNamespace(kernel=types.SimpleNamespace(_allow_stdin=allow_stdin))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)


@pytest.mark.parametrize("allow_stdin, shown", [(False, False), (True, True)])
def test_a_headless_kernel_gets_no_bar(monkeypatch, allow_stdin, shown):
    """nbclient (the kit's notebook runners) sends every cell with allow_stdin=False; JupyterLab allows input."""
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    _kernel(monkeypatch, allow_stdin)
    assert progress.interactive() is shown
    assert progress.progress_bar(range(3)).disable is not shown


def test_outside_a_kernel_bars_are_shown_and_the_environment_decides_first(monkeypatch):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    assert progress.interactive()
    monkeypatch.setenv(progress.PROGRESS_ENV, "0")
    assert not progress.interactive() and progress.progress_bar(range(3)).disable
    _kernel(monkeypatch, False)
    monkeypatch.setenv(progress.PROGRESS_ENV, "1")
    assert progress.interactive()
    assert progress.progress_bar(range(3), disable=True).disable  # the caller's own switch still wins
    assert list(progress.progress_bar(range(3))) == [0, 1, 2]
