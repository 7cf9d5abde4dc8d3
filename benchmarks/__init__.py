"""Benchmarks: each one a command that writes a JSON under benchmarks/results/.

The top floor (docs/architecture.md): nothing imports ``benchmarks`` but the CLI
(``iotgw bench``); what other packages share with it lives on the ground floor.
"""
