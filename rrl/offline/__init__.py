"""What runs away from live traffic: the profiler and its serving harness, the testbed that
replays a profile, the trace replay, episodes, the evaluation and its report, and the profile
priors the online agent starts from."""
