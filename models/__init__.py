"""Everything about one model: architectures, runtimes, the on-disk model repository.

The ground floor (docs/architecture.md): imports nothing of the project, so every package may
import it. Besides the models themselves it holds what several packages share: the helpers
(``models.machine``, ``models.reporting``, ``models.tf_env``) and the contracts between the
gateway and its tuner (``models.knobs``, ``models.window_stats``, ``models.batching_rule``,
``models.serving_plan``, ``models.runtime``, ``models.datatypes``).
"""
