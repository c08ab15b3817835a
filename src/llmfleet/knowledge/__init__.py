"""What llmfleet knows: the catalogs (GPUs, quantization formats, models, engine releases),
the per-engine rules, the compatibility checks, the capacity planner and the preflight.
Pure: values in, findings and plans out."""
