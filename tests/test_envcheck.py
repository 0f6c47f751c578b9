from mimo_kit.envcheck import REQUIRED, run_env_check
from mimo_kit.envs.isolation import LAYERS, capabilities


def test_env_check_passes_in_the_kit_environment():
    lines = []
    assert run_env_check(print_fn=lines.append) == 0
    assert sum(line.startswith("OK   ") for line in lines) >= len(REQUIRED)
    assert any("network isolation" in line for line in lines)


def test_env_check_reports_every_isolation_layer():
    """One line per layer, OK where the probe found it, WARN (not FAIL) where it did not."""
    lines = []
    assert run_env_check(required=[], optional=[], print_fn=lines.append) == 0
    for layer, active in capabilities().layers.items():
        name = layer.replace("_", " ")
        line = next(x for x in lines if x[5:].startswith(f"sandbox {name}:"))
        assert line.startswith("OK   " if active else "WARN ") and LAYERS[layer] in line


def test_env_check_fails_on_missing_required_dependency():
    lines = []
    code = run_env_check(required=[("torch", "torch", "x"), ("no_such_module_xyz", "no-such-dist", "y")],
                         optional=[("another_missing_mod", "another", "z")], print_fn=lines.append)
    assert code == 1
    assert any(line.startswith("FAIL no-such-dist") for line in lines)
    assert any(line.startswith("MISS another") for line in lines)
    assert lines[-1] == "env-check: required dependencies missing: no-such-dist"


def test_optional_missing_does_not_fail():
    assert run_env_check(required=[("torch", "torch", "x")], optional=[("missing_zz", "zz", "z")],
                         print_fn=lambda s: None) == 0
