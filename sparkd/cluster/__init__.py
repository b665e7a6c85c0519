"""The pair as one unit: the head's daemon leads every start and restart; workers run their rank on its word."""
