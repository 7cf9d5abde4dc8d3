"""The online agent: one ``ModelAgent`` per served model (``model_agent``), its decision rule
(``policy``) and the parts it owns: the queueing model's prediction and gate, trials, the
per-state memory, what measurement alone says, resting, the decision log and the core budget
shared between models."""
