"""Cost modelling: a step's rules, forward-latency profiles, decision costs."""
