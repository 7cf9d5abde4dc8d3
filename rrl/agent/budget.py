"""One coordinator for the cores every tuned model shares: the joint core budget.

Independent agents each see the others' load as noise and would each grow into the same cores.
The gateway gives all its agents one ``CoreBudget``; each agent reports what it runs (its
threads: instances x intra-op threads), the arrival rate it sees and the cores its instances
keep busy at that rate (``QueueModel.busy_cores``), and asks the budget before its gate
considers a candidate:

- **allowance**: a model's share of the cores: one thread each, and the cores left over shared
  in proportion to the arrivals each model sees (an idle model's share is one thread);
- **fits**: a candidate may hold as many threads as the model holds now (staying or shrinking is
  always allowed), or up to the cores the other models keep busy leave free (a model alone is
  not bounded). A thread that waits for work takes no core: a model trickling on its share
  leaves that core to one in a burst, so where bursts alternate the cores follow them, which
  no fixed split does (on 2 cores and two models, counting threads held would fix every split
  at one thread each);
- **yield**: a model whose candidates were held back by the budget says so (``want``), and the
  models together may come to keep more cores busy than there are (threads that were idle when
  another model grew get busy again; the others keeping at least half a core busy, since a
  model alone beyond the cores only time-slices its own threads); then a model holding more
  than its allowance is asked to come down to it (``should_yield``): its gate considers only
  candidates within its allowance and tries the best one predicted to meet the SLO, which is
  kept unless it is measured violating the SLO (the budget's joint objective: the cores go
  where the arrivals are, as long as the model that gives them up stays within the SLO).

Threads beyond the cores only time-slice, so the cores the models keep busy, each at most its
instances x intra-op threads, are what the budget bounds.
"""

from __future__ import annotations

import threading

from models.knobs import Knobs


def threads_of(config: Knobs) -> int:
    return config.concurrency * config.intra_op_threads


class CoreBudget:
    def __init__(self, cores: int) -> None:
        self.cores = cores
        self._claims: dict[str, int] = {}
        self._busy: dict[str, float] = {}
        self._rates: dict[str, float] = {}
        self._wants: dict[str, int] = {}
        # Agents report from the event loop and read from their choosing threads.
        self._lock = threading.Lock()

    def report(
        self, model: str, config: Knobs, rate_per_s: float, busy_cores: float | None = None
    ) -> None:
        """What ``model`` runs now, the arrival rate it sees and the cores it keeps busy (None:
        not known, so all its threads)."""
        with self._lock:
            self._claims[model] = threads = threads_of(config)
            self._busy[model] = threads if busy_cores is None else min(busy_cores, threads)
            self._rates[model] = max(rate_per_s, 0.0)
            if self._wants.get(model, 0) <= self._claims[model]:
                self._wants.pop(model, None)  # what it wanted, it has

    def leave(self, model: str) -> None:
        """``model`` is no longer tuned (unloaded): its cores are free for the others."""
        with self._lock:
            self._claims.pop(model, None)
            self._busy.pop(model, None)
            self._rates.pop(model, None)
            self._wants.pop(model, None)

    def want(self, model: str, threads: int) -> None:
        """``model``'s gate would have tried a candidate with ``threads`` threads."""
        with self._lock:
            if threads > self._claims.get(model, 0):
                self._wants[model] = threads

    def allowance(self, model: str) -> int:
        with self._lock:
            return self._allowance(model)

    def _allowance(self, model: str) -> int:
        """One thread for every model, and the cores left over shared by arrival rate."""
        models = set(self._rates) | {model}
        total = sum(self._rates.values())
        share = self._rates.get(model, 0.0) / total if total > 0 else 1.0 / len(models)
        return 1 + max(0, round((self.cores - len(models)) * share))

    def fits(self, model: str, config: Knobs) -> bool:
        threads = threads_of(config)
        with self._lock:
            if not any(m != model for m in self._claims):
                return True  # one model alone: nothing to share (it may time-slice its cores)
            held = self._claims.get(model, 0)
            busy = sum(b for m, b in self._busy.items() if m != model)
            return threads <= max(held, self.cores - round(busy))

    def should_yield(self, model: str) -> int | None:
        """The threads ``model`` should come down to, when it holds more than its allowance
        and another model wants cores, or the models keep more cores busy than there are; None
        otherwise."""
        with self._lock:
            allowance = self._allowance(model)
            others_want = any(m != model for m in self._wants)
            # Crowded by other models: one alone beyond the cores only time-slices its own
            # threads, which its gate weighs, and an idle model's reserved thread is no reason
            # to give up a core it does not use.
            others_busy = sum(b for m, b in self._busy.items() if m != model)
            crowded = others_busy >= 0.5 and round(sum(self._busy.values())) > self.cores
            if (others_want or crowded) and self._claims.get(model, 0) > allowance:
                return allowance
            return None

    def as_dict(self) -> dict[str, object]:
        with self._lock:
            return {
                "cores": self.cores,
                "claims": dict(self._claims),
                "busy": {m: round(b, 3) for m, b in self._busy.items()},
                "allowances": {m: self._allowance(m) for m in self._claims},
                "wants": dict(self._wants),
            }
