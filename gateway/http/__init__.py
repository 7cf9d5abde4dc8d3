"""The HTTP adapter (aiohttp):

- ``app``: the application and its routes: the Open Inference Protocol, TF Serving's REST API,
  the admin API, the error middleware that turns every exception into one error reply;
- ``security``: the middlewares in front of it (bearer tokens, the connection cap, the body
  deadline), the runner and the TLS context;
- ``repository_api``: loading and unloading models;
- ``dashboard``: the live page and its data.
"""
