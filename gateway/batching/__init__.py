"""Batching: a model version's queue and the instances that run its batches.

- ``batcher``: the queue and its dispatch (put, wait for a batch, run, fan out), with the
  deadline admission, the watchdog on a runtime call that does not return and the supervisor
  of the dispatch loop;
- ``arrivals``: the arrival rate the batch timeout is weighed against;
- ``service_time``, ``answer_lag``: the recent batch service times and event-loop waits that
  admission plans with;
- ``instances``: the runtime instances of a model version, one per batch in flight, rebuilt
  off the event loop when their threads change.
"""
