"""`mcsd train --decision budget`: the verification budget of a ragged batch, learned
(`train.budget.trainer`)."""
