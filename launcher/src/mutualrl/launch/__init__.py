"""`mutualrl up`: run the whole platform (Redis, SEE, THL, MWRA, one trainer per policy) as
supervised local processes."""
