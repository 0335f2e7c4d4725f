"""The decode engine: tree and masks, caches, propose/verify/commit, one loop for one row or
many."""
