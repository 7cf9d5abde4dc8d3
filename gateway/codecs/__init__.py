"""Wire formats: Open Inference Protocol (JSON and binary tensors) and TF Serving REST."""
