"""Storage backends: the only place SQL lives, besides the schema files."""
