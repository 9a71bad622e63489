"""Rollout: prompt data (``data``), the RolloutActor (``actor``) and its config (``config``)."""
