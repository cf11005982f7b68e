"""The domain: schedules, triggers, slots, misfire rules and time. Pure: no I/O."""
