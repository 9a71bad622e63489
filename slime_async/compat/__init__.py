"""Compatibility layers that let plug-ins written for other frameworks run here unchanged."""
