"""The tuners RRL is measured against, each behind the same ``StateTuner`` interface."""
