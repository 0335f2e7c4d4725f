"""Cost modelling: a step's rules (`step_model`), forward-latency profiles (`profile`) and their
measurement (`measure`), decision costs (`decision_cost`). `mcsd profile` is `cli.profile`."""
