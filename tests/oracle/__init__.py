"""An independent reference for the cron layer: brute force, stdlib only, no code from engine/."""
