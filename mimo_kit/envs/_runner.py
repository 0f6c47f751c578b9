"""The grader's own test runner (Report §4.2): runs hidden tests of a code task, reports to a grader-owned file.

Run as ``python -I -S _runner.py ROOT TESTS_DIR ID...`` inside the sandbox. It is deliberately not pytest:

- ``-I -S``: no PYTHONPATH, no user site, no ``site`` at all, so an agent's ``sitecustomize.py`` or ``.pth`` never
  loads, and there is no conftest or plugin mechanism to forge (peers' lesson: *graders get forged*);
- the first stdin line is a nonce, read before any agent code is imported; every result line carries it. Results
  go to an inherited write-only descriptor (``MIMO_RESULT_FD``) of a file in a root-only directory: agent code
  can read back neither the nonce nor the results, so lines it forges are ignored, and an ``os._exit(0)`` at
  import leaves tests missing, which the grader counts as failures;
- it starts in ~20 ms instead of pytest's ~400 ms, which is what keeps grading a toy task well under a second.

Test ids are ``file.py::test_name`` or ``file.py::TestClass::test_name``; tests are zero-argument functions using
plain ``assert``; raising ``unittest.SkipTest`` (or any exception named ``Skipped``) skips.
"""

import importlib.util
import json
import os
import sys
import traceback


def main() -> None:
    nonce = sys.stdin.readline().strip()
    out = os.fdopen(int(os.environ.get("MIMO_RESULT_FD", "3")), "w", buffering=1)
    root, tests_dir, ids = sys.argv[1], sys.argv[2], sys.argv[3:]

    def report(**rec):
        out.write(json.dumps({"nonce": nonce, **rec}) + "\n")

    sys.path.insert(0, root)
    os.chdir(root)
    modules = {}
    for test_id in ids:
        parts = test_id.split("::")
        fname = parts[0]
        try:
            if fname not in modules:
                spec = importlib.util.spec_from_file_location(f"hidden_{len(modules)}", os.path.join(tests_dir, fname))
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                modules[fname] = mod
            obj = modules[fname]
            for name in parts[1:]:
                obj = getattr(obj, name)
            if len(parts) == 3:  # a method: instantiate its class
                obj = getattr(getattr(modules[fname], parts[1])(), parts[2])
            obj()
            report(id=test_id, outcome="passed")
        except BaseException as e:  # noqa: BLE001 - SystemExit from agent code is a failure too
            skipped = type(e).__name__ in ("SkipTest", "Skipped")
            msg = "".join(traceback.format_exception_only(type(e), e)).strip()[-500:]
            report(id=test_id, outcome="skipped" if skipped else "failed", message=msg)
            if isinstance(e, KeyboardInterrupt):
                break
    report(done=True)


if __name__ == "__main__":
    main()
