"""device_sim."""
