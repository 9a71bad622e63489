"""Mirror of slime's package of the same path (see slime_async.compat.slime)."""
