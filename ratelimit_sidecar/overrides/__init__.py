"""Runtime overrides: the model, the store protocol with its file and Redis stores, the keeper
and the follower."""
