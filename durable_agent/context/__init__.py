"""What a model request holds: token budgets, compaction, the system prompt."""
