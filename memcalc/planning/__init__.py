"""Searching layouts: the space each framework runs (space) and the search over it (search)."""
