"""Everything about one model: architectures, runtimes, the on-disk model repository.

Must not import ``gateway``, ``rrl`` or ``device_sim``.
"""
