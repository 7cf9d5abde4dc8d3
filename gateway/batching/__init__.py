"""Batching: a model version's queue and the instances that run its batches.

- ``batcher``: the queue and its dispatch (put, wait for a batch, run, fan out), with the
  supervisor of the dispatch loop;
- ``watchdog``: runs a batch's runtime call off the loop and gives up on one that does not
  return in time, and bounds the executor threads stuck calls may hold;
- ``admission``: the refusals on arrival and when a batch starts, decided by the batching rule
  (``models.batching_rule``: the arrival estimate, the recent batch service times, the
  event-loop waits between a batch's end and its replies);
- ``instances``: the runtime instances of a model version, one per batch in flight, built off
  the event loop when their threads change, and the instances a reconfiguration retired kept
  (parked) a while, so that switching back reuses them.
"""
