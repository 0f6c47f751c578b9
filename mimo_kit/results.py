"""Run folders and the committed result files: experiments write runs, one explicit command publishes them.

Running an experiment never writes into the kit's shipped ``data/``: ``mimo-kit run NAME`` writes
``runs/NAME/<time>/`` (``config.yaml``, ``run.json``, ``result.json``) under the working directory, and a
comparison keeps its arms' checkpoints under ``runs/NAME/<arm>/``. The files the notebooks plot from when they
do not train live under ``data/`` and are committed; they change only through :func:`publish`
(``mimo-kit results``, ``make results``), which takes, for every experiment that declares
:class:`~mimo_kit.experiments.Publication` s, its newest finished run of each preset and writes the files from
that run's ``result.json``. So a committed table always comes from one named run, and a notebook or a test that
runs an experiment cannot change it by accident.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from mimo_kit.experiments import Experiment, discover

#: The kit's shipped data folder (a checkout of the repository has it; an installed wheel does not).
DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def saved_or_run(rel: str, command: str, run: Callable[[], dict], seeds_label: str = "seeds") -> dict:
    """A chapter's source of a study: the published full run ``data/<rel>`` when it exists, in quick mode too (a
    study of several seeds is minutes of training: quick mode runs a chapter's mechanisms and plots the committed
    studies), announced with the ``command`` that made it; else ``run()``, a live run."""
    saved = DATA_DIR / rel
    if saved.exists():
        res = json.loads(saved.read_text())
        print(f"loaded data/{rel} ({command}; {seeds_label} {res['seeds']})")
        return res
    return run()


@dataclasses.dataclass(frozen=True)
class Published:
    dest: Path
    source: Path
    overrides: tuple[str, ...]


def finished_runs(name: str, runs: Path | str = "runs") -> list[tuple[Path, dict]]:
    """Finished runs of experiment ``name`` under ``runs`` (folders with ``run.json`` and ``result.json``),
    oldest first, with their ``run.json`` metadata."""
    top = Path(runs) / name
    found = []
    for d in sorted(top.glob("*/")) if top.is_dir() else []:
        meta, result = d / "run.json", d / "result.json"
        if meta.is_file() and result.is_file():
            info = json.loads(meta.read_text())
            if info.get("finished"):
                found.append((d, info))
    return sorted(found, key=lambda x: x[1]["finished"])


def publishing() -> dict[str, Experiment]:
    """The registered experiments that publish committed files."""
    return {k: e for k, e in discover().items() if e.publishes}


def publish(names: list[str] | None = None, *, runs: Path | str = "runs", data: Path | str = DATA_DIR,
            preset: str | None = None, dry_run: bool = False) -> tuple[list[Published], list[str]]:
    """Write the committed files of ``names`` (default: every publishing experiment) from their newest finished
    run of each preset (or of ``preset`` only). Returns what was (or, with ``dry_run``, would be) written and, for
    each experiment without a finished run, the command that makes one. Unknown names raise, naming the known."""
    exps = publishing()
    names = list(exps) if not names else list(names)
    unknown = [n for n in names if n not in exps]
    if unknown:
        raise ValueError(f"no published results for {unknown!r}; experiments that publish: {sorted(exps)}")
    data = Path(data)
    if not data.is_dir():
        raise FileNotFoundError(f"{data} is not a folder: publishing needs a checkout of the kit with its data/")
    done, missing = [], []
    for name in names:
        latest: dict[str, tuple[Path, dict]] = {}
        for d, info in finished_runs(name, runs):
            latest[info["preset"]] = (d, info)  # oldest first: the newest run of each preset wins
        if preset is not None:
            latest = {k: v for k, v in latest.items() if k == preset}
        if not latest:
            missing.append(f"mimo-kit run {name} --preset {preset or 'tiny'}")
            continue
        for p, (d, info) in sorted(latest.items()):
            result = json.loads((d / "result.json").read_text())
            for pub in exps[name].publishes:
                dest = data / pub.dest.format(preset=p)
                text = pub.render(result) if pub.render else json.dumps(result, indent=1) + "\n"
                if not dry_run:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    if isinstance(text, bytes):  # a rendered figure (PNG)
                        dest.write_bytes(text)
                    else:
                        dest.write_text(text)
                done.append(Published(dest, d / "result.json", tuple(info.get("overrides", ()))))
    return done, missing
