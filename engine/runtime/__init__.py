"""Runtime loops: the scheduler daemon (and, with the execution issue, consumers)."""
