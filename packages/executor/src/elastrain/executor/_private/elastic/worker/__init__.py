"""The worker side of an elastic job: joining groups, resets, state and its sync."""
