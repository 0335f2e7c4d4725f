"""`mcsd train --decision schedule`: the draft length K by batch size for serving engines
(`train.schedule.trainer`)."""
