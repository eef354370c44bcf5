"""The chain family: two contractions, the second reading the first through casts."""
