"""The experiment registry: *experiment = config + function*.

A chapter module registers its experiments with :func:`experiment`; ``mimo-kit run NAME`` and a notebook cell
call the same function with the same config::

    @experiment("scale-knobs", ScaleKnobsConfig, chapter="ch01")
    def run_scale_knobs(cfg: ScaleKnobsConfig) -> dict: ...

Registration happens on import. :func:`discover` imports every ``mimo_kit.<subpackage>.experiments`` module,
so a later chapter adds a function and a config and nothing else; this module imports none of them.

An experiment whose result the notebooks plot from a committed file names it with ``publishes``
(:class:`Publication`); ``mimo-kit results`` (:mod:`mimo_kit.results`) copies it there from a finished run.
Running an experiment never writes into the shipped ``data/``. Every run writes into a folder of its own
(:func:`new_run_folder`, ``runs/NAME/<time>/``): checkpoints, metrics and warm starts too, so two runs never share,
resume or overwrite one another; a run is resumed by naming its folder (``mimo-kit run NAME --out FOLDER``).
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import pkgutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mimo_kit
from mimo_kit.config.base import Config, ConfigError


@dataclasses.dataclass(frozen=True)
class Publication:
    """A committed file made from a run's ``result.json``: ``dest`` under ``data/`` (``{preset}`` is filled in);
    ``render`` turns the result into the file's text, or its bytes for a figure (``None``: the result as JSON)."""

    dest: str
    render: Callable[[dict], str] | None = None


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    config_cls: type[Config]
    fn: Callable[[Any], Any]
    chapter: str
    summary: str
    publishes: tuple[Publication, ...] = ()

    def config(self, preset: str = "tiny", overrides: list[str] | tuple[str, ...] | dict[str, Any] = ()) -> Config:
        """The experiment's config for ``preset`` with dotted overrides applied."""
        return self.config_cls.preset(preset).override(overrides)

    def __call__(self, cfg: Config | None = None) -> Any:
        cfg = cfg if cfg is not None else self.config_cls.preset("tiny")
        if not isinstance(cfg, self.config_cls):
            raise ConfigError(f"experiment {self.name!r} takes a {self.config_cls.__name__}, "
                              f"got a {type(cfg).__name__}")
        return self.fn(cfg)


_REGISTRY: dict[str, Experiment] = {}


def experiment(name: str, config_cls: type[Config], *, chapter: str,
               publishes: tuple[Publication, ...] = ()) -> Callable:
    """Decorator: register ``fn(cfg) -> result`` as experiment ``name`` of ``chapter`` (e.g. ``"ch02a"``);
    ``publishes``: the committed files ``mimo-kit results`` makes from its runs."""

    def register(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        if name in _REGISTRY and _REGISTRY[name].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"experiment {name!r} is registered twice ({_REGISTRY[name].fn.__module__})")
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        _REGISTRY[name] = Experiment(name, config_cls, fn, chapter, summary, tuple(publishes))
        return fn

    return register


def discover() -> dict[str, Experiment]:
    """Import every ``mimo_kit.<subpackage>.experiments`` module and return the registry."""
    for info in pkgutil.iter_modules(mimo_kit.__path__):
        if info.ispkg and importlib.util.find_spec(f"mimo_kit.{info.name}.experiments") is not None:
            importlib.import_module(f"mimo_kit.{info.name}.experiments")
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> Experiment:
    """The registered experiment ``name``; an unknown name lists the known ones."""
    known = discover()
    if name not in known:
        raise ConfigError(f"unknown experiment {name!r}; known: {', '.join(known) or '(none)'}")
    return known[name]


def run(name: str, preset: str = "tiny", overrides: list[str] | tuple[str, ...] | dict[str, Any] = ()) -> Any:
    """Run experiment ``name`` on ``preset`` with overrides: what ``mimo-kit run`` does."""
    exp = get(name)
    return exp(exp.config(preset, overrides))


def new_run_folder(name: str, root: str | Path = "runs") -> Path:
    """A fresh folder for one run of experiment ``name``: ``root/NAME/<time>/``, or ``<time>-2``, ``-3``, … when a
    run started in the same second holds it. Created here (an exclusive ``mkdir``), so two runs never get one."""
    base = Path(root) / name
    base.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in itertools.count(1):
        path = base / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")
