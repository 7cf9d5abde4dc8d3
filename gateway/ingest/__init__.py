"""Ingest processes: protocol work (HTTP parsing, JSON decoding, MQTT framing) spread over
several processes, feeding the one serving process that batches and runs the models.

- ``frames``: the length-prefixed messages between the two sides (a private Unix socket).
- ``catalog``: what an ingest process knows of the models, to refuse early.
- ``hub``: the serving side, that takes requests from every ingest process.
- ``remote``: the ingest side's stand-in for the service.
- ``supervisor``: starts, restarts and stops the ingest processes.
- ``worker``: an ingest process (HTTP on the shared port, MQTT on the shared subscription).

See docs/architecture.md ("Ingest processes") for the design and its cost.
"""
