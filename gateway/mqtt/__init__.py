"""The MQTT adapter, in its parts:

- ``wire``: the MQTT 5 forms the adapter parses and writes itself (pure functions);
- ``paho_seam``: the one place that touches paho's and aiomqtt's private attributes (the
  per-message fast path), checked against the pinned versions;
- ``session``: connect, subscribe, reconnect with backoff;
- ``trust``: which devices may publish requests and where their replies may go;
- ``routes``, ``refusals``, ``seen``: a request's reply route, its refusals before it reaches a
  model, the redeliveries already answered;
- ``adapter``: the request flow, from a message taken to its reply and acknowledgement.

Nothing is imported here: the settings read ``trust``'s rules, and the adapter reads the
settings.
"""
