"""train: the learned decisions (`mcsd train --decision stop|copy|width`), each trained by
the same stages (`train.decision`: prepare, fit, choose by replay, write, check); `train.stop`,
`train.copy` and `train.width` hold what differs.

    from replay.runs import load_runs, output_lengths
    from train.stop.trainer import train_stopper
    from replay import ReplayData, replay

    df, manifests = load_runs(["runs/toy-dense"])
    summary = train_stopper(df, manifests, "stoppers/lgbm", model="lightgbm", label="hard")
    data = ReplayData(df, new_tokens=output_lengths(manifests))  # exact on dense greedy runs
    print(replay(data, "static:3").tau, replay(data, "oracle").tau)
"""
