"""The serving gateway: settings, model hosts, batcher, service, HTTP adapter."""

__version__ = "0.1.0"
