"""``slime.rollout.filter_hub`` (see slime_async.compat.slime)."""
