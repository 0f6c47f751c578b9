"""mimo_kit: the mechanisms of the MiMo-V2.6 report at scale knobs, one chapter at a time (docs/design.md).

A copy of the kit without ``mimo_kit/solutions/`` (the student edition that ``mimo-kit course --student`` writes, or
the view of the kit a kernel under ``mimo-kit grade`` imports) refuses ``import mimo_kit.solutions…`` outright, and
takes no other ``mimo_kit.<module>`` from outside its own folder: an editable install of the full kit in the same
environment (``pip install -e``) adds a finder that maps ``mimo_kit``'s modules to its checkout, through which the
edition would otherwise load the full kit's reference answers. The full kit, imported by a Python started inside a
student edition (a notebook kernel of an environment that has the full kit installed), warns that it is not the
edition's copy (:class:`FullKitInEditionWarning`).
"""

import sys
import warnings
from pathlib import Path

__version__ = "0.1.0"

#: the file at a student edition's root (written by :mod:`mimo_kit.student`): with a ``mimo_kit`` package beside it
#: that has no ``solutions/``, it marks the folder as a student edition
EDITION_MARKER = "STUDENT.md"
_PACKAGE = Path(__file__).parent  # not resolved: the grader's view links to the files of a checkout
#: whether this copy of the kit has the reference answers (``mimo_kit/solutions/``); the student edition has not
REFERENCES = (_PACKAGE / "solutions" / "__init__.py").is_file()


class FullKitInEditionWarning(UserWarning):
    """The kit imported inside a student edition is another copy, the full kit with the reference answers."""


class _NoReferences:
    """The first meta-path finder of a copy without references: ``mimo_kit.solutions`` and its submodules are not
    importable, and no other ``mimo_kit.<module>`` is taken from outside this copy's folder, whichever other finder
    (an editable install's maps the package's modules to its checkout) could find them in another copy."""

    mimo_kit_no_references = True

    def __init__(self, package):
        self.package = package

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("mimo_kit.") or sys.modules.get("mimo_kit") is not self.package:
            return None
        if name == "mimo_kit.solutions" or name.startswith("mimo_kit.solutions."):
            raise ModuleNotFoundError(
                f"No module named {name!r}: this copy of mimo_kit ({_PACKAGE}) has no reference answers (the "
                "student edition, or the kit a `mimo-kit grade` kernel imports); the instructor grades the notebooks "
                "handed in with `mimo-kit grade`", name=name)
        if name.count(".") == 1:  # deeper modules are looked up in their parent package's folder only
            from importlib.machinery import PathFinder

            if PathFinder.find_spec(name, list(self.package.__path__)) is None:
                raise ModuleNotFoundError(f"No module named {name!r} in this copy of mimo_kit ({_PACKAGE})",
                                          name=name)
        return None  # the ordinary finders load it from this copy


def edition_root(start: Path) -> Path | None:
    """The student edition folder that holds ``start`` (a folder with :data:`EDITION_MARKER` and a ``mimo_kit``
    package without ``solutions/``), or None."""
    for folder in (start, *start.parents):
        kit = folder / "mimo_kit"
        if (folder / EDITION_MARKER).is_file() and (kit / "__init__.py").is_file() \
                and not (kit / "solutions").exists():
            return folder
    return None


if not REFERENCES:  # one guard, for the package imported now (a re-import replaces an earlier one's)
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "mimo_kit_no_references", False)]
    sys.meta_path.insert(0, _NoReferences(sys.modules[__name__]))
else:
    try:
        _edition = edition_root(Path.cwd())
    except OSError:  # a working directory that is gone
        _edition = None
    if _edition is not None:
        warnings.warn(f"mimo_kit is imported from {_PACKAGE} (the full kit, with the reference answers), not from "
                      f"the student edition at {_edition}: this Python ({sys.prefix}) has the full kit installed. "
                      "In the edition, `make setup` installs it into its own .venv and `make lab` opens the notebooks "
                      "with that environment.", FullKitInEditionWarning, stacklevel=1)
