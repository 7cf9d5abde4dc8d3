"""The gateway's settings:

- ``schema``: every setting, its type, default and limits (pydantic), read from the
  environment (``IOTGW_<SECTION>__<NAME>``), a TOML file and the command line;
- ``cli``: the ``iotgw serve`` flags, one per setting, and the overrides they make;
- ``security``: the checks behind the security settings (secrets read from files, TLS
  certificate and key pairs and the server context made from them, no unauthenticated admin
  API beyond this machine).
"""
