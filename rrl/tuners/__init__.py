"""Tuners behind one ask/tell interface: the configuration space, the workload state, the
objectives, RRL, adaptive RRL, the Gaussian process, the baselines and the registry by name."""
