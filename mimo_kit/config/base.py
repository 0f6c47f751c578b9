"""Dataclass configs with presets, strict validation, YAML round trip and dotted ``key=value`` overrides.

Every experiment of the kit is *config + function*: a notebook cell builds ``XConfig.preset("tiny")``, a shell
runs ``mimo-kit run x --preset tiny key=value``, and the same config gives the ``torchrun`` command line
(:mod:`mimo_kit.launch`; FSDP2 under torchrun in :mod:`mimo_kit.dist`). The config is the single place
where scale lives, so it is strict:

- an unknown key names itself and lists the valid keys;
- a wrong type or an out-of-range value names the field, the value and what was expected;
- every constant the report does not publish is a field made with :func:`knob`, whose ``why`` says why the
  kit chose that default (``Config.describe()`` prints them as a table).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import yaml

#: The kit's scale knobs, smallest first. ``tiny``: CPU seconds; ``small``: CPU minutes or one GPU;
#: ``flash`` / ``pro``: the report's shapes (Report §2), built on the meta device unless asked.
PRESET_NAMES: tuple[str, ...] = ("tiny", "small", "flash", "pro")

C = TypeVar("C", bound="Config")


class ConfigError(ValueError):
    """A config value, key or file that the kit cannot accept. The message names the problem."""


def knob(default: Any = dataclasses.MISSING, why: str = "", *, min: float | None = None,
         max: float | None = None, default_factory: Any = dataclasses.MISSING) -> Any:
    """A config field with its reason and its valid range.

    ``why`` is the one-line reason for the default (mandatory in spirit for every constant the report does not
    publish); ``min``/``max`` are inclusive bounds checked on every construction.
    """
    meta = {"why": why, "min": min, "max": max}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin in (tuple, list):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Return ``value`` converted to the annotated type ``tp``, or raise a ConfigError naming ``where``."""
    origin = get_origin(tp)
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"{where}: got {value!r}, expected {_type_name(tp)}")
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: X's own message is the precise one
            return _coerce(value, options[0], where)
        for arg in options:
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: got {value!r}, expected {_type_name(tp)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{where}: got {value!r}, expected null")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: got {value!r}, expected {_type_name(tp)}")
        args = [a for a in get_args(tp) if a is not Ellipsis]
        items = [_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
        return tuple(items) if origin is tuple else items
    if isinstance(tp, type) and issubclass(tp, Config):
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):
            return tp.from_dict(value, _prefix=f"{where}.")
        raise ConfigError(f"{where}: got {value!r}, expected a mapping of {tp.__name__} fields")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: got {value!r}, expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{where}: got {value!r}, expected an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot in the mantissa) as a string
            try:
                number = float(value.strip())
            except ValueError:
                pass
            else:
                if math.isfinite(number):
                    return number
        raise ConfigError(f"{where}: got {value!r}, expected a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: got {value!r}, expected a string")
    if tp is Any:
        return value
    raise TypeError(f"config field type {tp!r} at {where} is not supported")


def _unknown_key(key: str, valid: list[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown key {where + key!r}{hint}; valid keys: {', '.join(valid)}")


@dataclasses.dataclass
class Config:
    """Base of every kit config: typed fields, presets, validation, YAML and overrides.

    Subclasses are dataclasses. ``PRESETS`` maps each supported preset name to the fields that differ from the
    defaults (nested dicts or dotted keys). A nested ``Config`` field follows the preset of its parent when its
    class supports that preset. Cross-field rules go in :meth:`check`.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {"tiny": {}}

    # ---- construction -------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            where = f"{type(self).__name__}.{f.name}"
            value = _coerce(getattr(self, f.name), hints[f.name], where)
            object.__setattr__(self, f.name, value)
            lo, hi = f.metadata.get("min"), f.metadata.get("max")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if lo is not None and value < lo:
                    raise ConfigError(f"{where}: got {value!r}, expected a value >= {lo}")
                if hi is not None and value > hi:
                    raise ConfigError(f"{where}: got {value!r}, expected a value <= {hi}")
        self.check()

    def check(self) -> None:
        """Cross-field validation; subclasses raise ConfigError naming the fields involved."""

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """The preset names this config supports, smallest first."""
        return tuple(n for n in PRESET_NAMES if n in cls.PRESETS) + tuple(
            n for n in cls.PRESETS if n not in PRESET_NAMES)

    @classmethod
    def preset(cls: type[C], name: str = "tiny", **overrides: Any) -> C:
        """The config of preset ``name`` (``tiny`` | ``small`` | ``flash`` | ``pro``), with optional overrides."""
        if name not in cls.PRESETS:
            raise ConfigError(f"{cls.__name__} has no preset {name!r}; available: {', '.join(cls.presets())}")
        data: dict[str, Any] = {}
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if isinstance(tp, type) and issubclass(tp, Config) and name in tp.PRESETS:
                data[f.name] = tp.preset(name).to_dict()
        _merge(data, _nest(cls.PRESETS[name]))
        _merge(data, _nest(overrides))
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any], *, _prefix: str = "") -> C:
        """Build from a (nested) mapping; unknown keys and bad values raise ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError(f"{_prefix or cls.__name__}: expected a mapping, got {data!r}")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise _unknown_key(str(key), names, _prefix)
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for key, value in data.items():
            kwargs[key] = _coerce(value, hints[key], f"{_prefix}{key}")
        return cls(**kwargs)

    # ---- serialisation ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.to_dict() if isinstance(v, Config) else (list(v) if isinstance(v, tuple) else v)
        return out

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls: type[C], source: str | Path) -> C:
        """Load from a YAML file path or a YAML string."""
        where = str(source)
        text = Path(source).read_text() if isinstance(source, Path) or (
            isinstance(source, str) and "\n" not in source and Path(source).is_file()) else source
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{where}: not valid YAML ({e})") from None
        try:
            return cls.from_dict(data or {})
        except ConfigError as e:
            raise ConfigError(f"{where if len(where) < 200 else 'YAML'}: {e}") from None

    # ---- overrides ----------------------------------------------------------------------------------------
    def override(self: C, assignments: list[str] | tuple[str, ...] | dict[str, Any] = ()) -> C:
        """A copy with dotted overrides applied: ``["model.hidden_size=64", "seed=1"]`` or a dict.

        String values are parsed as YAML scalars (``64`` → int, ``true`` → bool, ``[1, 2]`` → list).
        """
        pairs = dict(parse_assignments(assignments)) if not isinstance(assignments, dict) else assignments
        data = self.to_dict()
        _merge(data, _nest(pairs))
        return type(self).from_dict(data)

    def diff(self, other: Config) -> dict[str, Any]:
        """Dotted keys whose value in ``self`` differs from ``other`` (same class)."""
        return {k: v for k, v in _flatten(self.to_dict()).items() if _flatten(other.to_dict()).get(k) != v}

    @classmethod
    def why(cls, name: str) -> str:
        """The one-line reason recorded with field ``name``'s default (its ``knob``); unknown names raise."""
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f.metadata.get("why", "")
        raise ConfigError(f"{cls.__name__} has no field {name!r}")

    def describe(self) -> list[dict[str, Any]]:
        """Rows ``{key, value, default, why}`` for every (nested) field: the config as a readable table."""
        rows = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Config):
                rows += [{**r, "key": f"{f.name}.{r['key']}"} for r in v.describe()]
                continue
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            rows.append({"key": f.name, "value": v, "default": default, "why": f.metadata.get("why", "")})
        return rows


def parse_assignments(items: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    """``["a.b=1", "c=x"]`` → ``[("a.b", 1), ("c", "x")]``; values parsed as YAML scalars."""
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override {item!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        out.append((key, value))
    return out


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` → ``{"a": {"b": 1}}`` (nested dicts pass through)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {p!r} is not a section")
        node[parts[-1]] = _nest(value) if isinstance(value, dict) else value
    return out


def _merge(base: dict[str, Any], update: dict[str, Any]) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
