"""Everything about one model: architectures, runtimes, the on-disk model repository.

The ground floor (docs/architecture.md): imports nothing of the project, so every package may
import it; the helpers several packages share live here (``models.machine``,
``models.reporting``, ``models.tf_env``).
"""
