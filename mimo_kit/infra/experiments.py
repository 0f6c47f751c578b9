"""Chapter 6's infrastructure experiments for ``mimo-kit run`` (Report §6).

    mimo-kit run mixer-sim --preset tiny        # the Sample Mixer's trace-driven simulation (Figure 16)
    mimo-kit results mixer-sim                  # publish data/infra/mixer_sim_tiny.json, .md and .png

Result format (:func:`mimo_kit.infra.mixer_sim.run_mixer_sim`): ``arms.<α>`` per-seed rows (occupancy mean and
CV, imbalance, combined criterion, step time, KV overflow rate, surplus), ``summary.<α>.<metric>`` as {mean, sd,
min, max, n} over seeds, ``series.<α>`` seed 0's occupancy over time, ``startup`` / ``startup_summary`` the cold
start and the resume with and without replay, ``claim`` whether α = 0.5 beats both extremes.
"""

from __future__ import annotations

from mimo_kit.experiments import Publication, experiment
from mimo_kit.infra.mixer_sim import MixerSimConfig, figure_png, run_mixer_sim, table


@experiment("mixer-sim", MixerSimConfig, chapter="ch06",
            publishes=(Publication("infra/mixer_sim_{preset}.json"),
                       Publication("infra/mixer_sim_{preset}.md", render=table),
                       Publication("infra/mixer_sim_{preset}.png", render=figure_png)))
def mixer_sim(cfg: MixerSimConfig) -> dict:
    """The Sample Mixer in a trace-driven simulation: α = 0 / 0.5 / 1 and sample replay (Report §6, Fig. 16)."""
    return run_mixer_sim(cfg)

