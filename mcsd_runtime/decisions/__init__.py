"""The decoder's decisions and their contract: the stopper contract (`contract`) and the built-in
stoppers (`builtin`), the feature schema (`features`), learned stoppers (`learned`, their
artifact `artifact`), the step's planner contract (`contract.Planner`), the skip gate (`skip`),
the learned copy length (`copy_length`) and width (`width`), a batch's verification budget
(`verify_budget`, its rule `budget`), and what every learned decision shares: the `Decision`
protocol and its `decision.json` (`manifest`)."""
