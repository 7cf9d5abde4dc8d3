"""Does the agent find the optimum? (``iotgw bench find``, results ``tuner_find.json``).

For each model (sensor_mlp, vision_cnn) and each load (closed loop at 1, 8, 32 and 128
connections through wrk; Poisson at 0.3, 0.6 and 0.9 of the open loop's capacity measured at
the start of the run, through ``iotgw sim``: the highest rate the simulator and the gateway
sustain together, probed from wrk's capacity down, since the simulator takes far more of the
cores than wrk):

1. **The best static configuration**, measured in the same run: the static grid
   (``plan.static_grid``) screened with wrk at 1 and 32 connections; the fastest few at each
   (the finalists) measured at every load twice, each point as long as the agent's measured
   window. The better mean is the best static; its two runs' ratio is the noise floor printed
   beside every figure.
2. **The agent**: a fresh default ``iotgw serve`` per run, from the shipped default, from three
   poor starts (set by hand, then the agent resumed) and after a user's sweep (a burst of the
   other model, then each lower closed loop); 90 s per run, the last 30 s measured.
3. **The summary**: ``worst_throughput_vs_best_static`` (closed loop, target >= 0.95),
   ``worst_p99_vs_best_static`` (open loop, <= 1.1), ``worst_settle_s`` (until within 5% of
   the best static for good, <= 60), each with its noise floor; a target the floor cannot
   resolve says so instead of passing or failing.

``--quick`` (CI) runs one model at two short loads from two starts, to check it still works.
"""

from benchmarks.find.run import cli, main, run

__all__ = ["cli", "main", "run"]
