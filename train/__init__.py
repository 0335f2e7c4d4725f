"""train: decision models for early stopping, offline replay, stopper artifacts.

    from replay.runs import load_runs, output_lengths
    from train.stop.pipeline import train_stopper
    from replay import ReplayData, replay

    df, manifests = load_runs(["runs/toy-dense"])
    summary = train_stopper(df, manifests, "stoppers/lgbm", model="lightgbm", label="hard")
    data = ReplayData(df, new_tokens=output_lengths(manifests))  # exact on dense greedy runs
    print(replay(data, "static:3").tau, replay(data, "oracle").tau)
"""
