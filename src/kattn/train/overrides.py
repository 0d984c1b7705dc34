"""A run's config from a preset and ``section.field=value`` overrides (:func:`preset`,
:func:`apply_overrides`), and the preset's mechanism options a chosen mechanism does not take
(:func:`drop_preset_options`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..registry import MECHANISMS
from .config import TASKS, RunConfig, coerce_value, config_field, config_section
from .presets import PRESETS

__all__ = [
    "PRESETS",
    "apply_overrides",
    "drop_preset_options",
    "drop_preset_part_options",
    "parse_value",
    "preset",
    "unaccepted_options",
]


def preset(name: str, task: str) -> RunConfig:
    """The config of preset ``name`` for ``task`` (the dataclass defaults are Skyformer's)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}")
    if task not in PRESETS[name]:
        raise ValueError(
            f"preset {name!r} has no {task} configuration; it has {', '.join(PRESETS[name])}"
        )
    config = RunConfig()
    config.data.task = task
    apply_overrides(config, [f"{k}={json.dumps(v)}" for k, v in PRESETS[name][task].items()])
    return config


def apply_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``section.field=value`` strings in place; values are parsed as JSON when they
    can be (``4``, ``0.1``, ``true``, ``null``, ``"x"``), else taken as strings, then checked
    against the field's type. ``attention.options.KEY=value`` sets a mechanism option
    (``attention.decoder_options.KEY``, ``attention.cross_options.KEY``: translation's decoder
    and cross-attention)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"an override is 'section.field=value', got {item!r}")
        value = parse_value(raw)
        parts = key.split(".")
        if parts[0] == "attention" and len(parts) == 3 and parts[1] in _OPTION_DICTS:
            getattr(config.attention, parts[1])[parts[2]] = value
            continue
        if len(parts) != 2:
            raise ValueError(f"an override key is 'section.field', got {key!r}")
        section, name = parts
        part = config_section(config, section)
        setattr(part, name, coerce_value(config_field(part, section, name), value, key))
    return config


#: the attention fields that hold mechanism options (``attention.options.KEY=value``).
_OPTION_DICTS = ("options", "decoder_options", "cross_options")


def parse_value(raw: str) -> Any:
    """``raw`` read as JSON when it parses (``4``, ``0.1``, ``true``, ``null``, ``"x"``), else
    the text itself."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def unaccepted_options(name: str, options: Mapping[str, Any]) -> list[str]:
    """The names in ``options`` that mechanism ``name`` does not take (none when the
    mechanism checks its options itself)."""
    entry = MECHANISMS.get(name)
    valid = entry.cls.option_names({**entry.defaults, **options})
    return [] if valid is None else sorted(set(options) - set(valid))


def drop_preset_options(
    config: RunConfig, preset_options: Mapping[str, Any], user_options: Iterable[str]
) -> list[str]:
    """Remove from ``config.attention.options`` the options that came from the preset
    (``preset_options``), were not set by the user (``user_options``: their names) and that
    the chosen mechanism does not take (a preset's ``num_features`` with ``softmax``); return
    ``KEY=VALUE`` of each. The user's options are kept, so an unknown one still raises when
    the model is built."""
    options, given = config.attention.options, set(user_options)
    foreign = unaccepted_options(config.attention.name, options)
    dropped = [key for key in foreign if key in preset_options and key not in given]
    for key in dropped:
        del options[key]
    return [f"{key}={json.dumps(preset_options[key])}" for key in dropped]


def drop_preset_part_options(
    config: RunConfig, preset_parts: Mapping[str, Mapping[str, Any]], user_options: Iterable[str]
) -> list[str]:
    """As :func:`drop_preset_options` for translation's ``attention.decoder_options`` and
    ``attention.cross_options`` (``preset_parts``: the preset's, by field name;
    ``user_options``: ``FIELD.KEY`` names the user set), each against the mechanism it
    configures (``attention.decoder`` / ``attention.cross``, default ``attention.name``)."""
    a, given, dropped = config.attention, set(user_options), []
    for part, mechanism in (("decoder_options", a.decoder), ("cross_options", a.cross)):
        values = getattr(a, part)
        foreign = unaccepted_options(mechanism or a.name, {**a.options, **values})
        for key in foreign:
            if key in values and key in preset_parts[part] and f"{part}.{key}" not in given:
                del values[key]
                dropped.append(f"{part}.{key}={json.dumps(preset_parts[part][key])}")
    return dropped
