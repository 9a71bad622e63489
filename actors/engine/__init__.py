"""Inference engines: SGLang launchers, external URLs and the embedded CPU engine."""
